"""TileKernels behind our ops (backends/upstream/tile_kernels), checked against the stand-in ``tile_kernels`` package
(tests/standins/tile_kernels: upstream's signatures, asserts, allocations and math, the kernels' own amax rule on
non-finite values) as the first release 36d9e45 and as a later one (cd8f86c: the RMSNorm kernels, ``apply_rotary``),
with CPU tensors on the CUDA chain:

* every family sample and the DeepSeek-shaped ones below go through the chain: a call that reaches the library raises
  nothing there (no assert, no panic), has our CPU kernel's shape, dtype and strides and its values (bitwise for the
  casts and SwiGLU; for RMSNorm and RoPE within the op's threshold, the codes bitwise our cast of the kernel's own
  output); a call that does not reach it is bitwise what the chain gives with the library disabled;
* enough calls reach it, the reasons are right, and what is passed is what upstream expects;
* non-finite values give our op's results (the stand-in's kernels would not: shown), a device-graph capture keeps
  the casts off the library;
* bad inputs get our op's words and never reach the library; disabling it restores the other kernels bit for bit;
* a compiled graph and an exported program hold our op and still reach the library at run time;
* mutation: a backend that handed over a transposed x, another scale layout, or the weights of the wrong rows fails.
"""

from __future__ import annotations

import contextlib
import sys
from unittest import mock

import pytest
import torch

from tests.capture_emulation import capturing_everywhere
from tests.chains import labels
from tests.norm.specs import SPECS as NORM_SPECS
from tests.quant.specs import SPECS as QUANT_SPECS
from tests.rope.specs import SPECS as ROPE_SPECS
from tests.swiglu.specs import SPECS as SWIGLU_SPECS
from tests.swiglu.specs import layout
from tests.upstream.standin import installed
from torch_ascend_moe._registry import full_call
from torch_ascend_moe.backends import chain
from torch_ascend_moe.backends.portable.quant import tile_cast
from torch_ascend_moe.backends.upstream.tile_kernels import quant as tk_quant
from torch_ascend_moe.backends.upstream.tile_kernels import swiglu as tk_swiglu
from torch_ascend_moe.testing import calc_diff
from torch_ascend_moe.testing.harness import SampleInput

FP8 = torch.float8_e4m3fn
SPECS = {s.name: s for s in (*QUANT_SPECS, *SWIGLU_SPECS, *NORM_SPECS, *ROPE_SPECS)}
V1, LATER = "36d9e45", "cd8f86c"
CONFIGS = {V1: {"version": V1, "arch": 9}, LATER: {"version": LATER, "arch": 10}}  # SM90, SM100
SERVED = {
    V1: ["quantize_blocks", "swiglu_forward", "swiglu_backward"],
    LATER: ["quantize_blocks", "rms_norm", "rms_norm_quant", "rotary_embedding"],
}
# Outputs within the op's threshold rather than bitwise (the kernel's row sums, its fused multiply-adds).
TOLERANT = {"rms_norm": (0, 1), "rms_norm_quant": (2, 3), "rotary_embedding": (0,), "swiglu_backward": (3,)}
MIN_REACHED = 4


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.uint8) if t.numel() else t.detach().reshape(-1)


