"""The ep ops through DeepEP's V1 ``Buffer`` (``backends/upstream/deep_ep/legacy.py``) with the stand-in ``deep_ep``
(``tests/standins``) installed, on each rank of spawned gloo processes, the CUDA chains run on CPU tensors
(``chain.on_cpu("cuda")``).

Every check compares against the same call with ``deep_ep`` disabled (our transport), bitwise: the backend only
moves rows, so nothing may differ but ``backend_state`` (DeepEP's handle; empty for ours)."""

from __future__ import annotations

import os
import sys

import torch

from tests.ep.specs import random_routing
from tests.upstream.standin import STANDINS
from torch_ascend_moe import backends
from torch_ascend_moe.backends import chain
from torch_ascend_moe.distributed.groups import group_name_of
from torch_ascend_moe.ops.ep import (
    ep_combine,
    ep_dispatch,
    ep_dispatch_cached,
    ep_low_latency_combine,
    ep_low_latency_dispatch,
)

H, K = 64, 4


def _install(**config):
    backends.register_all()  # the CUDA chains, on this CPU-only process
    sys.path.insert(0, STANDINS)
    import deep_ep

    deep_ep._standin.configure(**config)
    deep_ep._standin.reset()
    chain.refresh()
    return deep_ep


def _calls(lib) -> list[str]:
    return [name for name, _ in lib._standin.CALLS]


def _inputs(rank, r, t, e, seed, dtype=torch.bfloat16, h=H, k=K):
    g = torch.Generator().manual_seed(seed * 100 + rank)
    x = torch.randn(t, h, generator=g).to(dtype)
    idx = random_routing(t, k, e, g)
    w = torch.rand(t, k, generator=g)
    return x, idx, w


