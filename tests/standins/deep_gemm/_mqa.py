"""Numerics and schedules shared by the MQA-logits stand-ins of both flavors (``_cuda_extra``, ``_ascend_extra``).

* ``relu_logits``: the indexer score ``sum_h w[t, h] * relu(q[t, h, :] . k[j, :])`` in float64 (the kernels'
  "weighted ReLU head reduction"; both libraries apply the ReLU per head before the weighted sum).
* ``group_scales``: per-32-element UE8M0 scale bytes (CUDA packed int32 words, Ascend int16 pairs) expanded along the
  head dim.
* ``requests``: the (query-token run, block-table row, context length) units the paged kernels walk, and the
  schedule-metadata replays of ``sched::sm90_paged_mqa_logits_metadata`` / ``sched::sm100_paged_mqa_logits_metadata``
  (deepseek-ai/DeepGEMM @ 54e2261, ``deep_gemm/include/deep_gemm/scheduler/sm{90,100}_paged_mqa_logits.cuh``) and of
  DeepGEMM-Ascend's ``paged_mqa_logits_metadata_simt_impl`` (Afloat16/DeepGEMM-Ascend @ 8491bbb,
  ``deep_gemm/include/deep_gemm/scheduler/paged_mqa_logits_metadata.hpp``): bit-exact host re-implementations, so the
  stand-in returns what the real metadata kernels write and can tell whether a ``schedule_meta`` matches the call.
"""

from __future__ import annotations

import bisect

import torch

from . import _ref
from ._ref import F64, ceil_div

# Keep the [rows, heads, kv] score intermediate below this many float64 elements (chunked over rows).
_CHUNK_ELEMS = 1 << 24