def _same(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Equal bit for bit, NaN signs and payloads aside (our op's own CPU and portable kernels differ there: x86's
    default NaN is negative)."""
    if x.dtype != y.dtype or x.shape != y.shape:
        return False
    if not x.is_floating_point():
        return torch.equal(x, y)
    nan = x.isnan()
    if not torch.equal(nan, y.isnan()):
        return False
    return torch.equal(_bytes(torch.where(nan, 0, x)), _bytes(torch.where(nan, 0, y)))


def _outputs(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _calls(library) -> list[str]:
    return [name for name, _ in library._standin.CALLS]


# ---- DeepSeek-shaped samples (the family samples are sized for the portable kernels: H of 32 to 96, ...) ----------


def _quant_samples(g) -> list[SampleInput]:
    out = []
    bf16 = lambda *s: (torch.randn(*s, generator=g) * 3).bfloat16()  # noqa: E731
    for x, fmt, block, round_sf in [
        (bf16(48, 1024), "e4m3", [1, 128], True),
        (bf16(48, 1024), "e4m3", [1, 128], False),
        (torch.randn(40, 512, generator=g), "e2m1", [1, 32], True),
        (bf16(9, 256), "e2m1", [1, 16], False),
        (bf16(130, 512), "e4m3", [128, 128], True),
        (torch.randn(70, 256, generator=g), "e2m1", [32, 32], False),
        (bf16(256, 192), "e4m3", [128, 1], False),
        (bf16(40, 1152)[:, :576], "e4m3", [1, 128], True),  # strided rows, a ragged last block
        (bf16(16, 64), "e4m3", [1, 128], True),  # a block wider than the row
    ]:
        out.append(SampleInput((x, fmt, block, round_sf, None, None), f"{list(x.shape)} {fmt} {block} r{round_sf}"))
    sf = torch.rand(16, 4, generator=g) * 3 + 0.01
    out.append(SampleInput((bf16(16, 256), "e4m3", [1, 64], False, sf, None), "given sf [1, 64]"))
    sf = torch.rand(2, 8, generator=g) + 0.1
    out.append(SampleInput((bf16(64, 256), "e2m1", [32, 32], False, sf, 6.0 * 2.0**-126), "given sf [32, 32] e2m1"))
    x = bf16(8, 256)
    out += [
        SampleInput((x, "e4m3", [1, 100], False, None, None), "miss: [1, 100]"),
        SampleInput((x.half(), "e4m3", [1, 128], False, None, None), "miss: FP16"),
        SampleInput((x.t().contiguous().t(), "e4m3", [1, 128], False, None, None), "miss: transposed"),
        SampleInput((x, "e5m6", [1, 256], False, None, None), "miss: E5M6"),
        SampleInput((x, "e4m3", [1, 128], False, None, 1e-3), "miss: amax_clamp"),
        SampleInput((x, "e4m3", [1, 256], False, None, None), "miss: a row-wide block"),
    ]
    return out


def _swiglu_forward_samples(g) -> list[SampleInput]:
    out = []
    for rows, h, dtype, weighted, experts, scale, clamp, npc, round_sf in [
        (40, 256, torch.bfloat16, True, 5, 2.5, 10.0, 128, True),
        (33, 128, torch.float32, True, 0, None, None, 128, False),
        (24, 256, torch.bfloat16, False, 0, None, None, 256, True),
        (30, 128, torch.bfloat16, False, 3, None, 0.5, 128, False),
        (8, 256, torch.bfloat16, True, 0, None, None, 32, False),  # blocks of 32
        (8, 256, torch.bfloat16, True, 0, None, 0.5, 256, False),  # clamp counts per row
        (8, 96, torch.bfloat16, True, 0, None, None, 96, False),  # H 96
    ]:
        miss = "miss: " if h % 128 or npc not in (128, h) or (clamp is not None and npc != 128) else ""
        x = (torch.randn(rows, 2 * h, generator=g) * 3).to(dtype)
        w = torch.rand(rows, generator=g) if weighted else None
        psum = layout(rows, experts, 8, g)
        args = (x, w, psum, 8, scale, clamp, FP8, npc, round_sf, None)
        out.append(SampleInput(args, f"{miss}N{rows} H{h} {dtype} w{weighted} E{experts} c{clamp} npc{npc}"))
    x = torch.randn(8, 512, generator=g).bfloat16()
    out.append(SampleInput((x, None, None, 1, None, None, torch.bfloat16, 128, False, None), "miss: BF16 out"))
    out.append(SampleInput((x, None, None, 1, None, None, FP8, 128, False, 1e-2), "sf_clamp_min"))
    return out


def _swiglu_backward_samples(g) -> list[SampleInput]:
    out = []
    for rows, h, block, weighted, experts, scale, clamp, npc, round_sf in [
        (40, 256, 128, True, 5, 1.5, 0.5, 128, True),
        (33, 128, 32, True, 0, None, None, 0, False),
        (24, 256, 32, False, 0, None, 10.0, 32, False),
        (30, 128, 128, True, 3, None, None, 128, False),
        (8, 256, 32, True, 0, None, None, 128, False),  # cast blocks != x's
        (8, 96, 32, True, 0, None, None, 0, False),  # x's blocks straddle the halves
    ]:
        miss = "miss: " if npc not in (0, block) or h % block else ""
        values = torch.randn(rows, 2 * h, generator=g) * 4
        x, x_sf = tile_cast(values, "e4m3", [1, block], True, None, 1e-4)
        grad = torch.randn(rows, h, generator=g).bfloat16()
        w = torch.rand(rows, generator=g) if weighted else None
        args = (x, x_sf, grad, w, layout(rows, experts, 8, g), 8, scale, clamp, None, npc, round_sf)
        out.append(SampleInput(args, f"{miss}N{rows} H{h} block{block} w{weighted} E{experts} c{clamp} npc{npc}"))
    x, x_sf = tile_cast(torch.randn(8, 512, generator=g), "e4m3", [1, 128], True, None, 1e-4)
    grad = torch.randn(8, 256, generator=g)
    out.append(SampleInput((x, x_sf, grad, None, None, 1, None, None, None, 128, False), "miss: FP32 grad_out"))
    out.append(SampleInput((x.float(), None, grad, None, None, 1, None, None, None, 0, False), "miss: FP32 x"))
    return out


def _norm_samples(g, quant: bool) -> list[SampleInput]:
    out = []
    for shape, dtype, weighted, residual, scale, npc, round_sf in [
        ([33, 512], torch.bfloat16, True, True, 1.0, 128, True),
        ([2, 5, 256], torch.bfloat16, False, True, 0.5, 32, True),
        ([17, 1024], torch.float32, True, False, 2.0, 32, True),
        ([3, 4, 1024], torch.bfloat16, True, True, 1.5, 128, True),
        ([12, 256], torch.bfloat16, True, False, 1.0, 32, False),  # rms_norm_quant: no round_sf
        ([4, 100], torch.bfloat16, True, False, 1.0, 32, True),  # H 100
    ]:
        miss = "miss: " if shape[-1] % 16 or (quant and (not round_sf or dtype != torch.bfloat16)) else ""
        x = (torch.randn(*shape, generator=g) * 2).to(dtype)
        w = torch.randn(shape[-1], generator=g).to(dtype) if weighted else None
        r = (torch.randn(*shape, generator=g) * 2).to(dtype) if residual else None
        args = (x, w, 1e-6, r, scale) + ((npc, round_sf) if quant else ())
        out.append(SampleInput(args, f"{miss}{shape} {dtype} w{weighted} r{residual} s{scale} npc{npc} r{round_sf}"))
    return out


def _rope_samples(g) -> list[SampleInput]:
    out = []
    for shape, rows, dtype, positioned, offset, interleaved, conjugate in [
        ([24, 8, 128], 64, torch.bfloat16, True, 3, False, False),
        ([2, 6, 4, 64], 16, torch.float32, False, 3, True, True),
        ([5, 2, 256], 9, torch.float32, True, 0, False, True),
        ([5, 2, 48], 9, torch.float32, True, 0, False, False),  # rot 48
    ]:
        rot = shape[-1]
        angle = torch.rand(rows, rot // 2, generator=g) * 6
        cache = torch.cat([angle.cos(), angle.sin()], 1)
        x = torch.randn(*shape, generator=g).to(dtype)
        positions = torch.randint(0, rows - offset, shape[:-2], generator=g) if positioned else None
        miss = "" if rot in (32, 64, 128, 256) else "miss: "
        out.append(
            SampleInput((x, cache, positions, offset, interleaved, conjugate), f"{miss}{shape} {dtype} rot{rot}")
        )
    return out


def _samples(op: str) -> list[SampleInput]:
    """The family's samples (every dtype of its spec), then the DeepSeek-shaped ones."""
    spec = SPECS[op]
    return [s for dtype in spec.dtypes for s in spec.sample_inputs("cpu", dtype)] + _extra(op)


def _extra(op: str) -> list[SampleInput]:
    g = torch.Generator().manual_seed(3)
    return {
        "quantize_blocks": lambda: _quant_samples(g),
        "swiglu_forward": lambda: _swiglu_forward_samples(g),
        "swiglu_backward": lambda: _swiglu_backward_samples(g),
        "rms_norm": lambda: _norm_samples(g, quant=False),
        "rms_norm_quant": lambda: _norm_samples(g, quant=True),
        "rotary_embedding": lambda: _rope_samples(g),
    }[op]()


def _check(op: str, library, samples) -> tuple[list[str], int]:
    """(problems, how many samples reached the library) of ``samples`` on the CUDA chain."""
    spec, problems, reached = SPECS[op], [], 0
    for s in samples:
        full = full_call(op, *s.args)
        where = f"{op}[{s.name}]"
        before = len(library._standin.CALLS)
        try:
            got = _outputs(chain.run(op, "cuda", *full))
        except library._standin.Panic as e:
            problems.append(f"{where}: a call the real kernel would trap or write garbage on reached it: {e}")
            continue
        except AssertionError as e:
            problems.append(f"{where}: a call the library asserts against reached it: {e}")
            continue
        if len(library._standin.CALLS) == before:
            with chain.disabled("tile_kernels"):
                want = _outputs(chain.run(op, "cuda", *full))
            if not all(_same(x, y) for x, y in zip(got, want, strict=True)):
                problems.append(f"{where}: not bitwise the chain without the library")
            continue
        reached += 1
        ours = _outputs(getattr(torch.ops.ascend_moe, op)(*full))  # the CPU kernel
        for i, (x, o) in enumerate(zip(got, ours, strict=True)):
            if (x.shape, x.dtype, x.stride()) != (o.shape, o.dtype, o.stride()):
                problems.append(f"{where} output {i}: {x.shape, x.dtype, x.stride()} != {o.shape, o.dtype, o.stride()}")
            elif i in TOLERANT.get(op, ()):
                bound = spec.threshold("cpu", full[0].dtype if full[0].dtype != FP8 else torch.bfloat16)
                same = torch.equal(torch.isfinite(x), torch.isfinite(o))
                diff = calc_diff(x.double(), o.double()) if x.numel() else 0.0
                if not same or not diff < bound:
                    problems.append(f"{where} output {i}: finite alike {same}, calc_diff {diff:.3g} >= {bound}")
            elif not _same(x, o):
                problems.append(f"{where} output {i}: not bitwise our CPU kernel's")
        if op == "rms_norm_quant":  # the codes: our cast of the kernel's own rounded output, bit for bit
            h, npc = full[0].shape[-1], full[5]
            data, sf = tile_cast(got[2].reshape(-1, h).float(), "e4m3", [1, npc], True, None, 1e-4)
            if not (_same(got[0].reshape(-1, h), data) and _same(got[1].reshape(-1, sf.shape[1]), sf)):
                problems.append(f"{where}: the codes are not our cast of the kernel's output")
    return problems, reached


CASES = [(version, op) for version, ops in SERVED.items() for op in ops]


@pytest.mark.parametrize(("version", "op"), CASES, ids=[f"{v}-{op}" for v, op in CASES])
def test_calls_the_library_takes_compute_the_op(version, op):
    with installed("tile_kernels", **CONFIGS[version]) as library:
        problems, reached = _check(op, library, _samples(op))
    assert not problems, "\n".join(problems[:8])
    assert reached >= MIN_REACHED, f"{version} {op}: only {reached} samples reached TileKernels"


@pytest.mark.parametrize("version", [V1, LATER])
def test_what_a_release_lacks_is_refused_with_the_reason(version):
    """36d9e45 has no RMSNorm kernels and no transform; the later releases' SwiGLU kernels take the psum layout."""
    missing = {V1: ["rms_norm", "rms_norm_quant", "rotary_embedding"], LATER: ["swiglu_forward", "swiglu_backward"]}
    with installed("tile_kernels", version=version) as library:
        for op in missing[version]:
            for s in [s for s in _extra(op) if not s.name.startswith("miss")]:
                step = chain.explain(op, "cuda", *s.args)[0]
                assert step.status == "refused", (op, s.name, step)
                assert "has no" in step.reason or "psum-layout form is not mapped" in step.reason, step.reason
                chain.run(op, "cuda", *full_call(op, *s.args))
        assert _calls(library) == []


@pytest.mark.parametrize("op", sorted({*SERVED[V1], *SERVED[LATER]}))
def test_tile_kernels_comes_first_and_is_missing_here(op):
    assert labels(op, "cuda")[0].startswith("tile_kernels."), labels(op, "cuda")
    s = _samples(op)[-1]
    first = chain.explain(op, "cuda", *s.args)[0]
    assert first.status == "not available" and "tile_kernels is not installed" in first.reason, first


def test_our_compat_package_and_other_gpus_are_never_taken(monkeypatch):
    import torch_ascend_moe.tile_kernels as ours

    x = torch.randn(4, 256)
    monkeypatch.setitem(sys.modules, "tile_kernels", ours)
    chain.refresh()
    try:
        first = chain.explain("quantize_blocks", "cuda", x, "e4m3", [1, 128])[0]
        assert first.status == "not available" and "own compat package" in first.reason, first
    finally:
        monkeypatch.delitem(sys.modules, "tile_kernels")
        chain.refresh()
    with installed("tile_kernels"), mock.patch.object(torch.cuda, "is_available", lambda: True):
        with mock.patch.object(torch.cuda, "get_device_capability", lambda *a: (8, 0)):
            chain.refresh()
            first = chain.explain("quantize_blocks", "cuda", x, "e4m3", [1, 128])[0]
            assert first.status == "not available" and "this GPU is SM8x" in first.reason, first
        chain.refresh()


def test_reasons_name_what_the_library_lacks():
    with installed("tile_kernels", version=LATER):
        cases = {s.name: s for s in _quant_samples(torch.Generator().manual_seed(0))}
        for name, reason in [
            ("miss: [1, 100]", "blocks [1, 100]"),
            ("miss: FP16", "torch.float16 x"),
            ("miss: transposed", "columns are not contiguous"),
            ("miss: E5M6", "E5M6"),
            ("miss: amax_clamp", "amax_clamp"),
            ("miss: a row-wide block", "blocks [1, 256]"),
        ]:
            step = chain.explain("quantize_blocks", "cuda", *cases[name].args)[0]
            assert step.status == "refused" and reason in step.reason, (name, step)
        x = torch.randn(8, 256).bfloat16()
        for op, args, reason in [
            ("swiglu_forward", (x, None, None, 1, None, None, None), "unquantized output"),
            ("rms_norm_quant", (x.float(), None, 1e-6, None, 1.0, 32, True), "BF16 only"),
            ("rms_norm_quant", (x, None, 1e-6, None, 1.0, 32, False), "no round_sf"),
            ("rms_norm", (x.double(), None, 1e-6), "torch.float64 x"),
            ("rms_norm", (x[:, :100], None, 1e-6), "H = 100"),
        ]:
            step = chain.explain(op, "cuda", *args)[0]
            assert step.status in ("refused", "not available") and reason in step.reason, (op, step)


def test_what_is_passed():
    g = torch.Generator().manual_seed(1)
    with installed("tile_kernels", version=V1) as library:
        x = torch.randn(16, 1024, generator=g).bfloat16()
        chain.run("quantize_blocks", "cuda", *full_call("quantize_blocks", x, "e4m3", [1, 128], True))
        name, call = library._standin.CALLS[-1]
        assert name == "per_token_cast" and call["num_per_channels"] == 128 and call["round_sf"] is True
        assert call["use_tma_aligned_col_major_sf"] is False and call["use_packed_ue8m0"] is False
        assert call["x"][3] == x.data_ptr()  # the caller's rows, no copy
        # SwiGLU: per-row weights times the scale as a [N, 1] table, the layout as pos_to_expert, int32 maps
        s = _swiglu_forward_samples(g)[0]
        chain.run("swiglu_forward", "cuda", *full_call("swiglu_forward", *s.args))
        name, call = library._standin.CALLS[-1]
        n = s.args[0].shape[0]
        assert name == "swiglu_forward_and_per_token_cast" and call["fmt"] == "e4m3"
        assert call["pos_to_token_topk"][:2] == (torch.int32, (n,)) and call["topk_weights"][:2] == (
            torch.float32,
            (n, 1),
        )
        assert call["pos_to_expert"][0] == torch.int32 and call["clamped_count"][:2] == (torch.int64, (3,))
        s = _swiglu_backward_samples(g)[0]
        chain.run("swiglu_backward", "cuda", *full_call("swiglu_backward", *s.args))
        name, call = library._standin.CALLS[-1]
        assert name == "swiglu_backward_and_per_token_cast" and call["grad_out"][0] == torch.bfloat16
        assert call["token_topk_to_pos"][1] == (n, 1) and call["num_per_channels"] == 128
    with installed("tile_kernels", version=LATER) as library:
        x = torch.randn(8, 256, generator=g).bfloat16()
        chain.run("rms_norm_quant", "cuda", *full_call("rms_norm_quant", x, None, 1e-6, None, 1.0, 32, True))
        name, call = library._standin.CALLS[-1]
        assert name == "norm_forward_and_per_token_cast" and call["with_out_bf16"] and call["round_sf"]
        s = _rope_samples(g)[0]
        chain.run("rotary_embedding", "cuda", *full_call("rotary_embedding", *s.args))
        name, call = library._standin.CALLS[-1]
        assert name == "apply_rotary" and call["query"][3] != s.args[0].data_ptr()  # a copy, not the caller's x


def test_non_finite_values_stay_off_the_library():
    """TileKernels' casts drop a NaN from a block's amax (CUDA's fmaxf) and, with round_sf, turn an infinite amax into a
    -inf multiplier; our op (TileKernels' own reference) gives such blocks a NaN, 0 or inf scale and x·0 codes. The
    stand-in's kernels show the difference (the failing example); our chain hands the library only calls whose cast
    values are bounded finite, so the results are our op's."""
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(9)).bfloat16()
    x[1, 3], x[2, 200] = float("nan"), float("inf")
    h = torch.randn(6, 512, generator=torch.Generator().manual_seed(10)).bfloat16()
    h[2, 7] = float("nan")
    w = torch.rand(6)
    huge = torch.full((6, 512), 2.0**70).bfloat16()  # finite, but silu(a) · b overflows FP32
    y = torch.randn(5, 256).bfloat16()
    y[3, 9] = float("inf")
    with installed("tile_kernels", version=V1) as library:
        for fmt in ("e4m3", "e2m1"):
            for round_sf in (False, True):
                ours = torch.ops.ascend_moe.quantize_blocks(x, fmt, [1, 128], round_sf)
                got = chain.run("quantize_blocks", "cuda", *full_call("quantize_blocks", x, fmt, [1, 128], round_sf))
                assert all(_same(a, b) for a, b in zip(got, ours)), (fmt, round_sf)
                kernel_data, kernel_sf = library.quant.per_token_cast(x, fmt, 128, round_sf=round_sf)
                assert not _same(kernel_sf, ours[1]), (fmt, round_sf)  # what the library would have returned
        step = chain.explain("quantize_blocks", "cuda", x, "e4m3", [1, 128])[0]
        assert step.status == "refused" and "not finite" in step.reason, step
        for h_ in (h, huge):
            full = full_call("swiglu_forward", h_, w, out_dtype=FP8, round_sf=True)
            ours = torch.ops.ascend_moe.swiglu_forward(*full)
            assert all(_same(a, b) for a, b in zip(chain.run("swiglu_forward", "cuda", *full), ours))
            assert not _same(
                library.quant.swiglu_forward_and_per_token_cast(h_, "e4m3", 128, round_sf=True)[0], ours[0]
            )
        assert set(_calls(library)) == {"per_token_cast", "swiglu_forward_and_per_token_cast"}
        assert len(_calls(library)) == 6  # the direct calls only
    with installed("tile_kernels", version=LATER) as library:
        full = full_call("rms_norm_quant", y, None, 1e-6, None, 1.0, 32, True)
        assert all(
            _same(a, b)
            for a, b in zip(chain.run("rms_norm_quant", "cuda", *full), torch.ops.ascend_moe.rms_norm_quant(*full))
        )
        for args in [(y, None, 1e-6, None, 1.0, 32, True), (y.nan_to_num(), None, 0.0, None, 1.0, 32, True)]:
            assert chain.explain("rms_norm_quant", "cuda", *args)[0].status == "refused"
        assert _calls(library) == []


