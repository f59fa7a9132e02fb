"""FlashMLA's ``fused_norm_rope_attn_rope_cast`` (the G3 release's DeepSeek V4.1 attention block; specs/flashmla_api.md
§7, specs/upstream_2609.md §7.2), ``prefill`` over our ``sparse_mla_prefill`` op:

1. Q "norm" (``enable_q_norm``, no weight): ``r[s, h] = rsqrt(Σ_d q² / d_qk + rms_norm_eps)`` of the pre-RoPE q, a
   multiplier on the scores ``P = (q_rope · k) · sm_scale · r`` (q itself is not rescaled);
2. RoPE on q's last ``rope_dim = 64`` dims, interleaved pairs (not NeoX): with ``cos = cos_sin_cache[pos, :32]``,
   ``sin = cos_sin_cache[pos, 32:]``, ``x0' = fma(x0, cos, -x1·sin)``, ``x1' = fma(x0, sin, x1·cos)`` in FP32, then
   rounded to BF16 before the attention;
3. the sparse attention (``sparse_mla_prefill``: ``max_logits``, natural-log ``lse``, the sink), its output kept in
   FP32;
4. the conjugate rotation (``sin -> -sin``) on O's last 64 dims, in FP32;
5. the cast: per 32 values E4M3 with power-of-two (UE8M0) scales packed four to an int32, over each group of 8 heads
   (``n_wv_group = h_q / 8``) laid out interleaved: element (head ``j``, dim ``32c + e``) of group ``g`` at
   ``[s, g, c, j, e]`` of a ``[s_q, n_wv_group, d_v / 32, 8, 32]`` view (what ``permute_wv_proj`` compensates for in
   the next ``fp8_einsum('bhr,hdr->bhd', ..., recipe=(1, 1, 32))``). ``out_fp8 [s_q, n_wv_group, 8·d_v]``; ``out_sf``
   int32 ``[s_q, n_wv_group, 8·d_v/128]``, token-major in memory (strides ``(1, W·A, A)`` with ``A = align(s_q, 4)``:
   our reading of "TMA-aligned column-major" for this 3-D tensor).

Upstream's constraints are enforced: ``is_rope_neox_style=False``, ``rope_dim=64``, ``num_per_channels=32``,
``use_tma_aligned_col_major_sf``, ``round_sf`` and ``use_packed_ue8m0`` all True. ``decode`` (over the V4.1 cache
records) and the weight relayouts ``permute_q_b_proj`` / ``permute_wv_proj`` are not provided: their exact
semantics are not pinned by the spec (the G3 files were read only through the index).
"""

from __future__ import annotations

import torch

from torch_ascend_moe import _checks as ck
from torch_ascend_moe.ops.sparse_mla import sparse_mla_prefill
from torch_ascend_moe.quant import per_token_cast_to_fp8

API = "flash_mla.fused_norm_rope_attn_rope_cast.prefill"
ROPE_DIM = 64
WV_GROUP = 8  # heads per wv group (the [.., d_v/32, 8, 32] interleave)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Interleaved pairs of ``x [..., 64]`` (FP32) rotated by ``cos``/``sin [..., 32]`` (FP32, broadcast)."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    r0 = torch.addcmul(-x1 * sin, x0, cos)
    r1 = torch.addcmul(x1 * cos, x0, sin)
    return torch.stack([r0, r1], dim=-1).flatten(-2)


