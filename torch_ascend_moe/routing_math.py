"""Plain-torch routing math shared by every layer: the ops' wrappers, the portable kernels and the tests' references
(gate scores, stable top-k, TileKernels' EP/TP expert mask). Below ``ops/`` and ``backends/``: it imports torch only,
so any of them may use it without reaching into another layer."""

from __future__ import annotations

import torch


def gate_scores(logits: torch.Tensor, scoring_func: str) -> torch.Tensor:
    """The unbiased gate scores ``u`` of ``logits [T, E]`` (``'sigmoid'``, ``'sqrtsoftplus'``, ``'identity'``, else
    softmax over the experts), in the logits' dtype.

    >>> gate_scores(torch.zeros(1, 2), "softmax").tolist()
    [[0.5, 0.5]]
    """
    if scoring_func == "sigmoid":
        return torch.sigmoid(logits)
    if scoring_func == "sqrtsoftplus":
        return torch.nn.functional.softplus(logits).sqrt()
    if scoring_func == "identity":  # DeepGEMM 2.8's Mega Gate: the logits themselves
        return logits.clone()
    return torch.softmax(logits, dim=-1)


def stable_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """int64 ``[T, k]``: the columns of each row's ``k`` largest of ``scores [T, N]``, descending, ties to the lower
    column (a view of the sort's indices).

    >>> stable_topk(torch.tensor([[1.0, 3.0, 3.0, 0.0]]), 2).tolist()
    [[1, 2]]
    """
    return torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k]


def tp_masked(idx: torch.Tensor, per_rank: int, tp_rank: int, num_tp_ranks: int) -> torch.Tensor:
    """TileKernels' EP/TP mask: index ``(d·num_tp + r)·per_rank + j`` is kept iff ``r == tp_rank`` and becomes
    ``d·per_rank + j``; every other index (and -1) is -1.

    >>> tp_masked(torch.tensor([[0, 1, 2, 3, -1]]), 1, 1, 2).tolist()
    [[-1, 0, -1, 1, -1]]
    """
    per_dp = per_rank * num_tp_ranks
    valid = idx >= 0
    rank = torch.where(valid, idx // per_rank, 0)
    keep = valid & (rank % num_tp_ranks == tp_rank)
    local = idx - tp_rank * per_rank
    remapped = local - torch.where(keep, local // per_dp, 0) * (per_dp - per_rank)
    return torch.where(keep & (remapped >= 0), remapped, -1)