def test_a_captured_graph_keeps_the_casts_off_the_library():
    x = torch.randn(8, 256).bfloat16()
    cache = torch.rand(16, 64)
    q = torch.randn(8, 2, 64)
    positions = torch.randint(0, 16, (8,))
    with installed("tile_kernels", version=LATER) as library, capturing_everywhere():
        for op, args in [
            ("quantize_blocks", (x, "e4m3", [1, 128], True)),
            ("rms_norm_quant", (x, None, 1e-6, None, 1.0, 32, True)),
        ]:
            step = chain.explain(op, "cuda", *args)[0]
            assert step.status == "refused" and "device graph is being captured" in step.reason, step
        assert chain.explain("rms_norm", "cuda", x, None, 1e-6)[0].status == "chosen"
        got = chain.run("rotary_embedding", "cuda", *full_call("rotary_embedding", q, cache, positions))
        assert _calls(library) == ["apply_rotary"]  # rows clamped on the device instead of checked
    assert calc_diff(got, torch.ops.ascend_moe.rotary_embedding(q, cache, positions)) < 1e-10


@pytest.mark.parametrize("version", [V1, LATER])
def test_bad_inputs_never_reach_the_library(version):
    with installed("tile_kernels", version=version) as library:
        for op in SERVED[version]:
            for bad in SPECS[op].bad_inputs("cpu"):
                with pytest.raises(bad.error, match=bad.match):
                    chain.run(op, "cuda", *full_call(op, *bad.args))
            assert _calls(library) == [], (op, _calls(library))


