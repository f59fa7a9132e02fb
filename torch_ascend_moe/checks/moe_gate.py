"""The moe_gate family's argument and value checks (``moe_topk_gate``). Twin: ``csrc/ops/moe_gate_checks.h`` (the same
checks in the same order, the same words; tests/test_validation_twins.py compares them)."""

from __future__ import annotations

import dataclasses

import torch

from torch_ascend_moe import checks as ck

OP = "ascend_moe::moe_topk_gate"
SCORING = ("sigmoid", "sqrtsoftplus", "softmax", "identity")  # identity: DeepGEMM 2.8's Mega Gate
GROUP_SUM_TOPK = 2  # a group's score: the sum of its two best ranking scores (DeepSeek-V3's rule)
DUPLICATE_HASH = 23333  # the redundant-expert choice: (ep_rank + token * 23333) % logical_count[expert]


@dataclasses.dataclass
class GateShapes:
    T: object
    E: object
    slots: int  # num_topk + num_shared_experts
    extra: int  # physical duplicates per logical expert beyond the first (to_physical_map's columns - 1)


def _vector(name, t, length, source, dtype, ref) -> None:
    if t is None:
        return
    ck.check_rank(OP, name, t, 1, f"[{source}]")
    ck.check_arg(t.dtype == dtype, OP, name, "dtype", dtype, t.dtype)
    ck.check_arg(t.device == ref.device, OP, name, "device", lambda: f"{ref.device} (same as 'logits')", t.device)
    ck.check_dim_size(OP, name, t, 0, source, length, "logits" if source != "E + S" else "E + num_shared_experts")


def _both_or_neither(a, a_name: str, b, b_name: str) -> None:
    ck.check_arg(
        (a is None) == (b is None),
        OP,
        b_name,
        "presence",
        f"given together with '{a_name}'",
        "None" if b is None else "a tensor",
    )


