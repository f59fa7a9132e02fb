"""The ep family's argument checks. The ep ops are Python kernels over torch.distributed (no C++ kernel: their
checks are Python's alone, ``PYTHON_ONLY``); their CPU helper kernels (``ascend_moe_kernels``: the combine's
reduction, the dispatch's send plan and unpacking, DeepEP V2's handle fields) have the checks below the ops', whose
twin is ``csrc/ops/ep_checks.h`` (the same checks in the same order, the same words; tests/test_validation_twins.py
compares them).

The ops' checks take the world size ``r``: their group's, resolved first (``distributed.groups.checked_size``)."""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck

LAYOUT = "ascend_moe::ep_dispatch_layout"
DISPATCH = "ascend_moe::ep_dispatch"
CACHED = "ascend_moe::ep_dispatch_cached"
COMBINE = "ascend_moe::ep_combine"
EXPAND = "ascend_moe::ep_expand"
LL_DISPATCH = "ascend_moe::ep_low_latency_dispatch"
LL_COMBINE = "ascend_moe::ep_low_latency_combine"
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
INDEX_DTYPES = (torch.int64, torch.int32)
LL_BLOCK = 128  # the low-latency dispatch's FP8 cast granularity (channels per scale)
# An absent optional output (no scales, no weights) comes back as an empty [N, 0] placeholder of this dtype: not a
# floating output, so it never looks differentiable (kernels and fakes alike).
ABSENT = torch.int32
# Check functions of ops that no C++ kernel implements (function -> its ops): they have no C++ twin. The ep ops are
# Python kernels over torch.distributed; only their CPU helper kernels (ascend_moe_kernels, below) are C++.
PYTHON_ONLY = {
    "check_topk": (LAYOUT, DISPATCH, LL_DISPATCH),
    "layout_signature": (LAYOUT,),
    "check_rows": (DISPATCH, CACHED, EXPAND),
    "check_topk_weights": (DISPATCH, EXPAND),
    "dispatch_signature": (DISPATCH,),
    "check_handle": (CACHED, COMBINE),
    "cached_signature": (CACHED,),
    "check_backend_state": (CACHED, COMBINE, LL_COMBINE),
    "combine_signature": (COMBINE,),
    "expand_signature": (EXPAND,),
    "ll_dispatch_signature": (LL_DISPATCH,),
    "ll_combine_signature": (LL_COMBINE,),
}


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


def dispatch_signature(a, r: int) -> None:
    """Checks an ``ep_dispatch`` call over ``r`` ranks."""
    op = DISPATCH
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


def cached_signature(a, r: int) -> None:
    """Checks an ``ep_dispatch_cached`` call over ``r`` ranks."""
    op = CACHED
    check_rows(op, a.x, a.x_scales)
    check_handle(op, a.send_src, a.send_counts, a.recv_counts, a.recv_gather, r)
    ck.check_arg(a.timeout_s > 0, op, "timeout_s", "value", "a positive number of seconds", a.timeout_s)
    check_backend_state(op, a.backend_state)


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


def combine_signature(a, r: int) -> None:
    """Checks an ``ep_combine`` call over ``r`` ranks."""
    op = COMBINE
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


def ll_dispatch_signature(a, r: int) -> None:
    """Checks an ``ep_low_latency_dispatch`` call over ``r`` ranks."""
    op = LL_DISPATCH
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


def ll_combine_signature(a, r: int) -> None:
    """Checks an ``ep_low_latency_combine`` call over ``r`` ranks."""
    op = LL_COMBINE
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


# ---- the CPU helper kernels (ascend_moe_kernels; C++ twin: csrc/ops/ep_checks.h) ----

REDUCE = "ep_combine_reduce"
PLAN = "ep_dispatch_plan"
UNPACK = "ep_dispatch_unpack"
HANDLE = "elastic_handle_fields"


def combine_reduce_signature(blocks, dest, num_tokens, bias_0, bias_1, visit) -> int:
    """Checks an ``ep_combine_reduce`` call (its rows' values and ``out`` apart); returns the number of rows."""
    ck.check_arg(len(blocks) > 0, REDUCE, "rows", "length", "at least one block", 0)
    first = blocks[0]
    h = first.shape[1] if first.dim() == 2 else 0
    n = 0
    for rows in blocks:
        ck.check_rank(REDUCE, "rows", rows, 2, "[rows, hidden]")
        ck.check_arg(rows.dtype in ck.GEMM_DTYPES, REDUCE, "rows", "dtype", ck.GEMM_DTYPES_TEXT, rows.dtype)
        ck.check_arg(rows.dtype == first.dtype, REDUCE, "rows", "dtype", first.dtype, rows.dtype)
        ck.check_arg(rows.shape[1] == h, REDUCE, "rows", "size(1)", h, rows.shape[1])
        ck.check_arg(rows.shape[1] <= 1 or rows.stride(1) == 1, REDUCE, "rows", "stride(1)", 1, rows.stride(1))
        n += rows.shape[0]
    ck.check_rank(REDUCE, "dest", dest, 1, "[rows]")
    ck.check_arg(dest.dtype == torch.int64, REDUCE, "dest", "dtype", "torch.int64", dest.dtype)
    ck.check_arg(dest.shape[0] == n, REDUCE, "dest", "size(0)", n, dest.shape[0])
    ck.check_int_arg(REDUCE, "num_tokens", num_tokens, 0)
    for name, b in (("bias_0", bias_0), ("bias_1", bias_1)):
        if b is not None:
            ck.check_arg(
                b.dim() == 2 and b.shape[0] == num_tokens and b.shape[1] == h,
                REDUCE,
                name,
                "shape",
                lambda: ck.shape_str([num_tokens, h]),
                lambda b=b: ck.shape_str(b.shape),
            )
    if visit is not None:
        ck.check_rank(REDUCE, "visit", visit, 1, "[rows]")
        ck.check_arg(visit.dtype == torch.int64, REDUCE, "visit", "dtype", "torch.int64", visit.dtype)
        ck.check_arg(visit.shape[0] == n, REDUCE, "visit", "size(0)", n, visit.shape[0])
    return n


