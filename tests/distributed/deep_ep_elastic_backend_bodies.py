"""The ep ops through DeepEP's V2 ``ElasticBuffer`` (``backends/upstream/deep_ep/elastic.py``) with the stand-in
``deep_ep`` (``tests/standins``) installed, on each rank of spawned gloo processes: the CUDA chains (V1 switched off,
or a group size V1 refuses) and the Ascend chains (the stand-in as DeepEP-Ascend) run on CPU tensors.

Every check compares against the same call with ``deep_ep`` disabled (our transport), bitwise: the backend only
moves rows, so nothing may differ but ``backend_state`` (V2's handle; empty for ours). The stand-in shuffles V2's
arrival order, so our order (source rank, then token) holds only through V2's deterministic epilogue."""

from __future__ import annotations

import torch

from tests.distributed.deep_ep_backend_bodies import CASES, H, _calls, _inputs, _install, _same, _same_dispatch
from torch_ascend_moe.backends import chain
from torch_ascend_moe.distributed.groups import group_name_of
from torch_ascend_moe.ops.ep import ep_combine, ep_copy_order, ep_dispatch, ep_dispatch_cached

DISPATCH, COMBINE = "ElasticBuffer.dispatch", "ElasticBuffer.combine"


def _devices(r: int):
    """(device whose chain runs, what to switch off so that V2 is asked, the stand-in's platform)."""
    cuda_off = () if r not in (2, 4, 8) else ("deep_ep.legacy",)  # V1 takes 2/4/8 ranks first
    return (("cuda", cuda_off, "cuda"), ("npu", (), "ascend"))


def dispatch_combine(rank, r):
    """Every case on both devices: dispatch, combine in V2's slot order with 0/1/2 biases, a cached dispatch; the
    combines V2 does not serve (ascending-rank order, weights back, FP32 rows) run our transport on its routing."""
    e = 4 * r
    for device, off, platform in _devices(r):
        lib = _install(platform=platform)
        with chain.on_cpu(device), chain.disabled(*off):
            for case, (name, tokens, worst, align, fp8, with_w) in enumerate(CASES):
                name = f"{device} {name}"
                x, idx, w = _inputs(rank, r, tokens(rank), e, seed=case)
                w = w if with_w else None
                scales = None
                if fp8:
                    scales = torch.rand(x.shape[0], 2) + 0.5  # ceil(H / 32) = 2 packs: V2's most
                    x = x.float().to(torch.float8_e4m3fn)
                kw = dict(num_experts=e, x_scales=scales, expert_alignment=align, num_worst_tokens=worst)
                lib._standin.reset()
                got = ep_dispatch(x, idx, w, **kw)
                assert DISPATCH in _calls(lib), f"{name}: V2 not reached: {_calls(lib)}"
                with chain.disabled("deep_ep"):
                    want = ep_dispatch(x, idx, w, **kw)
                _same_dispatch(got, want, name)
                g = torch.Generator().manual_seed(50 + rank)
                if fp8:
                    new = (torch.randn(x.shape, generator=g) * 4).to(torch.float8_e4m3fn)
                    lib._standin.reset()
                    c_got = ep_dispatch_cached(new, got.handle, scales * 2)
                    assert DISPATCH in _calls(lib), name
                    with chain.disabled("deep_ep"):
                        _same(c_got, ep_dispatch_cached(new, want.handle, scales * 2), f"{name}: cached")
                    continue
                y = torch.randn(got.recv_x.shape, generator=g).bfloat16()
                t = x.shape[0]
                order = ep_copy_order(idx, e, r)
                biases = [torch.randn(t, H, generator=g).bfloat16() for _ in range(2)]
                for nb in (0, 1, 2):
                    bias = tuple(biases[:nb]) if nb else None
                    lib._standin.reset()
                    out = ep_combine(y, got.handle, bias=bias, copy_order=order)
                    assert COMBINE in _calls(lib), f"{name}: V2's combine not reached"
                    with chain.disabled("deep_ep"):
                        ref = ep_combine(y, want.handle, bias=bias, copy_order=order)
                    _same(out, ref, f"{name}: combine with {nb} biases")
                new = torch.randn(x.shape, generator=g).bfloat16()
                lib._standin.reset()
                c_got = ep_dispatch_cached(new, got.handle)
                assert DISPATCH in _calls(lib), name
                with chain.disabled("deep_ep"):
                    _same(c_got, ep_dispatch_cached(new, want.handle), f"{name}: cached")
                # What V2 does not serve on its own handle: our transport, same routing, same result.
                lib._standin.reset()
                plain = ep_combine(y, got.handle)
                weights_back = got.recv_topk_weights if with_w else torch.rand(got.recv_x.shape[0], idx.shape[1])
                weighted = ep_combine(y, got.handle, weights_back, copy_order=order)
                if all(tokens(i) for i in range(r)):
                    # Another order: refused on every rank (a rank with no tokens would match any order trivially and
                    # choose V2 alone: the header then raises on every rank, which is not what is checked here).
                    ep_combine(y, got.handle, copy_order=torch.randint(0, 3, (t, r), generator=g))
                assert COMBINE not in _calls(lib), f"{name}: V2 took a combine it cannot serve: {_calls(lib)}"
                with chain.disabled("deep_ep"):
                    _same(plain, ep_combine(y, want.handle), f"{name}: ascending-rank combine")
                    _same(weighted, ep_combine(y, want.handle, weights_back, copy_order=order), f"{name}: weighted")
                if with_w:
                    _same(weighted[1], torch.where(idx >= 0, w, 0), f"{name}: weights back")


