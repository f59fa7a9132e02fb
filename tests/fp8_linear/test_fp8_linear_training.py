"""FP8 training: straight-through gradients of the fp8_linear ops, FP8Linear, and MLP loss curves."""

import pytest
import torch
from torch import nn

from torch_ascend_moe import fp8_linear, fp8_quant_gemm, quant
from torch_ascend_moe.nn import FP8Linear, convert_to_fp8_linear
from torch_ascend_moe.quant.reference import dequantized
from torch_ascend_moe.testing import calc_diff


def _deq_cast(x: torch.Tensor, block, use_ue8m0: bool) -> torch.Tensor:
    """fp64 value of x after the reference FP8 cast (what the op multiplies)."""
    q, sf = quant.block_cast_to_fp8(x.detach(), block, use_ue8m0)
    return dequantized(q, sf, block).double()


def _pad(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, cols, 0, rows))


def _inputs(m, n, k, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype).requires_grad_()
    bias = torch.randn(n, generator=g).to(dtype).requires_grad_()
    grad = torch.randn(m, n, generator=g).to(dtype)
    return x, w, bias, grad


@pytest.mark.parametrize("use_ue8m0", [False, True])
@pytest.mark.parametrize("m,n,k,block", [(64, 96, 256, 128), (37, 130, 128, 128), (5, 40, 96, 32)])
def test_fp8_backward_matches_its_fp64_definition(m, n, k, block, use_ue8m0):
    """dgrad = cast(grad, 1 x block) @ cast(W, block x block); wgrad = cast(grad^T) @ cast(x^T), both
    cast per channel along the (zero-padded) token axis: exactly what DeepSeek-V3's recipe specifies."""
    x, w, bias, grad = _inputs(m, n, k)
    fp8_linear(x, w, bias, block=block, use_ue8m0=use_ue8m0).backward(grad)
    pn, pm = (-n) % block, (-m) % block
    dgrad = _deq_cast(_pad(grad, 0, pn), (1, block), use_ue8m0) @ _deq_cast(_pad(w, pn, 0), (block, block), use_ue8m0)
    wgrad = (
        _deq_cast(_pad(grad, pm, 0).t(), (1, block), use_ue8m0) @ _deq_cast(_pad(x, pm, 0).t(), (1, block), use_ue8m0).T
    )
    assert calc_diff(x.grad, dgrad) < 1e-6
    assert calc_diff(w.grad, wgrad) < 1e-6
    assert calc_diff(bias.grad, grad.double().sum(0)) < 1e-10
    # And the FP8 gradients are close to the unquantized ones (DeepGEMM's FP8 x FP8 threshold).
    assert calc_diff(x.grad, grad.double() @ w.double()) < 1e-3
    assert calc_diff(w.grad, grad.double().T @ x.double()) < 1e-3


@pytest.mark.parametrize("dtype,threshold", [(torch.float32, 1e-10), (torch.bfloat16, 1e-5)])
def test_high_precision_backward_is_the_exact_ste(dtype, threshold):
    x, w, bias, grad = _inputs(33, 48, 256, dtype)
    fp8_linear(x, w, bias, fp8_backward=False).backward(grad)
    assert x.grad.dtype == w.grad.dtype == bias.grad.dtype == dtype
    assert calc_diff(x.grad, grad.double() @ w.double()) < threshold
    assert calc_diff(w.grad, grad.double().T @ x.double()) < threshold


def test_forward_error_against_the_unquantized_product():
    x, w, bias, _ = _inputs(128, 264, 512)
    out = fp8_linear(x, w, bias)
    assert calc_diff(out, x.double() @ w.double().T + bias.double()) < 1e-3


@pytest.mark.parametrize(
    "fmt,recipe_b", [(("fp8-block", 128, 128, False), [128, 128]), (("fp4", 1, 32, True), [1, 32])]
)
def test_quant_gemm_ste_gradient(fmt, recipe_b):
    from tests.fp8_gemm.specs import quantize

    x, w, _, grad = _inputs(9, 40, 256)
    b, sfb, recipe_b = quantize(w.detach(), fmt)
    c = torch.randn(9, 40, requires_grad=True)
    fp8_quant_gemm(x, b, sfb, c, recipe_b=recipe_b, alpha=0.5).backward(grad)
    assert calc_diff(x.grad, 0.5 * grad.double() @ dequantized(b, sfb, recipe_b).double()) < 1e-10
    assert torch.equal(c.grad, grad)


