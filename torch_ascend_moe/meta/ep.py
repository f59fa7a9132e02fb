"""Fakes of the ep family (expert-parallel dispatch / combine) and the validation its kernels share.

Shapes follow DeepEP V1 (specs/deepep_api.md §3-§5). The group is named by ``group_name`` and resolved
locally (no communication), so fakes know the world size. A compact dispatch (``num_worst_tokens == 0``)
receives a data-dependent number of rows: its fake returns unbacked sizes. A static one returns exactly
``num_worst_tokens`` rows and sends ``R * T`` (padded) rows: every shape is static.
"""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck
from torch_ascend_moe._registry import device_kind, fake
from torch_ascend_moe.distributed.groups import resolve_group

LAYOUT = "ascend_moe::ep_dispatch_layout"
DISPATCH = "ascend_moe::ep_dispatch"
CACHED = "ascend_moe::ep_dispatch_cached"
COMBINE = "ascend_moe::ep_combine"
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
INDEX_DTYPES = (torch.int64, torch.int32)
ABSENT = torch.int32  # dtype of the empty [N, 0] placeholder of an absent optional output (never differentiable)


def check_topk(op: str, topk_idx, num_experts, num_ranks, x=None) -> None:
    ck.check_rank(op, "topk_idx", topk_idx, 2, "[T, K]")
    ck.check_arg(topk_idx.dtype in INDEX_DTYPES, op, "topk_idx", "dtype", "torch.int64 or torch.int32", topk_idx.dtype)
    ck.check_int_arg(op, "num_experts", num_experts, 1)
    ck.check_arg(
        num_experts % num_ranks == 0,
        op,
        "num_experts",
        "value",
        lambda: f"a multiple of the number of ranks ({num_ranks})",
        num_experts,
    )
    if x is not None:
        ck.check_dim_size(op, "topk_idx", topk_idx, 0, "T", x.shape[0], "x.size(0)")


def layout_signature(topk_idx, num_experts, num_ranks, ranks_per_node) -> None:
    ck.check_int_arg(LAYOUT, "num_ranks", num_ranks, 1)
    ck.check_int_arg(LAYOUT, "ranks_per_node", ranks_per_node, 1)
    check_topk(LAYOUT, topk_idx, num_experts, num_ranks)


def check_rows(op: str, x, x_scales, name: str = "x") -> None:
    """x ``[T, H]`` high precision, or FP8 E4M3 with its scales ``[T, S]`` (FP32 or int32-packed UE8M0)."""
    ck.check_rank(op, name, x, 2, "[T, H]")
    fp8 = x.dtype == torch.float8_e4m3fn
    ck.check_arg(
        x.dtype in FLOAT_DTYPES or fp8,
        op,
        name,
        "dtype",
        "torch.bfloat16, torch.float16, torch.float32, torch.float64 or torch.float8_e4m3fn",
        x.dtype,
    )
    if not fp8:
        ck.check_arg(x_scales is None, op, f"{name}_scales", "value", f"None for a {x.dtype} {name}", "a tensor")
        return
    ck.check_arg(x_scales is not None, op, f"{name}_scales", "value", "the FP8 rows' scales [T, S]", None)
    ck.check_rank(op, f"{name}_scales", x_scales, 2, "[T, S]")
    ck.check_arg(
        x_scales.dtype in (torch.float32, torch.int32),
        op,
        f"{name}_scales",
        "dtype",
        "torch.float32 or torch.int32 (packed UE8M0)",
        x_scales.dtype,
    )
    ck.check_dim_size(op, f"{name}_scales", x_scales, 0, "T", x.shape[0], f"{name}.size(0)")


def check_topk_weights(op: str, topk_weights, topk_idx) -> None:
    """Optional routing weights: FP32/FP64, shaped like ``topk_idx``."""
    if topk_weights is None:
        return
    ck.check_arg(
        topk_weights.dtype in (torch.float32, torch.float64),
        op,
        "topk_weights",
        "dtype",
        "torch.float32 or torch.float64",
        topk_weights.dtype,
    )
    ck.check_arg(
        topk_weights.shape == topk_idx.shape,
        op,
        "topk_weights",
        "shape",
        lambda: f"{ck.shape_str(topk_idx.shape)} (topk_idx's)",
        lambda: ck.shape_str(topk_weights.shape),
    )


