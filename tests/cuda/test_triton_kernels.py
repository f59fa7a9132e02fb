"""The Triton kernels of the CUDA backend (backends/cuda/_scaled_gemm.py behind fp8_gemm, fp8_bmm,
m_grouped_fp8_gemm and its masked form) run on CPU tensors in Triton's interpreter (tests/conftest.py sets
``TRITON_INTERPRET=1`` on a machine without a GPU): values against the specs' fp64 references and the C++
kernels, which samples take the kernel, the layouts read on the device (no host read under an emulated capture),
non-finite scales landing where the dequantize-then-multiply contract puts them, the bad-input campaign, and
the kernels behind an opaque test op for ``opcheck`` and ``torch.compile(fullgraph=True)``. On a GPU the same
tests run the compiled kernels through ``tests/cuda`` in ``tools/device_check.sh``."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

pytest.importorskip("triton")

from tests.capture_emulation import capturing_everywhere  # noqa: E402
from tests.chains import cuda_chain, has  # noqa: E402
from tests.cuda.opaque import check_opaque  # noqa: E402
from tests.fp8_gemm.specs import SPECS as FP8_SPECS  # noqa: E402
from tests.grouped.specs import SPECS as GROUPED_SPECS  # noqa: E402
from tests.npu.test_capture import no_host_reads  # noqa: E402
from torch_ascend_moe._registry import full_call, with_defaults  # noqa: E402
from torch_ascend_moe.backends import chain  # noqa: E402
from torch_ascend_moe.backends.cuda import _scaled_gemm, _triton  # noqa: E402
from torch_ascend_moe.backends.portable import fp8_gemm as portable_fp8  # noqa: E402
from torch_ascend_moe.backends.portable import grouped as portable_grouped  # noqa: E402
from torch_ascend_moe.testing import calc_diff  # noqa: E402
from torch_ascend_moe.testing.harness import THRESHOLDS  # noqa: E402

pytestmark = pytest.mark.skipif(
    not _triton.INTERPRETED, reason="Triton's interpreter is off in this process (a GPU compiles the kernels)"
)

PORTABLE = {**vars(portable_fp8), **vars(portable_grouped)}
SPECS = [s for s in FP8_SPECS + GROUPED_SPECS if has(s.name, "cuda", "triton: _scaled_gemm")]


def _kernel(spec):
    """The op's CUDA chain (the Triton kernel for the calls it takes)."""
    return getattr(cuda_chain, spec.name)


def _samples(spec):
    return [
        (dtype, s)
        for dtype in spec.dtypes
        for small in (False, True)
        for s in spec.sample_inputs("cpu", dtype, small=small)
    ]


def _recipes(spec, s):
    """(recipe_a, recipe_b) of a sample, by schema name."""
    names = [a.name for a in spec.op._schema.arguments]
    args = full_call(spec.name, *s.args)
    return args[names.index("recipe_a")], args[names.index("recipe_b")]


def _takes_triton(spec, s) -> bool:
    """The samples the kernel should take: non-empty operands (K too) and a K chunk both recipes allow."""
    a, b = s.args[0], s.args[2]
    return a.numel() > 0 and b.numel() > 0 and _scaled_gemm.block_k(*_recipes(spec, s)) is not None


def test_registered():
    assert {s.name for s in SPECS} == {"fp8_gemm", "fp8_bmm", "m_grouped_fp8_gemm", "m_grouped_fp8_gemm_masked"}


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_values_vs_fp64_and_the_cpu_kernel(spec):
    reference = with_defaults(spec.name, spec.reference)
    taken = 0
    for dtype, s in _samples(spec):
        where = f"{spec.name}[{s.name}, {dtype}]"
        with mock.patch.object(_scaled_gemm, "scaled_gemm", wraps=_scaled_gemm.scaled_gemm) as launch:
            out = _kernel(spec)(*s.args)
        assert launch.called == _takes_triton(spec, s), f"{where}: Triton path taken = {launch.called}"
        taken += launch.called
        ours, ref = spec.op(*s.args), reference(*s.args)
        assert (out.shape, out.dtype, out.stride()) == (ours.shape, ours.dtype, ours.stride()), where
        if out.numel():
            assert calc_diff(out, ref) < THRESHOLDS[dtype], where
            # The same FP32 sums in another order, one rounding: within a BF16 ulp of the output's scale, or a few
            # FP32 ones, of the C++ kernel.
            ulps = 1 if dtype == torch.bfloat16 else 16
            tol = ulps * torch.finfo(dtype).eps * ours.abs().max().item()
            assert (out.double() - ours.double()).abs().max().item() <= tol, where
            assert torch.equal(out[ref == 0], ours[ref == 0]), f"{where}: rows no group owns differ"
    assert taken, f"{spec.name}: no sample took the Triton kernel"