def _check(flags: dict, q, cos_sin_cache, token_positions, n_wv_group) -> None:
    for name, (value, want) in flags.items():
        ck.check_arg(value == want, API, name, "value", want, value)
    ck.check_rank(API, "q", q, 3, "[s_q, h_q, d_qk]")
    ck.check_arg(
        cos_sin_cache.dim() == 2 and cos_sin_cache.shape[1] == ROPE_DIM and cos_sin_cache.dtype == torch.float32,
        API,
        "cos_sin_cache",
        "value",
        "FP32 [max_pos, 64] ([cos | sin])",
        lambda: f"{cos_sin_cache.dtype} {ck.shape_str(cos_sin_cache.shape)}",
    )
    ck.check_arg(
        token_positions.dim() == 1 and token_positions.shape[0] == q.shape[0] and token_positions.dtype == torch.int32,
        API,
        "token_positions",
        "value",
        f"int32 [{q.shape[0]}] (s_q)",
        lambda: f"{token_positions.dtype} {ck.shape_str(token_positions.shape)}",
    )
    ck.check_arg(
        q.shape[1] == WV_GROUP * n_wv_group,
        API,
        "n_wv_group",
        "value",
        lambda: f"h_q / {WV_GROUP} = {q.shape[1] / WV_GROUP:g}",
        n_wv_group,
    )


def prefill(
    enable_q_norm: bool,
    rms_norm_eps: float,
    token_positions: torch.Tensor,
    is_rope_neox_style: bool,
    rope_dim: int,
    cos_sin_cache: torch.Tensor,
    n_wv_group: int,
    num_per_channels: int,
    use_tma_aligned_col_major_sf: bool,
    round_sf: bool,
    use_packed_ue8m0: bool,
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = 512,
    attn_sink: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
):
    """``(out_fp8, out_sf, max_logits, lse)`` of the fused block (module docstring)."""
    flags = {
        "is_rope_neox_style": (is_rope_neox_style, False),
        "rope_dim": (rope_dim, ROPE_DIM),
        "num_per_channels": (num_per_channels, 32),
        "use_tma_aligned_col_major_sf": (use_tma_aligned_col_major_sf, True),
        "round_sf": (round_sf, True),
        "use_packed_ue8m0": (use_packed_ue8m0, True),
    }
    _check(flags, q, cos_sin_cache, token_positions, n_wv_group)
    s_q, h_q, d_qk = q.shape
    ck.check_arg(d_v >= ROPE_DIM and d_v % 128 == 0, API, "d_v", "value", "a multiple of 128 (>= 64)", d_v)
    qf = q.float()
    table = cos_sin_cache[token_positions.long()]  # [s_q, 64]
    cos, sin = table[:, None, : ROPE_DIM // 2], table[:, None, ROPE_DIM // 2 :]
    rotated = torch.cat([qf[..., : d_qk - ROPE_DIM], _rotate(qf[..., d_qk - ROPE_DIM :], cos, sin)], dim=-1)
    q_rope = rotated.to(q.dtype).float()  # rounded to q's dtype (BF16) before the attention, as upstream
    if enable_q_norm:
        # A per-(token, head) multiplier on the scores: folded into q (in FP32) so the op's scalar sm_scale serves.
        q_rope = q_rope * torch.rsqrt(qf.square().mean(-1, keepdim=True) + rms_norm_eps)
    out, max_logits, lse = sparse_mla_prefill(q_rope, kv.float(), indices, sm_scale, d_v, attn_sink, topk_length)
    o = torch.cat([out[..., : d_v - ROPE_DIM], _rotate(out[..., d_v - ROPE_DIM :], cos, -sin)], dim=-1)
    # [s_q, h_q, d_v] -> [s_q, g, 8, d_v/32, 32] -> [s_q, g, d_v/32, 8, 32]: each row one wv group.
    rows = o.view(s_q, n_wv_group, WV_GROUP, d_v // 32, 32).permute(0, 1, 3, 2, 4).reshape(s_q * n_wv_group, -1)
    data, sf = per_token_cast_to_fp8(rows, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    width = sf.shape[1]
    aligned = -(-s_q // 4) * 4
    storage = sf.new_zeros(n_wv_group, width, aligned)
    storage[:, :, :s_q] = sf.view(s_q, n_wv_group, width).permute(1, 2, 0)
    out_sf = storage.permute(2, 0, 1)[:s_q]
    return data.view(s_q, n_wv_group, -1), out_sf, max_logits, lse
