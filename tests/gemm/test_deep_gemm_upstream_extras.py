"""Upstream entry points and attributes the compat layer lacked (issue 14, point 9):
``fp8_gemm_nt_skip_head_mid``, ``cublaslt_gemm_*`` on FP8 operands, ``SymmBuffer``'s views."""

import pytest
import torch

import torch_ascend_moe.deep_gemm as deep_gemm
from torch_ascend_moe.testing import calc_diff


def _apply_skip_head_mid(d, head_splits):
    """Upstream's test helper (tests/test_attention.py): zero-filled mid columns inserted per head."""
    left, mid, right = head_splits
    m, n = d.shape
    d = d.view(m, n // (left + right), -1)
    zeros = torch.zeros(m, d.shape[1], mid, dtype=d.dtype)
    return torch.cat([d[:, :, :left], zeros, d[:, :, left:]], dim=2).view(m, -1)


@pytest.mark.parametrize("use_ue8m0", [False, True])
def test_fp8_gemm_nt_skip_head_mid(use_ue8m0):
    g = torch.Generator().manual_seed(0)
    head_splits, m, n, k = (32, 16, 32), 24, 128, 256
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    a = deep_gemm.per_token_cast_to_fp8(x, use_ue8m0=use_ue8m0)
    b = deep_gemm.per_block_cast_to_fp8(w, use_ue8m0=use_ue8m0)
    plain = torch.empty(m, n, dtype=torch.bfloat16)
    deep_gemm.fp8_gemm_nt(a, b, plain)
    d = torch.full((m, n + n // 64 * 16), 3.0, dtype=torch.bfloat16)
    deep_gemm.fp8_gemm_nt_skip_head_mid(a, b, d, head_splits, disable_ue8m0_cast=not use_ue8m0)
    mid = d.view(m, n // 64, 80)[:, :, 32:48]
    assert (mid == 3).all()  # not written
    mid.zero_()
    assert torch.equal(d, _apply_skip_head_mid(plain, head_splits))
    assert calc_diff(d, _apply_skip_head_mid((x @ w.T).bfloat16(), head_splits)) < 1e-3


def test_fp8_gemm_nt_skip_head_mid_rejects_bad_splits():
    a = deep_gemm.per_token_cast_to_fp8(torch.randn(4, 128), use_ue8m0=False)
    b = deep_gemm.per_block_cast_to_fp8(torch.randn(96, 128), use_ue8m0=False)
    with pytest.raises(ValueError, match="head_splits"):
        deep_gemm.fp8_gemm_nt_skip_head_mid(a, b, torch.empty(4, 96, dtype=torch.bfloat16), (64, 0, 64))
    with pytest.raises(ValueError, match="argument 'd'"):
        deep_gemm.fp8_gemm_nt_skip_head_mid(a, b, torch.empty(4, 96, dtype=torch.bfloat16), (32, 16, 16))


@pytest.mark.parametrize("layout", ["nt", "nn", "tn", "tt"])
@pytest.mark.parametrize("with_c", [False, True])
def test_cublaslt_gemm_takes_fp8_operands(layout, with_c):
    # Upstream's FP8 tests call cuBLASLt on the raw FP8 data: an unscaled FP8 product, FP32 accumulation.
    g = torch.Generator().manual_seed(1)
    m, n, k = 16, 24, 160
    a = torch.randn(m, k, generator=g).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, generator=g).to(torch.float8_e4m3fn)
    ref = a.double() @ b.double().T
    c = torch.randn(m, n, generator=g) if with_c else None
    if with_c:
        ref = ref + c.double()
    d = torch.empty(m, n, dtype=torch.float32)
    args = {"nt": (a, b), "nn": (a, b.T), "tn": (a.T, b.T), "tt": (a.T, b)}[layout]
    getattr(deep_gemm, f"cublaslt_gemm_{layout}")(*args, d, c)
    torch.testing.assert_close(d.double(), ref, rtol=1e-6, atol=1e-4)


def test_symm_buffer_has_upstreams_views():
    t, h, inter, topk = 8, 256, 128, 2
    buf = deep_gemm.get_symm_buffer_for_mega_moe(None, 4, t, topk, h, inter)
    t = buf.num_max_tokens_per_rank
    assert buf.buffer.dtype == torch.int8 and buf.handle.buffer_ptrs == [buf.buffer.data_ptr()]
    assert buf.x.shape == (t, h) and buf.x.dtype == torch.float8_e4m3fn
    assert buf.x_sf.shape == (t, h // 128) and buf.x_sf.dtype == torch.int32
    assert buf.topk_idx.dtype == torch.int64 and buf.topk_weights.dtype == torch.float32
    rows = buf.l1_acts.shape[0]
    assert buf.l1_acts.shape == (rows, h) and buf.l2_acts.shape == (rows, inter)
    sf_rows = buf.l1_acts_sf.shape[0]
    assert sf_rows % 4 == 0 and sf_rows >= rows
    # Upstream: x_sf K-major, the activation pools' scales M-major.
    assert buf.l1_acts_sf.stride() == (1, sf_rows) and buf.l2_acts_sf.shape == (sf_rows, inter // 128)
    base, end = buf.buffer.data_ptr(), buf.buffer.data_ptr() + buf.buffer.numel()
    for name in ("x", "x_sf", "topk_idx", "topk_weights", "l1_acts", "l1_acts_sf", "l2_acts", "l2_acts_sf"):
        view = getattr(buf, name)
        assert base <= view.data_ptr() < end, name  # all carved out of the one buffer
    assert (buf.topk_idx == -1).all()
    bf16 = deep_gemm.SymmBuffer(None, 4, 8, topk, h, inter, mma_type="bf16xbf16")
    assert bf16.x.dtype == torch.bfloat16 and bf16.x_sf is None and bf16.l1_acts_sf is None
    buf.destroy()
    assert buf.buffer is None and buf.handle is None and buf.x is None