def test_block_k():
    assert _scaled_gemm.block_k([1, 128], [128, 128]) == 128
    assert _scaled_gemm.block_k([1, 128], [1, 32]) == 32
    assert _scaled_gemm.block_k([1, 64], [1, 192]) == 64
    assert _scaled_gemm.block_k([1, 16], [1, 16]) is None  # below FP8 tl.dot's K
    assert _scaled_gemm.block_k([1, 96], [1, 96]) == 32
    assert _scaled_gemm.block_k([1, 48], [1, 48]) is None


def test_segment_tiles_cover_every_segment_once():
    """Each segment's rows in ceil(count / BLOCK_M) tiles, in order, within the static bound; the rest empty."""
    bm = _scaled_gemm.BLOCK_M
    begins = torch.tensor([0, 70, 70, 200, 330])
    ends = torch.tensor([65, 70, 199, 330, 331])
    tiles = _scaled_gemm.segment_tiles(begins, ends, 331)
    assert tiles.shape == (3, -(-331 // bm) + 5)
    covered = []
    for g, r0, r1 in tiles.T.tolist():
        if r1 > r0:
            assert r1 - r0 <= bm and begins[g] <= r0 < r1 <= ends[g]
            covered += [(g, r) for r in range(r0, r1)]
    assert covered == [(g, r) for g in range(5) for r in range(begins[g], ends[g])]


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_no_host_read_while_capturing(spec):
    for _, s in _samples(spec):
        if not _takes_triton(spec, s):
            continue
        eager = _kernel(spec)(*s.args)
        with capturing_everywhere(), no_host_reads():
            captured = _kernel(spec)(*s.args)
        assert torch.equal(eager, captured), spec.name


def _scale_args(spec, s):
    names = [a.name for a in spec.op._schema.arguments]
    return names.index("sfa"), names.index("sfb")


@pytest.mark.parametrize("spec", SPECS, ids=str)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 0.0])
def test_special_scales_land_as_the_contract_puts_them(spec, value):
    """A NaN, infinite or zero FP32 scale takes the in-tile dequantization: NaN and infinities
    exactly where the contract (dequantize, then multiply: the portable kernel, and the C++ one) has them, finite
    values within a few ulps. (Scales so large that the products overflow are dequantized in the tile too, but
    where sums of overflowing terms become inf or NaN depends on the summation order, in every kernel.)"""
    checked = 0
    for dtype, s in _samples(spec):
        if not _takes_triton(spec, s) or dtype != torch.float32:
            continue
        for i in _scale_args(spec, s):
            sf = s.args[i]
            if sf.dtype != torch.float32 or sf.numel() == 0:
                continue
            args = list(s.args)
            bad = sf.clone()
            bad.view(-1)[:: max(1, sf.numel() // 3)] = value
            args[i] = bad.as_strided(sf.shape, sf.stride()) if bad.is_contiguous() else bad
            out, ours, contract = _kernel(spec)(*args), spec.op(*args), PORTABLE[spec.name](*args)
            assert torch.equal(ours.isnan(), contract.isnan()), f"{spec.name}[{s.name}]: the C++ kernel's NaNs"
            where = f"{spec.name}[{s.name}] scale {i} = {value}"
            assert torch.equal(out.isnan(), ours.isnan()), f"{where}: NaN placement"
            inf = out.isinf() | ours.isinf()
            assert torch.equal(out[inf], ours[inf]), f"{where}: infinities"
            finite = ~(out.isnan() | inf)
            scale = max(ours[finite].abs().max().item() if finite.any() else 0.0, 1e-30)
            assert (out[finite] - ours[finite]).abs().max().item() <= 1e-5 * scale if finite.any() else True, where
            checked += 1
    assert checked, spec.name


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_bad_inputs_raise_our_errors(spec):
    for bad in spec.bad_inputs("cpu"):
        with pytest.raises(bad.error, match=bad.match):
            _kernel(spec)(*bad.args)


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_hostile_inputs_agree_with_the_cpu_kernel(spec):
    """The bad-input campaign's mutations of small samples (every other dtype, ranks, sizes, strides, int64 edges,
    NaN, out-of-range layout values): the Triton kernel gives the C++ kernel's verdict, the same whole message, and
    its outputs where both accept."""
    from torch_ascend_moe.testing import campaign

    samples = spec.sample_inputs("cpu", torch.float32, small=True)[:2]
    problems, count = campaign.kernel_problems(spec, _kernel(spec), samples)
    assert count and not problems, "\n".join(problems[:5])


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_opcheck_and_compile_through_an_opaque_op(spec):
    samples = [
        s for dtype in spec.dtypes for s in spec.sample_inputs("cpu", dtype, small=True) if _takes_triton(spec, s)
    ]
    assert samples
    check_opaque(spec.name, _kernel(spec), samples[:2])


@pytest.mark.parametrize("name", ["fp8_quant_gemm", "fp8_linear"])
def test_fp8_linear_family_steps_reach_the_triton_gemm(name):
    """The fp8_linear family on CUDA: the fused kernel where it takes the call, else the portable kernel's steps
    through the dispatcher (CPU tensors routed to the CUDA chains here, as CUDA tensors would be): the cast bitwise
    the reference's, the GEMM the Triton kernel's, within a few ulps of the C++ kernels (the same FP32 sums in
    another order, one rounding)."""

    from tests.fp8_linear.specs import SPECS as LINEAR_SPECS

    spec = next(s for s in LINEAR_SPECS if s.name == name)
    op = getattr(torch.ops.ascend_moe, name)
    reached = 0
    for dtype in spec.dtypes:
        for s in spec.sample_inputs("cpu", dtype):
            with mock.patch.object(_scaled_gemm, "scaled_gemm", wraps=_scaled_gemm.scaled_gemm) as launch:
                with chain.on_cpu("cuda"):
                    out = op(*s.args)
            ours = op(*s.args)
            where = f"{name}[{s.name}, {dtype}]"
            assert (out.shape, out.dtype) == (ours.shape, ours.dtype), where
            reached += launch.called
            if out.numel():
                tol = (1 if out.dtype == torch.bfloat16 else 16) * torch.finfo(out.dtype).eps
                assert (out.double() - ours.double()).abs().max().item() <= tol * max(ours.abs().max().item(), 1e-30), (
                    where
                )
    assert reached, f"{name}: no sample reached the Triton GEMM"


def test_fp8_quant_gemm_casts_in_the_tile_bit_for_bit():
    """``fp8_quant_gemm`` as one launch (the per-token cast inside the GEMM's K chunks) equals the two-launch
    composition (the Triton cast, then the Triton GEMM) bit for bit, NaN/inf rows included."""
    from tests.fp8_linear.specs import SPECS as LINEAR_SPECS
    from torch_ascend_moe.backends.cuda import _quant
    from torch_ascend_moe.backends.cuda import fp8_linear as cuda_linear

    spec = next(s for s in LINEAR_SPECS if s.name == "fp8_quant_gemm")
    fused = 0
    for dtype in spec.dtypes:
        for s in spec.sample_inputs("cpu", dtype):
            x, b, sfb, c, gran_k, recipe_b, ue8m0, alpha, out_dtype = full_call(spec.name, *s.args)
            if not x.numel() or not b.numel():
                continue
            x = x.detach().clone()
            if x.shape[0] >= 3:  # NaN/inf rows, and finite rows between them that must still match
                x[0, 1], x[-1, -1] = float("nan"), float("inf")
            args = (x, b, sfb, c, gran_k, recipe_b, ue8m0, alpha, out_dtype)
            takes = cuda_linear.cast_in_tile_refusal(x, b, [1, gran_k], recipe_b) is None
            with mock.patch.object(_scaled_gemm, "scaled_gemm", wraps=_scaled_gemm.scaled_gemm) as launch:
                out = cuda_chain.fp8_quant_gemm(*args)
            q, sf = _quant.quantize(x, (1, gran_k), ue8m0, False)
            want = cuda_chain.fp8_gemm(q, sf, b, sfb, c, [1, gran_k], recipe_b, alpha, out.dtype)
            where = f"fp8_quant_gemm[{s.name}, {dtype}]"
            assert torch.equal(out.isnan(), want.isnan()) and torch.equal(out.nan_to_num(), want.nan_to_num()), where
            if takes:
                assert launch.call_args.kwargs.get("quantize_a_ue8m0") == ue8m0, where
            fused += takes
    assert fused, "no sample took the fused cast"


def test_m_grouped_fp8_quant_gemm_casts_in_the_tile_bit_for_bit():
    """``m_grouped_fp8_quant_gemm`` as one launch (the per-token cast in the grouped GEMM's tiles, psum and id layouts)
    equals the Triton cast then the grouped Triton GEMM bit for bit, NaN/inf rows included; rows no expert owns
    (NaN here) are never read; no host read while capturing; the steps serve the other recipes; bad inputs raise our
    errors."""
    from tests.grouped.specs import _quantize_experts
    from torch_ascend_moe.backends.cuda import _quant
    from torch_ascend_moe.backends.cuda import fp8_linear as cuda_linear

    spec = next(s for s in GROUPED_SPECS if s.name == "m_grouped_fp8_quant_gemm")
    fused = 0
    for dtype in spec.dtypes:
        for s in spec.sample_inputs("cpu", dtype, small=dtype != torch.bfloat16):  # every case once in BF16
            x, b, sfb, layout, psum, alignment, gran_k, recipe_b, ue8m0, out_dtype = s.args
            x = x.detach().clone()
            owned = portable_grouped.m_grouped_fp8_quant_gemm(x, *s.args[1:]).ne(0).any(1)
            x[~owned] = float("nan")  # rows no expert owns (or all-zero products): never read when unowned
            if x.shape[0] >= 3:
                x[0, 1], x[-1, -1] = float("nan"), float("inf")
            args = (x, b, sfb, layout, psum, alignment, gran_k, recipe_b, ue8m0, out_dtype)
            takes = bool(x.shape[0]) and cuda_linear.cast_in_tile_refusal(x, b, [1, gran_k], recipe_b) is None
            with mock.patch.object(_scaled_gemm, "scaled_gemm", wraps=_scaled_gemm.scaled_gemm) as launch:
                with chain.on_cpu("cuda"):
                    out = torch.ops.ascend_moe.m_grouped_fp8_quant_gemm(*args)
            q, sf = _quant.quantize(x, (1, gran_k), ue8m0, False)
            want = cuda_chain.m_grouped_fp8_gemm(
                q, sf, b, sfb, layout, psum, alignment, [1, gran_k], recipe_b, out.dtype
            )
            where = f"m_grouped_fp8_quant_gemm[{s.name}, {dtype}]"
            assert torch.equal(out.isnan(), want.isnan()) and torch.equal(out.nan_to_num(), want.nan_to_num()), where
            if takes:
                assert launch.call_count == 1 and launch.call_args.kwargs.get("quantize_a_ue8m0") == ue8m0, where
            if takes and not fused:  # one capture check: the schedule is built alike for every sample
                with capturing_everywhere(), no_host_reads():
                    captured = cuda_chain.m_grouped_fp8_quant_gemm(*args)
                assert torch.equal(captured.nan_to_num(), out.nan_to_num()), where
            fused += takes
    assert fused, "no sample took the fused cast"
    # gran_k 16: no K chunk of the Triton GEMM (>= 32) is one cast block, so the steps run (the Triton cast, then
    # the portable grouped GEMM: the Triton one takes no gran_k 16 either).
    g = torch.Generator().manual_seed(4)
    x = torch.randn(5, 64, generator=g, dtype=torch.bfloat16)
    b, sfb, recipe_b = _quantize_experts(torch.randn(2, 8, 64, generator=g), ("fp8-token", 1, 16, False))
    layout = torch.tensor([2, 5], dtype=torch.int32)
    with mock.patch.object(_scaled_gemm, "scaled_gemm", wraps=_scaled_gemm.scaled_gemm) as launch:
        with chain.on_cpu("cuda"):
            out = torch.ops.ascend_moe.m_grouped_fp8_quant_gemm(x, b, sfb, layout, True, 1, 16, recipe_b, False, None)
    q, sf = _quant.quantize(x, (1, 16), False, False)
    want = portable_grouped.m_grouped_fp8_gemm(q, sf, b, sfb, layout, True, 1, [1, 16], recipe_b, torch.bfloat16)
    assert not launch.called and torch.equal(out, want)
    for bad in spec.bad_inputs("cpu"):
        with pytest.raises(bad.error, match=bad.match):
            cuda_chain.m_grouped_fp8_quant_gemm(*bad.args)


def _on_cuda(op: str, *args):
    """``ascend_moe::op`` with every op of it on its CUDA chain (CPU tensors, as CUDA tensors would run)."""
    with chain.on_cpu("cuda"):
        return getattr(torch.ops.ascend_moe, op)(*args)


def test_m_grouped_fp8_linear_steps_reach_the_triton_gemm():
    """``m_grouped_fp8_linear`` on CUDA is the per-token cast, one cast of every expert's weight (N padded to the
    block, so no tile straddles experts) and one launch of the grouped Triton GEMM: within an ulp of the portable
    kernel (a cast per expert, a GEMM per segment; the same FP32 sums in another order), padding rows zero, no
    host read while capturing, layout errors under this op's name."""
    spec = next(s for s in GROUPED_SPECS if s.name == "m_grouped_fp8_linear")
    reached = 0
    for dtype in spec.dtypes:
        for small in (False, True):
            for s in spec.sample_inputs("cpu", dtype, small=small):
                with mock.patch.object(_scaled_gemm, "scaled_gemm", wraps=_scaled_gemm.scaled_gemm) as launch:
                    out = _on_cuda("m_grouped_fp8_linear", *s.args)
                ours = torch.ops.ascend_moe.m_grouped_fp8_linear(*s.args)  # the C++ kernel
                where = f"m_grouped_fp8_linear[{s.name}, {dtype}]"
                assert (out.shape, out.dtype) == (ours.shape, ours.dtype), where
                reached += launch.call_count
                if out.numel():
                    tol = (1 if out.dtype == torch.bfloat16 else 16) * torch.finfo(out.dtype).eps
                    scale = max(ours.abs().max().item(), 1e-30)
                    assert (out.double() - ours.double()).abs().max().item() <= tol * scale, where
                    assert not out[(ours == 0).all(1)].any(), where  # rows no expert owns
                if launch.called and not small:  # the capture check on the full samples (the schedule's cases)
                    with capturing_everywhere(), no_host_reads():
                        captured = _on_cuda("m_grouped_fp8_linear", *s.args)
                    assert torch.equal(captured, out), where
    assert reached, "no sample reached the Triton GEMM"
    for bad in spec.bad_inputs("cpu"):
        with pytest.raises(bad.error, match=bad.match):
            _on_cuda("m_grouped_fp8_linear", *bad.args)


def test_m_grouped_fp8_linear_one_weight_cast_equals_one_per_expert():
    """The steps' single cast of ``[G, N, K]`` as ``[G * N', K]`` (``N`` zero-padded to the block) gives each
    expert's codes and scales bit for bit, at an N that is not a multiple of the block, NaN and inf included."""
    from torch_ascend_moe.quant import reference

    g = torch.Generator().manual_seed(3)
    calls = []

    def fp8_gemm_of(a, sfa, b, sfb, *rest):
        calls.append((b.clone(), sfb.clone()))
        return torch.zeros(a.shape[0], b.shape[1])

    # The grouped GEMM the steps call, replaced on CPU for the test (the casts stay the C++ ones: the reference's
    # bits), so the weights' cast reaches it as the steps made it.
    lib = torch.library.Library("ascend_moe", "IMPL")
    try:
        with chain._quiet_override():
            lib.impl("m_grouped_fp8_gemm", fp8_gemm_of, "CPU")
        for n, block, ue8m0 in ((40, 32, False), (72, 64, True), (128, 128, False)):
            w = torch.randn(3, n, 128, generator=g) * torch.logspace(-3, 3, n).unsqueeze(1)
            w[1, 5, 7], w[2, -1, 0] = float("nan"), float("inf")
            calls.clear()
            layout = torch.tensor([1, 2, 3], dtype=torch.int32)
            x = torch.randn(3, 128, generator=g)
            portable_grouped.m_grouped_fp8_linear(x, w, layout, True, 1, block, ue8m0)
            ((wq, ws),) = calls
            for e in range(3):
                q, sf = reference.quantize_fp8(w[e], (block, block), ue8m0, False)
                for got, want in ((wq[e], q), (ws[e], sf)):  # bit patterns: NaN scales compare too
                    assert torch.equal(got.contiguous().view(torch.uint8), want.view(torch.uint8)), (n, block, e)
    finally:
        lib._destroy()
