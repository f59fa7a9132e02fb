"""Sample inputs, reference, bad inputs and the harness spec of ``moe_topk_gate``.

Configurations from TileKernels' own test (no groups with 16..144 experts; 8 groups of 256 keeping 8 or 4; one or two
shared experts as routed slots through a 32-column physical map; EP 4 × TP 2, scaling 1.5; masked rows; fixed
routing; every scoring function), scaled to a few dozen tokens, plus the Ascend-era form (image bias,
``clamp_denominator=False``). The reference walks token by token through the spec's steps (§3.3), ranking on the
FP32 scores (what every kernel ranks) and forming the weights in FP64.
"""

from __future__ import annotations

import math

import torch

from torch_ascend_moe.backends.portable import moe_gate as portable
from torch_ascend_moe.routing_math import gate_scores
from torch_ascend_moe.testing.harness import BadInput, OpSpec, SampleInput

# (groups, topk groups, experts, shared, topk, scoring, extras)
_CASES = [
    (0, 0, 72, 1, 6, "sigmoid", {"mask": True, "tp_rank": 1}),
    (0, 0, 32, 2, 6, "sqrtsoftplus", {"fix": True}),
    (8, 4, 256, 2, 8, "softmax", {"mask": True}),
    (8, 8, 256, 0, 8, "sigmoid", {"image": True, "clamp": False}),
    (0, 0, 16, 0, 6, "sqrtsoftplus", {"no_bias": True, "clamp": False}),
    (0, 0, 64, 2, 6, "identity", {"mask": True, "clamp": False}),  # DeepGEMM 2.8's Mega Gate scoring
]
_CASES_SMALL = [
    (4, 2, 16, 0, 3, "sigmoid", {}),
    (0, 0, 12, 2, 4, "softmax", {"mask": True}),
    (0, 0, 8, 0, 3, "sqrtsoftplus", {"fix": True}),
    (0, 0, 8, 1, 2, "identity", {"clamp": False}),
]
EXTRA_EXPERTS = 32


def gate_call(logits, bias, topk, groups, topk_groups, scoring, shared, g, **extras) -> tuple:
    """The op's positional arguments for one configuration."""
    T, E = logits.shape
    mask = fix = unmapped = physical = count = image_bias = image_mask = None
    if extras.get("mask"):
        mask = torch.rand(T, generator=g) > 0.3
    if extras.get("fix"):
        fix = torch.rand(T, generator=g) > 0.5
        unmapped = torch.randint(0, E, (T, topk), generator=g)
    if shared:  # every logical expert has its replicas; some more than one, at random columns
        physical = torch.randint(0, E + EXTRA_EXPERTS, (E + shared, EXTRA_EXPERTS + 1), generator=g, dtype=torch.int32)
        count = torch.randint(1, 4, (E + shared,), generator=g, dtype=torch.int32)
    if extras.get("image"):
        image_bias = torch.randn(E, generator=g, dtype=logits.dtype)
        image_mask = torch.rand(T, generator=g) > 0.5
    ep_ranks, tp_ranks = (4, 2) if shared or extras.get("tp_rank") is not None else (1, 1)
    return (
        logits, None if extras.get("no_bias") else bias, topk, groups, topk_groups, scoring, 1.5, shared, mask, fix,
        unmapped, physical, count, 0, ep_ranks, extras.get("tp_rank", 0), tp_ranks, image_bias, image_mask,
        extras.get("clamp", True),
    )  # fmt: skip


def samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(31)
    out = []
    for groups, topk_groups, E, shared, topk, scoring, extras in _CASES_SMALL if small else _CASES:
        T = 7 if small else 37
        logits = torch.randn(T, E, generator=g, dtype=torch.float64).to(dtype)
        bias = torch.randn(E, generator=g, dtype=torch.float64).to(dtype) * 0.1
        args = gate_call(logits, bias, topk, groups, topk_groups, scoring, shared, g, **extras)
        args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)
        args = (args[0].requires_grad_(requires_grad),) + args[1:]
        out.append(SampleInput(args, f"G{groups}/{topk_groups} E{E} S{shared} k{topk} {scoring} {sorted(extras)}"))
    return out


def _score(x: float, scoring: str) -> float:
    if scoring == "sigmoid":
        return 1 / (1 + math.exp(-x))
    if scoring == "identity":
        return x
    return math.sqrt(x if x > 20 else math.log1p(math.exp(x)))


