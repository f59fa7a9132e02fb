"""The body each rank of tests/mega_moe's spawned expert-parallel run executes."""

from __future__ import annotations

import datetime
import os
import traceback

import torch
import torch.distributed as dist

from tests.mega_moe.specs import block_experts, fp4_experts
from torch_ascend_moe.ops.quant import quantize_fp8
from torch_ascend_moe.quant import per_token_cast_to_fp8
from torch_ascend_moe.testing import calc_diff


def ep_worker(rank: int, world_size: int, store_path: str) -> None:
    """Spawned by tests/mega_moe: expert-parallel mega_moe (BF16, FP8 x FP4, SM90's block-scaled FP8) against one
    process holding every expert: forward, recv counts, gradients (BF16)."""
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=120)
    )
    try:
        from torch_ascend_moe import mega_moe

        g = torch.Generator().manual_seed(0)  # the same full expert set (and shared experts) on every rank
        e, h, inter, k = 2 * world_size, 64, 32, 2
        l1 = (torch.randn(e, 2 * inter, h, generator=g) * h**-0.5).bfloat16()
        l2 = (torch.randn(e, h, inter, generator=g) * inter**-0.5).bfloat16()
        sl1 = (torch.randn(4 * inter, h, generator=g) * h**-0.5).bfloat16()
        sl2 = (torch.randn(h, 2 * inter, generator=g) * (2 * inter) ** -0.5).bfloat16()
        mine = slice(rank * 2, rank * 2 + 2)
        t = 5 + rank
        g = torch.Generator().manual_seed(10 + rank)
        x = torch.randn(t, h, generator=g).bfloat16()
        idx = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
        w = torch.rand(t, k, generator=g)
        for fp8 in (False, True):
            if fp8:
                xq, xsf = per_token_cast_to_fp8(x.float(), use_ue8m0=True, gran_k=32)
                (w1, s1), (w2, s2) = fp4_experts(l1), fp4_experts(l2)
                (q1, f1), (q2, f2) = (per_token_cast_to_fp8(m.float(), use_ue8m0=True, gran_k=32) for m in (sl1, sl2))
                shared = dict(shared_l1_weights=q1, shared_l1_sf=f1, shared_l2_weights=q2, shared_l2_sf=f2)
                full = mega_moe(xq, idx, w, w1, w2, x_sf=xsf, l1_sf=s1, l2_sf=s2, activation_clamp=1.0, **shared)
                ep = mega_moe(
                    xq,
                    idx,
                    w,
                    w1[mine],
                    w2[mine],
                    x_sf=xsf,
                    l1_sf=s1[mine],
                    l2_sf=s2[mine],
                    activation_clamp=1.0,
                    group=dist.group.WORLD,
                    **shared,
                )
            else:
                xg, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
                sg, se = sl1.clone().requires_grad_(), sl1.clone().requires_grad_()
                # The routed experts' weights trained too: the EP rank's local experts get every rank's rows.
                l1g, l2g = l1.clone().requires_grad_(), l2.clone().requires_grad_()
                l1e, l2e = l1[mine].clone().requires_grad_(), l2[mine].clone().requires_grad_()
                full = mega_moe(xg, idx, w, l1g, l2g, activation_clamp=1.0, shared_l1_weights=sg, shared_l2_weights=sl2)
                ep = mega_moe(
                    xe,
                    idx,
                    w,
                    l1e,
                    l2e,
                    activation_clamp=1.0,
                    group=dist.group.WORLD,
                    shared_l1_weights=se,
                    shared_l2_weights=sl2,
                )
            # One rounding of FP32 partials summed by rank instead of slot order: a few last-bit differences.
            diff = calc_diff(ep[0], full[0])
            print(f"mega_moe EP vs one process (fp8={fp8}): calc_diff {diff:.2e}", flush=True)
            assert diff < 1e-7, f"EP forward differs (fp8={fp8}): {diff}"
            counts = full[1].clone()
            dist.all_reduce(counts)
            assert torch.equal(ep[1], counts[mine]), "received pair counts differ"
            if not fp8:
                c = torch.randn(full[0].shape, generator=g).bfloat16()
                (full[0].float() * c).sum().backward()
                (ep[0].float() * c).sum().backward()
                assert calc_diff(xe.grad, xg.grad) < 1e-4, "EP input gradient differs"
                assert calc_diff(se.grad, sg.grad) < 1e-4, "EP shared-expert gradient differs"
                # A local expert's gradient sums the rows of every rank's tokens: the one-process gradients (each
                # rank's own tokens) summed over the ranks.
                for local, whole, name in ((l1e, l1g, "L1"), (l2e, l2g, "L2")):
                    summed = whole.grad.float()
                    dist.all_reduce(summed)
                    assert calc_diff(local.grad, summed[mine]) < 1e-4, f"EP {name} weight gradient differs"
        # SM90's block-scaled FP8 mode: x per 1x128 (FP32 scales travel with the rows), 128x128-block weights.
        hb, ib = 256, 128
        g = torch.Generator().manual_seed(1)
        (b1, c1), (b2, c2) = (
            block_experts(torch.randn(e, *shape, generator=g) / 16) for shape in ((2 * ib, hb), (hb, ib))
        )
        xb, xbsf = quantize_fp8(torch.randn(t, hb, generator=torch.Generator().manual_seed(20 + rank)), (1, 128))
        full = mega_moe(xb, idx, w, b1, b2, x_sf=xbsf, l1_sf=c1, l2_sf=c2, activation_clamp=2.0)
        ep = mega_moe(
            xb, idx, w, b1[mine], b2[mine], x_sf=xbsf, l1_sf=c1[mine], l2_sf=c2[mine], activation_clamp=2.0,
            group=dist.group.WORLD,
        )  # fmt: skip
        assert calc_diff(ep[0], full[0]) < 1e-7, f"EP forward differs (block-scaled): {calc_diff(ep[0], full[0])}"
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    os._exit(0)
