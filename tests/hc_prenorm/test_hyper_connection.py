"""nn.HyperConnection: DeepSeek's mHC step (the ``ops.mhc`` pipeline) around a layer, its parameters and options,
training, compile."""

import pytest
import torch
import torch.nn.functional as F

from torch_ascend_moe.nn import HyperConnection
from torch_ascend_moe.ops import mhc


def test_forward_is_the_pre_and_post_steps():
    torch.manual_seed(0)
    hc = HyperConnection(32, n_hc=4, norm_weight=True)
    with torch.no_grad():
        hc.fn.normal_(std=0.05)
        hc.norm_weight.uniform_(0.5, 1.5)
    layer = torch.nn.Linear(32, 32).bfloat16()
    streams = torch.randn(5, 4, 32).bfloat16()
    layer_input, post, comb = mhc.mhc_pre(streams, hc.fn, hc.scale, hc.base, norm_weight=hc.norm_weight,
                                          post_mult_value=2.0, sinkhorn_repeat=10)  # fmt: skip
    want = mhc.mhc_post(layer(layer_input), streams, post, comb)
    assert torch.equal(hc(streams, layer), want)
    assert hc.fn.shape == (24, 128) and hc.scale.shape == (3,) and hc.base.shape == (24,)
    assert torch.allclose(comb.sum(-2), torch.ones(5, 4), atol=1e-4)  # the combination is doubly stochastic


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
    assert hc.fn.grad is not None and hc.fn.grad.abs().sum() > 0  # gradients reach the pre-norm GEMM's b
    assert hc.scale.grad is not None and hc.base.grad is not None
    assert losses[-1] < 0.5 * losses[0]
    torch._dynamo.reset()
    compiled = torch.compile(lambda s: hc(s, layer), fullgraph=True)
    streams = hc.expand(x).bfloat16().float()
    torch.testing.assert_close(compiled(streams), hc(streams, layer), rtol=1e-4, atol=1e-5)


def test_parameters_in_any_dtype_and_bad_arguments():
    """After ``model.to(dtype)`` the mixes are still computed in FP32 (FP64 for FP64 streams): a BF16 or FP64 copy
    gives the FP32 module's result up to its parameters' rounding; misuse names the module's argument."""
    torch.manual_seed(0)
    hc = HyperConnection(32, 2)
    streams = torch.randn(5, 2, 32)
    want = hc(streams, torch.tanh)
    for dtype in (torch.bfloat16, torch.float16, torch.float64):
        copy = HyperConnection(32, 2).to(dtype)
        copy.load_state_dict(hc.state_dict())
        for s_dtype in (torch.float32, torch.bfloat16, torch.float64):
            got = copy(streams.to(s_dtype), torch.tanh)
            assert got.dtype == s_dtype and (got.double() - want.double()).abs().max() < 0.05
    with pytest.raises(ValueError, match=r"HyperConnection: argument 'n_hc' value: expected a positive integer"):
        HyperConnection(32, 0)
    with pytest.raises(ValueError, match=r"HyperConnection: argument 'streams' shape: expected \[\.\.\., 2, 32\]"):
        hc(torch.randn(5, 2, 16), torch.tanh)
    with pytest.raises(ValueError, match=r"HyperConnection: argument 'layer' output shape: expected its input's"):
        hc(streams, lambda z: z[..., :16])
