"""The fp8_gemm family's autograd: c gets the incoming gradient; a scale that requires grad is refused by name."""

import pytest
import torch

import torch_ascend_moe  # noqa: F401  (registers the ops)


def _operands():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(4, 128, generator=g).to(torch.float8_e4m3fn)
    b = torch.randn(8, 128, generator=g).to(torch.float8_e4m3fn)
    return a, torch.rand(4, 1, generator=g) + 0.5, b, torch.rand(1, 1, generator=g) + 0.5


def test_c_gets_the_gradient_and_nothing_else():
    a, sfa, b, sfb = _operands()
    c = torch.randn(4, 8, requires_grad=True)
    out = torch.ops.ascend_moe.fp8_gemm(a, sfa, b, sfb, c, [1, 128], [128, 128], 1.0, torch.float32)
    grad = torch.randn_like(out)
    (gc,) = torch.autograd.grad(out, c, grad)
    assert torch.equal(gc, grad)


@pytest.mark.parametrize("scale", ["sfa", "sfb"])
def test_a_scale_that_requires_grad_is_refused_by_name(scale):
    a, sfa, b, sfb = _operands()
    scales = {"sfa": sfa, "sfb": sfb}
    scales[scale].requires_grad_(True)
    out = torch.ops.ascend_moe.fp8_gemm(a, scales["sfa"], b, scales["sfb"], None, [1, 128], [128, 128], 1.0, None)
    with pytest.raises(RuntimeError, match=f"ascend_moe::fp8_gemm: argument '{scale}' requires grad"):
        out.float().sum().backward()
    batched = [t.unsqueeze(0) for t in (a, scales["sfa"], b, scales["sfb"])]
    out = torch.ops.ascend_moe.fp8_bmm(*batched, None, [1, 128], [128, 128], 1.0, None)
    with pytest.raises(RuntimeError, match=f"ascend_moe::fp8_bmm: argument '{scale}' requires grad"):
        out.float().sum().backward()
