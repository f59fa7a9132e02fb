"""mega_moe's eager CPU training forms the routed experts' weight gradients itself (autograd/mega_moe.py
``ExpertTape``), each into the previous step's gradient buffer once nothing else holds it (issue 51: no fresh large
allocation per training step). Checked: the same gradient bits as autograd's formulas (the tape switched off) in every
way a loop uses gradients; the buffer is reused only when it is free, never under a gradient someone still holds;
an expert that received no row gets zeros in a reused buffer; ``release_gradient_buffers`` and a dead weight drop
the buffers."""

import gc
import threading
import time

import pytest
import torch

from torch_ascend_moe import mega_moe
from torch_ascend_moe.autograd import mega_moe as taped
from torch_ascend_moe.nn import MegaMoE

E, H, INTER, T, K = 4, 64, 32, 48, 2


@pytest.fixture(autouse=True)
def no_buffers():
    taped.release_gradient_buffers()
    yield
    taped.release_gradient_buffers()


def _weights(seed=0, requires_grad=(True, True)):
    g = torch.Generator().manual_seed(seed)
    l1 = (torch.randn(E, 2 * INTER, H, generator=g) * H**-0.5).bfloat16().requires_grad_(requires_grad[0])
    l2 = (torch.randn(E, H, INTER, generator=g) * INTER**-0.5).bfloat16().requires_grad_(requires_grad[1])
    return l1, l2


def _tokens(seed, experts=E, x_grad=True):
    g = torch.Generator().manual_seed(100 + seed)
    x = torch.randn(T, H, generator=g).bfloat16().requires_grad_(x_grad)
    idx = torch.randint(0, experts, (T, K), generator=g)
    w = torch.rand(T, K, generator=g).requires_grad_()
    grad_y = torch.randn(T, H, generator=g).bfloat16()
    return x, idx, w, grad_y


def _bits(t):
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def _loop(steps, set_to_none, x_grad=True, requires_grad=(True, True), clamp=None, experts=E):
    """A training loop's gradients: (each step's weight .grad copies, each step's x grads)."""
    l1, l2 = _weights(requires_grad=requires_grad)
    seen, x_grads = [], []
    for step in range(steps):
        x, idx, w, grad_y = _tokens(step, experts if step else E, x_grad)
        y, _ = mega_moe(x, idx, w, l1, l2, activation_clamp=clamp)
        y.backward(grad_y)
        seen.append([None if p.grad is None else p.grad.clone() for p in (l1, l2, w)])
        x_grads.append(x.grad)
        if set_to_none:
            l1.grad = l2.grad = None
    return seen, x_grads


@pytest.mark.parametrize("set_to_none", [True, False], ids=["zero_grad", "accumulate"])
@pytest.mark.parametrize(
    "kw",
    [{}, {"x_grad": False}, {"requires_grad": (True, False)}, {"requires_grad": (False, True)}, {"clamp": 0.25}],
    ids=["all", "frozen x", "L1 only", "L2 only", "clamp"],
)
def test_the_gradients_are_autograds_bit_for_bit(set_to_none, kw, monkeypatch):
    ours = _loop(3, set_to_none, **kw)
    with monkeypatch.context() as m:
        m.setattr(taped, "_takes_weight_grads", lambda args: False)
        ref = _loop(3, set_to_none, **kw)
    for step, step_ref in zip(ours[0], ref[0]):
        for g, r in zip(step, step_ref):
            assert (g is None) == (r is None)
            if g is not None:
                assert torch.equal(_bits(g), _bits(r))
    for g, r in zip(ours[1], ref[1]):
        assert (g is None and r is None) or torch.equal(_bits(g), _bits(r))


def test_the_next_step_writes_into_the_released_gradient():
    l1, l2 = _weights()
    pointers = []
    for step in range(3):
        x, idx, w, grad_y = _tokens(step)
        mega_moe(x, idx, w, l1, l2)[0].backward(grad_y)
        pointers.append((l1.grad.data_ptr(), l2.grad.data_ptr()))
        l1.grad = l2.grad = None  # zero_grad(set_to_none=True)
    assert pointers[0] == pointers[1] == pointers[2]


def test_a_gradient_still_held_is_never_written():
    l1, l2 = _weights()
    x, idx, w, grad_y = _tokens(0)
    mega_moe(x, idx, w, l1, l2)[0].backward(grad_y)
    kept, kept_values = l1.grad, l1.grad.clone()  # the user keeps the first step's gradient
    l1.grad = l2.grad = None
    x, idx, w, grad_y = _tokens(1)
    mega_moe(x, idx, w, l1, l2)[0].backward(grad_y)
    assert l1.grad.data_ptr() != kept.data_ptr()
    assert torch.equal(_bits(kept), _bits(kept_values))


