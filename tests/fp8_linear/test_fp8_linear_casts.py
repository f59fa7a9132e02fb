"""The fp8_linear ops' C++ casts are bit-identical to the reference quantizer (quant.block_cast_to_fp8).

An identity matrix as the other operand (FP8, scale 1) makes the GEMM return the dequantized cast
itself; with UE8M0 scales every product is exact, so the comparison is bitwise.
"""

import pytest
import torch

from torch_ascend_moe import fp8_linear, fp8_quant_gemm
from torch_ascend_moe.quant import block_cast_to_fp8
from torch_ascend_moe.quant.reference import dequantized


def _values(m: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(m * k)
    x = torch.randn(m, k, generator=g) * torch.logspace(-4, 4, k)  # magnitudes across the E4M3 range
    x[0] *= 1e-7  # a row under the 1e-4 amax floor
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,k,gran_k", [(37, 256, 128), (5, 96, 32), (130, 384, 128)])
@pytest.mark.parametrize("use_ue8m0", [True, False])
def test_activation_cast_matches_reference(dtype, m, k, gran_k, use_ue8m0):
    x = _values(m, k, dtype)
    eye = torch.eye(k).to(torch.float8_e4m3fn)
    out = fp8_quant_gemm(
        x,
        eye,
        torch.ones(k, k // gran_k),
        gran_k=gran_k,
        recipe_b=[1, gran_k],
        use_ue8m0=use_ue8m0,
        out_dtype=torch.float32,
    )
    q, sf = block_cast_to_fp8(x, (1, gran_k), use_ue8m0)
    assert torch.equal(out, dequantized(q, sf, (1, gran_k)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,k,block", [(130, 256, 128), (40, 96, 32)])
def test_weight_block_cast_matches_reference(dtype, n, k, block):
    w = _values(n, k, dtype)
    eye = torch.eye(k, dtype=dtype)  # each row casts to exactly 1.0 with a power-of-two scale
    out = fp8_linear(eye, w, block=block, use_ue8m0=True)
    q, sf = block_cast_to_fp8(w, (block, block), True)
    assert torch.equal(out, dequantized(q, sf, (block, block)).T.to(dtype))
