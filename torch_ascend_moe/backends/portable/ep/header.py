"""What the ranks agree on before any row moves, for every ep op: the transport each rank uses, each op's header
fields (what every rank's call must match; ``distributed.agreement`` exchanges them), the argument check run with
one verdict on every rank, and the errors every rank raises alike."""

from __future__ import annotations

import enum

from torch_ascend_moe import checks as ck
from torch_ascend_moe.checks import ep as ep_checks
from torch_ascend_moe.distributed import agreement
from torch_ascend_moe.distributed.groups import checked_size


class Transport(enum.IntEnum):
    """The transport a header names: every rank must move rows the same way (a rank where DeepEP is installed and
    one where it is not raise on both instead of waiting in different collectives)."""

    OURS = 0  # torch.distributed (backends/portable/ep)
    DEEP_EP = 1  # DeepEP's Buffer (backends/upstream/deep_ep/legacy.py)
    DEEP_EP_V2 = 2  # DeepEP's ElasticBuffer (backends/upstream/deep_ep/elastic.py)


TRANSPORT_FIELD = "the transport (0: torch.distributed, 1: DeepEP's Buffer, 2: DeepEP's ElasticBuffer)"


def checked_on_every_rank(op: str, args, signature) -> int:
    """``signature(args, R)`` (the fake's checks) run on every rank with one agreed verdict: the world size R."""
    return agreement.checked(op, args.group_name, args.x, args.timeout_s, lambda: checked_size(op, signature, args))


def dispatch_fields(args, transport: Transport) -> dict:
    """What every rank's ``ep_dispatch`` must agree on (the header's fields): its rows', then its routing's."""
    return {
        **cached_fields(args, transport),
        "topk_idx's K": args.topk_idx.shape[1],
        "num_experts": args.num_experts,
        "topk_weights (given, dtype)": -1
        if args.topk_weights is None
        else agreement.dtype_code(args.topk_weights.dtype),
        "num_worst_tokens": args.num_worst_tokens,
        "expert_alignment": args.expert_alignment,
    }


def cached_fields(args, transport: Transport) -> dict:
    """What every rank's ``ep_dispatch_cached`` must agree on: the transport and its rows' shapes and dtypes."""
    return {
        TRANSPORT_FIELD: transport,
        "x's row bytes": args.x.shape[1] * args.x.element_size(),
        "x's dtype": agreement.dtype_code(args.x.dtype),
        "x_scales' columns": -1 if args.x_scales is None else args.x_scales.shape[1],
        "x_scales' dtype": -1 if args.x_scales is None else agreement.dtype_code(args.x_scales.dtype),
    }


def combine_fields(args, transport: Transport) -> dict:
    return {
        TRANSPORT_FIELD: transport,
        "x's row bytes": args.x.shape[1] * args.x.element_size(),
        "x's dtype": agreement.dtype_code(args.x.dtype),
        "topk_weights (K, dtype)": -1
        if args.topk_weights is None
        else args.topk_weights.shape[1] * 1000 + args.topk_weights.element_size(),
    }


def bad_ids(num_experts: int, op: str = ep_checks.DISPATCH) -> str:
    """The error for expert ids out of range on some ranks (``{ranks}``: which), for every op taking ``topk_idx``."""
    expected = f"expert ids in [-1, {num_experts}) on every rank"
    return ck.message(op, "topk_idx", "values", expected, "ids out of range on rank(s) {ranks}")


def static_overflow(op: str, num_worst_tokens: int, rank: int, received) -> str:
    actual = f"{num_worst_tokens} (rank {rank} receives {received}; rows are never dropped)"
    return ck.message(op, "num_worst_tokens", "value", "at least the rows every rank receives", actual)
