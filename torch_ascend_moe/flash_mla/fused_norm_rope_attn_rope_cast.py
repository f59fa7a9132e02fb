"""FlashMLA's ``fused_norm_rope_attn_rope_cast`` (the G3 release's DeepSeek V4/V4.1 attention block;
specs/flashmla_api.md §7, specs/upstream_2609.md §7.2), over our ``sparse_mla_prefill`` / ``sparse_mla_decode`` ops:

0. ``q`` arrives in the **permuted** layout that ``permute_q_b_proj``'s weight produces: within a token the
   ``h_q · d_qk`` values are 16-value chunks of the heads interleaved, natural (head ``h``, dim ``d``) at flat
   position ``(d // 16) · h_q · 16 + h · 16 + d % 16`` (so the kernel reads every head's dims 0..15 first); it is
   read back into ``[s_q, h_q, d_qk]`` first;
1. Q "norm" (``enable_q_norm``, no weight): ``r[s, h] = rsqrt(Σ_d q² / d_qk + rms_norm_eps)`` of the pre-RoPE q, a
   multiplier on the scores ``P = (q_rope · k) · sm_scale · r`` (q itself is not rescaled);
2. RoPE on q's last ``rope_dim = 64`` dims, interleaved pairs (not NeoX): with ``cos = cos_sin_cache[pos, :32]``,
   ``sin = cos_sin_cache[pos, 32:]``, ``x0' = fma(x0, cos, -x1·sin)``, ``x1' = fma(x0, sin, x1·cos)`` in FP32, then
   rounded to BF16 before the attention;
3. the sparse attention (prefill: ``sparse_mla_prefill`` over BF16 ``kv`` with ``max_logits``; decode:
   ``sparse_mla_decode`` over the paged V4 (584-byte) / V4.1 (528) cache, an optional extra cache (V4.1 FP4, 288)
   sharing the softmax, one request per query token), natural-log ``lse``, the sink; its output kept in FP32;
4. the conjugate rotation (``sin -> -sin``) on O's last 64 dims, in FP32;
5. the cast: per 32 values E4M3 with power-of-two (UE8M0) scales packed four to an int32, over each group of 8 heads
   (``n_wv_group = h_q / 8``) laid out interleaved: element (head ``j``, dim ``32c + e``) of group ``g`` at
   ``[s, g, c, j, e]`` of a ``[s_q, n_wv_group, d_v / 32, 8, 32]`` view (what ``permute_wv_proj`` applies to the
   weight of the next ``fp8_einsum('bhr,hdr->bhd', ..., recipe=(1, 1, 32))``). ``out_fp8 [s_q, n_wv_group, 8·d_v]``;
   ``out_sf`` int32 ``[s_q, n_wv_group, 8·d_v/128]``, token-major in memory (strides ``(1, W·A, A)`` with
   ``A = align(s_q, 4)``, DeepGEMM's TMA-aligned column-major scales).

Upstream's constraints are enforced: ``is_rope_neox_style=False``, ``rope_dim=64``, ``num_per_channels=32``,
``use_tma_aligned_col_major_sf``, ``round_sf`` and ``use_packed_ue8m0`` all True; its shape limits (``h_q`` 64/128,
``d_qk = d_v = 512``) are not: every shape the ops compute runs. ``permute_q_b_proj`` / ``permute_wv_proj`` are the
one-time weight relayouts (rows of ``Q_b``, 32-column chunks of each ``Wv`` group, scales moved with them).
"""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck
from torch_ascend_moe.ops.sparse_mla import sparse_mla_decode, sparse_mla_prefill
from torch_ascend_moe.quant import per_token_cast_to_fp8

_MODULE = "flash_mla.fused_norm_rope_attn_rope_cast"
ROPE_DIM = 64
WV_GROUP = 8  # heads per wv group (the [.., d_v/32, 8, 32] interleave)
Q_CHUNK = 16  # values per head in each chunk of the permuted q
O_CHUNK = 32  # values per head in each chunk of the permuted O (the cast's scale granularity)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Interleaved pairs of ``x [..., 64]`` (FP32) rotated by ``cos``/``sin [..., 32]`` (FP32, broadcast)."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    r0 = torch.addcmul(-x1 * sin, x0, cos)
    r1 = torch.addcmul(x1 * cos, x0, sin)
    return torch.stack([r0, r1], dim=-1).flatten(-2)


