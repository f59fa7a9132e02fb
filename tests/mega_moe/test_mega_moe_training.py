"""mega_moe's eager training path (autograd/mega_moe.py ``_Taped``): the pipeline recorded once in the forward,
its tape replayed in the backward, against the traced path (the op as one node, the backward recomputing the
pipeline): the same output and gradients bit for bit, the same output as a call without autograd, and a tape that
keeps BF16 ``h`` rather than FP32 intermediates."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.mega_moe.specs import GRAD_POSITIONS, samples

mega_moe = torch.ops.ascend_moe.mega_moe


class _Traced(TorchDispatchMode):
    """A dispatch mode that changes nothing but makes a call a traced one for ``_registry.autograd``: the op stays a
    leaf and its backward recomputes."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _bf16_cases():
    return [i for i, s in enumerate(samples("cpu", torch.bfloat16)) if s.args[0].dtype == torch.bfloat16]


def _run(case: int, traced: bool, wanted=GRAD_POSITIONS):
    args = list(samples("cpu", torch.bfloat16)[case].args)
    for i in wanted:
        if args[i] is not None:
            args[i] = args[i].clone().requires_grad_()
    grad_y = torch.randn(args[0].shape, generator=torch.Generator().manual_seed(case)).bfloat16()
    if traced:
        with _Traced():
            y, counts = mega_moe(*args)
    else:
        y, counts = mega_moe(*args)
    y.backward(grad_y)
    return y, counts, [args[i].grad for i in wanted if args[i] is not None]


@pytest.mark.parametrize("case", _bf16_cases())
def test_eager_tape_equals_the_traced_recompute(case):
    y, counts, grads = _run(case, traced=False)
    y_ref, counts_ref, grads_ref = _run(case, traced=True)
    assert y.grad_fn is not None and type(y.grad_fn).__name__ == "_TapedBackward"
    assert torch.equal(y, y_ref) and torch.equal(counts, counts_ref)
    assert len(grads) == len(grads_ref)
    for g, r in zip(grads, grads_ref):
        assert torch.equal(g, r)


@pytest.mark.parametrize("wanted", [(0,), (4, 6), (3,)], ids=["x", "weights", "topk_weights"])
def test_only_the_wanted_gradients(wanted):
    _, _, grads = _run(1, traced=False, wanted=wanted)
    _, _, grads_ref = _run(1, traced=True, wanted=wanted)
    for g, r in zip(grads, grads_ref):
        assert torch.equal(g, r)


@pytest.mark.parametrize("case", _bf16_cases())
def test_recording_does_not_change_the_output(case):
    args = samples("cpu", torch.bfloat16, requires_grad=True)[case].args
    y, _ = mega_moe(*args)
    with torch.no_grad():
        y0, _ = mega_moe(*args)
    assert torch.equal(y.detach(), y0)


def test_a_second_backward_needs_retain_graph():
    args = samples("cpu", torch.bfloat16, requires_grad=True)[1].args
    y, _ = mega_moe(*args)
    y.float().sum().backward(retain_graph=True)
    first = args[0].grad.clone()
    y.float().sum().backward()
    torch.testing.assert_close(args[0].grad, 2 * first)
    with pytest.raises(RuntimeError, match="mega_moe: trying to backward through the graph a second time"):
        y.float().sum().backward()


def test_the_tape_keeps_no_fp32_intermediates():
    """What autograd saves for the backward: BF16 ``h`` and the routing weights, not ``gate``, ``silu(gate)``, ``up``
    and their product in FP32 (``[pairs, I]`` each)."""
    args = samples("cpu", torch.bfloat16, requires_grad=True)[1].args
    x, l1 = args[0], args[4]
    rows, inter = args[2].numel(), l1.shape[1] // 2  # one permuted row per (token, slot)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        mega_moe(*args)
    wide_fp32 = [t for t in saved if t.dtype == torch.float32 and t.dim() == 2 and t.shape[-1] >= inter]
    assert wide_fp32 == [], [tuple(t.shape) for t in wide_fp32]
    assert any(t.dtype == torch.bfloat16 and tuple(t.shape) == (rows, 2 * inter) for t in saved)
    assert x.requires_grad


@pytest.mark.parametrize("native", [True, False], ids=["C++ loops", "ATen blocks"])
@pytest.mark.parametrize("block", [None, 256], ids=["one block", "blocks of 256"])
@pytest.mark.parametrize("clamp", [None, 3.0, 3.012], ids=["no clamp", "clamp 3", "clamp 3.012 (BF16 3.015625)"])
def test_kept_activation_is_autograds_formula_bit_for_bit_on_hostile_values(clamp, block, native, monkeypatch):
    """``_KeptActivation`` (in-place products, halves rounded straight into the result, the clamp's mask; on CPU the
    C++ loops of csrc/ops/mega_moe_cpu.cpp, else ATen row blocks) against autograd recording ``_activation``: NaN,
    infinities, huge values and signed zeros in ``h`` give the same bits, in one block or many; a clamp bound that
    BF16 cannot hold is used as torch uses it (its BF16 value)."""
    from torch_ascend_moe.backends.portable import mega_moe as portable
    from torch_ascend_moe.backends.portable.mega_moe import _activation, _KeptActivation

    if block is not None:
        monkeypatch.setattr(portable, "_ACT_BLOCK_ELEMENTS", block)
    g = torch.Generator().manual_seed(5)
    h = (torch.randn(37, 96, generator=g) * 4).bfloat16()
    h[0, 0] = h[3, 60] = float("nan")
    h[1, 50], h[2, 3], h[4, 5], h[6, 70] = float("inf"), float("-inf"), 1e30, -1e30
    h[5] = -0.0
    h[7, :4] = torch.tensor([3.0, 3.015625, -3.015625, 3.03125])  # on and beside the clamp's bounds
    weights = torch.rand(37, generator=g)
    grad = torch.randn(37, 48, generator=g).bfloat16()
    grad[8, 9] = float("nan")

    def run(kept):
        hh, ww = h.clone().requires_grad_(), weights.clone().requires_grad_()
        out = _KeptActivation.apply(hh, ww, clamp) if kept else _activation(hh, ww, clamp, False)[0]
        out.backward(grad)
        return out, hh.grad, ww.grad

    def bits(t):
        return t.detach().view(torch.int16 if t.element_size() == 2 else torch.int32)

    reference = run(False)  # autograd's own formulas: the C++ loops never serve a recorded call
    calls = []
    real = portable._native
    monkeypatch.setattr(portable, "_native", lambda *a: calls.append(real(*a)) or (native and calls[-1]))
    for kept, autograd in zip(run(True), reference):
        assert torch.equal(bits(kept), bits(autograd))
    assert calls and all(calls)  # the C++ loops could serve (plain CPU tensors); `native` says whether they did