def gradients(rank, r):
    """Autograd through V2: the combine's backward is V2's cached dispatch; the dispatch's backward (a combine that
    carries the weights' gradients) runs our transport on V2's routing; gradients equal ours bitwise."""
    e = 2 * r
    x, idx, w = _inputs(rank, r, 10 + rank, e, seed=7)
    scale = torch.randn(H, generator=torch.Generator().manual_seed(3)).bfloat16()
    order = ep_copy_order(idx, e, r)

    def step(x, w):
        sent = ep_dispatch(x, idx, w, num_experts=e)
        y = sent.recv_x * scale * sent.recv_topk_weights.sum(1, keepdim=True).bfloat16()
        out, _ = ep_combine(y, sent.handle, copy_order=order)
        return (out.float() ** 2).sum()

    for device, off, platform in _devices(r):
        lib = _install(platform=platform)
        with chain.on_cpu(device), chain.disabled(*off):
            args = [x.clone().requires_grad_(), w.clone().requires_grad_()]
            lib._standin.reset()
            grads = torch.autograd.grad(step(*args), args)
            calls = _calls(lib)
            assert calls.count(COMBINE) == 1 and calls.count(DISPATCH) == 2, calls  # dispatch, cached (backward)
            with chain.disabled("deep_ep"):
                args = [x.clone().requires_grad_(), w.clone().requires_grad_()]
                want = torch.autograd.grad(step(*args), args)
        _same(grads, want, f"{device} gradients")


def compiled(rank, r):
    """torch.compile(fullgraph=True) holds our ops; the compiled graph still reaches V2."""
    e = 2 * r
    x, idx, w = _inputs(rank, r, 8, e, seed=9)
    order = ep_copy_order(idx, e, r)

    def step(x, idx, w, order):
        sent = ep_dispatch(x, idx, w, num_experts=e, num_worst_tokens=8 * r)
        out, _ = ep_combine(sent.recv_x * 2, sent.handle, copy_order=order)
        return out

    device, off, platform = _devices(r)[0]
    lib = _install(platform=platform)
    with chain.on_cpu(device), chain.disabled(*off):
        lib._standin.reset()
        got = torch.compile(step, fullgraph=True, backend="aot_eager")(x, idx, w, order)
        assert DISPATCH in _calls(lib) and COMBINE in _calls(lib), _calls(lib)
        with chain.disabled("deep_ep"):
            want = step(x, idx, w, order)
    _same(got, want, "compiled")