def _check(api: str, flags: dict, q, cos_sin_cache, token_positions, n_wv_group) -> None:
    for name, want in (("is_rope_neox_style", False), ("rope_dim", ROPE_DIM), ("num_per_channels", 32)):
        ck.check_arg(flags[name] == want, api, name, "value", want, flags[name])
    for name in ("use_tma_aligned_col_major_sf", "round_sf", "use_packed_ue8m0"):
        ck.check_arg(flags[name] is True or flags[name] == 1, api, name, "value", True, flags[name])
    ck.check_rank(api, "q", q, 3, "[s_q, h_q, d_qk]")
    ck.check_arg(
        q.shape[2] % Q_CHUNK == 0 and q.shape[2] >= ROPE_DIM,
        api,
        "q",
        "d_qk",
        f"a multiple of {Q_CHUNK} (>= {ROPE_DIM}): the permuted layout's chunks",
        q.shape[2],
    )
    ck.check_arg(
        cos_sin_cache.dim() == 2 and cos_sin_cache.shape[1] == ROPE_DIM and cos_sin_cache.dtype == torch.float32,
        api,
        "cos_sin_cache",
        "value",
        "FP32 [max_pos, 64] ([cos | sin])",
        lambda: f"{cos_sin_cache.dtype} {ck.shape_str(cos_sin_cache.shape)}",
    )
    ck.check_arg(
        token_positions.dim() == 1 and token_positions.shape[0] == q.shape[0] and token_positions.dtype == torch.int32,
        api,
        "token_positions",
        "value",
        f"int32 [{q.shape[0]}] (s_q)",
        lambda: f"{token_positions.dtype} {ck.shape_str(token_positions.shape)}",
    )
    ck.check_arg(
        q.shape[1] == WV_GROUP * n_wv_group,
        api,
        "n_wv_group",
        "value",
        lambda: f"h_q / {WV_GROUP} = {q.shape[1] / WV_GROUP:g}",
        n_wv_group,
    )


