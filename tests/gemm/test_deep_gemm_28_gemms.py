"""DeepGEMM 2.8's ``batched_syrk`` / ``batched_symm`` (the Muon optimizer's Gram products) and
``cublaslt_nvfp4_gemm_nt`` (the NVFP4 cuBLASLt baseline) on our compat package (specs/upstream_2609.md §6): upstream's
reference ``(a.float() @ a.float().mT).to(dtype)`` within its ``calc_diff < 6e-7``, both majors, batched and not,
padded strides; NVFP4 exact against fp64 on scales laid out as upstream's ``to_cublaslt_vec16_sf_layout``."""

from __future__ import annotations

import pytest
import torch

import torch_ascend_moe.deep_gemm as deep_gemm
from torch_ascend_moe import quant
from torch_ascend_moe.testing import calc_diff


def _strided(x: torch.Tensor, k_major: bool) -> torch.Tensor:
    """``x`` with padded strides, K-major or MN-major."""
    if k_major:
        return torch.nn.functional.pad(x, (0, 8))[..., : x.shape[-1]]
    return torch.nn.functional.pad(x.mT.contiguous(), (0, 8))[..., : x.shape[-2]].mT


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("k_major", [True, False])
def test_syrk_and_symm_match_upstreams_reference(dtype, batched, k_major):
    g = torch.Generator().manual_seed(3)
    lead = (3,) if batched else ()
    a = _strided(torch.randn(*lead, 48, 80, generator=g).to(dtype), k_major)
    d = torch.empty(*lead, 48, 48, dtype=dtype)
    deep_gemm.batched_syrk(a, d)
    ref = (a.float() @ a.float().mT).to(dtype)
    assert calc_diff(d, ref) < 6e-7
    sym = ref.float()
    sym = ((sym + sym.mT) / 2).to(dtype)
    b = _strided(torch.randn(*lead, 48, 24, generator=g).to(dtype), k_major)
    d2 = torch.empty(*lead, 48, 24, dtype=dtype)
    deep_gemm.batched_symm(sym, b, d2)
    assert calc_diff(d2, (sym.float() @ b.float()).to(dtype)) < 6e-7


def test_syrk_refusals():
    a = torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"batched_syrk: argument 'd' dtype: expected torch.float32 \(a's\)"):
        deep_gemm.batched_syrk(a, torch.empty(4, 4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"batched_syrk: argument 'd' shape: expected \[4, 4\], got \[4, 8\]"):
        deep_gemm.batched_syrk(a, torch.empty(4, 8))
    with pytest.raises(ValueError, match=r"batched_syrk: argument 'a' dtype: expected torch.bfloat16 or torch.float32"):
        deep_gemm.batched_syrk(a.half(), torch.empty(4, 4, dtype=torch.half))


def _cublaslt_sf(scales: torch.Tensor) -> torch.Tensor:
    """Upstream's ``to_cublaslt_vec16_sf_layout``: ``[MN, K/16]`` UE4M3 bytes padded to tiles, row ``32a + b`` of a
    128-row tile to ``[b][a]``."""
    mn, kb = scales.shape
    mt, kt = -(-mn // 128), -(-kb // 4)
    padded = torch.zeros(mt * 128, kt * 4, dtype=torch.uint8)
    padded[:mn, :kb] = scales
    return padded.view(mt, 4, 32, kt, 4).permute(0, 3, 2, 1, 4).contiguous()


def test_nvfp4_gemm_exact_on_the_quantized_values():
    g = torch.Generator().manual_seed(4)
    m, n, k = 150, 72, 320
    ops = []
    for rows in (m, n):
        data, _ = quant.per_token_cast_to_fp4(torch.randn(rows, k, generator=g), True, gran_k=32)
        # Random positive UE4M3 scales per 16 (normal and subnormal codes), not only powers of two.
        codes = torch.randint(1, 0x7F, (rows, k // 16), generator=g, dtype=torch.uint8)
        values = quant.decode_e2m1(quant.unpack_e2m1(data)).double()
        values = values * codes.view(torch.float8_e4m3fn).double().repeat_interleave(16, dim=1)
        ops.append(((data, _cublaslt_sf(codes)), values))
    (a, av), (b, bv) = ops
    d = torch.empty(m, n)
    deep_gemm.cublaslt_nvfp4_gemm_nt(a, b, d)
    ref = av @ bv.T
    assert calc_diff(d, ref) < 1e-12
    c = torch.randn(m, n, generator=g)
    deep_gemm.cublaslt_nvfp4_gemm_nt(a, b, d, c)
    assert calc_diff(d, ref + c.double()) < 1e-12
    with pytest.raises(ValueError, match=r"argument 'sfa' value: expected 5120 UE4M3 bytes"):
        deep_gemm.cublaslt_nvfp4_gemm_nt((a[0], a[1][:1]), b, d)
