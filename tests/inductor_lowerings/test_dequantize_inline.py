"""The dequantize_inline rewrite (inductor_lowerings/dequantize_inline.py): ``dequantize`` becomes its reference math
in ATen ops so Inductor fuses it into its consumers. Golden graph; the inlined dequantization equals the op bit for
bit over hypothesis-drawn shapes, blocks, scale formats, output dtypes and special values, static and dynamic;
fused with a consumer within the output dtype's error of fp64 and of the unrewritten compile; near misses (FP4
codes, E8M0 or packed scales, ragged blocks, a dynamic width) left to the op."""

from __future__ import annotations

import pytest
import torch
from expecttest import assert_expected_inline
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.inductor_lowerings.graphs import compiled
from torch_ascend_moe import inductor_lowerings
from torch_ascend_moe.inductor_lowerings import dequantize_inline
from torch_ascend_moe.testing import calc_diff

ops = torch.ops.ascend_moe


@pytest.fixture(autouse=True)
def _on_cpu(monkeypatch):
    """The rewrite runs on CUDA only (on CPU our kernel is as fast: see the module); its values are checked here."""
    monkeypatch.setattr(dequantize_inline, "DEVICES", {"cpu", "cuda"})


def _dequant(data, scale, block=(1, 128), out_dtype=None):
    return ops.dequantize(data, scale, list(block), out_dtype)


def _codes(m, n, block, g, ue8m0=False, special=False):
    x = torch.randn(m, n, generator=g) * torch.rand(m, 1, generator=g) * 300
    if special:
        x[0, 0], x[-1, -1] = float("nan"), float("-inf")
    data, scale = ops.quantize_fp8(x, list(block), ue8m0)  # UE8M0: FP32 powers of two
    if special:
        scale.view(-1)[-1] = float("nan")  # a NaN scale too
    return data, scale


def test_golden_graph():
    data, scale = _codes(4, 256, (1, 128), torch.Generator().manual_seed(0))
    _, graph = compiled(_dequant, data, scale, passes=False)
    assert_expected_inline(graph, """dequantize = dequantize(arg0_1, arg1_1)""")
    _, graph = compiled(_dequant, data, scale, passes=True)
    assert_expected_inline(
        graph,
        """\
convert_element_type_default = prims.convert_element_type(arg0_1, torch.float32)
view_default = aten.view(convert_element_type_default, [4, 1, 2, 128])
unsqueeze_default = aten.unsqueeze(arg1_1, 1)
unsqueeze_default_1 = aten.unsqueeze(unsqueeze_default, 3)
mul_tensor = aten.mul.Tensor(view_default, unsqueeze_default_1)
view_default_1 = aten.view(mul_tensor, [4, 256])""",
    )


@settings(max_examples=10, deadline=None)
@given(
    rows=st.integers(1, 4),
    cols=st.integers(1, 3),
    block=st.sampled_from([(1, 128), (1, 32), (128, 128), (1, 64), (32, 32)]),
    out_dtype=st.sampled_from([None, torch.float32, torch.bfloat16, torch.float16]),
    ue8m0=st.booleans(),
    special=st.booleans(),
    dynamic=st.booleans(),
    transposed_scale=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_inlined_dequantize_is_the_op(rows, cols, block, out_dtype, ue8m0, special, dynamic, transposed_scale, seed):
    m, n = rows * (block[0] if block[0] > 1 else 3), cols * block[1]
    data, scale = _codes(m, n, block, torch.Generator().manual_seed(seed), ue8m0, special)
    if transposed_scale:  # the column-major scale layout DeepGEMM's kernels read
        scale = scale.t().contiguous().t()
    if dynamic and block[0] == 1:  # a dynamic token count, the hidden size static, as in a model
        torch._dynamo.mark_dynamic(data, 0)
        torch._dynamo.mark_dynamic(scale, 0)
    before = inductor_lowerings.MATCHES["dequantize_inline"]
    got, graph = compiled(lambda d, s: _dequant(d, s, block, out_dtype), data, scale, passes=True, dynamic=None)
    assert inductor_lowerings.MATCHES["dequantize_inline"] == before + 1 and "dequantize" not in graph, graph
    want = _dequant(data, scale, block, out_dtype)
    assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
    torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=0, equal_nan=True)


