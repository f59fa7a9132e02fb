"""nn.GroupedExperts: matches a per-expert SwiGLU loop (forward and gradients), trains, compiles once."""

import pytest
import torch
import torch.nn.functional as F

from torch_ascend_moe.nn import GroupedExperts
from torch_ascend_moe.testing import calc_diff
from torch_ascend_moe.testing.moe_routing import random_topk


def _reference(experts: GroupedExperts, x, idx, weights):
    """The plain PyTorch MoE: loop over (token, choice), fp64."""
    out = torch.zeros(x.shape[0], experts.hidden_size, dtype=torch.float64)
    wgu, wd = experts.gate_up_proj.double(), experts.down_proj.double()
    for t in range(x.shape[0]):
        for j in range(idx.shape[1]):
            e = int(idx[t, j])
            if e >= 0:
                gate, up = (wgu[e] @ x[t].double()).chunk(2)
                out[t] += weights[t, j].double() * (wd[e] @ (F.silu(gate) * up))
    return out


@pytest.mark.parametrize("dtype,threshold", [(torch.float32, 1e-10), (torch.bfloat16, 1e-4)])
@pytest.mark.parametrize("alignment", [1, 8])
def test_matches_per_expert_loop_forward_and_backward(dtype, threshold, alignment):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    experts = GroupedExperts(6, 32, 24, alignment=alignment, dtype=dtype)
    x = torch.randn(11, 32, generator=g).to(dtype).requires_grad_()
    idx, weights = random_topk(11, 2, 6, g), torch.rand(11, 2, generator=g).to(dtype).requires_grad_()
    out = experts(x, idx, weights)
    ref = _reference(experts, x, idx, weights)
    assert out.dtype == dtype and calc_diff(out, ref) < threshold
    grad = torch.randn_like(out)
    out.backward(grad)
    x64 = x.detach().double().requires_grad_()
    w64 = weights.detach().double().requires_grad_()
    params = [p.detach().double().requires_grad_() for p in (experts.gate_up_proj, experts.down_proj)]
    ref_module = GroupedExperts(6, 32, 24, dtype=torch.float64)
    ref_module.gate_up_proj, ref_module.down_proj = (torch.nn.Parameter(p) for p in params)
    _reference(ref_module, x64, idx, w64).backward(grad.double())
    for got, want in [
        (x.grad, x64.grad),
        (weights.grad, w64.grad),
        (experts.gate_up_proj.grad, ref_module.gate_up_proj.grad),
        (experts.down_proj.grad, ref_module.down_proj.grad),
    ]:
        assert calc_diff(got, want) < threshold * 10


def test_trains():
    """Fits a fixed batch: the gradients through permute, both grouped GEMMs and unpermute are usable."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2)
    experts = GroupedExperts(4, 32, 16)
    x, idx = torch.randn(32, 32, generator=g), random_topk(32, 2, 4, g, drop=0.1)
    weights, target = torch.softmax(torch.randn(32, 2, generator=g), dim=-1), torch.randn(32, 32, generator=g)
    opt = torch.optim.Adam(experts.parameters(), lr=1e-2)
    losses = []
    for _ in range(100):
        loss = F.mse_loss(experts(x, idx, weights), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0], losses[::10]


def test_compiles_once_across_routings():
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    experts = GroupedExperts(8, 32, 16, alignment=4)
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(experts, fullgraph=True, backend=counter)
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        x, idx, w = torch.randn(9, 32, generator=g), random_topk(9, 2, 8, g), torch.rand(9, 2, generator=g)
        out = compiled(x, idx, w)
        torch.testing.assert_close(out, experts(x, idx, w))
        out.sum().backward()
    assert counter.frame_count == 1
