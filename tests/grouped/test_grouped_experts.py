"""nn.GroupedExperts: matches a per-expert SwiGLU loop (forward and gradients), trains, compiles once."""

import pytest
import torch
import torch.nn.functional as F

from tests.moe_routing.specs import random_topk
from torch_ascend_moe.nn import GroupedExperts
from torch_ascend_moe.testing import calc_diff


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


def test_fp8_experts_track_the_bf16_ones_and_train():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(4)
    ref = GroupedExperts(4, 128, 128)
    fp8 = GroupedExperts(4, 128, 128, fp8=True)
    fp8.load_state_dict(ref.state_dict())  # same parameters, same keys
    x, idx = torch.randn(24, 128, generator=g), random_topk(24, 2, 4, g)
    w = torch.rand(24, 2, generator=g)
    out_ref, out_fp8 = ref(x, idx, w), fp8(x, idx, w)
    assert calc_diff(out_fp8, out_ref.double()) < 2e-3  # two FP8 GEMMs in a row
    grad = torch.randn_like(out_ref)
    out_ref.backward(grad)
    out_fp8.backward(grad)
    for p_ref, p_fp8 in zip(ref.parameters(), fp8.parameters()):
        assert calc_diff(p_fp8.grad, p_ref.grad.double()) < 5e-3
    target = torch.randn(24, 128, generator=g)
    opt = torch.optim.Adam(fp8.parameters(), lr=1e-2)
    losses = []
    for _ in range(60):
        loss = F.mse_loss(fp8(x, idx, w), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.3 * losses[0], losses[::10]


def test_fp8_experts_any_size():
    """Ragged hidden / intermediate sizes: m_grouped_fp8_linear zero-pads K to the block (exact), so the FP8
    experts track the BF16 ones as at multiples of 128 (they raised before)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(5)
    ref, fp8 = GroupedExperts(4, 96, 72), GroupedExperts(4, 96, 72, fp8=True)
    fp8.load_state_dict(ref.state_dict())
    x, idx, w = torch.randn(24, 96, generator=g), random_topk(24, 2, 4, g), torch.rand(24, 2, generator=g)
    out = fp8(x, idx, w)
    assert calc_diff(out, ref(x, idx, w).double()) < 2e-3
    out.sum().backward()
    assert fp8.gate_up_proj.grad.shape == (4, 144, 96) and fp8.down_proj.grad.abs().sum() > 0


@pytest.mark.parametrize("fp8_backward", [True, False])
def test_fp8_linear_experts_straight_through_gradients(fp8_backward):
    """dx = dD @ deq(cast(W[g])) per the recipe (FP8: dD cast per token too); dW = dD^T x exactly."""
    from tests.grouped.specs import psum_layout
    from torch_ascend_moe import m_grouped_fp8_linear, quant
    from torch_ascend_moe.quant.reference import dequantized

    g = torch.Generator().manual_seed(5)
    layout, rows = psum_layout([7, 0, 12], 4)
    x = torch.randn(rows, 256, generator=g).requires_grad_()
    w = (torch.randn(3, 40, 256, generator=g) / 16).requires_grad_()
    grad = torch.randn(rows, 40, generator=g)
    m_grouped_fp8_linear(x, w, layout, alignment=4, fp8_backward=fp8_backward).backward(grad)
    gx, gw = torch.zeros(rows, 256, dtype=torch.float64), torch.zeros(3, 40, 256, dtype=torch.float64)
    for grp, (s, e) in enumerate([(0, 7), (8, 8), (8, 20)]):
        gd = grad[s:e]
        if fp8_backward:
            pad = (-40) % 128
            q, sf = quant.block_cast_to_fp8(F.pad(gd, (0, pad)), (1, 128), False)
            wq, ws = quant.block_cast_to_fp8(F.pad(w[grp].detach(), (0, 0, 0, pad)), (128, 128), False)
            gx[s:e] = dequantized(q, sf, (1, 128)).double() @ dequantized(wq, ws, (128, 128)).double()
        else:
            gx[s:e] = gd.double() @ w[grp].double()
        gw[grp] = gd.double().T @ x[s:e].double()
    assert calc_diff(x.grad, gx) < 1e-6
    assert calc_diff(w.grad, gw) < 1e-10