def _dequant_residual_silu(data, scale, residual):
    return torch.nn.functional.silu(_dequant(data, scale, (1, 128), torch.bfloat16) + residual)


def test_fused_into_its_consumer():
    """Dequantize -> add -> SiLU in one kernel: within BF16's error of fp64 and of the unrewritten compile."""
    g = torch.Generator().manual_seed(1)
    data, scale = _codes(64, 512, (1, 128), g)
    residual = torch.randn(64, 512, generator=g).bfloat16()
    got, graph = compiled(_dequant_residual_silu, data, scale, residual, passes=True)
    assert "dequantize" not in graph
    want, _ = compiled(_dequant_residual_silu, data, scale, residual, passes=False)
    exact = torch.nn.functional.silu(data.double() * scale.double().repeat_interleave(128, dim=1) + residual.double())
    assert calc_diff(got, exact) < 1e-4 and calc_diff(want, exact) < 1e-4
    assert calc_diff(got, want) < 1e-4


def test_near_misses_stay_the_op():
    g = torch.Generator().manual_seed(2)
    before = inductor_lowerings.MATCHES["dequantize_inline"]
    ragged, ragged_sf = _codes(8, 300, (1, 128), g)
    got, graph = compiled(_dequant, ragged, ragged_sf, passes=True)
    assert "dequantize" in graph  # a ragged last block
    torch.testing.assert_close(got, _dequant(ragged, ragged_sf), rtol=0, atol=0)
    data, scale = _codes(8, 256, (1, 128), g)
    packed = ops.quantize_fp8(data.float(), [1, 128], True, True)
    _, graph = compiled(_dequant, *packed, passes=True)
    assert "dequantize" in graph  # packed UE8M0 scales
    _, graph = compiled(_dequant, data, scale.to(torch.float8_e8m0fnu), passes=True)
    assert "dequantize" in graph  # E8M0 scales: Inductor has no code for the dtype
    fp4, fp4_sf = ops.quantize_fp4(torch.randn(8, 256, generator=g), [1, 32])
    _, graph = compiled(lambda d, s: _dequant(d, s, (1, 32)), fp4, fp4_sf, passes=True)
    assert "dequantize" in graph  # packed FP4 codes
    _, graph = compiled(_dequant, data, scale, passes=True, dynamic=True)
    assert "dequantize" in graph  # a dynamic hidden size: whole blocks cannot be proven
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dequantize_inline, "DEVICES", {"cuda"})
        _, graph = compiled(_dequant, data, scale, passes=True)
    assert "dequantize" in graph  # CPU, as shipped
    assert inductor_lowerings.MATCHES["dequantize_inline"] == before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (tools/device_check.sh runs the cuda tests)")
def test_inlined_dequantize_on_cuda(monkeypatch):
    """Where the rewrite ships: bit for bit the op alone, and fused into a consumer within BF16's error."""
    monkeypatch.setattr(dequantize_inline, "DEVICES", {"cuda"})
    g = torch.Generator().manual_seed(3)
    data, scale = (t.cuda() for t in _codes(256, 1024, (1, 128), g, special=True))
    got, graph = compiled(lambda d, s: _dequant(d, s, (1, 128), torch.bfloat16), data, scale, passes=True)
    assert "dequantize" not in graph, graph
    torch.testing.assert_close(got, _dequant(data, scale, (1, 128), torch.bfloat16), rtol=0, atol=0, equal_nan=True)
    finite, finite_sf = (t.cuda() for t in _codes(256, 1024, (1, 128), g))
    residual = torch.randn(256, 1024, generator=g).bfloat16().cuda()
    fused, graph = compiled(_dequant_residual_silu, finite, finite_sf, residual, passes=True)
    assert "dequantize" not in graph, graph
    assert calc_diff(fused, _dequant_residual_silu(finite, finite_sf, residual)) < 1e-4