def dispatch_signature(a):
    """Returns the world size R."""
    op = DISPATCH
    group = resolve_group(op, a.group_name)
    r = group.size()
    check_rows(op, a.x, a.x_scales)
    check_topk(op, a.topk_idx, a.num_experts, r, a.x)
    check_topk_weights(op, a.topk_weights, a.topk_idx)
    ck.check_int_arg(op, "expert_alignment", a.expert_alignment, 1)
    ck.check_arg(
        a.num_worst_tokens >= 0,
        op,
        "num_worst_tokens",
        "value",
        "0 (exact rows) or a positive capacity",
        a.num_worst_tokens,
    )
    ck.check_arg(
        a.num_worst_tokens <= ck.MAX_INT_ARG, op, "num_worst_tokens", "value", ck.MAX_INT_ARG_TEXT, a.num_worst_tokens
    )
    ck.check_arg(a.timeout_s > 0, op, "timeout_s", "value", "a positive number of seconds", a.timeout_s)
    return r


def check_handle(op: str, send_src, send_counts, recv_counts, recv_gather, r) -> None:
    for name, t, rank in (
        ("send_src", send_src, 1),
        ("send_counts", send_counts, 1),
        ("recv_counts", recv_counts, 1),
        ("recv_gather", recv_gather, 1),
    ):
        ck.check_rank(op, name, t, rank, "1-D (a dispatch handle's)")
        ck.check_arg(t.dtype == torch.int64, op, name, "dtype", "torch.int64", t.dtype)
    ck.check_dim_size(op, "send_counts", send_counts, 0, "ranks", r, "the group's size")
    ck.check_dim_size(op, "recv_counts", recv_counts, 0, "ranks", r, "the group's size")


def cached_signature(a):
    op = CACHED
    r = resolve_group(op, a.group_name).size()
    check_rows(op, a.x, a.x_scales)
    check_handle(op, a.send_src, a.send_counts, a.recv_counts, a.recv_gather, r)
    ck.check_arg(a.timeout_s > 0, op, "timeout_s", "value", "a positive number of seconds", a.timeout_s)
    check_backend_state(op, a.backend_state)
    return r


def check_backend_state(op: str, state) -> None:
    """A dispatch's ``backend_state`` handed back (None: the handle has none)."""
    if state is not None:
        ck.check_arg(
            state.dim() == 1 and state.dtype == torch.int32,
            op,
            "backend_state",
            "layout",
            "a 1-D torch.int32 tensor (the dispatch's backend_state)",
            lambda: f"{state.dim()}-D {state.dtype}",
        )


def combine_signature(a):
    op = COMBINE
    r = resolve_group(op, a.group_name).size()
    ck.check_rank(op, "x", a.x, 2, "[N, H] (rows in the dispatch's receive order)")
    ck.check_arg(
        a.x.dtype in FLOAT_DTYPES,
        op,
        "x",
        "dtype",
        "torch.bfloat16, torch.float16, torch.float32 or torch.float64 (FP8 rows are not combined)",
        a.x.dtype,
    )
    check_handle(op, a.send_src, a.send_counts, a.recv_counts, a.recv_gather, r)
    ck.check_dim_size(op, "x", a.x, 0, "N", a.recv_gather.shape[0], "the handle's received rows")
    ck.check_int_arg(op, "num_tokens", a.num_tokens, 0)
    if a.topk_weights is not None:
        ck.check_rank(op, "topk_weights", a.topk_weights, 2, "[N, K]")
        ck.check_arg(
            a.topk_weights.dtype in (torch.float32, torch.float64),
            op,
            "topk_weights",
            "dtype",
            "torch.float32 or torch.float64",
            a.topk_weights.dtype,
        )
        ck.check_dim_size(op, "topk_weights", a.topk_weights, 0, "N", a.x.shape[0], "x.size(0)")
    for name, b in (("bias_0", a.bias_0), ("bias_1", a.bias_1)):
        if b is not None:
            ck.check_arg(
                b.dim() == 2 and b.shape[0] == a.num_tokens and b.shape[1] == a.x.shape[1],
                op,
                name,
                "shape",
                lambda: ck.shape_str([a.num_tokens, a.x.shape[1]]) + " (num_tokens, H)",
                lambda b=b: ck.shape_str(b.shape),
            )
    ck.check_arg(a.timeout_s > 0, op, "timeout_s", "value", "a positive number of seconds", a.timeout_s)
    if a.copy_order is not None:
        ck.check_arg(
            a.copy_order.dtype in INDEX_DTYPES,
            op,
            "copy_order",
            "dtype",
            "torch.int64 or torch.int32",
            a.copy_order.dtype,
        )
        ck.check_arg(
            a.copy_order.dim() == 2 and a.copy_order.shape[0] == a.num_tokens and a.copy_order.shape[1] == r,
            op,
            "copy_order",
            "shape",
            lambda: ck.shape_str([a.num_tokens, r]) + " (num_tokens, ranks)",
            lambda: ck.shape_str(a.copy_order.shape),
        )
    check_backend_state(op, a.backend_state)
    return r


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
    r = dispatch_signature(args)
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
    cached_signature(args)
    n = args.recv_gather.shape[0]
    s_dtype = args.x_scales.dtype if args.x_scales is not None else ABSENT
    return args.x.new_empty([n, args.x.shape[1]]), args.x.new_empty([n, _scale_cols(args.x_scales)], dtype=s_dtype)


