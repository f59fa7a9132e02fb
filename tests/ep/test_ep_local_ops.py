"""Direct checks of the ep ops a user calls by hand: ``ep_dispatch_layout`` (DeepEP's get_dispatch_layout) and
``ep_dispatch_cached`` (a handle's routing replayed with new rows), on a one-rank gloo group."""

import torch

from tests.ep.specs import init_single_rank_group
from torch_ascend_moe.ops.ep import ep_dispatch, ep_dispatch_cached, ep_dispatch_layout


def test_ep_dispatch_layout_counts_each_token_once_per_rank_and_node():
    # 16 experts on 4 ranks (4 each), 2 ranks per node; -1 slots are unrouted.
    topk_idx = torch.tensor([[0, 1, 5], [4, 12, -1], [15, 14, 13], [-1, -1, -1], [2, 9, 6]])
    per_rank, per_node, per_expert, in_rank = torch.ops.ascend_moe.ep_dispatch_layout(topk_idx, 16, 4, 2)
    expect_in_rank = torch.zeros(5, 4, dtype=torch.bool)
    for t, row in enumerate(topk_idx.tolist()):
        for e in row:
            if e >= 0:
                expect_in_rank[t, e // 4] = True
    assert torch.equal(in_rank, expect_in_rank)
    assert per_rank.tolist() == expect_in_rank.sum(0).tolist() == [2, 3, 1, 2]
    assert per_node.tolist() == [3, 3]  # a token with experts on both ranks of a node counts once there
    assert per_expert.tolist() == torch.bincount(topk_idx[topk_idx >= 0], minlength=16).tolist()
    wrapped = ep_dispatch_layout(topk_idx, 16, 4, 2)
    assert all(torch.equal(a, b) for a, b in zip(wrapped, (per_rank, per_node, per_expert, in_rank)))


def test_ep_dispatch_cached_replays_the_routing_with_new_rows():
    group = init_single_rank_group()
    g = torch.Generator().manual_seed(5)
    topk_idx = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(6)])
    x, x_new = torch.randn(6, 16, generator=g), torch.randn(6, 16, generator=g)
    first = ep_dispatch(x, topk_idx, num_experts=8, group=group)
    fresh = ep_dispatch(x_new, topk_idx, num_experts=8, group=group)
    replayed, scales = ep_dispatch_cached(x_new, first.handle)
    assert scales is None
    assert torch.equal(replayed, fresh.recv_x)
    raw, _ = torch.ops.ascend_moe.ep_dispatch_cached(x_new, None, *first.handle[:4], first.handle.group_name)
    assert torch.equal(raw, fresh.recv_x)
