"""TileKernels' fused routing layout (specs/tilekernels_deepselect.md §4): ``get_fused_mapping``, ``expand_to_fused``
(``_with_sf``) and ``reduce_fused``, with upstream's signatures and asserts.

The layout is ``moe_permute``'s (the routing family's counting sort, the m-grouped GEMMs' psum layout, DeepEP V2's
expand layout): expert ``e`` owns an aligned block, its (token, slot) pairs first in token order (upstream leaves the
order inside a block unspecified), then padding. The maps are derived from ``moe_permute``'s row map on the device;
only the default ``num_expanded_tokens=0`` path reads the counts on the host, as upstream's does. ``reduce_fused``
accumulates with a fused multiply-add per slot (upstream's rounding), which ``moe_unpermute`` (one rounded product
per slot) does not, so it is its own composition.
"""

from __future__ import annotations

import torch

from torch_ascend_moe._arith import fma
from torch_ascend_moe.ops.moe_routing import moe_permute

__all__ = ["expand_to_fused", "expand_to_fused_with_sf", "get_fused_mapping", "reduce_fused"]


def _align(n, a):
    return (n + a - 1) // a * a


def get_fused_mapping(topk_idx: torch.Tensor, num_experts: int, num_expanded_tokens: int, alignment: int,
                      force_no_sync: bool = False):  # fmt: skip
    """``(pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start, expert_end,
    num_tokens_per_expert, num_tokens_per_expert_list)``: int32 maps between (token, slot) pairs and the expanded
    expert-major rows (-1: padding / an unused slot); the per-expert blocks' starts, ends and aligned sizes; the
    sizes as a list (after a host read) when ``num_expanded_tokens == 0`` and not ``force_no_sync``, else ``[]``."""
    assert topk_idx.is_contiguous() and topk_idx.dtype == torch.int64
    assert 0 < num_experts <= 1024 and alignment > 0
    num_tokens, num_topk = topk_idx.shape
    should_sync = num_expanded_tokens == 0 and not force_no_sync
    if num_expanded_tokens == 0:
        num_expanded_tokens = (num_tokens * num_topk + (alignment - 1) * num_experts) // alignment * alignment
    n, dev = num_expanded_tokens, topk_idx.device
    _, token_topk_to_pos, ends = moe_permute(
        topk_idx.new_empty(num_tokens, 0, dtype=torch.float32), topk_idx, num_experts, alignment=alignment
    )
    ends = ends.long()
    expert_start = _align(torch.cat([ends.new_zeros(1), ends[:-1]]), alignment)
    expert_end = _align(ends, alignment)
    # Free to check in eager CPU code (a device would need a sync; a compiled graph a data-dependent guard, which
    # fullgraph refuses): rows must fit. Past that, rows that do not fit are dropped, never written out of bounds.
    if dev.type == "cpu" and num_tokens and not torch.compiler.is_compiling():
        assert int(expert_end[-1]) <= n, f"num_expanded_tokens={n} is below the layout's {int(expert_end[-1])} rows"
    valid = token_topk_to_pos >= 0
    flat = torch.arange(num_tokens * num_topk, dtype=torch.int32, device=dev)
    pos_to_token_topk = torch.full((n + 1,), -1, dtype=torch.int32, device=dev)
    target = torch.where(valid, token_topk_to_pos, n).flatten().long().clamp(max=n)
    pos_to_token_topk.scatter_(0, target, flat)
    pos_to_token_topk = pos_to_token_topk[:n]
    used = pos_to_token_topk >= 0
    safe = pos_to_token_topk.clamp(min=0).long()
    pos_to_token = torch.where(used, pos_to_token_topk // num_topk, -1).int()
    pos_to_expert = torch.where(used, topk_idx.flatten()[safe] if num_tokens else safe, -1).int()
    num_tokens_per_expert = (expert_end - expert_start).int()
    counts: list[int] = []
    if should_sync:
        counts = num_tokens_per_expert.tolist()
        rows = sum(counts)
        pos_to_expert, pos_to_token, pos_to_token_topk = (
            pos_to_expert[:rows],
            pos_to_token[:rows],
            pos_to_token_topk[:rows],
        )
    return (
        pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos.contiguous(), expert_start.int(),
        expert_end.int(), num_tokens_per_expert, counts,
    )  # fmt: skip


def _gather_rows(x: torch.Tensor, token_topk_to_pos: torch.Tensor, rows: int) -> torch.Tensor:
    """``out[token_topk_to_pos[t, j]] = x[t]`` for every used slot; every other row zero. Any dtype: one-byte
    ones (FP8) move as their bytes (zero bytes are +0.0), which every device can copy."""
    if x.element_size() == 1 and x.dtype != torch.uint8:
        return _gather_rows(x.view(torch.uint8), token_topk_to_pos, rows).view(x.dtype)
    num_tokens, num_topk = token_topk_to_pos.shape
    out = x.new_zeros((rows + 1,) + tuple(x.shape[1:]))
    target = torch.where(token_topk_to_pos >= 0, token_topk_to_pos.long(), rows).flatten().clamp(max=rows)
    out.index_copy_(0, target, x.repeat_interleave(num_topk, dim=0))
    return out[:rows]


def expand_to_fused(x: torch.Tensor, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor) -> torch.Tensor:
    """``[N, H]``: token ``t``'s row at each of its slots' positions; padding rows zero."""
    assert x.is_contiguous() and token_topk_to_pos.is_contiguous()
    assert x.dim() == 2 and token_topk_to_pos.dim() == 2
    assert x.shape[0] == token_topk_to_pos.shape[0]
    return _gather_rows(x, token_topk_to_pos, pos_to_expert.shape[0])


def expand_to_fused_with_sf(x, num_per_channels: int, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor,
                            use_tma_aligned_col_major_sf: bool = False):  # fmt: skip
    """``(out [N, H], out_sf)``: the expansion of FP8 data and its per-token scales (FP32, or packed UE8M0 int32
    with the column-major layout); ``out_sf`` column-major with its row count aligned to 4 when asked."""
    x, x_sf = x
    assert x.is_contiguous() and x_sf.is_contiguous() and token_topk_to_pos.is_contiguous()
    assert pos_to_expert.is_contiguous()
    assert x.dim() == 2 and token_topk_to_pos.dim() == 2 and pos_to_expert.dim() == 1
    assert x_sf.dtype in (torch.float32, torch.int32)
    assert num_per_channels in (32, 128)
    num_tokens, hidden = x.shape
    assert num_tokens == token_topk_to_pos.shape[0] == x_sf.shape[0]
    hidden_sf = -(-hidden // num_per_channels)
    if x_sf.dtype == torch.int32:
        hidden_sf = -(-hidden_sf // 4)
        assert use_tma_aligned_col_major_sf
    assert hidden_sf == x_sf.shape[1]
    rows = pos_to_expert.shape[0]
    out = _gather_rows(x, token_topk_to_pos, rows)
    sf = _gather_rows(x_sf, token_topk_to_pos, rows)
    if use_tma_aligned_col_major_sf:
        storage = sf.new_zeros(hidden_sf, _align(rows, 4))
        storage[:, :rows] = sf.T
        sf = storage[:, :rows].T
    return out, sf


def reduce_fused(x, topk_weights: torch.Tensor | None, token_topk_to_pos: torch.Tensor, fp8_format: str = "",
                 sf: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """``out[t] = Σ_j x[pos] · (w[t, j] · x_sf[pos])`` over the used slots in slot order, each step a fused
    multiply-add into an FP32 accumulator from 0, then ``· sf[0]``, cast once to x's dtype or E4M3."""
    x, x_sf = x if isinstance(x, tuple) else (x, None)
    _, hidden = x.shape
    num_tokens, num_topk = token_topk_to_pos.shape
    assert hidden % 256 == 0
    assert fp8_format in ("", "e4m3")
    out_dtype = torch.float8_e4m3fn if fp8_format == "e4m3" else x.dtype
    if fp8_format == "":
        assert sf is None, "Only FP8 output supports sf."
    if out is not None:
        assert tuple(out.shape) == (num_tokens, hidden)
    if x_sf is not None:
        assert x_sf.shape[0] == x.shape[0]
    acc = torch.zeros(num_tokens, hidden, dtype=torch.float32, device=x.device)
    for k in range(num_topk):
        pos = token_topk_to_pos[:, k]
        used = pos >= 0
        safe = pos.clamp(min=0).long()
        s = torch.ones(num_tokens, dtype=torch.float32, device=x.device)
        if topk_weights is not None:
            s = topk_weights[:, k].float()
        if x_sf is not None:
            s = s * x_sf[safe]
        acc = torch.where(used[:, None], fma(x[safe].float(), s[:, None], acc), acc)
    if sf is not None:
        acc = acc * sf[0]
    result = acc.to(out_dtype)
    if out is None:
        return result
    out.copy_(result)
    return out
