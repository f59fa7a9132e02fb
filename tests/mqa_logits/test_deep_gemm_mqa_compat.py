"""deep_gemm's MQA-logits API: upstream's and DeepGEMM-Ascend's argument forms on the same ops."""

from __future__ import annotations

import pytest
import torch

import torch_ascend_moe.deep_gemm as deep_gemm
from tests.mqa_logits import specs as T
from torch_ascend_moe import quant
from torch_ascend_moe.testing import calc_diff


def _close(out, ref, bound=1e-10):
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(out), finite)
    assert calc_diff(out[finite], ref[finite]) < bound


def _ragged(s=32, h=16, d=64, s_kv=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(s, h, d, generator=g), torch.randn(s_kv, d, generator=g)
    w = torch.randn(s, h, generator=g)
    ks, ke = T.context_parallel_ranges(s, s_kv)
    return q, k, w, ks, ke


@pytest.mark.parametrize("compressed", [False, True])
def test_upstream_fp8(compressed):
    q, k, w, ks, ke = _ragged()
    q8 = q.to(torch.float8_e4m3fn)
    k8, sf = quant.per_custom_dims_cast_to_fp8(k, (0,), False)  # upstream: one FP32 scale per KV token
    width = int((ke - ks).max()) if compressed else 0
    out = deep_gemm.fp8_mqa_logits(q8, (k8, sf), w, ks, ke, clean_logits=not compressed, max_seqlen_k=width)
    ref = T.reference_logits(q8.double(), k8.double() * sf.double()[:, None], w, ks, ke, width or 96, compressed)
    assert out.dtype == torch.float32
    _close(out, ref)


def test_upstream_fp4_packed_int32_scales():
    q, k, w, ks, ke = _ragged(d=128)
    q4, q_sf = quant.per_token_cast_to_fp4(q.view(-1, 128), True, gran_k=32, use_packed_ue8m0=True)
    k4, k_sf = quant.per_token_cast_to_fp4(k, True, gran_k=32, use_packed_ue8m0=True)
    q4, q_sf = q4.view(32, 16, 64), q_sf.view(32, 16)  # int8 [S, H, D/2], int32 [S, H]
    out = deep_gemm.fp8_fp4_mqa_logits((q4, q_sf), (k4, k_sf.view(-1)), w, ks, ke, logits_dtype=torch.bfloat16)
    qd = quant.cast_back_from_fp4(q4.view(-1, 64), q_sf.view(-1, 1), 32, use_packed_ue8m0=True).view(32, 16, 128)
    kd = quant.cast_back_from_fp4(k4, k_sf, 32, use_packed_ue8m0=True)
    ref = T.reference_logits(qd.double(), kd.double(), w, ks, ke, 96, False)
    assert out.dtype == torch.bfloat16
    _close(out, ref, 1e-5)


def test_ascend_form_positional_max_seqlen_int16_scales():
    q, k, w, ks, ke = _ragged(h=8, d=64)
    q8, q_sf = quant.per_token_cast_to_fp8(q.view(-1, 64), True, gran_k=32, use_packed_ue8m0=False)
    k8, k_sf = quant.per_token_cast_to_fp8(k, True, gran_k=32)
    q_sf16 = quant.pack_ue8m0_to_int16(q_sf)  # [S*H, D/64], one of the Ascend shapes
    width = int((ke - ks).max())
    out = deep_gemm.fp8_fp4_mqa_logits(
        (q8.view(32, 8, 64), q_sf16), (k8, quant.pack_ue8m0_to_int16(k_sf)), w.bfloat16(), ks, ke, width
    )
    ref = T.reference_logits(
        quant.dequantize_fp8(q8, q_sf, 1, 32).double().view(32, 8, 64),
        quant.dequantize_fp8(k8, k_sf, 1, 32).double(),
        w.bfloat16(),
        ks,
        ke,
        width,
        True,
    )
    assert out.dtype == torch.bfloat16 and out.shape == (32, width)
    _close(out, ref, 1e-5)


@pytest.mark.parametrize("compressed", [False, True])
def test_positional_max_seqlen_k_28_form(compressed):
    """vLLM 0.33 calls ``fp8_fp4_mqa_logits(q, kv, weights, ks, ke, max_seqlen_k)`` (DeepGEMM 2.8's order) with CUDA's
    scales: FP32 logits, the same as the keyword form (it was read as DeepGEMM-Ascend's and returned BF16)."""
    q, k, w, ks, ke = _ragged()
    q8 = q.to(torch.float8_e4m3fn)
    k8, sf = quant.per_custom_dims_cast_to_fp8(k, (0,), False)
    width = int((ke - ks).max()) if compressed else 0
    out = deep_gemm.fp8_fp4_mqa_logits((q8, None), (k8, sf), w, ks, ke, width)
    want = deep_gemm.fp8_fp4_mqa_logits((q8, None), (k8, sf), w, ks, ke, clean_logits=width == 0, max_seqlen_k=width)
    assert out.dtype == torch.float32 and torch.equal(out, want)


def test_upstream_limits_and_modes():
    q, k, w, ks, ke = _ragged(h=14)
    k8, sf = quant.per_custom_dims_cast_to_fp8(k, (0,), False)
    with pytest.raises(ValueError, match=r"argument 'q' heads \(H\): expected a multiple of 4 in \(0, 128\], got 14"):
        deep_gemm.fp8_mqa_logits(q.to(torch.float8_e4m3fn), (k8, sf), w, ks, ke)
    q, k, w, ks, ke = _ragged()
    with pytest.raises(ValueError, match=r"argument 'clean_logits' value: expected False with compressed logits"):
        deep_gemm.fp8_mqa_logits(q.to(torch.float8_e4m3fn), (k8, sf), w, ks, ke, clean_logits=True, max_seqlen_k=64)
    with pytest.raises(ValueError, match=r"argument 'q' dtype: expected torch.float8_e4m3fn"):
        deep_gemm.fp8_mqa_logits(q, (k8, sf), w, ks, ke)


def _paged(fmt, ascend, block_kv, next_n=1, varlen=False, d=64, h=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    lengths = [70, 33, 128]
    cache = T.build_paged_cache([torch.randn(n, d, generator=g) for n in lengths], block_kv, fmt, ascend, g)
    if varlen:
        rows = torch.tensor([0, 0, 1, 2, 2, 2])
        lens = torch.tensor([69, 70, 33, 126, 127, 128], dtype=torch.int32).view(-1, 1)
        return cache, cache.block_table[rows], lens, rows.to(torch.int32), [cache.values[r] for r in rows.tolist()]
    lens = torch.tensor([[n - 1, n] if next_n == 2 else [n] for n in lengths], dtype=torch.int32)
    return cache, cache.block_table, lens, None, [cache.values[r // next_n] for r in range(3 * next_n)]


def _paged_reference(qd, per_row, lens, w, columns):
    out = torch.full((qd.shape[0], columns), float("-inf"), dtype=torch.float64)
    for r, n in enumerate(lens.flatten().tolist()):
        out[r, :n] = torch.einsum("hj,h->j", torch.einsum("hd,jd->hj", qd[r], per_row[r][:n]).relu(), w[r].double())
    return out


def test_upstream_paged_fp8_next_n_2():
    cache, table, lens, _, per_row = _paged("fp8", False, 32, next_n=2)
    q = torch.randn(3, 2, 8, 64).to(torch.float8_e4m3fn)
    w = torch.rand(6, 8)
    meta = deep_gemm.get_paged_mqa_logits_metadata(lens, 32, deep_gemm.get_num_sms())
    out = deep_gemm.fp8_paged_mqa_logits(q, cache.cache, w, lens, table, meta, 130)
    _close(out, _paged_reference(q.double().view(6, 8, 64), per_row, lens, w, 130))


def test_upstream_paged_fp4_varlen():
    cache, table, lens, indices, per_row = _paged("fp4", False, 64, varlen=True)
    q4, q_sf = quant.per_token_cast_to_fp4(torch.randn(6 * 8, 64), True, gran_k=32, use_packed_ue8m0=True)
    meta = deep_gemm.get_paged_mqa_logits_metadata(lens, 64, 16, indices)
    w = torch.rand(6, 8)
    out = deep_gemm.fp8_fp4_paged_mqa_logits(
        (q4.view(6, 1, 8, 32), q_sf.view(6, 1, 8)), cache.cache, w, lens, table, meta, 128, indices=indices
    )
    qd = quant.cast_back_from_fp4(q4, q_sf, 32, use_packed_ue8m0=True).double().view(6, 8, 64)
    _close(out, _paged_reference(qd, per_row, lens, w, 128))


def test_ascend_paged_layout_positional_indices():
    cache, table, lens, indices, per_row = _paged("fp8", True, 64, varlen=True, d=128, h=16)
    q8, q_sf = quant.per_token_cast_to_fp8(torch.randn(6 * 16, 128), True, gran_k=32)
    meta = deep_gemm.get_paged_mqa_logits_metadata(lens, 16, indices)  # Ascend: (context_lens, num_heads, indices)
    assert meta.shape == (deep_gemm.get_num_sms() + 1, 2)
    w = torch.rand(6, 16).bfloat16()
    out = deep_gemm.fp8_fp4_paged_mqa_logits(
        (q8.view(6, 1, 16, 128), quant.pack_ue8m0_to_int16(q_sf).view(6, 1, 16, 2)),
        cache.cache,
        w,
        lens,
        table,
        meta,
        128,
        indices,
        use_ascend_kv_layout=True,
    )
    qd = quant.dequantize_fp8(q8, q_sf, 1, 32).double().view(6, 16, 128)
    assert out.dtype == torch.bfloat16
    _close(out, _paged_reference(qd, per_row, lens, w, 128), 1e-5)


def test_paged_rejections():
    cache, table, lens, _, _ = _paged("fp8", False, 32)
    q = torch.randn(3, 1, 8, 64).to(torch.float8_e4m3fn)
    meta = deep_gemm.get_paged_mqa_logits_metadata(lens, 32, 4)
    w = torch.rand(3, 8)
    with pytest.raises(ValueError, match=r"argument 'context_lens' rank: expected 2-D \[B, next_n\]"):
        deep_gemm.fp8_paged_mqa_logits(q, cache.cache, w, lens.flatten(), table, meta, 130)
    with pytest.raises(ValueError, match=r"argument 'clean_logits' value: expected False"):
        deep_gemm.fp8_paged_mqa_logits(q, cache.cache, w, lens, table, meta, 130, clean_logits=True)
    with pytest.raises(ValueError, match=r"argument 'schedule_meta' value: expected int32 \[num_sms \+ 1, 2\]"):
        deep_gemm.fp8_paged_mqa_logits(q, cache.cache, w, lens, table, meta.float(), 130)


@pytest.mark.parametrize("d", [32, 64, 128])
def test_paged_mxfp8_pages_of_every_head_dim(d):
    """DeepGEMM 2.8's MXFP8 pages (``D`` bytes, then one 4-byte word of ``D/32`` UE8M0 codes per token) give the
    ragged logits of the same tokens, for head dims 32, 64 (re-laid out) and 128 (read in place)."""
    g = torch.Generator().manual_seed(d)
    heads, block_kv, length = 8, 64, 100
    k, k_sf = quant.per_token_cast_to_fp8(torch.randn(length, d, generator=g), True, gran_k=32, use_packed_ue8m0=True)
    cache = torch.zeros(2, block_kv * (d + 4), dtype=torch.uint8)
    for b in range(2):
        rows = slice(b * block_kv, min((b + 1) * block_kv, length))
        n = rows.stop - rows.start
        cache[b, : n * d] = k[rows].view(torch.uint8).reshape(-1)
        cache[b, block_kv * d : block_kv * d + n * 4] = k_sf[rows].contiguous().view(torch.uint8).reshape(-1)
    cache = cache.view(2, block_kv, 1, d + 4)
    q, q_sf = quant.per_token_cast_to_fp8(torch.randn(heads, d, generator=g), True, gran_k=32, use_packed_ue8m0=True)
    w = torch.rand(1, heads, generator=g)
    lens, table = torch.tensor([[length]], dtype=torch.int32), torch.tensor([[0, 1]], dtype=torch.int32)
    schedule = deep_gemm.get_paged_mqa_logits_metadata(lens, block_kv, 4)
    paged = deep_gemm.fp8_fp4_paged_mqa_logits(
        (q.view(1, 1, heads, d), q_sf.view(1, 1, heads)), cache, w, lens, table, schedule, length
    )
    ks, ke = torch.zeros(1, dtype=torch.int32), torch.tensor([length], dtype=torch.int32)
    ragged = deep_gemm.fp8_fp4_mqa_logits((q.view(1, heads, d), q_sf.view(1, heads)), (k, k_sf.view(-1)), w, ks, ke)
    assert torch.equal(paged, ragged)
