"""The scaled_mm rewrite (inductor_lowerings/scaled_mm.py): ``torch._scaled_mm`` / ``torch._scaled_grouped_mm`` become
``fp8_gemm`` / ``m_grouped_fp8_gemm`` where the device's ATen kernel refuses them. On this CPU: the blockwise recipes and
the grouped form (which fail when the unrewritten graph runs) are rewritten, tensorwise and rowwise run ATen's kernel;
those two, and a bias, are checked through the rewrite with the CPU standing in for a device that lacks them
(``NATIVE`` patched). Values vs an fp64 dequantized product and vs ATen's own kernel where it runs."""

from __future__ import annotations

import pytest
import torch
from expecttest import assert_expected_inline

from tests.inductor_lowerings.graphs import compiled
from torch_ascend_moe import inductor_lowerings
from torch_ascend_moe.inductor_lowerings import scaled_mm
from torch_ascend_moe.testing import calc_diff
from torch_ascend_moe.testing.harness import THRESHOLDS

M, K, N = 64, 256, 192
FP8 = torch.float8_e4m3fn


def _operands(seed=0, m=M, k=K, n=N):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g).to(FP8)
    b = torch.randn(n, k, generator=g).to(FP8).t()  # [K, N] column-major, as _scaled_mm takes it
    return a, b, g


def _expand(scale, rows, cols, block):
    """A per-block scale tensor (one per ``block = (r, c)`` elements) repeated to the element grid it scales."""
    r, c = block
    return (
        scale.double()
        .reshape(-(-rows // r), -(-cols // c))
        .repeat_interleave(r, 0)[:rows]
        .repeat_interleave(c, 1)[:, :cols]
    )


def _reference(a, b, sa, sb, block_a, block_b, bias=None):
    """fp64 ``(a * scale_a) @ (b * scale_b)`` with ``scale_a`` per ``block_a`` of ``a [M, K]`` and ``scale_b`` per
    ``block_b`` of ``b [K, N]``."""
    (m, k), n = a.shape, b.shape[1]
    out = (a.double() * _expand(sa, m, k, block_a)) @ (b.double() * _expand(sb, k, n, block_b))
    return out if bias is None else out + bias.double()


def _scaled(a, b, sa, sb):
    return torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)


def _scaled_bias(a, b, sa, sb, bias):
    return torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.bfloat16)


