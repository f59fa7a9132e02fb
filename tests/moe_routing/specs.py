"""Sample inputs, references, bad inputs and harness specs of the moe_routing family.

Routings include unrouted pairs (-1, as DeepEP marks experts of other ranks), experts nobody chose,
alignment padding and int32/int64 ids. The permute reference is a plain loop over (token, choice) pairs.
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.portable import moe_routing as portable
from torch_ascend_moe.checks.moe_routing import permute_capacity
from torch_ascend_moe.testing.harness import BadInput, OpSpec, SampleInput


def random_topk(tokens: int, topk: int, experts: int, generator: torch.Generator, drop: float = 0.2) -> torch.Tensor:
    """Distinct experts per token (as a router's top-k), some pairs dropped to -1."""
    scores = torch.rand(tokens, experts, generator=generator)
    idx = scores.topk(topk, dim=1).indices
    dropped = torch.rand(tokens, topk, generator=generator) < drop
    return torch.where(dropped, -1, idx)


# (T, H, k, E, alignment, id dtype)
_PERMUTE_CASES = [(9, 16, 2, 4, 1, torch.int64), (13, 24, 3, 6, 4, torch.int32), (1, 8, 1, 3, 8, torch.int64)]
_PERMUTE_CASES_SMALL = [(4, 3, 2, 3, 1, torch.int64), (5, 2, 2, 4, 2, torch.int32)]


def permute_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(30)
    samples = []
    for t, h, k, e, alignment, id_dtype in _PERMUTE_CASES_SMALL if small else _PERMUTE_CASES:
        x = torch.randn(t, h, generator=g).to(dtype).to(device).requires_grad_(requires_grad)
        idx = random_topk(t, k, e, g).to(id_dtype).to(device)
        samples.append(SampleInput((x, idx, e, alignment), f"T{t} H{h} k{k} E{e} align={alignment} {id_dtype}"))
    return samples


def permute_reference(x, topk_idx, num_experts, alignment):
    t, k = topk_idx.shape
    pairs = [(int(topk_idx[i, j]), i, j) for i in range(t) for j in range(k) if int(topk_idx[i, j]) >= 0]
    out = torch.zeros(permute_capacity(t, k, num_experts, alignment), x.shape[1], dtype=torch.float64)
    row_map = torch.full((t, k), -1, dtype=torch.int32)
    offs, end = [], 0
    for expert in range(num_experts):
        row = -(-end // alignment) * alignment
        for e, i, j in pairs:
            if e == expert:
                out[row] = x[i].detach().double()
                row_map[i, j] = row
                row += 1
        end = row
        offs.append(end)
    return out, row_map, torch.tensor(offs, dtype=torch.int32)


def permute_bad_inputs(device) -> list[BadInput]:
    x, idx = torch.randn(4, 8), torch.tensor([[0, 1], [2, -1], [1, 0], [2, 2]])
    return [
        BadInput((x, idx.float(), 3, 1), r"argument 'topk_idx' dtype: expected torch.int32 or torch.int64", "dtype"),
        BadInput((x, idx[:3], 3, 1), r"argument 'topk_idx' size\(0\) \(T\): expected 4", "T"),
        BadInput((x, idx, 0, 1), r"argument 'num_experts' value", "E"),
        BadInput((x, idx, 3, 0), r"argument 'alignment' value", "alignment"),
        BadInput(
            (x, idx, 2, 1),
            r"argument .topk_idx. values: expected expert ids in \[-1, 2\).*got topk_idx\[1, 0\] = 2",
            "id >= E",
            data_dependent=True,
        ),
    ]


def unpermute_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(31)
    samples = []
    for i, (t, h, k, e, alignment, _) in enumerate(_PERMUTE_CASES_SMALL if small else _PERMUTE_CASES):
        idx = random_topk(t, k, e, g)
        _, row_map, _ = portable.moe_permute(torch.zeros(t, 1), idx, e, alignment)
        y = torch.randn(permute_capacity(t, k, e, alignment), h, generator=g).to(dtype).to(device)
        w = torch.rand(t, k, generator=g).to(dtype).to(device) if i % 2 == 0 else None
        # A residual / shared-expert output as the bias on every other case (with and without weights).
        bias = torch.randn(t, h, generator=g).to(dtype).to(device) if i % 3 != 2 and i > 0 else None
        for x in (y, w, bias):
            if x is not None:
                x.requires_grad_(requires_grad)
        name = f"T{t} H{h} k{k} E{e}{' weighted' if w is not None else ''}{' bias' if bias is not None else ''}"
        samples.append(SampleInput((y, row_map.to(device), w, bias), name))
    return samples


def unpermute_reference(y, row_map, topk_weights, bias=None):
    out = torch.zeros(row_map.shape[0], y.shape[1], dtype=torch.float64)
    if bias is not None:
        out += bias.detach().double()
    for t in range(row_map.shape[0]):
        for j in range(row_map.shape[1]):
            r = int(row_map[t, j])
            if r >= 0:
                w = 1.0 if topk_weights is None else float(topk_weights[t, j])
                out[t] += w * y[r].detach().double()
    return out


def unpermute_bad_inputs(device) -> list[BadInput]:
    y, rm, w = torch.randn(6, 4), torch.tensor([[0, 1], [2, -1]], dtype=torch.int32), torch.rand(2, 2)
    return [
        BadInput((y, rm.long(), w), r"argument 'row_map' dtype: expected torch.int32", "dtype"),
        BadInput((y, rm, w[:1]), r"argument 'topk_weights' shape: expected \[2, 2\] \(row_map's shape\)", "w shape"),
        BadInput((y[0], rm, w), r"argument 'y' rank: expected 2-D", "rank"),
        BadInput(
            (y, rm, w, torch.randn(2, 3)),
            r"argument 'bias' shape: expected \[2, 4\] \(row_map.size\(0\), y.size\(1\)\), got \[2, 3\]",
            "bias shape",
        ),
        BadInput(
            (y, rm, w, torch.ones(2, 4, dtype=torch.int32)),
            r"argument 'bias' dtype: expected one of torch.bfloat16, .*got torch.int32",
            "bias dtype",
        ),
        BadInput(
            (y, rm + 5, w),
            r"argument 'row_map' values: expected rows of y in \[-1, 6\) \(-1 = not routed\), got row_map\[0, 1\] = 6",
            "row >= R",
            data_dependent=True,
        ),
    ]


# (T, E, topk, score_func, bias, num_groups, topk_groups, renormalize, scale): Mixtral (softmax top-2,
# renormalized), Qwen-MoE without renormalization, DeepSeek-V3 (sigmoid, bias, 4 groups keep 2, scaled 2.5),
# sigmoid groups without bias (group score = best expert), and exact ties (integer logits).
_GATING_CASES = [
    (7, 8, 2, "softmax", False, 1, 1, True, 1.0),
    (5, 6, 3, "softmax", False, 1, 1, False, 1.0),
    (9, 16, 4, "sigmoid", True, 4, 2, True, 2.5),
    (6, 12, 3, "sigmoid", False, 3, 2, False, 1.0),
    (4, 8, 3, "softmax", False, 2, 2, True, 1.0),
    (0, 8, 2, "sigmoid", True, 2, 1, True, 1.0),
    # topk above the kept groups' experts (4 kept of 8, top-6): all four, then the two best others
    (5, 8, 6, "sigmoid", True, 4, 2, True, 1.0),
]


def gating_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(32)
    samples = []
    for i, (t, e, k, func, with_bias, groups, kept, renorm, scale) in enumerate(_GATING_CASES):
        if small and i == 4:  # ties: the choice flips under gradcheck's perturbations (no derivative there)
            continue
        if i == 4:  # exact ties: equal logits must resolve to the lower expert index everywhere
            logits = torch.randint(0, 3, (t, e), generator=g).double()
        else:  # distinct ranks 0.25 apart plus noise: no near-ties, so fp32 and fp64 choose alike
            logits = torch.stack([torch.randperm(e, generator=g) for _ in range(t)]).double() * 0.25 if t else None
            logits = torch.zeros(0, e, dtype=torch.float64) if logits is None else logits
            logits = logits + torch.rand(t, e, generator=g, dtype=torch.float64) * 0.01 - 1.0
        logits = logits.to(dtype).to(device).requires_grad_(requires_grad)
        bias_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        bias = (torch.randn(e, generator=g) * 0.02).to(bias_dtype).to(device) if with_bias else None
        samples.append(
            SampleInput(
                (logits, k, bias, func, groups, kept, renorm, scale),
                f"T{t} E{e} top-{k} {func}{' bias' if with_bias else ''} groups {kept}/{groups} renorm={renorm}",
            )
        )
    return samples


def gating_reference(
    logits,
    topk,
    bias,
    score_func,
    num_groups,
    topk_groups,
    renormalize,
    routed_scaling_factor,
):
    """Token by token in fp64, with sorted() on (-value, index) keys: best first, ties to the lower index."""
    t, e = logits.shape
    size = e // num_groups
    idx = torch.zeros(t, topk, dtype=torch.int64)
    weights = torch.zeros(t, topk, dtype=torch.float64)
    for i in range(t):
        row = logits[i].detach().double()
        scores = row.sigmoid() if score_func == "sigmoid" else row.softmax(0)
        choice = [float(scores[j]) + (float(bias[j]) if bias is not None else 0.0) for j in range(e)]
        eligible = list(range(e))
        if num_groups > 1:
            group_scores = []
            for grp in range(num_groups):
                members = sorted(choice[grp * size : (grp + 1) * size], reverse=True)
                group_scores.append(sum(members[:2]) if bias is not None else members[0])
            kept = sorted(range(num_groups), key=lambda grp: (-group_scores[grp], grp))[:topk_groups]
            eligible = [j for j in range(e) if j // size in kept]
        # The kept groups' experts first, then the others; each best first, ties to the lower index.
        chosen = sorted(range(e), key=lambda j: (j not in eligible, -choice[j], j))[:topk]
        w = torch.tensor([float(scores[j]) for j in chosen], dtype=torch.float64)
        if renormalize:
            w = w / (w.sum() + 1e-20)
        idx[i] = torch.tensor(chosen)
        weights[i] = w * routed_scaling_factor
    return weights, idx


def gating_bad_inputs(device) -> list[BadInput]:
    logits, bias = torch.randn(4, 8), torch.zeros(8)
    return [
        BadInput(
            (logits, 2, None, "relu", 1, 1, True, 1.0), r"argument 'score_func' value: expected 'softmax' or", "fn"
        ),
        BadInput((logits, 9, None, "softmax", 1, 1, True, 1.0), r"argument 'topk' value: expected in \[1, 8\]", "k>E"),
        BadInput((logits, 0, None, "softmax", 1, 1, True, 1.0), r"argument 'topk' value: expected in \[1, 8\]", "k=0"),
        BadInput(
            (logits, 2, None, "sigmoid", 3, 1, True, 1.0),
            r"argument 'num_groups' value: expected a positive divisor of the expert count 8, got 3",
            "groups",
        ),
        BadInput(
            (logits, 2, None, "sigmoid", 4, 5, True, 1.0),
            r"argument 'topk_groups' value: expected in \[1, num_groups=4\]",
            "kept",
        ),
        BadInput(
            (logits, 2, bias[:4], "sigmoid", 1, 1, True, 1.0), r"argument 'bias' size\(0\) \(E\): expected 8", "bias E"
        ),
        BadInput(
            (logits, 2, bias.half(), "sigmoid", 1, 1, True, 1.0),
            r"argument 'bias' dtype: expected torch.float32",
            "bias dtype",
        ),
        BadInput((logits.int(), 2, None, "softmax", 1, 1, True, 1.0), r"argument 'logits' dtype: expected", "dtype"),
        BadInput((logits[0], 2, None, "softmax", 1, 1, True, 1.0), r"argument 'logits' rank: expected 2-D", "rank"),
    ]


SPECS = [
    OpSpec("moe_permute", permute_samples, permute_reference, permute_bad_inputs, portable.moe_permute),
    OpSpec("moe_unpermute", unpermute_samples, unpermute_reference, unpermute_bad_inputs, portable.moe_unpermute),
    OpSpec("moe_gating_topk", gating_samples, gating_reference, gating_bad_inputs, portable.moe_gating_topk),
]
