"""``deep_ep.utils.gate``: DeepEP V2's unbalanced gate-score generators for tests (specs/deepep_api.md §8.4),
upstream's names, signatures and algorithms.

``get_unbalanced_scores(num_tokens, num_experts, num_ranks, num_topk, ratio, precise)`` returns FP32 scores
``[num_tokens, num_experts]`` whose top-k sends rank 0 about ``ratio`` times the tokens of every other rank:
``precise`` builds the per-token rank counts explicitly (``generate_rank_count`` / ``generate_topk_idx``), otherwise
rank 0's experts get scores drawn from ``[0, factor)`` with ``factor`` found by bisection.

Upstream hard-codes ``device='cuda'``; ours draws on torch's default device (``torch.get_default_device()``), so it
runs on CPU too. The random draws are made in upstream's order with upstream's shapes and dtypes (``torch.rand``
without a dtype follows the default dtype, as upstream's does), so a seeded generator on the same device gives the
same scores.
"""

from __future__ import annotations

import torch


def _device() -> torch.device:
    return torch.get_default_device()


def generate_topk_idx(
    rank_count: torch.Tensor, num_tokens: int, num_experts: int, num_ranks: int, num_topk: int
) -> torch.Tensor:
    """Map per-token rank counts ``[num_tokens, num_ranks]`` (rows summing to ``num_topk``) to expert ids
    ``[num_tokens, num_topk]``: ``rank_count[i, r]`` distinct random experts of rank ``r`` per token."""
    if tuple(rank_count.shape) != (num_tokens, num_ranks):
        raise ValueError(
            f"deep_ep.utils.gate.generate_topk_idx: rank_count must be [{num_tokens}, {num_ranks}], "
            f"got {list(rank_count.shape)}"
        )
    if not bool((rank_count.sum(dim=1) == num_topk).all()):
        raise ValueError(f"deep_ep.utils.gate.generate_topk_idx: every row of rank_count must sum to {num_topk}")
    device = rank_count.device
    num_experts_per_rank = num_experts // num_ranks
    shape = (num_tokens, num_ranks, num_experts_per_rank)

    base_vals = torch.arange(num_experts, device=device).view(1, num_ranks, num_experts_per_rank).expand(*shape)
    # A random permutation of each rank's experts, per token: the first rank_count[i, r] of them are taken.
    perm_indices = torch.argsort(torch.rand(*shape, device=device), dim=-1)
    permuted = torch.gather(base_vals, 2, perm_indices)
    k_idx = torch.arange(num_experts_per_rank, device=device).view(1, 1, num_experts_per_rank).expand(*shape)
    mask = k_idx < rank_count.unsqueeze(2).expand(*shape)
    return permuted[mask].view(num_tokens, num_topk)


def generate_rank_count(num_tokens: int, num_experts: int, num_ranks: int, num_topk: int, ratio: float) -> torch.Tensor:
    """``[num_tokens, num_ranks]`` int32: ``[i, j]`` = how many of token ``i``'s top-k experts are on rank ``j``,
    drawn so that rank 0 (the special rank) receives ``ratio`` times the tokens of each other rank."""
    if ratio < 1.0:
        raise ValueError(f"deep_ep.utils.gate.generate_rank_count: ratio must be no less than 1.0, got {ratio}")
    device = _device()
    num_experts_per_rank = num_experts // num_ranks
    num_normal_ranks = num_ranks - 1

    # Number of distinct ranks per token under a uniform gate.
    random_scores = torch.rand(num_tokens, num_experts, device=device)
    _, topk_indices = torch.topk(random_scores, num_topk, dim=1, largest=True, sorted=False)
    topk_indices //= num_experts_per_rank
    sorted_topk_indices = torch.sort(topk_indices, dim=1)[0]
    a = (sorted_topk_indices[:, 1:] != sorted_topk_indices[:, :-1]).sum(dim=1) + 1

    # The algorithm cannot give a token more ranks than this and still keep the ratio.
    upper_bound_per_token = int(num_normal_ranks / ratio) + 1
    a = torch.clamp(a, None, upper_bound_per_token)

    # How many tokens the special rank gets.
    sum_a = torch.sum(a).item()
    normal_token_count = int(sum_a / (num_normal_ranks + ratio))
    special_token_count = sum_a - normal_token_count * num_normal_ranks
    special_token_count = min(special_token_count, int(normal_token_count * ratio) + 1)

    # Tokens on every rank must include the special one; the rest are picked at random.
    must_mask = a == num_ranks
    must_count = int(must_mask.sum().item())
    special_token_count = max(must_count, special_token_count)
    optional_token_indices = torch.where(must_mask == 0)[0]
    optional_token_indices = optional_token_indices[torch.randperm(num_tokens - must_count, device=device)][
        : special_token_count - must_count
    ]
    must_token_indices = torch.where(must_mask != 0)[0]
    special_token_row_index = torch.cat([must_token_indices, optional_token_indices])

    # Normal ranks cycle through one random permutation.
    rank_perm = (torch.randperm(num_normal_ranks, device=device) + 1).repeat(
        num_tokens * num_topk // num_normal_ranks + 1
    )

    # Row i's ranks occupy [row_starts[i], row_starts[i] + a[i]) of a flat list; special tokens start with rank 0.
    a_cumsum = torch.cumsum(torch.cat((torch.tensor([0], device=device), a)), dim=0)
    row_starts = a_cumsum[:-1]
    rank_perm_with_special_rank = torch.zeros(num_tokens * num_topk, dtype=torch.long, device=device)
    special_token_mask = torch.zeros(num_tokens * num_topk, dtype=torch.bool, device=device)
    special_token_mask[row_starts[special_token_row_index]] = 1
    non_special_indices = torch.arange(num_tokens * num_topk, device=device)[~special_token_mask]
    rank_perm_with_special_rank[non_special_indices] = rank_perm[: len(non_special_indices)]

    # Slot k of row i takes the row's (k % a[i])-th rank, so the row's ranks are reused to fill num_topk slots.
    col_idx = torch.arange(num_topk, device=device).view(1, num_topk)
    b_indices = row_starts.view(num_tokens, 1) + col_idx % a.view(num_tokens, 1)
    result = rank_perm_with_special_rank[b_indices]

    # Shuffle rows so the special tokens form no pattern.
    result = result[torch.randperm(num_tokens, device=device)]

    rank_count = torch.zeros((num_tokens, num_ranks), dtype=torch.int32, device=device)
    rank_count.scatter_add_(dim=1, index=result, src=torch.ones_like(result, dtype=torch.int32))
    return rank_count


