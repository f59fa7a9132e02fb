"""The body each rank of tests/moe's spawned expert-parallel run executes."""

from __future__ import annotations

import datetime
import os
import traceback

import torch
import torch.distributed as dist

from torch_ascend_moe.testing import calc_diff


def ep_parity_worker(rank: int, world_size: int, store_path: str) -> None:
    """Spawned by tests/moe: an expert-parallel ``MoE`` (compact and static dispatch) and ``MegaMoE`` against the
    same layer in one process (every expert local), forward and gradients; raises on mismatch (mp.spawn reports
    it)."""
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=120)
    )
    try:
        from torch_ascend_moe.nn import MegaMoE, MoE

        config = dict(num_shared_experts=1, score_func="sigmoid", use_expert_bias=True, num_groups=2, topk_groups=1)
        torch.manual_seed(0)  # the same full layer on every rank
        full = MoE(32, 16, 4 * world_size, 2, dtype=torch.float64, **config)
        with torch.no_grad():
            full.gate.e_score_correction_bias.copy_(torch.randn(4 * world_size) * 0.01)
        modes = [
            (static, expand, align) for static in (None, 5 + world_size) for expand, align in ((False, 1), (True, 4))
        ]
        for static, expand, align in modes:
            ep = MoE(
                32,
                16,
                4 * world_size,
                2,
                dtype=torch.float64,
                ep_group=dist.group.WORLD,
                ep_static_tokens=static,
                ep_expand=expand,
                ep_alignment=align,
                **config,
            )
            ep.load_full_state_dict(full.state_dict())
            t = 5 + world_size if static else 3 + 2 * rank  # uneven token counts when compact
            x = torch.randn(t, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(10 + rank))
            x_ep, x_full = x.clone().requires_grad_(), x.clone().requires_grad_()
            y_ep, y_full = ep(x_ep), full(x_full)
            assert calc_diff(y_ep, y_full) < 1e-12, f"EP forward differs (static={static}, expand={expand})"
            c = torch.randn(y_full.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(20 + rank))
            (y_ep * c).sum().backward()
            (y_full * c).sum().backward()
            assert calc_diff(x_ep.grad, x_full.grad) < 1e-12, "EP input gradient differs"
            # Expert gradients: this rank's slice of the full layer's (summed over every rank's tokens).
            local = ep.experts.gate_up_proj.shape[0]
            full_grad = full.experts.gate_up_proj.grad.clone()
            dist.all_reduce(full_grad)
            mine = full_grad[rank * local : (rank + 1) * local]
            ep_grad = ep.experts.gate_up_proj.grad
            assert calc_diff(ep_grad, mine) < 1e-12, "EP expert gradient differs"
            full.zero_grad()
        # MegaMoE: routed and shared experts in one mega_moe call, expert-parallel inside the op (one rounding of
        # FP32 partials summed by rank rather than in slot order: equal up to a few last bits).
        mega_full = MegaMoE(32, 16, 4 * world_size, 2, dtype=torch.float64, **config)
        mega_full.load_state_dict(full.state_dict())
        mega_ep = MegaMoE(32, 16, 4 * world_size, 2, dtype=torch.float64, ep_group=dist.group.WORLD, **config)
        mega_ep.load_full_state_dict(full.state_dict())
        assert mega_ep._fused_shared(), "MegaMoE did not fuse its shared experts"
        x = torch.randn(3 + 2 * rank, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(30 + rank))
        x_ep, x_full = x.clone().requires_grad_(), x.clone().requires_grad_()
        y_ep, y_full = mega_ep(x_ep), mega_full(x_full)
        assert calc_diff(y_ep, y_full) < 1e-7, "EP MegaMoE forward differs"
        y_ep.sum().backward()
        y_full.sum().backward()
        assert calc_diff(x_ep.grad, x_full.grad) < 1e-4, "EP MegaMoE input gradient differs"
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    os._exit(0)
