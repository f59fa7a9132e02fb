"""FlashMLA G3's ``fused_norm_rope_attn_rope_cast`` (specs/upstream_2609.md §7.2) on our compat package, against an
fp64 reference written from the spec: q given in the permuted layout of ``permute_q_b_proj``'s weight, the
weightless Q norm as a score multiplier, interleaved RoPE on q's last 64 dims (rounded to BF16), sparse attention
(prefill over BF16 kv, decode over V4.1 paged records with an FP4 extra cache) with a sink and lengths, the conjugate
rotation of O, and the FP8 cast in the 8-head interleaved layout (cast back within FP8 precision, scales powers of
two); ``lse`` and ``max_logits`` within upstream's tolerances; the weight relayouts checked end to end as upstream's
test does (the permuted Q_b's GEMM gives the permuted q; the permuted Wv's einsum on the fused output gives the
natural projection); the constraints enforced."""

from __future__ import annotations

import pytest
import torch

import torch_ascend_moe.deep_gemm as deep_gemm
import torch_ascend_moe.flash_mla as flash_mla
from tests.sparse_mla.specs import _dequantized, paged_scope
from torch_ascend_moe.quant import per_token_cast_to_fp8
from torch_ascend_moe.testing import calc_diff

F = flash_mla.fused_norm_rope_attn_rope_cast


def _cache(max_pos: int) -> torch.Tensor:
    inv = 100000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv
    return torch.cat([ang.cos(), ang.sin()], dim=1).float()


def _rot64(x, cos, sin):
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)


