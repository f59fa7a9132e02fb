"""fp8_gemm numerics: every FP8/FP4 code through both CPU paths, and DeepGEMM's thresholds on a grid."""

import pytest
import torch

from tests.fp8_gemm.specs import _FORMATS, quantize
from torch_ascend_moe import fp8_gemm, quant
from torch_ascend_moe.quant.reference import dequantized
from torch_ascend_moe.testing import calc_diff

# calc_diff against the unquantized product (DeepGEMM's thresholds) per format index of _FORMATS.
_THRESHOLDS = [1e-3, 1e-3, 1e-2, 2e-2]
_E4M3_CODES = torch.arange(256).to(torch.uint8)  # 0x7F and 0xFF are NaN


def _decode_via_gemm(codes: torch.Tensor, as_b: bool, fp4: bool) -> torch.Tensor:
    """Each code times 1.0 through fp8_gemm: as A (panel path) or as B with one row of A (streaming path)."""
    n = codes.numel()
    if fp4:
        data = quant.pack_e2m1(torch.stack([codes, torch.zeros_like(codes)], dim=1))  # [n, 1]: code, then 0
        one = quant.pack_e2m1(torch.tensor([[2, 0]], dtype=torch.uint8))  # 1.0, 0
    else:
        data = torch.stack([codes, torch.zeros_like(codes)], dim=1).view(torch.float8_e4m3fn)
        one = torch.tensor([[1.0, 0.0]]).to(torch.float8_e4m3fn)
    sf_n, sf_1 = torch.ones(n, 1), torch.ones(1, 1)
    recipe = [1, 2]
    if as_b:
        return fp8_gemm(one, sf_1, data, sf_n, recipe_a=recipe, recipe_b=recipe, out_dtype=torch.float32)[0]
    return fp8_gemm(data, sf_n, one, sf_1, recipe_a=recipe, recipe_b=recipe, out_dtype=torch.float32)[:, 0]


@pytest.mark.parametrize("as_b", [False, True], ids=["panel", "streaming"])
def test_every_e4m3_code(as_b):
    expected = _E4M3_CODES.view(torch.float8_e4m3fn).float()
    torch.testing.assert_close(_decode_via_gemm(_E4M3_CODES, as_b, fp4=False), expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("as_b", [False, True], ids=["panel", "streaming"])
def test_every_e2m1_code(as_b):
    codes = torch.arange(16, dtype=torch.uint8)
    assert torch.equal(_decode_via_gemm(codes, as_b, fp4=True), quant.decode_e2m1(codes))


@pytest.mark.parametrize("fmt", range(len(_FORMATS)), ids=[f[0] for f in _FORMATS])
@pytest.mark.parametrize("m", [1, 8, 9, 128])
@pytest.mark.parametrize("n,k", [(576, 512), (129, 1024), (264, 384)])
def test_grid(fmt, m, n, k):
    g = torch.Generator().manual_seed(m + n + k + fmt)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    _, fa, fb = _FORMATS[fmt]
    a, sfa, ra = quantize(x, fa)
    b, sfb, rb = quantize(w, fb)
    out = fp8_gemm(a, sfa, b, sfb, recipe_a=ra, recipe_b=rb)
    assert out.dtype == torch.bfloat16
    assert calc_diff(out, x.double() @ w.double().T) < _THRESHOLDS[fmt]
    exact = fp8_gemm(a, sfa, b, sfb, recipe_a=ra, recipe_b=rb, out_dtype=torch.float32)
    ref = dequantized(a, sfa, ra).double() @ dequantized(b, sfb, rb).double().T
    assert calc_diff(exact, ref) < 1e-6  # design §5: already-quantized inputs


def test_alpha_accumulate_and_mn_major_b():
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(4, 256, generator=g), torch.randn(40, 256, generator=g)
    a, sfa = quant.per_token_cast_to_fp8(x, True)
    b, sfb = quant.per_block_cast_to_fp8(w, True)
    b_mn = b.t().contiguous().t()  # MN-major B takes the panel path even for few rows
    c = torch.randn(4, 40, generator=g)
    ref = 0.5 * (dequantized(a, sfa, (1, 128)).double() @ dequantized(b, sfb, (128, 128)).double().T) + c.double()
    for weight in (b, b_mn):
        out = fp8_gemm(a, sfa, weight, sfb, c, alpha=0.5)
        assert out.dtype == torch.float32 and calc_diff(out, ref) < 1e-12
