"""nn.HyperConnection: the pre-norm identity, doubly stochastic mixing, gradients, training, compile."""

import torch
import torch.nn.functional as F

from torch_ascend_moe.nn import HyperConnection, sinkhorn
from torch_ascend_moe.quant import round_to_tf32


def test_sinkhorn_is_doubly_stochastic():
    p = sinkhorn(torch.randn(7, 4, 4, generator=torch.Generator().manual_seed(0)), 50)
    torch.testing.assert_close(p.sum(-2), torch.ones(7, 4), atol=1e-5, rtol=0)  # the last step: exact
    torch.testing.assert_close(p.sum(-1), torch.ones(7, 4), atol=1e-3, rtol=0)  # converged
    assert (p > 0).all()


def test_coefficients_match_an_explicit_rmsnorm_projection():
    torch.manual_seed(0)
    hc = HyperConnection(32, n_hc=4)
    with torch.no_grad():
        hc.proj.normal_()
    streams = torch.randn(5, 4, 32)
    pre, post, res = hc.coefficients(streams)
    flat = streams.reshape(5, 128)
    logits = F.rms_norm(flat, (128,), eps=hc.eps) @ round_to_tf32(hc.proj.detach()).T + hc.bias.detach()
    torch.testing.assert_close(pre, torch.sigmoid(logits[:, :4]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(post, 2 * torch.sigmoid(logits[:, 4:8]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(res, sinkhorn(logits[:, 8:].view(5, 4, 4), hc.sinkhorn_iterations), rtol=1e-4, atol=1e-5)


def test_trains_and_compiles():
    torch.manual_seed(0)
    hc, layer = HyperConnection(32, n_hc=4), torch.nn.Linear(32, 32)
    x, target = torch.randn(16, 32), torch.randn(16, 32)
    opt = torch.optim.Adam([*hc.parameters(), *layer.parameters()], lr=1e-2)
    losses = []
    for _ in range(80):
        out = hc(hc.expand(x), layer).mean(1)
        loss = F.mse_loss(out, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert hc.proj.grad is not None and hc.proj.grad.abs().sum() > 0  # gradients reach the pre-norm GEMM's b
    assert losses[-1] < 0.5 * losses[0]
    torch._dynamo.reset()
    compiled = torch.compile(lambda s: hc(s, layer), fullgraph=True)
    streams = hc.expand(x).bfloat16().float()
    torch.testing.assert_close(compiled(streams), hc(streams, layer), rtol=1e-4, atol=1e-5)