def get_precise_unbalanced_scores(
    num_tokens: int, num_experts: int, num_ranks: int, num_topk: int, ratio: float
) -> torch.Tensor:
    """FP32 scores whose top-k follow ``generate_rank_count`` exactly: chosen experts in ``(0.9, 1)``, the rest in
    ``[0, 0.9)``. A precise ratio, not a realistic gate distribution."""
    device = _device()
    rank_count = generate_rank_count(num_tokens, num_experts, num_ranks, num_topk, ratio)
    threshold = 0.9
    scores = torch.empty((num_tokens, num_experts), dtype=torch.float32, device=device)
    scores.uniform_(to=threshold)
    topk_idx = generate_topk_idx(rank_count, num_tokens, num_experts, num_ranks, num_topk)
    topk_scores = torch.empty((num_tokens, num_topk), dtype=torch.float32, device=device)
    topk_scores.uniform_(threshold + 1e-6, 1.0)
    row_idx = torch.arange(num_tokens, device=device).unsqueeze(1).expand(num_tokens, num_topk)
    scores[row_idx, topk_idx] = topk_scores
    return scores


def get_scores_by_factor(num_tokens: int, num_experts: int, num_ranks: int, factor: float) -> torch.Tensor:
    """FP32 scores: rank 0's experts uniform in ``[0, factor)``, all others in ``[0, 1)``."""
    num_experts_per_rank = num_experts // num_ranks
    scores = torch.empty((num_tokens, num_experts), dtype=torch.float32, device=_device())
    scores[:, :num_experts_per_rank].uniform_(to=factor)
    scores[:, num_experts_per_rank:].uniform_(to=1)
    return scores


def map_unbalanced_ratio_to_factor(
    num_tokens: int, num_experts: int, num_ranks: int, num_topk: int, ratio: float
) -> float:
    """Bisect (20 steps over ``[1, 100]``) the ``factor`` of ``get_scores_by_factor`` at which rank 0's token count
    is ``ratio`` times the mean of the others; returns the lower end."""
    factor_l, factor_r = 1.0, 100.0
    num_experts_per_rank = num_experts // num_ranks
    for _ in range(20):
        factor_mid = (factor_l + factor_r) / 2
        scores = get_scores_by_factor(num_tokens, num_experts, num_ranks, factor_mid)
        _, topk_idx = torch.topk(scores, num_topk, dim=-1, largest=True, sorted=False)
        one_hot = torch.nn.functional.one_hot(topk_idx // num_experts_per_rank, num_ranks)
        counts = one_hot.any(dim=1).to(torch.float).sum(dim=0)
        if counts[0].item() > counts[1:].mean().item() * ratio:
            factor_r = factor_mid
        else:
            factor_l = factor_mid
    return factor_l


def get_random_unbalanced_scores(
    num_tokens: int, num_experts: int, num_ranks: int, num_topk: int, ratio: float
) -> torch.Tensor:
    """FP32 scores with rank 0 boosted by the factor that gives about ``ratio`` (1.0: a uniform gate)."""
    factor = 1.0
    if ratio != 1.0:
        factor = map_unbalanced_ratio_to_factor(num_tokens, num_experts, num_ranks, num_topk, ratio)
    return get_scores_by_factor(num_tokens, num_experts, num_ranks, factor)


def get_unbalanced_scores(
    num_tokens: int, num_experts: int, num_ranks: int, num_topk: int, ratio: float, precise: bool
) -> torch.Tensor:
    """FP32 ``[num_tokens, num_experts]`` gate scores with rank 0 receiving about ``ratio`` times the tokens of
    the other ranks: ``precise`` → ``get_precise_unbalanced_scores``, else ``get_random_unbalanced_scores``."""
    if precise:
        return get_precise_unbalanced_scores(num_tokens, num_experts, num_ranks, num_topk, ratio)
    return get_random_unbalanced_scores(num_tokens, num_experts, num_ranks, num_topk, ratio)


__all__ = [
    "generate_rank_count",
    "generate_topk_idx",
    "get_precise_unbalanced_scores",
    "get_random_unbalanced_scores",
    "get_scores_by_factor",
    "get_unbalanced_scores",
    "map_unbalanced_ratio_to_factor",
]
