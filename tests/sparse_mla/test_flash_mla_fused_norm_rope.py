"""FlashMLA G3's ``fused_norm_rope_attn_rope_cast.prefill`` (specs/upstream_2609.md §7.2) on our compat package,
against an fp64 reference written from the spec: the weightless Q norm as a score multiplier, interleaved RoPE on q's
last 64 dims (rounded to BF16), sparse attention with a sink and lengths, the conjugate rotation of O, and the FP8
cast in the 8-head interleaved layout (cast back within FP8 precision, scales powers of two); ``lse`` and
``max_logits`` within upstream's tolerances; the constraints it enforces."""

from __future__ import annotations

import pytest
import torch

import torch_ascend_moe.flash_mla as flash_mla
from torch_ascend_moe.testing import calc_diff

F = flash_mla.fused_norm_rope_attn_rope_cast


def _cache(max_pos: int) -> torch.Tensor:
    inv = 100000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv
    return torch.cat([ang.cos(), ang.sin()], dim=1).float()


def _rot64(x, cos, sin):
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)


def _reference(q, kv, idx, pos, cache, scale, d_v, sink, lengths, norm, eps):
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
        rows = [int(i) for p, i in enumerate(idx[t, 0].tolist()) if 0 <= i < kv.shape[0] and p < lengths[t]]
        if not rows:
            continue
        k = kv[rows, 0].double()
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
        norm, 1e-4, pos, False, 64, cache, h // 8, 32, True, True, True, q, kv, idx, 0.07, d_v, sink, lengths
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