def relu_logits(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``q [T, H, D]``, ``k [J, D]``, ``w [T, H]`` (float64) -> ``[T, J]`` = ``sum_h w * relu(q . k)``."""
    t, h, _ = q.shape
    j = k.shape[0]
    out = torch.empty((t, j), dtype=F64)
    step = max(1, _CHUNK_ELEMS // max(1, h * j))
    for lo in range(0, t, step):
        s = torch.einsum("thd,jd->thj", q[lo : lo + step], k).clamp_min(0)
        out[lo : lo + step] = torch.einsum("thj,th->tj", s, w[lo : lo + step])
    return out


def group_scales(codes: torch.Tensor, d: int) -> torch.Tensor:
    """UE8M0 codes ``[..., G]`` (one per 32 elements) -> float64 per-element scales ``[..., d]``."""
    return _ref.ue8m0_values(codes).repeat_interleave(32, -1)[..., :d]


def c_align(x: int, y: int) -> int:
    """``align`` of csrc/utils/math.hpp on C ints: ``ceil_div`` truncates toward zero for negative values."""
    num = x + y - 1
    q = abs(num) // y
    return (q if num >= 0 else -q) * y


# ---------------------------------------------------------------------------------------------------------------------
# Paged requests
# ---------------------------------------------------------------------------------------------------------------------


def runs(indices: list) -> list:
    """``[(start, count)]``: maximal runs of equal ``indices`` values (a varlen "request")."""
    out, t = [], 0
    while t < len(indices):
        s = t
        while t < len(indices) and indices[t] == indices[s]:
            t += 1
        out.append((s, t - s))
    return out


def requests(lens: list, next_n: int, indices: list | None) -> list:
    """``[(start_token, num_tokens, block_table_row, context_len)]`` as the paged kernels walk them: a request is
    ``next_n`` consecutive tokens (block-table row ``b``) or, with ``indices``, a run of equal indices (block-table row
    of its first token); its KV length is that of its *last* token."""
    if indices is not None:
        return [(s, c, s, lens[s + c - 1]) for s, c in runs(indices)]
    return [(b * next_n, next_n, b, lens[b * next_n + next_n - 1]) for b in range(len(lens) // max(next_n, 1))]


def sm100_metadata(lens: list, next_n: int, indices: list | None, num_sms: int) -> list:
    """``sched::sm100_paged_mqa_logits_metadata``: ``num_sms + 1`` (q_token_idx, kv_split_idx) starts."""
    split_kv = 256
    num_tokens = len(lens)
    reqs = requests(lens, next_n, indices)
    prefix, acc = [], 0
    for _, count, _, ctx in reqs:
        acc += ceil_div(ctx, split_kv) * count
        prefix.append(acc)
    total = prefix[-1] if prefix else 0
    q, rem = divmod(total, num_sms)
    meta = []
    for sm in range(num_sms + 1):
        w = sm * q + min(sm, rem)
        r = bisect.bisect_right(prefix, w)
        if r < len(reqs):
            before = prefix[r - 1] if r else 0
            meta.append((reqs[r][0], (w - before) // reqs[r][1]))
        else:
            meta.append((num_tokens, 0))
    return meta


def sm90_metadata(lens: list, batch: int, next_n: int, num_sms: int) -> list:
    """``sched::sm90_paged_mqa_logits_metadata`` (non-varlen): per-SM (q_atom_idx, kv_split_idx), then the sentinel."""
    split_kv = 256
    prefix, acc = [], 0
    for b in range(batch):
        acc += ceil_div(lens[b * next_n + next_n - 1], split_kv)
        prefix.append(acc)
    atom = 2 if next_n >= 2 else 1
    num_atoms = ceil_div(next_n, atom)
    total = acc * num_atoms
    q, r = divmod(total, num_sms)
    pivot = num_sms - r
    meta = []
    for sm in range(num_sms):
        seg = sm * q + (sm - pivot if sm > pivot else 0)
        lo, hi = 0, batch
        while lo < hi:
            mid = (lo + hi) // 2
            if prefix[mid] * num_atoms <= seg:
                lo = mid + 1
            else:
                hi = mid
        offset = seg if lo == 0 else seg - prefix[lo - 1] * num_atoms
        padded = prefix + [acc]  # the shared prefix array is zero-padded to align(batch, 32) entries
        num_segs = padded[0] if lo == 0 else padded[lo] - padded[lo - 1]
        atom_idx, split = (offset // num_segs, offset % num_segs) if num_segs > 0 else (0, 0)
        meta.append((lo * num_atoms + atom_idx, split))
    meta.append((batch * num_atoms, 0))
    return meta


def _ascend_split_cost(num_q_tokens: int, num_kv_tokens: int, tokens_per_tile: int, split_kv: int) -> int:
    tiles = ceil_div(num_q_tokens, tokens_per_tile)
    cost = 2 + 2 * tiles if tokens_per_tile > 1 else tiles
    return ceil_div(num_kv_tokens, split_kv // 4) * cost + 2


def ascend_metadata(lens: list, indices: list, num_heads: int, num_cores: int) -> list:
    """DeepGEMM-Ascend ``paged_mqa_logits_metadata_vf``: per-core (q_token_start, kv_split_idx), ``(T, 0)`` unused."""
    split_kv = 512
    tokens_per_tile = (64 // num_heads * num_heads) // num_heads
    num_tokens = len(lens)
    meta = [(num_tokens, 0)] * (num_cores + 1)
    reqs = requests(lens, 1, indices)
    if not reqs:
        return meta
    prefix, acc, full = [], 0, []
    for _, count, _, ctx in reqs:
        splits = ceil_div(ctx, split_kv)
        f = _ascend_split_cost(count, split_kv, tokens_per_tile, split_kv)
        full.append(f)
        if splits:
            last = ctx - (splits - 1) * split_kv
            acc += (splits - 1) * f + _ascend_split_cost(count, last, tokens_per_tile, split_kv)
        prefix.append(acc)
    total = acc
    for core in range(num_cores + 1):
        target = core * (total // num_cores) + min(core, total % num_cores)
        if target < total:
            r = bisect.bisect_right(prefix, target)
            before = prefix[r - 1] if r else 0
            meta[core] = (reqs[r][0], min((target - before) // full[r], ceil_div(reqs[r][3], split_kv) - 1))
    return meta


def gather_tokens(pages: torch.Tensor, table_row: torch.Tensor, length: int) -> torch.Tensor:
    """Logical KV tokens ``[length, ...]`` of one request from ``pages [num_blocks, block, ...]``."""
    block = pages.shape[1]
    ids = table_row[: ceil_div(length, block)].long()
    return pages.index_select(0, ids).flatten(0, 1)[:length]