def refusals(rank, r):
    """Reasons; bad input never reaching V2 (the op's own error on every rank); a rank on V2 and one on our
    transport raising on both; V1's state never taken by V2 (nor V2's by V1)."""
    e = 2 * r
    x, idx, w = _inputs(rank, r, 6, e, seed=11)
    device, off, platform = _devices(r)[0]
    lib = _install(platform=platform)
    name = group_name_of()
    with chain.on_cpu(device), chain.disabled(*off):
        reasons = {
            "torch.float32 rows (DeepEP V2 moves BF16 or FP8 rows)": (x.float(), None, idx, w, e, name),
            "top-33 (DeepEP V2 takes at most 32)": (x, None, idx.new_zeros(6, 33), None, e, name),
            "torch.float64 weights": (x, None, idx, w.double(), e, name),
            "3 scales per row": (x.float().to(torch.float8_e4m3fn), torch.ones(6, 3), idx, w, e, name),
        }
        for reason, call in reasons.items():
            steps = [s for s in chain.explain("ep_dispatch", device, *call) if s.kernel.library == "deep_ep.elastic"]
            assert steps[0].status == "refused" and reason in steps[0].reason, (reason, steps)
        sent = ep_dispatch(x, idx, w, num_experts=e)
        y = torch.zeros_like(sent.recv_x)
        h = sent.handle
        steps = chain.explain("ep_combine", device, y, None, None, None, *h[:4], h.num_tokens, name, 300.0, None,
                              h.backend_state)  # fmt: skip
        v2 = [s for s in steps if s.kernel.library == "deep_ep.elastic"][0]
        assert v2.status == "refused" and "no copy_order" in v2.reason, steps
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
        assert DISPATCH not in _calls(lib), _calls(lib)
        broken = h._replace(backend_state=h.backend_state[:-3])
        try:
            ep_combine(y, broken, copy_order=ep_copy_order(idx, e, r))
        except ValueError as err:
            # A corrupt state may read as V1's on some ranks (by its length) and go elsewhere: the header then
            # raises on every rank instead.
            assert "argument 'backend_state' value" in str(err) or "disagree on the transport" in str(err), err
        else:
            raise AssertionError("a truncated backend_state did not raise")
    if r in (2, 4, 8):  # V1 and V2 side by side: each takes only its own state
        with chain.on_cpu("cuda"):
            v1 = ep_dispatch(x, idx, w, num_experts=e)
            with chain.disabled("deep_ep.legacy"):
                v2 = ep_dispatch(x, idx, w, num_experts=e)
            order = ep_copy_order(idx, e, r)
            lib._standin.reset()
            with chain.disabled("deep_ep.legacy"):  # V2 asked with V1's state: refused, our transport runs
                ep_combine(torch.zeros_like(v1.recv_x), v1.handle, copy_order=order)
            lib._standin.reset()
            ep_combine(torch.zeros_like(v2.recv_x), v2.handle, copy_order=order)  # V1 refuses V2's state
            assert _calls(lib).count(COMBINE) == 1 and "Buffer.combine" not in _calls(lib), _calls(lib)
    # V2 on one rank only: both raise (the header names the transport) instead of waiting apart.
    with chain.on_cpu(device), chain.disabled(*off, *(["deep_ep.elastic"] if rank == 1 else [])):
        try:
            ep_dispatch(x, idx, w, num_experts=e)
        except ValueError as err:
            assert "disagree on the transport" in str(err), err
        else:
            raise AssertionError("ranks on different transports did not raise")