def _queries(q, token_positions, cos_sin_cache, enable_q_norm: bool, rms_norm_eps: float):
    """Steps 0-2: ``(q_rope FP32 [s_q, h_q, d_qk] with the norm multiplier folded in, cos, sin)``."""
    s_q, h_q, d_qk = q.shape
    qf = q.reshape(s_q, d_qk // Q_CHUNK, h_q, Q_CHUNK).transpose(1, 2).reshape(s_q, h_q, d_qk).float()
    table = cos_sin_cache[token_positions.long()]  # [s_q, 64]
    cos, sin = table[:, None, : ROPE_DIM // 2], table[:, None, ROPE_DIM // 2 :]
    rotated = torch.cat([qf[..., : d_qk - ROPE_DIM], _rotate(qf[..., d_qk - ROPE_DIM :], cos, sin)], dim=-1)
    q_rope = rotated.to(q.dtype).float()  # rounded to q's dtype (BF16) before the attention, as upstream
    if enable_q_norm:
        # A per-(token, head) multiplier on the scores: folded into q (in FP32) so the op's scalar sm_scale serves.
        q_rope = q_rope * torch.rsqrt(qf.square().mean(-1, keepdim=True) + rms_norm_eps)
    return q_rope, cos, sin


def _cast(out: torch.Tensor, cos, sin, n_wv_group: int):
    """Steps 4-5 on the attention output ``out [s_q, h_q, d_v]``: ``(out_fp8, out_sf)``."""
    s_q, _, d_v = out.shape
    o = torch.cat([out[..., : d_v - ROPE_DIM], _rotate(out[..., d_v - ROPE_DIM :], cos, -sin)], dim=-1)
    # [s_q, h_q, d_v] -> [s_q, g, 8, d_v/32, 32] -> [s_q, g, d_v/32, 8, 32]: each row one wv group.
    rows = o.view(s_q, n_wv_group, WV_GROUP, d_v // O_CHUNK, O_CHUNK).permute(0, 1, 3, 2, 4)
    data, sf = per_token_cast_to_fp8(
        rows.reshape(s_q * n_wv_group, -1), use_ue8m0=True, gran_k=O_CHUNK, use_packed_ue8m0=True
    )
    width = sf.shape[1]
    aligned = -(-s_q // 4) * 4
    storage = sf.new_zeros(n_wv_group, width, aligned)
    storage[:, :, :s_q] = sf.view(s_q, n_wv_group, width).permute(1, 2, 0)
    return data.view(s_q, n_wv_group, -1), storage.permute(2, 0, 1)[:s_q]


def _check_d_v(api: str, d_v: int) -> None:
    ck.check_arg(d_v >= ROPE_DIM and d_v % 128 == 0, api, "d_v", "value", "a multiple of 128 (>= 64)", d_v)


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
    """``(out_fp8, out_sf, max_logits, lse)`` of the fused block over ``kv [s_kv, 1, d_qk]`` BF16 and
    ``indices [s_q, 1, topk]`` (module docstring); ``q [s_q, h_q, d_qk]`` in the permuted layout."""
    api = f"{_MODULE}.prefill"
    flags = dict(locals())
    _check(api, flags, q, cos_sin_cache, token_positions, n_wv_group)
    _check_d_v(api, d_v)
    q_rope, cos, sin = _queries(q, token_positions, cos_sin_cache, enable_q_norm, rms_norm_eps)
    out, max_logits, lse = sparse_mla_prefill(q_rope, kv.float(), indices, sm_scale, d_v, attn_sink, topk_length)
    out_fp8, out_sf = _cast(out, cos, sin, n_wv_group)
    return out_fp8, out_sf, max_logits, lse


def decode(
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
    k_cache: torch.Tensor,
    indices_in_kvcache: torch.Tensor,
    sm_scale: float,
    d_v: int = 512,
    attn_sink: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices_in_kvcache: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
):
    """``(out_fp8, out_sf, lse)`` of the fused block over a paged FP8 cache ``k_cache [blocks, page, 1, bytes]``
    (V4's 584-byte or V4.1's 528-byte records; ``extra_k_cache`` the same or V4.1's 288-byte FP4),
    ``indices_in_kvcache [s_q, topk]`` record numbers (``block · page + offset``), ``topk_length [s_q]`` per query
    token: batch size 1 with no batch dim, as upstream (callers flatten ``b · s_q``). ``q [s_q, h_q, d_qk]`` in the
    permuted layout. Each query token is its own request of ``sparse_mla_decode``; ``lse [s_q, h_q]``."""
    api = f"{_MODULE}.decode"
    flags = dict(locals())
    _check(api, flags, q, cos_sin_cache, token_positions, n_wv_group)
    _check_d_v(api, d_v)
    ck.check_rank(api, "indices_in_kvcache", indices_in_kvcache, 2, "[s_q, topk]")
    if extra_indices_in_kvcache is not None:
        ck.check_rank(api, "extra_indices_in_kvcache", extra_indices_in_kvcache, 2, "[s_q, extra_topk]")
    q_rope, cos, sin = _queries(q, token_positions, cos_sin_cache, enable_q_norm, rms_norm_eps)
    extra = extra_indices_in_kvcache[:, None] if extra_indices_in_kvcache is not None else None
    out, lse = sparse_mla_decode(
        q_rope[:, None], k_cache, indices_in_kvcache[:, None], sm_scale, d_v, attn_sink, topk_length, extra_k_cache,
        extra, extra_topk_length,
    )  # fmt: skip
    out_fp8, out_sf = _cast(out[:, 0], cos, sin, n_wv_group)
    return out_fp8, out_sf, lse[:, :, 0]


def _check_weight(api: str, w: torch.Tensor, sf: torch.Tensor, rank: int, layout: str) -> None:
    ck.check_rank(api, "weight", w, rank, layout)
    ck.check_rank(api, "scale_factors", sf, rank, layout + " (packed UE8M0)")
    ck.check_arg(w.dtype == torch.float8_e4m3fn, api, "weight", "dtype", torch.float8_e4m3fn, w.dtype)
    ck.check_arg(sf.dtype == torch.int32, api, "scale_factors", "dtype", torch.int32, sf.dtype)
    ck.check_arg(
        sf.device == w.device, api, "scale_factors", "device", lambda: f"{w.device} (same as 'weight')", sf.device
    )


def _mn_major(sf: torch.Tensor) -> torch.Tensor:
    """``sf`` with unit stride along its MN (second to last) dim, DeepGEMM's scale layout."""
    return sf.mT.contiguous().mT


def permute_q_b_proj(weight_and_sf: tuple[torch.Tensor, torch.Tensor], h_q: int, d_q: int):
    """``Q_b [h_q·d_q, q_lora_rank]`` E4M3 and its packed UE8M0 scales ``[h_q·d_q, q_lora_rank/gran/4]`` (gran 32
    or 128, MN-major) with row (head ``h``, dim ``d``) moved to ``(d // 16)·h_q·16 + h·16 + d % 16``: the
    projection then writes q in the permuted layout ``prefill`` / ``decode`` read. Same shapes, scales MN-major."""
    api = f"{_MODULE}.permute_q_b_proj"
    w, sf = weight_and_sf
    _check_weight(api, w, sf, 2, "[h_q * d_q, q_lora_rank]")
    ck.check_int_arg(api, "h_q", h_q, 1)
    ck.check_int_arg(api, "d_q", d_q, 1)
    ck.check_arg(d_q % Q_CHUNK == 0, api, "d_q", "value", f"a multiple of {Q_CHUNK}", d_q)
    rows, rank = w.shape
    ck.check_arg(rows == h_q * d_q, api, "weight", "rows", f"h_q * d_q = {h_q * d_q}", rows)
    gran = rank // (4 * sf.shape[1]) if sf.shape[1] else 0
    ck.check_arg(
        gran in (32, 128) and rank % (4 * gran) == 0 and tuple(sf.shape) == (rows, rank // gran // 4),
        api,
        "scale_factors",
        "shape",
        f"[{rows}, q_lora_rank / gran / 4] with gran 32 or 128 (q_lora_rank {rank})",
        ck.shape_str(sf.shape),
    )
    ck.check_arg(sf.stride(0) == 1 or rows == 1, api, "scale_factors", "stride(0)", 1, sf.stride(0))

    def moved(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(h_q, d_q // Q_CHUNK, Q_CHUNK, -1).transpose(0, 1).reshape(rows, -1)

    return moved(w).contiguous(), _mn_major(moved(sf))


def permute_wv_proj(weight_and_sf: tuple[torch.Tensor, torch.Tensor], wv_group_size: int, d_o: int):
    """``Wv [n_wv_group, d_proj_out, wv_group_size·d_o]`` E4M3 and its packed UE8M0 per-32 scales
    ``[n_wv_group, d_proj_out, wv_group_size·d_o/128]`` (MN-major) with the 32-column chunk (head ``h``, chunk
    ``c``) of each group moved to chunk ``c · wv_group_size + h``: the layout of ``prefill`` / ``decode``'s
    ``out_fp8``, so ``fp8_einsum('bhr,hdr->bhd', out, Wv')`` contracts it directly. Same shapes."""
    api = f"{_MODULE}.permute_wv_proj"
    w, sf = weight_and_sf
    _check_weight(api, w, sf, 3, "[n_wv_group, d_proj_out, wv_group_size * d_o]")
    ck.check_int_arg(api, "wv_group_size", wv_group_size, 1)
    ck.check_int_arg(api, "d_o", d_o, 1)
    ck.check_arg(d_o % O_CHUNK == 0, api, "d_o", "value", f"a multiple of {O_CHUNK}", d_o)
    groups, out_dim, width = w.shape
    ck.check_arg(
        width == wv_group_size * d_o, api, "weight", "columns", f"wv_group_size * d_o = {wv_group_size * d_o}", width
    )
    ck.check_arg(
        width % (4 * O_CHUNK) == 0 and tuple(sf.shape) == (groups, out_dim, width // O_CHUNK // 4),
        api,
        "scale_factors",
        "shape",
        f"[{groups}, {out_dim}, {width} / 32 / 4] (granularity 32, four scales per int32)",
        ck.shape_str(sf.shape),
    )
    ck.check_arg(sf.stride(1) == 1 or out_dim == 1, api, "scale_factors", "stride(1)", 1, sf.stride(1))

    def moved(x: torch.Tensor, per: int) -> torch.Tensor:
        # columns [h, c, e] -> [c, h, e] with e the ``per`` values of one 32-column chunk
        return (
            x.reshape(groups, out_dim, wv_group_size, d_o // O_CHUNK, per).transpose(2, 3).reshape(w.shape[:2] + (-1,))
        )

    codes = sf.contiguous().view(torch.uint8)  # four UE8M0 codes per int32, the first chunk's lowest
    return moved(w, O_CHUNK).contiguous(), _mn_major(moved(codes, 1).contiguous().view(torch.int32))


__all__ = ["decode", "permute_q_b_proj", "permute_wv_proj", "prefill"]
