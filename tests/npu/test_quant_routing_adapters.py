"""The quant, moe_routing and fp8_gemm Ascend adapters against torch_npu's own schemas and meta rules (the wheel,
via ``npu_ops``), and, for values, against CPU references of the called npu ops (``quant_routing_refs``: our
reading of their docs). Every family sample runs (plus a few extra ones the adapters take), on both SoC rule
sets (A3: 250, Ascend 950: 260):

1. shapes: under FakeTensorMode, the adapter (torch_npu's metas inside) and our op's fake agree on every
   output's shape, dtype and stride, for every sample the adapter maps to torch_npu;
2. values: the adapter on CPU tensors matches the spec's fp64 reference within the harness thresholds, and our
   portable kernel bit for bit where the op is bitwise (codes, scales, ids, moved rows); the samples it does not
   map go to the portable kernel (checked by call), and which samples are mapped is pinned;
3. bad inputs: the adapter raises our op's errors.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from tests.chains import npu_chain
from tests.fp8_gemm.specs import SPECS as FP8_GEMM_SPECS
from tests.fp8_gemm.specs import quantize as fp8_quantize
from tests.moe_routing.specs import SPECS as ROUTING_SPECS
from tests.npu import quant_routing_refs
from tests.quant.specs import SPECS as QUANT_SPECS
from tests.quant.specs import _high_precision
from torch_ascend_moe._registry import full_call
from torch_ascend_moe.backends import chain
from torch_ascend_moe.backends.npu import fp8_gemm as npu_fp8_gemm
from torch_ascend_moe.backends.npu import moe_routing as npu_routing
from torch_ascend_moe.backends.npu import quant as npu_quant
from torch_ascend_moe.backends.portable import moe_routing as portable_routing
from torch_ascend_moe.testing import calc_diff, npu_wheel
from torch_ascend_moe.testing.harness import THRESHOLDS, SampleInput

SPECS = {s.name: s for s in (*QUANT_SPECS, *ROUTING_SPECS, *FP8_GEMM_SPECS)}
# The ops with a torch_npu adapter here.
ADAPTED = ["quantize_fp8", "quantize_blocks", "moe_permute", "moe_gating_topk", "moe_unpermute", "fp8_gemm"]
A3, ASCEND950 = 250, 260


def _extra_quantize_samples(device, dtype):
    """UE8M0 row blocks the MX op takes (the family's samples have one): ragged widths, short blocks, packed
    and FP32 scales, a transposed input, a row of zeros (the amax floor)."""
    g = torch.Generator().manual_seed(41)
    cases = [(33, 300, [1, 128], False, False), (7, 100, [1, 32], True, True), (5, 40, [1, 64], False, False)]
    cases += [(3, 1000, [1, 1024], True, False), (6, 64, [1, 32], False, True)]
    return [
        SampleInput((_high_precision(m, n, dtype, device, tr, g), block, True, packed), f"extra M{m}N{n} {block}")
        for m, n, block, packed, tr in cases
    ]


def _extra_blocks_samples(device, dtype):
    """TileKernels' power-of-two E4M3 row blocks (what the MX op takes): ragged widths, a custom amax floor, a row of
    zeros (the floor decides its scale), a transposed input; and near misses that stay portable."""
    g = torch.Generator().manual_seed(44)
    cases = [
        (9, 300, [1, 128], True, None, False),
        (5, 64, [1, 32], True, 0.5, True),
        (4, 40, [1, 64], True, None, False),
    ]
    cases += [(6, 64, [1, 32], False, None, False), (6, 64, [2, 32], True, None, False)]
    out = []
    for m, n, block, round_sf, clamp, tr in cases:
        x = _high_precision(m, n, dtype, device, tr, g)
        x[0] = 0
        name = f"extra M{m}N{n} {block}{' round_sf' if round_sf else ''} clamp={clamp}"
        out.append(SampleInput((x, "e4m3", block, round_sf, None, clamp), name))
    return out


def _extra_unpermute_samples(device, dtype):
    """Full routings (no -1, no alignment rows): the only layout npu_moe_finalize_routing takes."""
    g = torch.Generator().manual_seed(42)
    out = []
    for t, h, k, e, weighted in [(9, 16, 2, 4, True), (5, 8, 3, 6, False), (1, 4, 1, 2, True)]:
        idx = torch.rand(t, e, generator=g).topk(k, dim=1).indices
        _, row_map, _ = portable_routing.moe_permute(torch.zeros(t, 1), idx, e, 1)
        y = torch.randn(t * k, h, generator=g).to(dtype).to(device)
        w = torch.rand(t, k, generator=g).to(dtype).to(device) if weighted else None
        out.append(SampleInput((y, row_map.to(device), w), f"extra full T{t} k{k}{' weighted' if weighted else ''}"))
    # FP32 y with BF16 weights: one dtype is what the op takes, so this stays portable
    y, rm, _ = out[0].args
    out.append(SampleInput((y, rm, torch.rand(rm.shape, generator=g).to(torch.bfloat16)), "extra mixed dtypes"))
    return out


def _extra_fp8_gemm_samples(device, dtype):
    """The 1x128 x 128x128 recipe the G-B mode takes, ragged M and N, an MN-major A and its MN-major scales."""
    g = torch.Generator().manual_seed(43)
    out = []
    for m, n, k, mn_major in [(33, 129, 384, False), (128, 264, 256, True)]:
        a, sfa, recipe_a = fp8_quantize(torch.randn(m, k, generator=g), ("fp8-token", 1, 128, False))
        b, sfb, recipe_b = fp8_quantize(torch.randn(n, k, generator=g), ("fp8-block", 128, 128, False))
        if mn_major:
            a, sfa = a.t().contiguous().t(), sfa.t().contiguous().t()
        args = (a, sfa, b, sfb, None, recipe_a, recipe_b, 1.0, dtype)
        out.append(SampleInput(args, f"extra M{m}N{n}K{k}{' mn-major' if mn_major else ''}"))
    return out


EXTRA = {
    "quantize_fp8": _extra_quantize_samples,
    "quantize_blocks": _extra_blocks_samples,
    "moe_unpermute": _extra_unpermute_samples,
    "fp8_gemm": _extra_fp8_gemm_samples,
}

# The samples each adapter maps to torch_npu, per SoC rule set: (op, dtype) -> sample names. Everything else
# must reach the portable kernel.
MAPPED = {
    A3: {
        ("moe_permute", torch.bfloat16): {
            "T9 H16 k2 E4 align=1 torch.int64",
            "T13 H24 k3 E6 align=4 torch.int32",
            "T1 H8 k1 E3 align=8 torch.int64",
        },
        ("moe_permute", torch.float32): {
            "T9 H16 k2 E4 align=1 torch.int64",
            "T13 H24 k3 E6 align=4 torch.int32",
            "T1 H8 k1 E3 align=8 torch.int64",
        },
        ("moe_gating_topk", torch.float32): {
            "T7 E8 top-2 softmax groups 1/1 renorm=True",
            "T9 E16 top-4 sigmoid bias groups 2/4 renorm=True",
            "T4 E8 top-3 softmax groups 2/2 renorm=True",
        },
        ("moe_unpermute", torch.float32): {
            "extra full T9 k2 weighted",
            "extra full T5 k3",
            "extra full T1 k1 weighted",
        },
    },
    ASCEND950: {
        ("quantize_fp8", torch.bfloat16): {
            "M16N512 block=[1, 128] ue8m0 packed",
            "extra M33N300 [1, 128]",
            "extra M7N100 [1, 32]",
            "extra M5N40 [1, 64]",
            "extra M3N1000 [1, 1024]",
            "extra M6N64 [1, 32]",
        },
        ("quantize_fp8", torch.float32): {"extra M7N100 [1, 32]", "extra M6N64 [1, 32]"},
        ("quantize_blocks", torch.bfloat16): {
            "M33N300 block=[1, 128] e4m3 round_sf clamp=None transposed",
            "extra M9N300 [1, 128] round_sf clamp=None",
            "extra M5N64 [1, 32] round_sf clamp=0.5",
            "extra M4N40 [1, 64] round_sf clamp=None",
        },
        ("quantize_blocks", torch.float32): {"extra M5N64 [1, 32] round_sf clamp=0.5"},
        ("fp8_gemm", torch.bfloat16): {
            "M1N576K512 fp8-1x128 x fp8-128x128",
            "extra M33N129K384",
            "extra M128N264K256 mn-major",
        },
        ("moe_gating_topk", torch.float32): {"T9 E16 top-4 sigmoid bias groups 2/4 renorm=True"},
    },
}
# BF16/FP16 logits are cast to FP32 (exactly) first: the FP32 samples' mapping
for _soc in (A3, ASCEND950):
    for _dtype in (torch.bfloat16, torch.float16):
        MAPPED[_soc][("moe_gating_topk", _dtype)] = MAPPED[_soc][("moe_gating_topk", torch.float32)]
# moe_permute and moe_unpermute do not depend on the SoC
for _key in (("moe_permute", torch.bfloat16), ("moe_permute", torch.float32), ("moe_unpermute", torch.float32)):
    MAPPED[ASCEND950][_key] = MAPPED[A3][_key]


@pytest.fixture(params=[A3, ASCEND950], ids=["A3", "Ascend950"])
def soc(request, npu_ops, monkeypatch):
    """One SoC rule set for torch_npu's metas and for the adapters' SoC checks; the CPU references installed."""
    quant_routing_refs.register()
    monkeypatch.setitem(npu_wheel.SOC, "version", request.param)
    for module in (npu_quant, npu_routing, npu_fp8_gemm):
        monkeypatch.setattr(module, "soc_version", lambda: npu_wheel.SOC["version"])
    return request.param


def _samples(name, dtype):
    spec = SPECS[name]
    extra = EXTRA.get(name)
    return list(spec.sample_inputs("cpu", dtype)) + (extra("cpu", dtype) if extra else [])


def _cases():
    return [
        pytest.param(name, dtype, id=f"{name}-{str(dtype).split('.')[-1]}")
        for name in ADAPTED
        for dtype in SPECS[name].dtypes
    ]


def _call(name, args):
    """(outputs of the NPU chain, whether it chose the portable kernel)."""
    full = full_call(name, *args)
    kernel = chain.choose(name, "npu", full)
    out = kernel.run(*full)
    return out if isinstance(out, tuple) else (out,), kernel.library == "portable"


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype.itemsize == 1 and t.is_floating_point() else t


@pytest.mark.parametrize(("name", "dtype"), _cases())
def test_values_and_mapping(soc, name, dtype):
    spec = SPECS[name]
    mapped = set()
    for s in _samples(name, dtype):
        outs, fell_back = _call(name, s.args)
        if not fell_back:
            mapped.add(s.name)
        refs = spec.reference(*s.args)
        refs = refs if isinstance(refs, tuple) else (refs,)
        ours = spec.portable(*s.args)
        ours = ours if isinstance(ours, tuple) else (ours,)
        for i, (out, ref, port) in enumerate(zip(outs, refs, ours, strict=True)):
            where = f"{name}[{s.name}, {dtype}] output {i}"
            assert out.shape == ref.shape and out.dtype == port.dtype, where
            assert out.stride() == port.stride() or out.numel() == 0, f"{where}: strides {out.stride()}"
            if out.is_floating_point():
                value = out.float()
                finite = torch.isfinite(ref)
                assert torch.equal(torch.isfinite(value), finite), f"{where}: non-finite entries differ"
                assert calc_diff(value[finite], ref[finite]) < THRESHOLDS[dtype], where
            else:
                assert torch.equal(out, ref.to(out.dtype)), f"{where}: {out.tolist()} != {ref.tolist()}"
            if name in ("quantize_fp8", "moe_permute") or not out.is_floating_point():
                assert torch.equal(_bits(out), _bits(port)), f"{where}: not bitwise the portable kernel's"
    assert mapped == MAPPED[soc].get((name, dtype), set())


@pytest.mark.parametrize(("name", "dtype"), _cases())
def test_meta_matches_our_fake(soc, name, dtype):
    """torch_npu's metas, through the adapter, give our op's output shapes, dtypes and strides."""
    op = getattr(torch.ops.ascend_moe, name).default
    mapped = MAPPED[soc].get((name, dtype), set())
    samples = [s for s in _samples(name, dtype) if s.name in mapped]
    for s in samples:
        with FakeTensorMode() as mode:
            args = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in s.args)
            outs, fell_back = _call(name, args)
            fakes = op(*args)
        fakes = fakes if isinstance(fakes, tuple) else (fakes,)
        assert not fell_back, f"{name}[{s.name}]: the adapter did not reach torch_npu under fake tensors"
        for i, (out, fake) in enumerate(zip(outs, fakes, strict=True)):
            where = f"{name}[{s.name}, {dtype}] output {i}"
            assert (out.shape, out.dtype, out.stride()) == (fake.shape, fake.dtype, fake.stride()), where


@pytest.mark.parametrize("name", ADAPTED)
def test_bad_inputs_raise_our_errors(soc, name):
    for bad in SPECS[name].bad_inputs("cpu"):
        with pytest.raises(bad.error, match=bad.match):
            getattr(npu_chain, name)(*bad.args)


def test_npu_call_fails_like_torch_npu(soc):
    """The metas are the wheel's: a call outside the op's rules fails inside torch_npu's meta, so the adapters'
    calls above passed real checks (here: the MX op's block size must be a multiple of 32)."""
    with FakeTensorMode(), pytest.raises(RuntimeError, match="block_size must be divisible by 32"):
        torch.ops.npu.npu_dynamic_mx_quant(torch.empty(4, 64, dtype=torch.bfloat16), dst_type=292, block_size=48)


def test_mx_scale_conversion_layouts():
    """The MX op's ``[M, ceil(G/2), 2]`` codes (odd G padded) -> our FP32 and packed int32 scales."""
    codes = torch.tensor([[[127, 128], [120, 0]]], dtype=torch.uint8)  # G = 3 real groups, one pad
    fp32 = npu_quant.mx_scales_to_ours(codes, 3, packed=False)
    assert fp32.tolist() == [[1.0, 2.0, 2.0**-7]]
    packed = npu_quant.mx_scales_to_ours(codes, 3, packed=True)
    assert packed.dtype == torch.int32 and packed.view(torch.uint8).tolist() == [[127, 128, 120, 127]]


def test_permute_alignment_shift_is_ours():
    """The dense-to-aligned move on its own: expert segments start at multiples of the alignment."""
    shift, ends = npu_routing._aligned_layout(torch.tensor([3, 0, 5, 1]), 4)
    assert shift.tolist() == [0, 1, 1, 4] and ends.tolist() == [3, 4, 9, 13]