@fake
def ep_combine(args):
    combine_signature(args)
    k = args.topk_weights.shape[1] if args.topk_weights is not None else 0
    w_dtype = args.topk_weights.dtype if args.topk_weights is not None else ABSENT
    return args.x.new_empty([args.num_tokens, args.x.shape[1]]), args.x.new_empty([args.num_tokens, k], dtype=w_dtype)


# ---- expanded layout (DeepEP V2's do_expand) ----

EXPAND = "ascend_moe::ep_expand"


def expand_signature(a) -> None:
    op = EXPAND
    check_rows(op, a.x, a.x_scales)
    ck.check_rank(op, "topk_idx", a.topk_idx, 2, "[N, K]")
    ck.check_arg(
        a.topk_idx.dtype in INDEX_DTYPES, op, "topk_idx", "dtype", "torch.int64 or torch.int32", a.topk_idx.dtype
    )
    ck.check_dim_size(op, "topk_idx", a.topk_idx, 0, "N", a.x.shape[0], "x.size(0)")
    check_topk_weights(op, a.topk_weights, a.topk_idx)
    for name, t in (("x_scales", a.x_scales), ("topk_idx", a.topk_idx), ("topk_weights", a.topk_weights)):
        if t is not None:  # a meta tensor beside a real x would give uninitialized outputs
            ck.check_arg(t.device == a.x.device, op, name, "device", lambda: f"{a.x.device} (same as 'x')", t.device)
    ck.check_int_arg(op, "num_local_experts", a.num_local_experts, 1)
    ck.check_int_arg(op, "expert_alignment", a.expert_alignment, 1)
    ck.check_int_arg(op, "num_rows", a.num_rows, 0)


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

LL_DISPATCH = "ascend_moe::ep_low_latency_dispatch"
LL_COMBINE = "ascend_moe::ep_low_latency_combine"
LL_BLOCK = 128  # FP8 cast granularity (channels per scale)