def test_disabling_restores_the_other_kernels_bit_for_bit(monkeypatch):
    samples = [s for s in _quant_samples(torch.Generator().manual_seed(2)) if not s.name.startswith("miss")]
    run = lambda s: chain.run("quantize_blocks", "cuda", *full_call("quantize_blocks", *s.args))  # noqa: E731
    without = [run(s) for s in samples]
    with installed("tile_kernels") as library:
        for how in ("context", "environment"):
            with contextlib.ExitStack() as stack:
                if how == "context":
                    stack.enter_context(chain.disabled("tile_kernels"))
                else:
                    monkeypatch.setenv(chain.ENV, "quantize_blocks:tile_kernels")
                got = [run(s) for s in samples]
            monkeypatch.delenv(chain.ENV, raising=False)
            assert all(_same(a, b) for x, y in zip(got, without) for a, b in zip(x, y)), how
        assert _calls(library) == []


def test_compiled_and_exported_programs_hold_our_op_and_reach_the_library(tmp_path):
    x = torch.randn(16, 512).bfloat16()

    class Layer(torch.nn.Module):
        def forward(self, x):
            data, sf = torch.ops.ascend_moe.quantize_blocks(x, "e4m3", [1, 128], True)
            return data.float() * sf.repeat_interleave(128, 1)

    eager = Layer()(x)
    program = torch.export.export(Layer(), (x,))
    assert any(n.target is torch.ops.ascend_moe.quantize_blocks.default for n in program.graph.nodes)
    path = tmp_path / "layer.pt2"
    torch.export.save(program, path)
    loaded = torch.export.load(path)
    with installed("tile_kernels") as library, chain.on_cpu("cuda"):
        torch._dynamo.reset()
        compiled = torch.compile(Layer(), fullgraph=True, backend="aot_eager")(x)
        reached_compiled = len(_calls(library))
        exported = loaded.module()(x)
        reached_exported = len(_calls(library)) - reached_compiled
    assert reached_compiled >= 1 and reached_exported == 1
    assert torch.equal(compiled, eager) and torch.equal(exported, eager)