def _same(got, want, what):
    assert type(got) is type(want), what
    if isinstance(got, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape, (
            f"{what}: {got.dtype}{list(got.shape)} vs {want.dtype}{list(want.shape)}"
        )
        assert torch.equal(
            got.view(torch.uint8) if got.dtype.itemsize == 1 else got,
            want.view(torch.uint8) if want.dtype.itemsize == 1 else want,
        ), what
    elif isinstance(got, (tuple, list)):
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            _same(a, b, f"{what}[{i}]")
    else:
        assert got == want, f"{what}: {got} vs {want}"


def _same_dispatch(got, want, what):
    for name in (
        "recv_x",
        "recv_x_scales",
        "recv_topk_idx",
        "recv_topk_weights",
        "num_recv_tokens_per_expert",
        "num_recv",
        "recv_src_idx",
    ):
        _same(getattr(got, name), getattr(want, name), f"{what}: {name}")
    for name in ("send_src", "send_counts", "recv_counts", "recv_gather", "num_tokens", "group_name"):
        _same(getattr(got.handle, name), getattr(want.handle, name), f"{what}: handle.{name}")
    assert got.handle.backend_state.numel() > 0, f"{what}: DeepEP's handle missing from backend_state"
    assert want.handle.backend_state.numel() == 0, f"{what}: our transport keeps no state"


CASES = [
    # (name, T on rank i, num_worst_tokens, expert_alignment, fp8, weights)
    ("bf16 compact", lambda i: 9 + 3 * i, 0, 1, False, True),
    ("bf16 static", lambda i: 7 + i, 40, 1, False, True),
    ("bf16 no weights, aligned", lambda i: 5 + 2 * i, 0, 4, False, False),
    ("fp8 compact", lambda i: 6 + i, 0, 1, True, True),
    ("fp8 static", lambda i: 6, 30, 2, True, True),
    ("one rank sends nothing", lambda i: 0 if i == 1 else 8, 0, 1, False, True),
]


def dispatch_combine(rank, r):
    """Every case: dispatch, combine with 0/1/2 biases, the weights back, a cached dispatch; then the calls DeepEP
    refuses on a DeepEP handle (FP32 rows, copy_order) run our transport on the same routing."""
    lib = _install()
    e = 4 * r
    with chain.on_cpu("cuda"):
        for case, (name, tokens, worst, align, fp8, with_w) in enumerate(CASES):
            x, idx, w = _inputs(rank, r, tokens(rank), e, seed=case)
            w = w if with_w else None
            scales = None
            if fp8:
                scales = torch.rand(x.shape[0], 1) + 0.5
                x = x.float().to(torch.float8_e4m3fn)
            lib._standin.reset()
            got = ep_dispatch(x, idx, w, num_experts=e, x_scales=scales, expert_alignment=align, num_worst_tokens=worst)
            assert "Buffer.dispatch" in _calls(lib), f"{name}: DeepEP not reached: {_calls(lib)}"
            with chain.disabled("deep_ep"):
                want = ep_dispatch(
                    x, idx, w, num_experts=e, x_scales=scales, expert_alignment=align, num_worst_tokens=worst
                )
            _same_dispatch(got, want, name)
            if fp8:
                new = (torch.randn(x.shape, generator=torch.Generator().manual_seed(rank)) * 4).to(torch.float8_e4m3fn)
                lib._standin.reset()
                c_got = ep_dispatch_cached(new, got.handle, scales * 2)
                assert "Buffer.dispatch" in _calls(lib), name
                with chain.disabled("deep_ep"):
                    c_want = ep_dispatch_cached(new, want.handle, scales * 2)
                _same(c_got, c_want, f"{name}: cached")
                continue
            g = torch.Generator().manual_seed(50 + rank)
            y = torch.randn(got.recv_x.shape, generator=g).bfloat16()
            t = x.shape[0]
            biases = [torch.randn(t, H, generator=g).bfloat16() for _ in range(2)]
            for nb in (0, 1, 2):
                bias = tuple(biases[:nb]) if nb else None
                lib._standin.reset()
                out = ep_combine(y, got.handle, got.recv_topk_weights, bias)
                assert "Buffer.combine" in _calls(lib), f"{name}: DeepEP's combine not reached"
                with chain.disabled("deep_ep"):
                    ref = ep_combine(y, want.handle, want.recv_topk_weights, bias)
                _same(out, ref, f"{name}: combine with {nb} biases")
                if with_w:  # the received weights come back whole (zeros at other ranks' slots)
                    _same(out[1], torch.where(idx >= 0, w, 0), f"{name}: weights back")
            new = torch.randn(x.shape, generator=g).bfloat16()
            lib._standin.reset()
            c_got = ep_dispatch_cached(new, got.handle)
            assert "Buffer.dispatch" in _calls(lib), name
            with chain.disabled("deep_ep"):
                c_want = ep_dispatch_cached(new, want.handle)
            _same(c_got, c_want, f"{name}: cached")
            # What DeepEP refuses on its own handle: our transport, same routing, same result.
            lib._standin.reset()
            out32 = ep_combine(y.float(), got.handle)
            order = torch.randint(0, 3, (t, r), generator=g)
            out_order = ep_combine(y, got.handle, copy_order=order)
            assert "Buffer.combine" not in _calls(lib), f"{name}: DeepEP took a call it cannot serve"
            with chain.disabled("deep_ep"):
                _same(out32, ep_combine(y.float(), want.handle), f"{name}: FP32 combine")
                _same(out_order, ep_combine(y, want.handle, copy_order=order), f"{name}: copy_order combine")


def gradients(rank, r):
    """Autograd through DeepEP: dispatch's backward is DeepEP's combine, combine's a DeepEP cached dispatch; the
    gradients equal our transport's bitwise."""
    lib = _install()
    e = 2 * r
    x, idx, w = _inputs(rank, r, 10 + rank, e, seed=7)
    scale = torch.randn(H, generator=torch.Generator().manual_seed(3)).bfloat16()

    def step(x, w):
        sent = ep_dispatch(x, idx, w, num_experts=e)
        y = sent.recv_x * scale
        out, back_w = ep_combine(y, sent.handle, sent.recv_topk_weights)
        return (out.float() ** 2).sum() + (back_w * 3).sum()

    with chain.on_cpu("cuda"):
        args = [x.clone().requires_grad_(), w.clone().requires_grad_()]
        lib._standin.reset()
        grads = torch.autograd.grad(step(*args), args)
        calls = _calls(lib)
        # forward: a dispatch and a combine; backward: the combine's two cached dispatches (x, weights), the
        # dispatch's combine
        assert calls.count("Buffer.combine") == 2 and calls.count("Buffer.dispatch") == 3, calls
        with chain.disabled("deep_ep"):
            args = [x.clone().requires_grad_(), w.clone().requires_grad_()]
            want = torch.autograd.grad(step(*args), args)
    _same(grads, want, "gradients")


def compiled(rank, r):
    """torch.compile(fullgraph=True) holds our ops; the compiled graph still reaches DeepEP."""
    lib = _install()
    e = 2 * r
    x, idx, w = _inputs(rank, r, 8, e, seed=9)

    def step(x, idx, w):
        sent = ep_dispatch(x, idx, w, num_experts=e, num_worst_tokens=8 * r)
        out, _ = ep_combine(sent.recv_x * 2, sent.handle)
        return out

    with chain.on_cpu("cuda"):
        lib._standin.reset()
        got = torch.compile(step, fullgraph=True, backend="aot_eager")(x, idx, w)
        assert "Buffer.dispatch" in _calls(lib) and "Buffer.combine" in _calls(lib), _calls(lib)
        with chain.disabled("deep_ep"):
            want = step(x, idx, w)
    _same(got, want, "compiled")


def refusals(rank, r):
    """Reasons, and the calls DeepEP never sees: bad input (the op's own error on every rank), a mismatched
    transport, a corrupt backend_state."""
    lib = _install()  # no DeepEP buffer yet: building one is collective
    e = 2 * r
    x, idx, w = _inputs(rank, r, 6, e, seed=11)
    with chain.on_cpu("cuda"):
        # Rank 0's arguments fail our check (its chain refuses DeepEP and raises); the others chose DeepEP: they must
        # meet rank 0 in the header, before anything collective of DeepEP's, and raise too.
        try:
            ep_dispatch(x, idx, w[:, :2] if rank == 0 else w, num_experts=e)
        except ValueError as err:
            want = "argument 'topk_weights'" if rank == 0 else "rejected their arguments"
            assert want in str(err), err
        else:
            raise AssertionError("a rank's bad arguments did not raise on every rank")
        assert "Buffer.__init__" not in _calls(lib), _calls(lib)
        name = group_name_of()
        steps = chain.explain("ep_dispatch", "cuda", x, None, idx, w, e, name)
        assert [s.status for s in steps] == ["chosen", "not asked", "not asked"], steps
        reasons = {
            "rows of 6 bytes": (x[:, :3], None, idx, w, e, name),
            "torch.float64 weights": (x, None, idx, w.double(), e, name),
            "arguments our check refuses": (x, None, idx, w[:, :2], e, name),
            "top-33 (DeepEP traps above 32)": (x, None, idx.new_zeros(6, 33), None, e, name),
        }
        for reason, call in reasons.items():
            steps = chain.explain("ep_dispatch", "cuda", *call)
            assert steps[0].status == "refused" and reason in steps[0].reason, (reason, steps)
        y = torch.zeros(4, H, dtype=torch.bfloat16)
        idx_ = torch.zeros(4, 1, dtype=torch.int64)
        handle = [idx_[:, 0], torch.full((r,), 4 // r if rank == 0 else 0), torch.zeros(r, dtype=torch.int64)]
        steps = chain.explain("ep_combine", "cuda", y, None, None, None, *handle, torch.arange(4), 4, name)
        assert steps[0].status == "refused" and "did not go through DeepEP" in steps[0].reason, steps
        bad = idx.clone()
        if rank == 0:
            bad[0, 0] = e + 5
        lib._standin.reset()
        try:
            ep_dispatch(x, bad, w, num_experts=e)
        except ValueError as err:
            assert "expected expert ids in [-1" in str(err) and "rank(s) [0]" in str(err), err
        else:
            raise AssertionError("bad ids did not raise")
        assert "Buffer.dispatch" not in _calls(lib), _calls(lib)
        sent = ep_dispatch(x, idx, w, num_experts=e)
        broken = sent.handle._replace(backend_state=sent.handle.backend_state[:-1])
        try:
            ep_combine(sent.recv_x, broken)
        except ValueError as err:
            assert "argument 'backend_state' value" in str(err), err
        else:
            raise AssertionError("a truncated backend_state did not raise")
    # DeepEP on one rank only: both raise (the header names the transport) instead of waiting apart.
    with chain.on_cpu("cuda"), chain.disabled(*(["deep_ep"] if rank == 1 else [])):
        try:
            ep_dispatch(x, idx, w, num_experts=e)
        except ValueError as err:
            assert "disagree on the transport" in str(err), err
        else:
            raise AssertionError("ranks on different transports did not raise")
    os.environ.pop("TORCH_ASCEND_MOE_DISABLE", None)


def _canonical(recv, count, handle, t_max):
    """A low-latency dispatch's valid rows per expert, sorted by (source rank, token): the order-free content."""
    from torch_ascend_moe.backends.portable.ep.low_latency import ll_row_sources

    data, scales = recv if isinstance(recv, tuple) else (recv, None)
    local, n = handle.src_info.shape
    source, inside = ll_row_sources(handle.layout_range, n)
    out = []
    for i in range(local):
        valid = inside[i] & (handle.src_info[i] >= 0)
        assert int(valid.sum()) == int(count[i]), (i, int(valid.sum()), int(count[i]))
        keys = (source[i] * t_max + handle.src_info[i].long())[valid]
        order = torch.argsort(keys)
        rows = [
            keys[order],
            data[i][valid][order].view(torch.uint8) if data.dtype.itemsize == 1 else data[i][valid][order],
        ]
        if scales is not None:
            rows.append(scales[i][valid][order])
        out.append(rows)
    return out


def low_latency(rank, r):
    """DeepEP's low-latency kernels: the same rows per expert as ours (in DeepEP's arrival order: compared sorted
    by source and token), BF16 and FP8 (plain, round_scale, UE8M0); the weighted combine bitwise ours, on DeepEP's
    layout and, through our transport, on DeepEP's handle; gradients (the combine's backward re-dispatches with slot
    weights, which DeepEP refuses: our rows moved into DeepEP's layout)."""
    lib = _install()
    e, t_max, h = 4 * r, 8, 2048
    x, idx, w = _inputs(rank, r, 5 + rank, e, seed=13, h=h)
    for fp8, round_scale, ue8m0 in ((False, False, False), (True, False, False), (True, True, True)):
        opts = dict(use_fp8=fp8, round_scale=round_scale, use_ue8m0=ue8m0)
        with chain.on_cpu("cuda"):
            lib._standin.reset()
            got = ep_low_latency_dispatch(x, idx, t_max, e, **opts)
            assert "Buffer.low_latency_dispatch" in _calls(lib), _calls(lib)
            with chain.disabled("deep_ep"):
                want = ep_low_latency_dispatch(x, idx, t_max, e, **opts)
        _same(got[1], want[1], f"{opts}: recv_count")
        _same(_canonical(got[0], got[1], got[2], t_max), _canonical(want[0], want[1], want[2], t_max), f"{opts}: rows")
    scale = torch.randn(h, generator=torch.Generator().manual_seed(5)).bfloat16()
    with chain.on_cpu("cuda"):
        got = ep_low_latency_dispatch(x, idx, t_max, e, use_fp8=False)
        lib._standin.reset()
        out = ep_low_latency_combine(got[0] * scale, idx, w, got[2])
        assert "Buffer.low_latency_combine" in _calls(lib), _calls(lib)
        with chain.disabled("deep_ep"):
            want = ep_low_latency_dispatch(x, idx, t_max, e, use_fp8=False)
            ref = ep_low_latency_combine(want[0] * scale, idx, w, want[2])
            mixed = ep_low_latency_combine(got[0] * scale, idx, w, got[2])  # our combine on DeepEP's layout
        _same(out, ref, "low-latency combine")
        _same(mixed, ref, "our combine on DeepEP's layout")

        def step(x, w):
            recv, _, handle = ep_low_latency_dispatch(x, idx, t_max, e, use_fp8=False)
            return (ep_low_latency_combine(recv * scale, idx, w, handle).float() ** 2).sum()

        args = [x.clone().requires_grad_(), w.clone().requires_grad_()]
        lib._standin.reset()
        grads = torch.autograd.grad(step(*args), args)
        assert "Buffer.low_latency_combine" in _calls(lib), _calls(lib)
        with chain.disabled("deep_ep"):
            args = [x.clone().requires_grad_(), w.clone().requires_grad_()]
            want_grads = torch.autograd.grad(step(*args), args)
    _same(grads, want_grads, "low-latency gradients")


def mutations(rank, r):
    """The stand-in's checks catch a backend that hands DeepEP a wrong handle: prefix matrices swapped, send_head
    shifted (each a wrong answer or the stand-in's error), and a static handle's receive slots misplaced."""
    from torch_ascend_moe.backends.upstream.deep_ep import legacy as backend

    lib = _install()
    e = 2 * r
    x, idx, w = _inputs(rank, r, 9 + rank, e, seed=17)
    real = backend.unpack
    mutants = {
        "prefix matrices swapped": lambda h: (h[0], h[2], h[1], *h[3:]),
        "send_head shifted": lambda h: (*h[:5], h[5].roll(1, 0)),
    }
    with chain.on_cpu("cuda"):
        sent = ep_dispatch(x, idx, w, num_experts=e)
        y = torch.randn(sent.recv_x.shape, generator=torch.Generator().manual_seed(rank)).bfloat16()
        right = ep_combine(y, sent.handle)[0]
        for name, mutate in mutants.items():
            backend.unpack = lambda *a, mutate=mutate: mutate(real(*a))
            try:
                caught = not torch.equal(ep_combine(y, sent.handle)[0], right)
            except RuntimeError:
                caught = True
            finally:
                backend.unpack = real
            flags = [torch.zeros(1) for _ in range(r)]
            torch.distributed.all_gather(flags, torch.tensor([float(caught)]))
            assert any(bool(f) for f in flags), f"{name}: not caught on any rank"
    lib._standin.reset()


def moe_layer(rank, r):
    """``nn.MoE`` expert-parallel over the group with DeepEP under it (compact and static dispatch, expanded or not):
    output and gradients bitwise the same layer with DeepEP disabled, DeepEP reached."""
    from torch_ascend_moe.nn import MoE

    lib = _install()
    config = dict(num_shared_experts=1, score_func="sigmoid", num_groups=2, topk_groups=1)
    for static, expand in ((None, False), (8, True)):
        torch.manual_seed(0)
        layer = MoE(64, 32, 4 * r, 2, dtype=torch.bfloat16, ep_group=torch.distributed.group.WORLD,
                    ep_static_tokens=static, ep_expand=expand, ep_alignment=4 if expand else 1, **config)  # fmt: skip
        t = 8 if static else 3 + 2 * rank
        x = torch.randn(t, 64, generator=torch.Generator().manual_seed(10 + rank)).bfloat16()
        results = []
        for disable in ((), ("deep_ep",)):
            lib._standin.reset()
            layer.zero_grad()
            xi = x.clone().requires_grad_()
            with chain.on_cpu("cuda"), chain.disabled(*disable):
                y = layer(xi)
                (y.float() * 3).sum().backward()
            reached = "Buffer.dispatch" in _calls(lib)
            assert reached == (not disable), (static, expand, _calls(lib))
            results.append((y.detach(), xi.grad, layer.experts.gate_up_proj.grad.clone()))
        _same(results[0], results[1], f"MoE static={static} expand={expand}")


CHECKS = {f.__name__: f for f in (dispatch_combine, gradients, compiled, refusals, low_latency, mutations, moe_layer)}