def moe_topk_gate_signature(args) -> GateShapes:
    """Checks the arguments (``args``: the op's arguments by name)."""
    logits = args.logits
    ck.check_rank(OP, "logits", logits, 2, "[T, E]")
    ck.check_arg(
        logits.dtype in (torch.float32, torch.float64),
        OP,
        "logits",
        "dtype",
        "torch.float32 or torch.float64",
        logits.dtype,
    )
    T, E = logits.shape
    _vector("bias", args.bias, E, "E", logits.dtype, logits)
    ck.check_int_arg(OP, "num_topk", args.num_topk, 1)
    ck.check_arg(
        args.num_topk <= E, OP, "num_topk", "value", lambda: f"at most E={ck._text(E)} (logits.size(1))", args.num_topk
    )
    groups, topk_groups = args.num_groups, args.num_topk_groups
    ck.check_int_arg(OP, "num_groups", groups, 0)
    ck.check_int_arg(OP, "num_topk_groups", topk_groups, 0)
    ck.check_arg(
        (groups == 0) == (topk_groups == 0),
        OP,
        "num_topk_groups",
        "value",
        "0 exactly when num_groups is 0",
        topk_groups,
    )
    ck.check_arg(topk_groups <= groups, OP, "num_topk_groups", "value", f"at most num_groups={groups}", topk_groups)
    if groups:
        ck.check_arg(E % groups == 0, OP, "num_groups", "value", lambda: f"a divisor of E={ck._text(E)}", groups)
        if topk_groups != groups:
            ck.check_arg(
                E // groups >= GROUP_SUM_TOPK,
                OP,
                "num_groups",
                "value",
                lambda: f"at most E/2={ck._text(E // 2)} (a group's score sums its top 2)",
                groups,
            )
    ck.check_arg(
        args.scoring_func in SCORING,
        OP,
        "scoring_func",
        "value",
        "'sigmoid', 'sqrtsoftplus', 'softmax' or 'identity'",
        repr(args.scoring_func),
    )
    shared = args.num_shared_experts
    ck.check_arg(shared in (0, 1, 2), OP, "num_shared_experts", "value", "0, 1 or 2", shared)
    _vector("mask", args.mask, T, "T", torch.bool, logits)
    _vector("fix_routing_mask", args.fix_routing_mask, T, "T", torch.bool, logits)
    if args.fix_routing_mask is not None:
        ck.check_arg(
            args.unmapped_topk_idx is not None,
            OP,
            "unmapped_topk_idx",
            "presence",
            "given with 'fix_routing_mask'",
            "None",
        )
    unmapped = args.unmapped_topk_idx
    if unmapped is not None:
        ck.check_rank(OP, "unmapped_topk_idx", unmapped, 2, "[T, num_topk]")
        ck.check_arg(unmapped.dtype == torch.int64, OP, "unmapped_topk_idx", "dtype", torch.int64, unmapped.dtype)
        ck.check_arg(
            tuple(unmapped.shape) == (T, args.num_topk),
            OP,
            "unmapped_topk_idx",
            "shape",
            lambda: ck.shape_str([T, args.num_topk]),
            lambda: ck.shape_str(unmapped.shape),
        )
    _both_or_neither(args.to_physical_map, "to_physical_map", args.logical_count, "logical_count")
    extra = 0
    physical = args.to_physical_map
    if physical is not None:
        ck.check_rank(OP, "to_physical_map", physical, 2, "[E + num_shared_experts, duplicates + 1]")
        ck.check_arg(physical.dtype == torch.int32, OP, "to_physical_map", "dtype", torch.int32, physical.dtype)
        ck.check_dim_size(OP, "to_physical_map", physical, 0, "E + S", E + shared, "E + num_shared_experts")
        _vector("logical_count", args.logical_count, E + shared, "E + S", torch.int32, logits)
        extra = physical.shape[1] - 1
    ck.check_arg(
        shared <= extra,
        OP,
        "num_shared_experts",
        "value",
        f"at most to_physical_map.size(1) - 1 = {extra} (shared experts live in the physical extra slots)",
        shared,
    )
    ck.check_int_arg(OP, "num_ep_ranks", args.num_ep_ranks, 1)
    ck.check_arg(
        args.num_ep_ranks <= E + extra,
        OP,
        "num_ep_ranks",
        "value",
        lambda: f"at most E + duplicates = {ck._text(E + extra)} (every rank holds an expert)",
        args.num_ep_ranks,
    )
    ck.check_int_arg(OP, "num_tp_ranks", args.num_tp_ranks, 1)
    ck.check_arg(
        0 <= args.ep_rank < args.num_ep_ranks, OP, "ep_rank", "value", f"in [0, {args.num_ep_ranks})", args.ep_rank
    )
    ck.check_arg(
        0 <= args.tp_rank < args.num_tp_ranks, OP, "tp_rank", "value", f"in [0, {args.num_tp_ranks})", args.tp_rank
    )
    _both_or_neither(args.image_bias, "image_bias", args.image_token_mask, "image_token_mask")
    _vector("image_bias", args.image_bias, E, "E", logits.dtype, logits)
    _vector("image_token_mask", args.image_token_mask, T, "T", torch.bool, logits)
    return GateShapes(T, E, args.num_topk + shared, extra)


def check_values(args, active: torch.Tensor) -> None:
    """The kernel's checks of values (fakes cannot see them): finite logits on routed rows, fixed indices in
    ``[-1, E)``, duplicate counts in ``[1, duplicates + 1]``."""
    logits, E = args.logits, args.logits.shape[1]
    bad = (~torch.isfinite(logits) & active[:, None]).nonzero()
    if bad.numel():
        t, e = bad[0].tolist()
        ck.check_arg(
            False, OP, "logits", "values", "finite on routed rows", f"{float(logits[t, e])} at logits[{t}, {e}]"
        )
    if args.fix_routing_mask is not None:
        fixed = args.unmapped_topk_idx[args.fix_routing_mask & active]
        ck.check_arg(
            bool(((fixed >= -1) & (fixed < E)).all()),
            OP,
            "unmapped_topk_idx",
            "values",
            f"in [-1, E={E}) on fix_routing_mask rows",
            lambda: f"min {int(fixed.min())}, max {int(fixed.max())}",
        )
    if args.logical_count is not None:
        count, limit = args.logical_count, args.to_physical_map.shape[1]
        ck.check_arg(
            bool(((count >= 1) & (count <= limit)).all()),
            OP,
            "logical_count",
            "values",
            f"in [1, {limit}] (to_physical_map.size(1))",
            lambda: f"min {int(count.min())}, max {int(count.max())}",
        )