def _transposed_x(real):
    def cast(x, *args):
        return real(x.t().contiguous().t(), *args)

    return cast


def _column_major_scales(real):
    def cast(x, fmt, block, round_sf, sf, how):
        data, scale = real(x, fmt, block, round_sf, sf, how)
        return data, scale.t().contiguous().t()

    return cast


def _weights_of_reversed_rows(real):
    return lambda args: None if args.topk_weights is None else real(args).flip(0)


_MUTATIONS = {
    # x handed over transposed (an MN-major view): the per-token kernel reads garbage, the per-block one asserts
    "a transposed x": ("quantize_blocks", tk_quant, "cast", _transposed_x, ("write garbage", "asserts against")),
    # the scales returned column-major (upstream's TMA layout): not our fake's strides
    "another scale layout": ("quantize_blocks", tk_quant, "cast", _column_major_scales, ("!=",)),
    # the weights of the wrong rows: values off
    "weights of reversed rows": ("swiglu_forward", tk_swiglu, "_weights", _weights_of_reversed_rows, ("not bitwise",)),
}


@pytest.mark.parametrize("mutation", list(_MUTATIONS))
def test_a_wrong_handover_is_caught(mutation):
    """Mutation check: a backend that handed the library a transposed x, returned its scales in another layout or
    weighted the wrong rows fails the checks of the samples that reach it."""
    op, module, name, wrap, symptom = _MUTATIONS[mutation]
    samples = [s for s in _samples(op) if not s.name.startswith("miss") and s.args[1] is not None][-6:]
    with installed("tile_kernels") as library:
        problems, reached = _check(op, library, samples)
        assert not problems and reached, problems
        with mock.patch.object(module, name, wrap(getattr(module, name))):
            problems, _ = _check(op, library, samples)
    assert problems and all(any(s in p for s in symptom) for p in problems), problems
