"""Fakes of the ep family (expert-parallel dispatch / combine); the checks are ``torch_ascend_moe/checks/ep.py``.

Shapes follow DeepEP V1 (specs/deepep_api.md §3-§5). The group is named by ``group_name`` and resolved
locally (no communication), so fakes know the world size. A compact dispatch (``num_worst_tokens == 0``)
receives a data-dependent number of rows: its fake returns unbacked sizes. A static one returns exactly
``num_worst_tokens`` rows and sends ``R * T`` (padded) rows: every shape is static.
"""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import device_kind, fake
from torch_ascend_moe.checks.ep import (
    ABSENT,
    CACHED,
    COMBINE,
    DISPATCH,
    LL_COMBINE,
    LL_DISPATCH,
    cached_signature,
    combine_signature,
    dispatch_signature,
    expand_signature,
    layout_signature,
    ll_combine_signature,
    ll_dispatch_signature,
    ll_scale_shape,
)
from torch_ascend_moe.distributed.groups import checked_size


def _scale_cols(x_scales):
    return x_scales.shape[1] if x_scales is not None else 0


@fake
def ep_dispatch_layout(topk_idx, num_experts, num_ranks, ranks_per_node):
    layout_signature(topk_idx, num_experts, num_ranks, ranks_per_node)
    nodes = max(1, num_ranks // ranks_per_node)
    i32 = torch.int32
    return (
        topk_idx.new_empty([num_ranks], dtype=i32),
        topk_idx.new_empty([nodes], dtype=i32),
        topk_idx.new_empty([num_experts], dtype=i32),
        topk_idx.new_empty([topk_idx.shape[0], num_ranks], dtype=torch.bool),
    )


@fake
def ep_dispatch(args):
    r = checked_size(DISPATCH, dispatch_signature, args)
    if args.num_worst_tokens > 0:
        n, m = args.num_worst_tokens, r * args.x.shape[0]
    else:
        # Received rows: >= 0 (other ranks' token counts are unknown here, so no upper bound); sent rows: each
        # token goes at most once to each rank, <= R * T when T is static.
        ctx = torch.library.get_ctx()
        t = args.x.shape[0]
        n = ctx.new_dynamic_size(min=0)
        m = ctx.new_dynamic_size(min=0, max=r * t) if isinstance(t, int) else ctx.new_dynamic_size(min=0)
    k = args.topk_idx.shape[1]
    w_dtype = args.topk_weights.dtype if args.topk_weights is not None else ABSENT
    i64 = torch.int64
    return (
        args.x.new_empty([n, args.x.shape[1]]),
        args.x.new_empty(
            [n, _scale_cols(args.x_scales)], dtype=args.x_scales.dtype if args.x_scales is not None else ABSENT
        ),
        args.x.new_empty([n, k], dtype=i64),
        args.x.new_empty([n, k if args.topk_weights is not None else 0], dtype=w_dtype),
        args.x.new_empty([args.num_experts // r], dtype=torch.int32),
        args.x.new_empty([1], dtype=i64),
        args.x.new_empty([m], dtype=i64),
        args.x.new_empty([r], dtype=i64),
        args.x.new_empty([r], dtype=i64),
        args.x.new_empty([n], dtype=i64),
        args.x.new_empty([n], dtype=i64),
        # The transport's own routing state (DeepEP's handle; empty for ours): its size is the chosen kernel's
        # business, so unbacked where a kernel may keep one.
        args.x.new_empty(
            [torch.library.get_ctx().new_dynamic_size(min=0) if dispatch_keeps_state(args.x.device) else 0],
            dtype=torch.int32,
        ),
    )


@fake
def ep_dispatch_cached(args):
    checked_size(CACHED, cached_signature, args)
    n = args.recv_gather.shape[0]
    s_dtype = args.x_scales.dtype if args.x_scales is not None else ABSENT
    return args.x.new_empty([n, args.x.shape[1]]), args.x.new_empty([n, _scale_cols(args.x_scales)], dtype=s_dtype)


@fake
def ep_combine(args):
    checked_size(COMBINE, combine_signature, args)
    k = args.topk_weights.shape[1] if args.topk_weights is not None else 0
    w_dtype = args.topk_weights.dtype if args.topk_weights is not None else ABSENT
    return args.x.new_empty([args.num_tokens, args.x.shape[1]]), args.x.new_empty([args.num_tokens, k], dtype=w_dtype)


# ---- expanded layout (DeepEP V2's do_expand) ----


@fake
def ep_expand(args):
    expand_signature(args)
    m = args.num_rows if args.num_rows > 0 else torch.library.get_ctx().new_dynamic_size(min=0)
    x, local = args.x, args.num_local_experts
    s_dtype = args.x_scales.dtype if args.x_scales is not None else ABSENT
    w = args.topk_weights
    return (
        x.new_empty([m, x.shape[1]]),
        x.new_empty([m, _scale_cols(args.x_scales)], dtype=s_dtype),
        x.new_empty([m if w is not None else 0], dtype=w.dtype if w is not None else ABSENT),
        x.new_empty(list(args.topk_idx.shape), dtype=torch.int64),
        x.new_empty([local], dtype=torch.int32),
        x.new_empty([local], dtype=torch.int32),
    )


# ---- low-latency mode ----


def keeps_backend_state(device: torch.device) -> bool:
    """Whether a low-latency dispatch on ``device`` may return a non-empty ``backend_state``: only Ascend's kernel
    does (MC2's routing state, backends/npu/ep.py); everywhere else it is empty."""
    return device_kind(device) == "npu"


def dispatch_keeps_state(device: torch.device) -> bool:
    """Whether ``ep_dispatch`` on ``device`` may return a non-empty ``backend_state``: on CUDA, where DeepEP's kernels
    may move the rows (its handle, backends/upstream/deep_ep/); our transport keeps none (empty), so a CPU or NPU
    dispatch keeps its static shapes."""
    return device_kind(device) == "cuda"


@fake
def ep_low_latency_dispatch(args):
    t_max = args.num_max_dispatch_tokens_per_rank
    r = checked_size(LL_DISPATCH, ll_dispatch_signature, args)
    local, rows, h = args.num_experts // r, r * t_max, args.x.shape[1]
    cols, s_dtype = ll_scale_shape(h, args.use_fp8, args.use_ue8m0)
    # MC2's state has a size its SoC's rules and the ranks' token counts decide at run time: unbacked there.
    state = torch.library.get_ctx().new_dynamic_size(min=0) if keeps_backend_state(args.x.device) else 0
    return (
        args.x.new_empty([local, rows, h], dtype=torch.float8_e4m3fn if args.use_fp8 else args.x.dtype),
        args.x.new_empty([local, rows, cols], dtype=s_dtype),
        args.x.new_empty([local], dtype=torch.int32),
        args.x.new_empty([local, rows], dtype=torch.int32),
        args.x.new_empty([local, r], dtype=torch.int64),
        args.x.new_empty([state], dtype=torch.int32),
    )


@fake
def ep_low_latency_combine(args):
    checked_size(LL_COMBINE, ll_combine_signature, args)
    return args.x.new_empty([args.topk_idx.shape[0], args.x.shape[2]])