def test_gradients_returned_by_autograd_grad_stay_valid():
    l1, l2 = _weights()
    held = []
    for step in range(3):
        x, idx, w, grad_y = _tokens(step)
        y, _ = mega_moe(x, idx, w, l1, l2)
        grads = torch.autograd.grad(y, (l1, l2), grad_y)
        held.append((grads, [g.clone() for g in grads]))
    for grads, values in held:
        for g, v in zip(grads, values):
            assert torch.equal(_bits(g), _bits(v))


def test_an_expert_without_rows_gets_zeros_in_a_reused_buffer():
    # Step 0 routes to every expert; step 1 only to experts 0 and 1, into the same buffers.
    seen, _ = _loop(2, set_to_none=True, experts=2)
    l1_grad, l2_grad, _ = seen[1]
    for g in (l1_grad, l2_grad):
        assert g[:2].abs().sum() > 0
        assert torch.equal(_bits(g[2:]), torch.zeros_like(_bits(g[2:])))
    assert seen[0][0][2:].abs().sum() > 0  # the buffer held nonzero values before


def test_retained_graph_backwards_accumulate_correctly():
    l1, l2 = _weights()
    x, idx, w, grad_y = _tokens(0)
    y, _ = mega_moe(x, idx, w, l1, l2)
    y.backward(grad_y, retain_graph=True)
    first = l1.grad.clone()
    y.backward(grad_y)
    assert l1.grad.data_ptr() != first.data_ptr()
    assert torch.equal(_bits(l1.grad), _bits(2 * first))  # the same gradient twice: doubling is exact


def test_release_and_dead_weights_drop_the_buffers():
    l1, l2 = _weights()
    x, idx, w, grad_y = _tokens(0)
    mega_moe(x, idx, w, l1, l2)[0].backward(grad_y)
    assert len(taped._BUFFERS) == 2
    MegaMoE.release_gradient_buffers()
    assert len(taped._BUFFERS) == 0
    mega_moe(x, idx, w, l1, l2)[0].backward(grad_y)
    assert len(taped._BUFFERS) == 2
    del l1, l2
    gc.collect()
    assert len(taped._BUFFERS) == 0


def test_the_module_trains_without_fresh_gradient_memory():
    torch.manual_seed(0)
    moe = MegaMoE(H, INTER, num_experts=E, topk=K, num_shared_experts=1, dtype=torch.bfloat16)
    opt = torch.optim.SGD(moe.parameters(), lr=1e-3)
    pointers = []
    for step in range(3):
        x, _, _, _ = _tokens(step)
        moe(x.detach()).float().square().mean().backward()
        pointers.append(moe.experts.gate_up_proj.grad.data_ptr())
        opt.step()
        opt.zero_grad()
    assert pointers[0] == pointers[1] == pointers[2]


def test_a_weight_no_longer_trained_keeps_no_buffer():
    l1, l2 = _weights()
    x, idx, w, grad_y = _tokens(0)
    mega_moe(x, idx, w, l1, l2)[0].backward(grad_y)
    assert len(taped._BUFFERS) == 2
    l2.requires_grad_(False)  # L2 frozen: only L1's buffer stays
    mega_moe(x, idx, w, l1, l2)[0].backward(grad_y)
    assert l2 not in taped._BUFFERS and l1 in taped._BUFFERS
    l1.requires_grad_(False)
    mega_moe(x, idx, w, l1, l2)[0].backward(grad_y)
    assert len(taped._BUFFERS) == 0


def test_backwards_in_two_threads_never_share_a_buffer(monkeypatch):
    # Two threads run the backward of their own graph through the same weights at once, while the buffers are free.
    # The reference count check is slowed down so that both threads are inside it together unless the lock keeps
    # the second one out: each must still get its own buffer and autograd's gradients.
    l1, l2 = _weights()
    calls = [_tokens(step) for step in range(2)]
    with monkeypatch.context() as m:
        m.setattr(taped, "_takes_weight_grads", lambda args: False)
        expected = [torch.autograd.grad(mega_moe(x, i, w, l1, l2)[0], (l1, l2), g) for x, i, w, g in calls]
    x, i, w, g = calls[0]
    torch.autograd.grad(mega_moe(x, i, w, l1, l2)[0], (l1, l2), g)  # the buffers exist, and are free again
    count = taped._use_count

    def slow_count(storage):
        n = count(storage)
        time.sleep(0.05)
        return n

    monkeypatch.setattr(taped, "_use_count", slow_count)
    graphs = [mega_moe(x, i, w, l1, l2)[0] for x, i, w, _ in calls]
    start = threading.Barrier(2)
    results = [None, None]

    def backward(k):
        start.wait()
        results[k] = torch.autograd.grad(graphs[k], (l1, l2), calls[k][3])

    threads = [threading.Thread(target=backward, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results[0][0].data_ptr() != results[1][0].data_ptr()
    for got, want in zip(results, expected):
        for a, b in zip(got, want):
            assert torch.equal(_bits(a), _bits(b))