def ll_dispatch_signature(a):
    """Returns the world size R."""
    op = LL_DISPATCH
    r = resolve_group(op, a.group_name).size()
    ck.check_rank(op, "x", a.x, 2, "[T, H]")
    ck.check_arg(
        a.x.dtype in FLOAT_DTYPES,
        op,
        "x",
        "dtype",
        "torch.bfloat16, torch.float16, torch.float32 or torch.float64 (the op casts to FP8 itself)",
        a.x.dtype,
    )
    check_topk(op, a.topk_idx, a.num_experts, r, a.x)
    ck.check_int_arg(op, "num_max_dispatch_tokens_per_rank", a.num_max_dispatch_tokens_per_rank, 1)
    ck.check_arg(
        a.x.shape[0] <= a.num_max_dispatch_tokens_per_rank,
        op,
        "x",
        "size(0) (T)",
        lambda: f"at most num_max_dispatch_tokens_per_rank={a.num_max_dispatch_tokens_per_rank}",
        lambda: a.x.shape[0],
    )
    if a.use_fp8:
        ck.check_arg(
            a.x.shape[1] % (4 * LL_BLOCK if a.use_ue8m0 else LL_BLOCK) == 0,
            op,
            "x",
            "size(1) (H)",
            "a multiple of 512 (UE8M0 scales)" if a.use_ue8m0 else "a multiple of 128 (FP8 cast)",
            lambda: a.x.shape[1],
        )
    ck.check_arg(not a.use_ue8m0 or a.round_scale, op, "use_ue8m0", "value", "False unless round_scale", a.use_ue8m0)
    if a.slot_weights is not None:
        ck.check_arg(
            not a.use_fp8,
            op,
            "slot_weights",
            "value",
            "None with use_fp8 (weighted messages stay high precision)",
            "a tensor",
        )
        ck.check_arg(
            a.slot_weights.shape == a.topk_idx.shape,
            op,
            "slot_weights",
            "shape",
            lambda: f"{ck.shape_str(a.topk_idx.shape)} (topk_idx's)",
            lambda: ck.shape_str(a.slot_weights.shape),
        )
    ck.check_arg(a.timeout_s > 0, op, "timeout_s", "value", "a positive number of seconds", a.timeout_s)
    return r


def ll_scale_shape(h, use_fp8, use_ue8m0):
    """(columns, dtype) of the received scales."""
    if not use_fp8:
        return 0, ABSENT
    return (h // (4 * LL_BLOCK), torch.int32) if use_ue8m0 else (h // LL_BLOCK, torch.float32)


def ll_combine_signature(a):
    op = LL_COMBINE
    r = resolve_group(op, a.group_name).size()
    ck.check_int_arg(op, "num_max_dispatch_tokens_per_rank", a.num_max_dispatch_tokens_per_rank, 1)
    ck.check_rank(op, "x", a.x, 3, "[L, R * T_max, H] (expert outputs in the dispatch layout)")
    ck.check_arg(
        a.x.dtype in FLOAT_DTYPES,
        op,
        "x",
        "dtype",
        "torch.bfloat16, torch.float16, torch.float32 or torch.float64",
        a.x.dtype,
    )
    ck.check_arg(
        a.x.shape[1] == r * a.num_max_dispatch_tokens_per_rank,
        op,
        "x",
        "size(1)",
        lambda: f"{r * a.num_max_dispatch_tokens_per_rank} (R * T_max)",
        lambda: a.x.shape[1],
    )
    ck.check_rank(op, "topk_idx", a.topk_idx, 2, "[T, K] (this rank's original routing)")
    ck.check_arg(
        a.topk_weights.shape == a.topk_idx.shape,
        op,
        "topk_weights",
        "shape",
        lambda: f"{ck.shape_str(a.topk_idx.shape)} (topk_idx's)",
        lambda: ck.shape_str(a.topk_weights.shape),
    )
    ck.check_arg(
        a.topk_idx.shape[0] <= a.num_max_dispatch_tokens_per_rank,
        op,
        "topk_idx",
        "size(0) (T)",
        lambda: f"at most num_max_dispatch_tokens_per_rank={a.num_max_dispatch_tokens_per_rank}",
        lambda: a.topk_idx.shape[0],
    )
    ck.check_arg(
        a.src_info.shape == a.x.shape[:2] and a.layout_range.shape[0] == a.x.shape[0] and a.layout_range.shape[1] == r,
        op,
        "src_info",
        "shape",
        lambda: (
            f"src_info {ck.shape_str(a.x.shape[:2])} and layout_range {ck.shape_str([a.x.shape[0], r])} (the "
            "dispatch's handle)"
        ),
        lambda: f"{ck.shape_str(a.src_info.shape)} and {ck.shape_str(a.layout_range.shape)}",
    )
    ck.check_arg(a.timeout_s > 0, op, "timeout_s", "value", "a positive number of seconds", a.timeout_s)
    check_backend_state(op, a.backend_state)
    return r


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
    r = ll_dispatch_signature(args)
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
    ll_combine_signature(args)
    return args.x.new_empty([args.topk_idx.shape[0], args.x.shape[2]])
