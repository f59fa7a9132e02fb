"""FP64 references for the MoE layer (``torch_ascend_moe.nn.MoE``): tests and the ``demo`` compare against them.

The reference takes the layer's expert choice (``topk_idx``: near-ties between FP32 and FP64 scores could
otherwise pick different experts; the choice itself is tested op by op against ``testing.moe_routing``) and
recomputes everything else in FP64 with plain loops: the gate's scores and weights, every chosen expert's
SwiGLU, the weighted sum, the shared experts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gate_weights_fp64(gate, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """The gate's weights at the chosen experts ``idx``, in FP64."""
    logits = x.double() @ gate.weight.double().T
    scores = logits.sigmoid() if gate.score_func == "sigmoid" else logits.softmax(-1)
    w = scores.gather(1, idx)
    if gate.renormalize:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return w * gate.routed_scaling_factor


def swiglu_fp64(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """One expert: ``gate_up [2I, H]`` (gate rows first), ``down [H, I]``."""
    gate, up = (x @ gate_up.double().T).chunk(2, dim=-1)
    return (F.silu(gate) * up) @ down.double().T


def moe_reference(moe, x: torch.Tensor, gate_up: torch.Tensor | None = None, down: torch.Tensor | None = None):
    """``moe(x)`` in FP64 (``x [..., H]``). ``gate_up`` / ``down`` hold every expert's weights when the layer
    holds a slice of them (expert parallelism); by default the layer's own."""
    shape = x.shape
    tokens = x.detach().reshape(-1, shape[-1]).double()
    gate_up = moe.experts.gate_up_proj if gate_up is None else gate_up
    down = moe.experts.down_proj if down is None else down
    with torch.no_grad():
        idx, _, _ = moe.gate(x.detach().reshape(-1, shape[-1]))
        weights = gate_weights_fp64(moe.gate, tokens, idx)
        out = torch.zeros_like(tokens)
        for e in range(gate_up.shape[0]):
            rows, slots = (idx == e).nonzero(as_tuple=True)
            if rows.numel():
                out.index_add_(
                    0, rows, weights[rows, slots].unsqueeze(1) * swiglu_fp64(tokens[rows], gate_up[e], down[e])
                )
        if moe.shared_experts is not None:
            s = moe.shared_experts
            hidden = F.silu(tokens @ s.gate_proj.weight.double().T) * (tokens @ s.up_proj.weight.double().T)
            out += hidden @ s.down_proj.weight.double().T
    return out.view(shape)


def ep_parity_worker(rank: int, world_size: int, store_path: str) -> None:
    """Spawned by tests/moe: an expert-parallel ``MoE`` (compact and static dispatch) and ``MegaMoE`` against the
    same layer in one process (every expert local), forward and gradients; raises on mismatch (mp.spawn reports
    it)."""
    import datetime
    import os
    import traceback

    import torch.distributed as dist

    store = dist.FileStore(store_path, world_size)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=120)
    )
    try:
        from torch_ascend_moe.nn import MegaMoE, MoE
        from torch_ascend_moe.testing import calc_diff

        config = dict(num_shared_experts=1, score_func="sigmoid", use_expert_bias=True, num_groups=2, topk_groups=1)
        torch.manual_seed(0)  # the same full layer on every rank
        full = MoE(32, 16, 4 * world_size, 2, dtype=torch.float64, **config)
        with torch.no_grad():
            full.gate.e_score_correction_bias.copy_(torch.randn(4 * world_size) * 0.01)
        for static in (None, 5 + world_size):
            ep = MoE(
                32,
                16,
                4 * world_size,
                2,
                dtype=torch.float64,
                ep_group=dist.group.WORLD,
                ep_static_tokens=static,
                **config,
            )
            ep.load_full_state_dict(full.state_dict())
            t = 5 + world_size if static else 3 + 2 * rank  # uneven token counts when compact
            x = torch.randn(t, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(10 + rank))
            x_ep, x_full = x.clone().requires_grad_(), x.clone().requires_grad_()
            y_ep, y_full = ep(x_ep), full(x_full)
            assert calc_diff(y_ep, y_full) < 1e-12, f"EP forward differs (static={static})"
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