# name -> (scale_a shape, scale_b shape) for M, K, N above, (scale_a's block of a [M, K], scale_b's block of b [K, N])
_BLOCKWISE = {
    "1x128 x 128x128": (((M, K // 128), (K // 128, -(-N // 128))), ((1, 128), (128, 128))),
    "1x128 x 1x128": (((M, K // 128), (K // 128, N)), ((1, 128), (128, 1))),
    "128x128 x 1x128": (((-(-M // 128), K // 128), (K // 128, N)), ((128, 128), (128, 1))),
}


def test_golden_graph():
    a, b, g = _operands()
    sa, sb = (torch.rand(*shape, generator=g) for shape in _BLOCKWISE["1x128 x 128x128"][0])
    _, after = compiled(_scaled, a, b, sa, sb, passes=True)
    assert_expected_inline(
        after,
        """\
permute_default = aten.permute(arg1_1, [1, 0])
permute_default_1 = aten.permute(arg3_1, [1, 0])
fp8_gemm_default = fp8_gemm(arg0_1, arg2_1, permute_default, permute_default_1, None, [1, 128], [128, 128], 1.0, torch.bfloat16)""",
    )


@pytest.mark.parametrize("recipe", list(_BLOCKWISE), ids=str)
def test_blockwise_recipes_run_on_cpu_through_fp8_gemm(recipe):
    a, b, g = _operands(1)
    shapes, blocks = _BLOCKWISE[recipe]
    sa, sb = (torch.rand(*shape, generator=g) + 0.5 for shape in shapes)
    with pytest.raises(Exception, match="Invalid scaling configuration"):  # what runs without the rewrite
        compiled(_scaled, a, b, sa, sb, passes=False)
    before = inductor_lowerings.MATCHES["scaled_mm"]
    got, graph = compiled(_scaled, a, b, sa, sb, passes=True)
    assert inductor_lowerings.MATCHES["scaled_mm"] == before + 1 and "_scaled_mm" not in graph, graph
    assert (
        got.dtype == torch.bfloat16 and calc_diff(got, _reference(a, b, sa, sb, *blocks)) < THRESHOLDS[torch.bfloat16]
    )


@pytest.mark.parametrize("form", ["tensorwise", "rowwise", "rowwise + bias"])
def test_tensorwise_and_rowwise_where_the_device_lacks_them(form, monkeypatch):
    a, b, g = _operands(2)
    if form == "tensorwise":
        sa, sb, blocks = torch.tensor(0.75), torch.tensor(1.5), ((M, K), (K, N))
    else:
        sa, sb, blocks = torch.rand(M, 1, generator=g) + 0.5, torch.rand(1, N, generator=g) + 0.5, ((1, K), (K, 1))
    bias = torch.randn(N, generator=g).bfloat16() if "bias" in form else None
    fn, args = (_scaled_bias, (a, b, sa, sb, bias)) if bias is not None else (_scaled, (a, b, sa, sb))
    native, graph = compiled(fn, *args, passes=True)  # the CPU runs these itself: left alone
    assert "_scaled_mm" in graph, graph
    monkeypatch.setitem(scaled_mm.NATIVE, "cpu", set())  # a device without them (Ascend)
    got, graph = compiled(fn, *args, passes=True)
    assert "fp8_gemm" in graph and "_scaled_mm" not in graph, graph
    assert calc_diff(got, _reference(a, b, sa, sb, *blocks, bias)) < THRESHOLDS[torch.bfloat16]
    assert calc_diff(got, native) < THRESHOLDS[torch.bfloat16]


def _grouped(a, b, sa, sb, offs):
    return torch._scaled_grouped_mm(a, b, sa, sb, offs, out_dtype=torch.bfloat16)


def test_grouped_rowwise_runs_on_cpu_through_m_grouped_fp8_gemm():
    g = torch.Generator().manual_seed(3)
    groups, offs = 3, torch.tensor([10, 10, 64], dtype=torch.int32)
    a = torch.randn(M, K, generator=g).to(FP8)
    b = torch.randn(groups, N, K, generator=g).to(FP8).transpose(1, 2)  # [G, K, N] column-major per group
    sa, sb = torch.rand(M, generator=g) + 0.5, torch.rand(groups, N, generator=g) + 0.5
    before = inductor_lowerings.MATCHES["scaled_mm"]
    got, graph = compiled(_grouped, a, b, sa, sb, offs, passes=True)
    assert inductor_lowerings.MATCHES["scaled_mm"] == before + 1 and "m_grouped_fp8_gemm" in graph, graph
    ref, begin = torch.zeros(M, N, dtype=torch.float64), 0
    for e, end in enumerate(offs.tolist()):
        ref[begin:end] = _reference(a[begin:end], b[e], sa[begin:end], sb[e], (1, K), (K, 1))
        begin = end
    assert calc_diff(got, ref) < THRESHOLDS[torch.bfloat16]


def _fp8_out(a, b, sa, sb):
    return torch._scaled_mm(a, b, sa, sb, out_dtype=FP8).float()


def _mx_like(a, b, sa, sb):
    return torch._scaled_mm(a, b, sa[:, :1].expand(M, K // 32).contiguous(), sb, out_dtype=torch.bfloat16)


@pytest.mark.parametrize("fn", [_fp8_out, _mx_like], ids=lambda f: f.__name__)
def test_near_misses_are_left_alone(fn, monkeypatch):
    """An FP8 output and 1x32 scales (not a recipe our ops share): left to ATen, whatever it does with them."""
    monkeypatch.setitem(scaled_mm.NATIVE, "cpu", set())
    a, b, g = _operands(4)
    sa, sb = torch.rand(M, 1, generator=g) + 0.5, torch.rand(1, N, generator=g) + 0.5
    before = inductor_lowerings.MATCHES["scaled_mm"]
    try:
        _, graph = compiled(fn, a, b, sa, sb, passes=True)
        assert "_scaled_mm" in graph, graph
    except Exception as e:  # ATen's CPU kernel refusing the call is fine: it was not rewritten
        assert "scal" in str(e).lower(), e
    assert inductor_lowerings.MATCHES["scaled_mm"] == before


# ---- torch.nn.functional.scaled_mm (aten._scaled_mm_v2) ----

_S = torch.nn.functional.ScalingType
_KB = K // 128
_L4 = -(-_KB // 4) * 4


def _v2_scales(recipe, m, n, g):
    """(scale_a, recipe_a, scale_b, recipe_b, scale_a's block of a, scale_b's block of b [K, N], scale_a and scale_b
    as the fp64 reference reads them) in the layouts torch's meta function asks for: blockwise scales K-block-major,
    128x128 ones padded to L4 = K/128 rounded up to 4 rows."""
    if recipe == "tensorwise":
        sa, sb = torch.tensor(0.75), torch.tensor(1.5)
        return sa, _S.TensorWise, sb, _S.TensorWise, (m, K), (K, n), sa, sb
    if recipe == "rowwise":
        sa, sb = torch.rand(m, 1, generator=g) + 0.5, torch.rand(1, n, generator=g) + 0.5
        return sa, _S.RowWise, sb, _S.RowWise, (1, K), (K, 1), sa, sb
    if recipe == "1x128 x 128x128":
        sa = torch.rand(_KB, m, generator=g).t() + 0.5  # [M, K/128], stride [1, M]
        sb = torch.rand(n // 128, _L4, generator=g).t() + 0.5  # [L4, N/128], stride [1, L4]
        return sa, _S.BlockWise1x128, sb, _S.BlockWise128x128, (1, 128), (128, 128), sa, sb[:_KB]
    if recipe == "1x128 x 1x128":
        sa = torch.rand(_KB, m, generator=g).t() + 0.5
        sb = torch.rand(_KB, n, generator=g).t() + 0.5  # [N, K/128], stride [1, N]
        return sa, _S.BlockWise1x128, sb, _S.BlockWise1x128, (1, 128), (128, 1), sa, sb.t()
    sa = torch.rand(m // 128, _L4, generator=g).t() + 0.5  # 128x128 x 1x128: [L4, M/128]
    sb = torch.rand(_KB, n, generator=g).t() + 0.5
    return sa, _S.BlockWise128x128, sb, _S.BlockWise1x128, (128, 128), (128, 1), sa[:_KB].t(), sb.t()


# The 128x128 operand's outer size is a multiple of 128 (torch's meta divides it by 128, rounding down).
_V2_SIZES = {"1x128 x 128x128": (M, 256), "128x128 x 1x128": (128, N)}


@pytest.mark.parametrize(
    "recipe", ["tensorwise", "rowwise", "1x128 x 128x128", "1x128 x 1x128", "128x128 x 1x128"], ids=str
)
@pytest.mark.parametrize("bias", [False, True], ids=["", "bias"])
def test_scaled_mm_v2(recipe, bias, monkeypatch):
    """F.scaled_mm's blockwise recipes fail on CPU unrewritten and run through fp8_gemm rewritten; tensorwise and
    rowwise run ATen's kernel here and are rewritten for a device without them; values vs fp64."""
    m, n = _V2_SIZES.get(recipe, (M, N))
    a, b, g = _operands(5, m=m, n=n)
    sa, ra, sb, rb, block_a, block_b, ref_sa, ref_sb = _v2_scales(recipe, m, n, g)
    c = torch.randn(n, generator=g).bfloat16() if bias else None

    def fn(a, b, sa, sb, *c):
        return torch.nn.functional.scaled_mm(a, b, sa, ra, sb, rb, bias=c[0] if c else None)

    args = (a, b, sa, sb, *([c] if bias else []))
    if recipe in ("tensorwise", "rowwise"):
        _, graph = compiled(fn, *args, passes=True)
        assert "_scaled_mm_v2" in graph, graph  # the CPU runs these itself: left alone
        monkeypatch.setitem(scaled_mm.NATIVE, "cpu", set())  # a device without them (Ascend)
    else:
        with pytest.raises(Exception, match="Invalid scaling configuration"):  # what runs without the rewrite
            compiled(fn, *args, passes=False)
    before = inductor_lowerings.MATCHES["scaled_mm"]
    got, graph = compiled(fn, *args, passes=True)
    assert inductor_lowerings.MATCHES["scaled_mm"] == before + 1, graph
    assert "fp8_gemm" in graph and "_scaled_mm_v2" not in graph, graph
    ref = _reference(a, b, ref_sa, ref_sb, block_a, block_b, c)
    assert got.dtype == torch.bfloat16 and calc_diff(got, ref) < THRESHOLDS[torch.bfloat16]


def test_scaled_mm_v2_near_misses_are_left_alone(monkeypatch):
    """Swizzled scales and MX (1x32, E8M0) scales: not recipes our ops share, left to ATen."""
    monkeypatch.setitem(scaled_mm.NATIVE, "cpu", set())
    a, b, g = _operands(6)
    sa, sb = torch.rand(M, 1, generator=g) + 0.5, torch.rand(1, N, generator=g) + 0.5
    swizzled = torch.nn.functional.SwizzleType.SWIZZLE_32_4_4

    def fn(a, b, sa, sb):
        return torch.nn.functional.scaled_mm(a, b, sa, _S.RowWise, sb, _S.RowWise, swizzle_a=swizzled)

    before = inductor_lowerings.MATCHES["scaled_mm"]
    try:
        _, graph = compiled(fn, a, b, sa, sb, passes=True)
        assert "_scaled_mm_v2" in graph, graph
    except Exception as e:  # ATen refusing the call is fine: it was not rewritten
        assert "swizzle" in str(e).lower() or "scal" in str(e).lower(), e
    assert inductor_lowerings.MATCHES["scaled_mm"] == before


def _grouped_operands(seed=7):
    g = torch.Generator().manual_seed(seed)
    groups, offs = 3, torch.tensor([10, 10, 64], dtype=torch.int32)
    a = torch.randn(M, K, generator=g).to(FP8)
    b = torch.randn(groups, N, K, generator=g).to(FP8).transpose(1, 2)  # [G, K, N] column-major per group
    sa, sb = torch.rand(M, generator=g) + 0.5, torch.rand(groups, N, generator=g) + 0.5
    return a, b, sa, sb, offs


def _grouped_v2(a, b, sa, sb, offs):
    return torch.nn.functional.scaled_grouped_mm(a, b, sa, _S.RowWise, sb, _S.RowWise, offs=offs)


def test_scaled_grouped_mm_v2_rowwise_runs_on_cpu_through_m_grouped_fp8_gemm():
    """F.scaled_grouped_mm (aten._scaled_grouped_mm_v2: no Meta and no CPU kernel in torch 2.13): enable() gives it a
    Meta kernel, so Dynamo traces it, and the rewrite runs it as m_grouped_fp8_gemm; the same values as the first
    grouped form's rewrite (bit for bit) and within BF16's threshold of fp64."""
    a, b, sa, sb, offs = _grouped_operands()
    before = inductor_lowerings.MATCHES["scaled_mm"]
    got, graph = compiled(_grouped_v2, a, b, sa, sb, offs, passes=True)
    assert inductor_lowerings.MATCHES["scaled_mm"] == before + 1, graph
    assert_expected_inline(
        graph,
        """\
unsqueeze_default = aten.unsqueeze(arg0_1, 1)
permute_default = aten.permute(arg3_1, [0, 2, 1])
unsqueeze_default_1 = aten.unsqueeze(arg1_1, 2)
m_grouped_fp8_gemm_default = m_grouped_fp8_gemm(arg2_1, unsqueeze_default, permute_default, unsqueeze_default_1, arg4_1, True, 1, [1, 256], [1, 256], torch.bfloat16)""",
    )
    first_form, _ = compiled(_grouped, a, b, sa, sb, offs, passes=True)
    assert torch.equal(got, first_form)
    ref, begin = torch.zeros(M, N, dtype=torch.float64), 0
    for e, end in enumerate(offs.tolist()):
        ref[begin:end] = _reference(a[begin:end], b[e], sa[begin:end], sb[e], (1, K), (K, 1))
        begin = end
    assert got.dtype == torch.bfloat16 and calc_diff(got, ref) < THRESHOLDS[torch.bfloat16]


def test_scaled_grouped_mm_v2_meta_kernel():
    """The registered Meta kernel's shapes (torch's helper for the grouped GEMMs): 2-D x 3-D -> [M, N], 3-D x 3-D ->
    [G, M, N], 2-D x 2-D (the K-grouped weight gradient) -> [G, M, N]; registered once, only where torch has none."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    inductor_lowerings.enable()
    inductor_lowerings.disable()
    name = "aten::_scaled_grouped_mm_v2"
    assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "Meta")
    a, b, sa, sb, offs = _grouped_operands()
    with FakeTensorMode() as mode:
        fa, fb, fsa, fsb, fo = (mode.from_tensor(x) for x in (a, b, sa, sb, offs))
        assert _grouped_v2(fa, fb, fsa, fsb, fo).shape == (M, N)
        batched = torch.ops.aten._scaled_grouped_mm_v2(fb.transpose(1, 2), fb, [fsb], [1], [], [fsb], [1], [], None)
        assert batched.shape == (3, N, N) and batched.dtype == torch.bfloat16
        k_grouped = torch.ops.aten._scaled_grouped_mm_v2(fa.t(), fa, [fsa], [1], [], [fsa], [1], [], fo)
        assert k_grouped.shape == (3, K, K)


@pytest.mark.parametrize("near_miss", ["tensorwise", "swizzled", "contraction_dim"])
def test_scaled_grouped_mm_v2_near_misses_are_left_alone(near_miss):
    """Recipes, swizzles and contractions our grouped op does not share stay ATen's call (which has no CPU kernel: the
    compiled graph fails when it runs, as it does without the passes)."""
    a, b, sa, sb, offs = _grouped_operands(8)
    kwargs = {"tensorwise": {}, "swizzled": {"swizzle_a": torch.nn.functional.SwizzleType.SWIZZLE_32_4_4}}.get(
        near_miss, {"contraction_dim": (1, 1)}
    )
    recipe = _S.TensorWise if near_miss == "tensorwise" else _S.RowWise
    scales = (sa[:1], sb[:1, :1].reshape(1)) if near_miss == "tensorwise" else (sa, sb)

    def fn(a, b, sa, sb, offs):
        return torch.nn.functional.scaled_grouped_mm(a, b, sa, recipe, sb, recipe, offs=offs, **kwargs)

    before = inductor_lowerings.MATCHES["scaled_mm"]
    with pytest.raises(Exception, match="_scaled_grouped_mm_v2"):
        compiled(fn, a, b, *scales, offs, passes=True)
    assert inductor_lowerings.MATCHES["scaled_mm"] == before