def reference(logits, bias, topk, groups, topk_groups, scoring, scale, shared, mask, fix, unmapped_in, physical,
              count, ep_rank, ep_ranks, tp_rank, tp_ranks, image_bias, image_mask, clamp):  # fmt: skip
    T, E = logits.shape
    u32 = gate_scores(logits.detach(), scoring)  # ranking happens on the kernel's scores
    extra = 0 if physical is None else physical.shape[1] - 1
    per_rank = (E + extra) // ep_ranks
    idx_out = torch.full((T, topk + shared), -1, dtype=torch.int64)
    w_out = torch.zeros(T, topk + shared, dtype=torch.float64)
    unmapped = torch.full((T, topk), -1, dtype=torch.int64)
    scores = torch.zeros(T, E, dtype=torch.float64)
    for t in range(T):
        if mask is not None and not mask[t]:
            continue
        row = logits[t].detach().double().tolist()
        if scoring == "softmax":
            peak = max(row)
            exps = [math.exp(x - peak) for x in row]
            u = [e / sum(exps) for e in exps]
        else:
            u = [_score(x, scoring) for x in row]
        scores[t] = torch.tensor(u)
        b = [0.0] * E if bias is None else bias.tolist()
        if image_bias is not None and image_mask[t]:
            b = image_bias.tolist()
        base = logits[t].tolist() if scoring == "softmax" else u32[t].tolist()
        rank = [base[e] + b[e] for e in range(E)]
        if groups != topk_groups:
            size = E // groups
            group_score = [sum(sorted(rank[i * size : (i + 1) * size])[-2:]) for i in range(groups)]
            best = sorted(range(groups), key=lambda i: (-group_score[i], i))[:topk_groups]
            rank = [r if e // size in best else -math.inf for e, r in enumerate(rank)]
        chosen = sorted(range(E), key=lambda e: (-rank[e], e))[:topk]
        if fix is not None and fix[t]:
            chosen = unmapped_in[t].tolist()
        unmapped[t] = torch.tensor(chosen)
        s = [u[max(e, 0)] for e in chosen]
        total = sum(s)
        denominator = max(total, 1e-20) if clamp else total + 1e-20
        weights = [x / denominator * scale for x in s] + [1.0] * shared
        slots = chosen + list(range(E, E + shared))
        for j, e in enumerate(slots):
            if e >= 0 and physical is not None:
                e = int(physical[e, (ep_rank + t * 23333) % int(count[e])])
            if e >= 0:
                d, rest = divmod(e, per_rank * tp_ranks)
                r, jj = divmod(rest, per_rank)
                e = d * per_rank + jj if r == tp_rank else -1
            idx_out[t, j], w_out[t, j] = e, weights[j]
    return w_out, idx_out, unmapped, scores


def bad_inputs(device) -> list[BadInput]:
    g = torch.Generator().manual_seed(0)
    logits, bias = torch.randn(4, 16, generator=g), torch.randn(16, generator=g)

    def call(**kw):
        names = ["logits", "bias", "num_topk", "num_groups", "num_topk_groups", "scoring_func",
                 "routed_scaling_factor", "num_shared_experts", "mask", "fix_routing_mask", "unmapped_topk_idx",
                 "to_physical_map", "logical_count", "ep_rank", "num_ep_ranks", "tp_rank", "num_tp_ranks",
                 "image_bias", "image_token_mask", "clamp_denominator"]  # fmt: skip
        values = [logits, bias, 4, 0, 0, "sigmoid", 1.0, 0, None, None, None, None, None, 0, 1, 0, 1, None, None, True]
        args = dict(zip(names, values))
        args.update(kw)
        return tuple(args.values())

    inf = logits.clone()
    inf[2, 5] = float("inf")
    return [
        BadInput(
            call(logits=logits.half()), r"argument 'logits' dtype: expected torch.float32 or torch.float64", "dtype"
        ),
        BadInput(call(bias=bias[:8]), r"argument 'bias' size\(0\) \(E\): expected 16", "bias size"),
        BadInput(call(num_topk=17), r"argument 'num_topk' value: expected at most E=16", "topk > E"),
        BadInput(
            call(num_groups=4), r"argument 'num_topk_groups' value: expected 0 exactly when num_groups is 0", "groups"
        ),
        BadInput(
            call(num_groups=3, num_topk_groups=2), r"argument 'num_groups' value: expected a divisor of E=16", "E % G"
        ),
        BadInput(
            call(scoring_func="tanh"),
            r"argument 'scoring_func' value: expected 'sigmoid', 'sqrtsoftplus', 'softmax' or 'identity'",
            "scoring",
        ),
        BadInput(
            call(num_shared_experts=1),
            r"argument 'num_shared_experts' value: expected at most to_physical_map",
            "shared",
        ),
        BadInput(
            call(fix_routing_mask=torch.ones(4, dtype=torch.bool)),
            r"argument 'unmapped_topk_idx' presence: expected given with 'fix_routing_mask'",
            "fix without idx",
        ),
        BadInput(
            call(logical_count=torch.ones(16, dtype=torch.int32)), r"argument 'logical_count' presence", "map pair"
        ),
        BadInput(call(tp_rank=2, num_tp_ranks=2), r"argument 'tp_rank' value: expected in \[0, 2\), got 2", "tp rank"),
        BadInput(
            call(logits=inf),
            r"argument 'logits' values: expected finite on routed rows, got inf at logits\[2, 5\]",
            "inf logits",
            data_dependent=True,
        ),
        BadInput(
            call(fix_routing_mask=torch.ones(4, dtype=torch.bool), unmapped_topk_idx=torch.full((4, 4), 16)),
            r"argument 'unmapped_topk_idx' values: expected in \[-1, E=16\) on fix_routing_mask rows",
            "fixed idx",
            data_dependent=True,
        ),
    ]


SPECS = [
    OpSpec(
        "moe_topk_gate",
        samples,
        reference,
        bad_inputs,
        portable.moe_topk_gate,
        dtypes=(torch.float32,),
    )
]