def mutations(rank, r):
    """The stand-in catches a backend that hands V2 a wrong handle (received rows' metadata swapped, slots shifted)
    or builds its buffer without the deterministic epilogue (rows in V2's arrival order)."""
    from torch_ascend_moe.backends.upstream.deep_ep import elastic as backend

    e = 2 * r
    x, idx, w = _inputs(rank, r, 9 + rank, e, seed=17)
    order = ep_copy_order(idx, e, r)
    device, off, platform = _devices(r)[0]
    lib = _install(platform=platform)
    real = backend.unpack

    def swap_metadata(handle):
        handle.recv_src_metadata = handle.recv_src_metadata.roll(1, 0).contiguous()
        return handle

    def shift_slots(handle):
        handle.dst_buffer_slot_idx = handle.dst_buffer_slot_idx.roll(1, 0).contiguous()
        return handle

    caught = {}
    with chain.on_cpu(device), chain.disabled(*off):
        sent = ep_dispatch(x, idx, w, num_experts=e)
        y = torch.randn(sent.recv_x.shape, generator=torch.Generator().manual_seed(rank)).bfloat16()
        new = torch.randn(x.shape, generator=torch.Generator().manual_seed(rank)).bfloat16()
        right = ep_combine(y, sent.handle, copy_order=order)[0], ep_dispatch_cached(new, sent.handle)[0]
        for what, mutate in (("metadata rows swapped", swap_metadata), ("slots shifted", shift_slots)):
            backend.unpack = lambda *a, mutate=mutate: (mutate(real(*a)[0]), real(*a)[1])
            try:
                got = ep_combine(y, sent.handle, copy_order=order)[0], ep_dispatch_cached(new, sent.handle)[0]
                caught[what] = any(not torch.equal(a, b) for a, b in zip(got, right))
            except RuntimeError:
                caught[what] = True
            finally:
                backend.unpack = real
        shuffled = lib.ElasticBuffer

        class Arrival(shuffled):  # the buffer without deterministic=True: rows in arrival order
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **{**kwargs, "deterministic": False})

        lib.ElasticBuffer = Arrival
        chain.refresh()
        try:
            got = ep_dispatch(x, idx, w, num_experts=e)
            with chain.disabled("deep_ep"):
                want = ep_dispatch(x, idx, w, num_experts=e)
            caught["arrival order"] = not torch.equal(got.recv_x, want.recv_x)
        finally:
            lib.ElasticBuffer = shuffled
            chain.refresh()
    for what, flag in caught.items():
        flags = [torch.zeros(1) for _ in range(r)]
        torch.distributed.all_gather(flags, torch.tensor([float(flag)]))
        assert any(bool(f) for f in flags), f"{what}: not caught on any rank"


def moe_layer(rank, r):
    """``nn.MoE`` expert-parallel with V2 under it (compact and static dispatch, expanded or not): output and
    gradients bitwise the same layer without DeepEP, V2 reached."""
    from torch_ascend_moe.nn import MoE

    device, off, platform = _devices(r)[0]
    lib = _install(platform=platform)
    config = dict(num_shared_experts=1, score_func="sigmoid", num_groups=2, topk_groups=1)
    for static, expand in ((None, False), (8, True)):
        torch.manual_seed(0)
        layer = MoE(64, 32, 4 * r, 2, dtype=torch.bfloat16, ep_group=torch.distributed.group.WORLD,
                    ep_static_tokens=static, ep_expand=expand, ep_alignment=4 if expand else 1, **config)  # fmt: skip
        t = 8 if static else 3 + 2 * rank
        x = torch.randn(t, 64, generator=torch.Generator().manual_seed(10 + rank)).bfloat16()
        results = []
        for disable in (off, ("deep_ep",)):
            lib._standin.reset()
            layer.zero_grad()
            xi = x.clone().requires_grad_()
            with chain.on_cpu(device), chain.disabled(*disable):
                y = layer(xi)
                (y.float() * 3).sum().backward()
            reached = DISPATCH in _calls(lib)
            assert reached == (disable == off), (static, expand, _calls(lib))
            results.append((y.detach(), xi.grad, layer.experts.gate_up_proj.grad.clone()))
        _same(results[0], results[1], f"MoE static={static} expand={expand}")


CHECKS = {f.__name__: f for f in (dispatch_combine, gradients, compiled, refusals, mutations, moe_layer)}