def test_quant_gemm_refuses_weight_grad():
    x, w, _, _ = _inputs(4, 8, 128)
    b, sfb = quant.per_block_cast_to_fp8(w.detach(), use_ue8m0=False)
    with pytest.raises(RuntimeError, match="argument 'sfb' requires grad"):
        fp8_quant_gemm(x, b, sfb.requires_grad_()).sum().backward()


# ---- nn.FP8Linear ----


def test_fp8linear_is_a_drop_in_with_linear_state_dict():
    torch.manual_seed(0)
    ref = nn.Linear(256, 64)
    layer = FP8Linear(256, 64)
    assert layer.state_dict().keys() == ref.state_dict().keys()
    layer.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 256)
    out = layer(x)
    assert out.shape == (2, 3, 64)
    assert calc_diff(out, ref(x).double()) < 1e-3
    ref.load_state_dict(layer.state_dict())  # and back
    assert "block=128" in repr(layer)
    with pytest.raises(ValueError, match="argument 'in_features': expected a multiple of block=128, got 100"):
        FP8Linear(100, 8)


def test_convert_to_fp8_linear_swaps_in_place_and_shares_parameters():
    model = nn.Sequential(nn.Linear(256, 128), nn.ReLU(), nn.Sequential(nn.Linear(128, 10), nn.Linear(10, 4)))
    weights = [model[0].weight, model[2][0].weight]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert convert_to_fp8_linear(model) is model
    assert isinstance(model[0], FP8Linear) and isinstance(model[2][0], FP8Linear)
    assert type(model[2][1]) is nn.Linear  # in_features 10 is not a multiple of the block
    assert model[0].weight is weights[0] and model[2][0].weight is weights[1]
    model(torch.randn(4, 256)).sum().backward()
    opt.step()  # the optimizer created before the swap still owns the (shared) parameters
    convert_to_fp8_linear(model, lambda name, m: name == "2.1", block=2, fp8_backward=False)
    assert isinstance(model[2][1], FP8Linear) and model[2][1].block == 2
    with pytest.raises(ValueError, match="argument 'model'"):
        convert_to_fp8_linear(nn.Linear(128, 4))


def test_fp8linear_compiles_and_exports():
    model = nn.Sequential(FP8Linear(128, 256), nn.GELU(), FP8Linear(256, 128))
    x = torch.randn(16, 128, requires_grad=True)
    compiled = torch.compile(model, fullgraph=True)
    out = compiled(x)
    torch.testing.assert_close(out, model(x))  # GELU differs by an ulp under Inductor
    out.sum().backward()
    ep = torch.export.export(model, (torch.randn(16, 128),))
    assert str(ep.graph).count("ascend_moe.fp8_linear") == 2


# ---- training ----


def _train(convert: bool, fp8_backward: bool = True, steps: int = 300) -> list[float]:
    """Fit a fixed random teacher with a 2-layer MLP; the same seed gives the same init and batches."""
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(128, 256), nn.Tanh(), nn.Linear(256, 128))
    student = nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 128))
    if convert:
        convert_to_fp8_linear(student, fp8_backward=fp8_backward)
    opt = torch.optim.AdamW(student.parameters(), lr=2e-3)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(64, 128, generator=g)
        with torch.no_grad():
            y = teacher(x)
        loss = nn.functional.mse_loss(student(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("fp8_backward", [True, False], ids=["fp8-backward", "high-precision-backward"])
def test_mlp_loss_curve_matches_nn_linear(fp8_backward):
    """Stated tolerance: the mean loss over every 50-step window stays within 5% of nn.Linear's."""
    ref, fp8 = _train(False), _train(True, fp8_backward)
    assert ref[-1] < 0.2 * ref[0]  # the task is learnt
    for start in range(0, len(ref), 50):
        r, f = sum(ref[start : start + 50]) / 50, sum(fp8[start : start + 50]) / 50
        assert abs(f - r) <= 0.05 * r, f"steps {start}..{start + 49}: FP8 mean loss {f:.5f} vs nn.Linear {r:.5f}"