def _permuted(q: torch.Tensor) -> torch.Tensor:
    """``q [s_q, h, d]`` written element by element at upstream's permuted positions
    ``(d // 16) * h_q * 16 + h * 16 + d % 16`` of each token."""
    s_q, h_q, d_q = q.shape
    flat = torch.empty(s_q, h_q * d_q, dtype=q.dtype)
    h, d = torch.meshgrid(torch.arange(h_q), torch.arange(d_q), indexing="ij")
    flat[:, ((d // 16) * h_q * 16 + h * 16 + d % 16).reshape(-1)] = q.reshape(s_q, -1)
    return flat.view(s_q, h_q, d_q)


def _reference(q, kv, idx, pos, cache, scale, d_v, sink, lengths, norm, eps):
    """``kv`` a tensor ``[s_kv, 1, d]`` with ``idx [s_q, 1, topk]``, or per token the list of its key rows."""
    s_q, h, d = q.shape
    table = cache.double()[pos.long()]
    cos, sin = table[:, None, :32], table[:, None, 32:]
    qd = q.double()
    q_rope = torch.cat([qd[..., :-64], _rot64(qd[..., -64:], cos, sin)], -1).to(torch.bfloat16).double()
    r = torch.rsqrt(qd.square().mean(-1) + eps) if norm else torch.ones(s_q, h, dtype=torch.float64)
    out = torch.zeros(s_q, h, d_v, dtype=torch.float64)
    lse = torch.full((s_q, h), float("inf"), dtype=torch.float64)
    mx = torch.full((s_q, h), float("-inf"), dtype=torch.float64)
    for t in range(s_q):
        if isinstance(kv, list):
            k = kv[t]
        else:
            rows = [int(i) for p, i in enumerate(idx[t, 0].tolist()) if 0 <= i < kv.shape[0] and p < lengths[t]]
            k = kv[rows, 0].double()
        if not len(k):
            continue
        p = (q_rope[t] @ k.T) * scale * r[t][:, None]
        lse[t], mx[t] = torch.logsumexp(p, -1), p.max(-1).values
        o = torch.softmax(p, -1) @ k[:, :d_v]
        out[t] = o * (1 / (1 + torch.exp(sink.double() - lse[t])))[:, None]
    out = torch.cat([out[..., :-64], _rot64(out[..., -64:], cos, -sin)], -1)
    return out, mx, lse


def _cast_back(data, sf, s_q, groups, d_v):
    codes = sf.contiguous().view(torch.uint8).view(s_q, groups, -1)  # four codes per word, the first lowest
    scales = 2.0 ** (codes.double() - 127)
    values = data.double().view(s_q, groups, -1, 32) * scales[..., None]
    # [s, g, c, j, e] -> head 8g + j, dim 32c + e
    return values.view(s_q, groups, d_v // 32, 8, 32).permute(0, 1, 3, 2, 4).reshape(s_q, groups * 8, d_v)


@pytest.mark.parametrize("norm", [True, False])
def test_prefill_matches_the_reference(norm):
    g = torch.Generator().manual_seed(3 + norm)
    s_q, h, d, s_kv, topk, d_v = 5, 16, 576, 300, 64, 512
    q = (torch.randn(s_q, h, d, generator=g) * 0.5).bfloat16()
    kv = (torch.randn(s_kv, 1, d, generator=g) * 0.5).bfloat16()
    idx = torch.randint(-3, s_kv + 3, (s_q, 1, topk), generator=g, dtype=torch.int32)
    pos = torch.tensor([0, 7, 1000, 3, 65535], dtype=torch.int32)
    cache = _cache(65536)
    sink = torch.randn(h, generator=g)
    lengths = torch.tensor([64, 30, 64, 10, 50], dtype=torch.int32)
    out_fp8, out_sf, max_logits, lse = F.prefill(
        norm, 1e-4, pos, False, 64, cache, h // 8, 32, True, True, True, _permuted(q), kv, idx, 0.07, d_v, sink, lengths
    )
    assert out_fp8.dtype == torch.float8_e4m3fn and out_fp8.shape == (s_q, h // 8, 8 * d_v)
    assert out_sf.dtype == torch.int32 and out_sf.shape == (s_q, h // 8, 8 * d_v // 128) and out_sf.stride(0) == 1
    ref, mx, ref_lse = _reference(q, kv, idx, pos, cache, 0.07, d_v, sink, lengths.tolist(), norm, 1e-4)
    assert calc_diff(_cast_back(out_fp8, out_sf, s_q, h // 8, d_v), ref) < 2e-3
    torch.testing.assert_close(lse.double(), ref_lse, rtol=4.01 / 65536, atol=1e-5)
    torch.testing.assert_close(max_logits.double(), mx, rtol=4.01 / 65536, atol=1e-5)


def test_prefill_constraints():
    q, kv = torch.randn(2, 16, 576).bfloat16(), torch.randn(10, 1, 576).bfloat16()
    idx = torch.zeros(2, 1, 64, dtype=torch.int32)
    pos, cache = torch.zeros(2, dtype=torch.int32), _cache(4)
    args = (pos, False, 64, cache, 2, 32, True, True, True, q, kv, idx, 0.1)
    with pytest.raises(ValueError, match=r"prefill: argument 'is_rope_neox_style' value: expected False, got True"):
        F.prefill(True, 1e-4, pos, True, *args[2:])
    with pytest.raises(ValueError, match=r"prefill: argument 'n_wv_group' value: expected h_q / 8 = 2, got 3"):
        F.prefill(True, 1e-4, *args[:4], 3, *args[5:])


def _records(k_cache, indices, lengths, t):
    """Token ``t``'s valid records of one cache, dequantized from their bytes."""
    n = k_cache.shape[0] * k_cache.shape[1]
    keep = [int(i) for p, i in enumerate(indices[t].tolist()) if 0 <= i < n and (lengths is None or p < lengths[t])]
    return [_dequantized(k_cache, i) for i in keep]


@pytest.mark.parametrize("extra", [False, True])
def test_decode_matches_the_reference(extra):
    g = torch.Generator().manual_seed(11 + extra)
    s_q, h, d_v = 4, 16, 512
    k_cache, idx = paged_scope([37], s_q, 24, 5, 528, g)
    idx = idx[0]
    lengths = torch.tensor([24, 9, 0, 17], dtype=torch.int32)
    kw = {}
    keys = [_records(k_cache, idx, lengths.tolist(), t) for t in range(s_q)]
    if extra:
        e_cache, e_idx = paged_scope([29], s_q, 16, 3, 288, g)
        e_len = torch.tensor([16, 3, 0, 5], dtype=torch.int32)
        kw = dict(extra_k_cache=e_cache, extra_indices_in_kvcache=e_idx[0], extra_topk_length=e_len)
        keys = [k + _records(e_cache, e_idx[0], e_len.tolist(), t) for t, k in enumerate(keys)]
    keys = [torch.stack(k) if k else torch.zeros(0, 512, dtype=torch.float64) for k in keys]
    q = (torch.randn(s_q, h, 512, generator=g) * 0.5).bfloat16()
    pos, cache, sink = torch.tensor([3, 0, 90, 4095], dtype=torch.int32), _cache(4096), torch.randn(h, generator=g)
    out_fp8, out_sf, lse = F.decode(
        True, 1e-4, pos, False, 64, cache, h // 8, 32, True, True, True, _permuted(q), k_cache, idx, 0.05, d_v, sink,
        lengths, **kw,
    )  # fmt: skip
    assert out_fp8.shape == (s_q, h // 8, 8 * d_v) and lse.shape == (s_q, h) and out_sf.stride(0) == 1
    ref, _, ref_lse = _reference(q, keys, None, pos, cache, 0.05, d_v, sink, None, True, 1e-4)
    assert calc_diff(_cast_back(out_fp8, out_sf, s_q, h // 8, d_v), ref) < 2e-3
    torch.testing.assert_close(lse.double(), ref_lse, rtol=4.01 / 65536, atol=1e-5)
    assert lse[2].isinf().all() and not out_fp8[2].float().any()  # no key at all: lse +inf, zero output


@pytest.mark.parametrize("gran", [32, 128])
def test_permuted_q_b_proj_writes_the_permuted_q(gran):
    g = torch.Generator().manual_seed(gran)
    h_q, d_q, rank, s = 4, 64, 512, 3
    w, w_sf = per_token_cast_to_fp8(torch.randn(h_q * d_q, rank, generator=g) / 10, True, gran, True)
    x, x_sf = per_token_cast_to_fp8(torch.randn(s, rank, generator=g), True, gran, True)
    pw, pw_sf = F.permute_q_b_proj((w, w_sf.mT.contiguous().mT), h_q, d_q)
    assert pw.shape == w.shape and pw_sf.shape == w_sf.shape and pw_sf.stride(0) == 1

    def project(weight):
        out = torch.empty(s, h_q * d_q, dtype=torch.bfloat16)
        deep_gemm.fp8_gemm_nt((x, x_sf), weight, out, recipe_a=(1, gran), recipe_b=(1, gran))
        return out.view(s, h_q, d_q)

    torch.testing.assert_close(project((pw, pw_sf)), _permuted(project((w, w_sf))), rtol=0, atol=0)


def test_permuted_wv_proj_contracts_the_fused_output():
    g = torch.Generator().manual_seed(5)
    s_q, h, d_v, out_dim, groups = 3, 16, 128, 64, 2
    q = (torch.randn(s_q, h, d_v, generator=g) * 0.5).bfloat16()
    kv = (torch.randn(40, 1, d_v, generator=g) * 0.5).bfloat16()
    idx = torch.randint(0, 40, (s_q, 1, 16), generator=g, dtype=torch.int32)
    pos, cache = torch.tensor([1, 2, 3], dtype=torch.int32), _cache(8)
    out_fp8, out_sf, _, _ = F.prefill(False, 1e-4, pos, False, 64, cache, groups, 32, True, True, True,
                                      _permuted(q), kv, idx, 0.1, d_v)  # fmt: skip
    wv = torch.randn(groups * out_dim, 8 * d_v, generator=g) / 10
    w, w_sf = per_token_cast_to_fp8(wv, True, 32, True)
    natural = (
        w.double().view(groups * out_dim, -1, 32)
        * 2.0 ** (w_sf.contiguous().view(torch.uint8).double().view(groups * out_dim, -1) - 127)[..., None]
    )
    w_sf = w_sf.view(groups, out_dim, -1).mT.contiguous().mT
    pw, pw_sf = F.permute_wv_proj((w.view(groups, out_dim, -1), w_sf), 8, d_v)
    assert pw.shape == (groups, out_dim, 8 * d_v) and pw_sf.shape == w_sf.shape and pw_sf.stride(1) == 1
    got = torch.empty(s_q, groups, out_dim, dtype=torch.bfloat16)
    deep_gemm.fp8_einsum("bhr,hdr->bhd", (out_fp8, out_sf), (pw, pw_sf), got, recipe=(1, 1, 32))
    o = _cast_back(out_fp8, out_sf, s_q, groups, d_v).view(s_q, groups, 8 * d_v)  # natural: head-major columns
    want = torch.einsum("bhr,hdr->bhd", o, natural.view(groups, out_dim, -1))
    assert calc_diff(got, want) < 1e-5


def test_permute_constraints():
    w = torch.zeros(64, 128, dtype=torch.float8_e4m3fn)
    sf = torch.zeros(64, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"permute_q_b_proj: argument 'weight' rows: expected h_q \* d_q = 96, got 64"):
        F.permute_q_b_proj((w, sf), 6, 16)
    with pytest.raises(ValueError, match=r"permute_q_b_proj: argument 'scale_factors' shape"):
        F.permute_q_b_proj((w, torch.zeros(64, 2, dtype=torch.int32)), 4, 16)
    wv, wv_sf = torch.zeros(1, 4, 256, dtype=torch.float8_e4m3fn), torch.zeros(1, 4, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"permute_wv_proj: argument 'scale_factors' shape: .*granularity 32"):
        F.permute_wv_proj((wv, wv_sf), 8, 32)
    with pytest.raises(ValueError, match=r"permute_wv_proj: argument 'weight' dtype"):
        F.permute_wv_proj((wv.float(), wv_sf), 8, 32)
