"""``deep_ep.utils.refs`` checks on each rank of spawned gloo processes (tests/ep/test_deep_ep_utils_v2.py):
``refs.dispatch`` against a brute-force reference in which every rank gathers every rank's tokens and routing and
picks what it should receive, in (source rank, source token) order."""

from __future__ import annotations

import torch
import torch.distributed as dist

from tests.distributed import run_named
from torch_ascend_moe.deep_ep.utils import refs
from torch_ascend_moe.deep_ep.utils.math import per_token_cast_to_fp8

NUM_MAX_TOKENS = 8
NUM_EXPERTS = 8
NUM_TOPK = 3
HIDDEN = 160  # not a multiple of 128: FP8 scales are [T, 2]


def _inputs(rank: int, num_tokens: int, seed: int):
    g = torch.Generator().manual_seed(seed * 100 + rank)
    x = torch.randn(num_tokens, HIDDEN, generator=g).to(torch.bfloat16)
    # Distinct experts per token, then some slots masked to -1 (a token may end up with none at all).
    idx = torch.argsort(torch.rand(num_tokens, NUM_EXPERTS, generator=g), dim=1)[:, :NUM_TOPK]
    idx = idx.masked_fill(torch.rand(num_tokens, NUM_TOPK, generator=g) < 0.3, -1)
    if num_tokens > 0:
        idx[0] = -1
    w = torch.rand(num_tokens, NUM_TOPK, generator=g)
    return x, idx, w


def _brute_force(rank: int, world_size: int, payloads: list[list[torch.Tensor]], topk_idx: list[torch.Tensor]):
    """What ``rank`` must receive: every token (in source rank, source token order) with an expert here."""
    per_rank = NUM_EXPERTS // world_size
    lo, hi = rank * per_rank, (rank + 1) * per_rank
    rows = [[] for _ in payloads[0]]
    idx_rows, src_ids, counts = [], [], []
    for src in range(world_size):
        count = 0
        for t in range(topk_idx[src].shape[0]):
            experts = topk_idx[src][t].tolist()
            if not any(lo <= e < hi for e in experts):
                continue
            count += 1
            for k, p in enumerate(payloads[src]):
                rows[k].append(p[t])
            idx_rows.append(torch.tensor([e - lo if lo <= e < hi else -1 for e in experts]))
            src_ids.append(src * NUM_MAX_TOKENS + t)
        counts.append(count)

    def stack(parts, like):
        return torch.stack(parts) if parts else like.new_empty((0, *like.shape[1:]))

    return (
        [stack(r, p) for r, p in zip(rows, payloads[rank])],
        stack(idx_rows, topk_idx[rank]).to(topk_idx[rank].dtype),
        torch.tensor(src_ids, dtype=torch.int32),
        torch.tensor(counts, dtype=torch.int32),
    )


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype.is_floating_point and t.element_size() == 1 else t


def _bitwise(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    if a.dtype.is_floating_point and a.element_size() == 1:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    assert torch.equal(a, b), f"{what} differs"


def check_dispatch(rank: int, world_size: int) -> None:
    # Per-rank different T, one rank without tokens at all, and both with every variant of the inputs.
    for seed, sizes in enumerate([(7, 5), (NUM_MAX_TOKENS, 0), (1, NUM_MAX_TOKENS)]):
        num_tokens = sizes[rank]
        x, idx, w = _inputs(rank, num_tokens, seed)
        if num_tokens:
            fp8, scales = per_token_cast_to_fp8(x)
        else:  # per_token_cast_to_fp8 cannot view 0 rows as [0, -1, 128]
            fp8, scales = x.to(torch.float8_e4m3fn), torch.empty(0, 2)
        assert scales.shape == (num_tokens, 2)
        # Generic scale width: besides the [T, ceil(H / 128)] FP32 scales, packed int32 scales of any width.
        wide_sf = torch.randint(-(2**31), 2**31 - 1, (num_tokens, 5), dtype=torch.int32)
        for use_fp8, sf in ((False, None), (True, scales), (True, wide_sf)):
            for with_weights in (True, False):
                payload = [fp8, sf] if use_fp8 else [x]
                if with_weights:
                    payload.append(w)
                # FP8 tensors do not pickle: they travel as bytes and are viewed back.
                gathered = [None] * world_size
                dist.all_gather_object(gathered, ([_as_bytes(p) for p in payload], idx))
                payloads = [[q.view(p.dtype) for p, q in zip(payload, g[0])] for g in gathered]
                want_payload, want_idx, want_src, want_counts = _brute_force(
                    rank, world_size, payloads, [g[1] for g in gathered]
                )

                recv_x, recv_idx, recv_w, recv_src, counts = refs.dispatch(
                    (fp8, sf) if use_fp8 else x, idx, w if with_weights else None, NUM_MAX_TOKENS, NUM_EXPERTS
                )
                what = f"seed={seed} fp8={use_fp8} sf={None if sf is None else list(sf.shape)} weights={with_weights}"
                if use_fp8:
                    assert isinstance(recv_x, tuple)
                    _bitwise(recv_x[0], want_payload[0], f"{what}: x")
                    _bitwise(recv_x[1], want_payload[1], f"{what}: sf")
                else:
                    _bitwise(recv_x, want_payload[0], f"{what}: x")
                if with_weights:
                    _bitwise(recv_w, want_payload[-1], f"{what}: weights")
                else:
                    assert recv_w is None, what
                _bitwise(recv_idx, want_idx, f"{what}: topk_idx")
                _bitwise(recv_src, want_src, f"{what}: src_token_idx")
                _bitwise(counts, want_counts, f"{what}: num_recv_tokens_per_rank")


def check_pre_combine_data_is_rank_independent(rank: int, world_size: int) -> None:
    """Any rank regenerates any token's expert outputs: the same ids give the same values on every rank."""
    ids = torch.tensor([0, 3, NUM_MAX_TOKENS + 1, 2 * NUM_MAX_TOKENS - 1], dtype=torch.int32)
    y = refs.generate_pre_combine_data(ids, NUM_MAX_TOKENS, NUM_TOPK, HIDDEN)
    gathered = [None] * world_size
    dist.all_gather_object(gathered, y)
    for other in gathered:
        assert torch.equal(other, y)


CHECKS = {
    "dispatch": check_dispatch,
    "pre_combine_data_is_rank_independent": check_pre_combine_data_is_rank_independent,
}


def run_check(rank: int, world_size: int, store_path: str, name: str) -> None:
    run_named(CHECKS, rank, world_size, store_path, name)