# The C++ kernel's value and ``out`` checks. The tensor-op path (CUDA / NPU) skips the value checks, as it runs
# without host syncs, and has no ``out``: these serve a Python kernel that reads its tensors on the host.


def check_visit_values(visit, n: int) -> None:
    """The visiting order's values (a kernel's check; fakes cannot see values): row indices of the n rows."""
    bad = (visit < 0) | (visit >= n)
    if bool(bad.any()):
        ck.check_arg(False, REDUCE, "visit", "values", f"row indices in [0, {n})", int(visit[bad][0]))


def check_dest_values(dest, num_tokens: int) -> None:
    """The destinations' values (a kernel's check): token indices, -1 for rows that add nowhere."""
    bad = (dest < -1) | (dest >= num_tokens)
    if bool(bad.any()):
        ck.check_arg(False, REDUCE, "dest", "values", f"token indices in [-1, {num_tokens})", int(dest[bad][0]))


def check_reduce_out(out, rows, num_tokens: int, h: int) -> None:
    """The ``.out`` overload's ``out``: contiguous ``[num_tokens, H]`` in the rows' dtype."""
    ck.check_arg(out.dtype == rows.dtype, REDUCE, "out", "dtype", rows.dtype, out.dtype)
    ck.check_arg(
        out.dim() == 2 and out.shape[0] == num_tokens and out.shape[1] == h and out.is_contiguous(),
        REDUCE,
        "out",
        "shape",
        lambda: "contiguous " + ck.shape_str([num_tokens, h]),
        lambda: ck.shape_str(out.shape),
    )


def dispatch_plan_signature(topk_idx, num_experts: int, num_ranks: int, x_scales, topk_weights) -> None:
    """Checks an ``ep_dispatch_plan`` call."""
    ck.check_rank(PLAN, "topk_idx", topk_idx, 2, "[T, K]")
    ck.check_int_arg(PLAN, "num_experts", num_experts, 1)
    ck.check_int_arg(PLAN, "num_ranks", num_ranks, 1)
    ck.check_arg(num_experts % num_ranks == 0, PLAN, "num_experts", "value", "a multiple of num_ranks", num_experts)
    ck.check_arg(
        topk_idx.dtype in INDEX_DTYPES, PLAN, "topk_idx", "dtype", "torch.int64 or torch.int32", topk_idx.dtype
    )
    if x_scales is not None:
        ck.check_rank(PLAN, "x_scales", x_scales, 2, "[T, S]")
        ck.check_arg(
            x_scales.shape[0] == topk_idx.shape[0], PLAN, "x_scales", "size(0)", topk_idx.shape[0], x_scales.shape[0]
        )
    if topk_weights is not None:
        ck.check_arg(
            topk_weights.shape == topk_idx.shape,
            PLAN,
            "topk_weights",
            "shape",
            lambda: ck.shape_str(topk_idx.shape),
            lambda: ck.shape_str(topk_weights.shape),
        )


def dispatch_unpack_signature(meta, scale_bytes: int, k: int, weight_size: int, local_experts: int, alignment: int):
    """Checks an ``ep_dispatch_unpack`` call."""
    ck.check_rank(UNPACK, "meta", meta, 2, "[N, W]")
    ck.check_arg(meta.dtype == torch.uint8, UNPACK, "meta", "dtype", "torch.uint8", meta.dtype)
    ck.check_int_arg(UNPACK, "scale_bytes", scale_bytes, 0)
    ck.check_int_arg(UNPACK, "k", k, 0)
    ck.check_int_arg(UNPACK, "weight_size", weight_size, 0)
    ck.check_int_arg(UNPACK, "local_experts", local_experts, 1)
    ck.check_int_arg(UNPACK, "alignment", alignment, 1)
    used = scale_bytes + k * 8 + k * weight_size
    width = used + (8 - used % 8) % 8 + 8
    ck.check_arg(meta.shape[1] == width, UNPACK, "meta", "size(1)", width, meta.shape[1])


def handle_fields_signature(recv_counts, recv_topk_idx, topk_idx, num_scaleup_ranks: int, local_experts: int) -> None:
    """Checks an ``elastic_handle_fields`` call."""
    ck.check_rank(HANDLE, "recv_topk_idx", recv_topk_idx, 2, "[N, K]")
    ck.check_rank(HANDLE, "topk_idx", topk_idx, 2, "[T, K]")
    ck.check_int_arg(HANDLE, "num_scaleup_ranks", num_scaleup_ranks, 1)
    ck.check_int_arg(HANDLE, "local_experts", local_experts, 1)
    ck.check_arg(
        recv_counts.numel() % num_scaleup_ranks == 0,
        HANDLE,
        "num_scaleup_ranks",
        "value",
        "a divisor of the ranks",
        recv_counts.numel(),
    )


def ll_scale_shape(h: int, use_fp8: bool, use_ue8m0: bool) -> tuple[int, torch.dtype]:
    """(columns, dtype) of a low-latency dispatch's received scales, for a hidden size ``h``: what the kernels
    allocate and the fake returns."""
    if not use_fp8:
        return 0, ABSENT
    return (h // (4 * LL_BLOCK), torch.int32) if use_ue8m0 else (h // LL_BLOCK, torch.float32)
