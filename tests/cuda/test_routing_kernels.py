"""The moe_routing family's CUDA kernels (backends/cuda/_routing.py behind ``moe_permute``, ``moe_unpermute`` and
``moe_gating_topk``) on CPU tensors in Triton's interpreter: permute and unpermute bit for bit the C++ kernel, the
gating's choice exactly the C++ kernel's (ties, NaN, -0.0, group-limited routing, top-k beyond the kept groups)
and its weights within a few ulps (the renormalising sum's order), on the specs' samples and random calls; which
calls take the kernels, no host read under an emulated capture, bad inputs, the campaign, opcheck/compile. On a
GPU: the same values on CUDA tensors, and CUDA-graph capture and replay."""

from __future__ import annotations

from unittest import mock

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

pytest.importorskip("triton")

from tests.capture_emulation import capturing_everywhere  # noqa: E402
from tests.chains import cuda_chain as kernels  # noqa: E402
from tests.chains import ops_running  # noqa: E402
from tests.cuda.opaque import check_opaque  # noqa: E402
from tests.cuda.test_grouped_kernels import GPU, _on  # noqa: E402
from tests.moe_routing.specs import SPECS, random_topk  # noqa: E402
from tests.npu.test_capture import no_host_reads  # noqa: E402
from torch_ascend_moe.backends.cuda import _routing, _triton  # noqa: E402
from torch_ascend_moe.checks.moe_routing import permute_capacity  # noqa: E402
from torch_ascend_moe.testing import campaign  # noqa: E402

INTERPRETED = pytest.mark.skipif(
    not _triton.INTERPRETED, reason="Triton's interpreter is off in this process (a GPU compiles the kernels)"
)
ROUTING = {s.name: s for s in SPECS}
LAUNCHERS = {"moe_permute": "permute", "moe_unpermute": "unpermute", "moe_gating_topk": "gating"}


def _samples(spec):
    return [(d, s) for d in spec.dtypes for small in (False, True) for s in spec.sample_inputs("cpu", d, small=small)]


def _takes(name, s) -> bool:
    return not (name == "moe_gating_topk" and s.args[0].dtype == torch.float64)


def _assert_agrees(name, got, ours, where=""):
    """permute / unpermute / the gating's ids: bit for bit; the gating's weights: within 4 ulps of their scale."""
    for i, (g, o) in enumerate(zip(got, ours, strict=True) if isinstance(ours, tuple) else [(got, ours)]):
        assert (g.shape, g.dtype, g.stride()) == (o.shape, o.dtype, o.stride()), (name, i, where)
        if name == "moe_gating_topk" and i == 0:
            assert torch.equal(g.isnan(), o.isnan()), (name, where)
            tol = 4 * torch.finfo(g.dtype).eps * max(o.nan_to_num().abs().max().item() if o.numel() else 0, 1e-30)
            assert (g.nan_to_num() - o.nan_to_num()).abs().max().item() <= tol if g.numel() else True, (name, where)
        else:
            assert torch.equal(g.isnan(), o.isnan()) and torch.equal(g.nan_to_num(), o.nan_to_num()), (name, i, where)
            if g.is_floating_point():  # bitwise includes the sign of zero
                assert torch.equal(g.signbit() & ~g.isnan(), o.signbit() & ~o.isnan()), (name, i, where)


def test_registered():
    assert ops_running("cuda", "triton: _routing") | ops_running(
        "cuda", "triton: ATen softmax / sigmoid, then _routing"
    ) == set(LAUNCHERS)


@INTERPRETED
@pytest.mark.parametrize("name", LAUNCHERS)
def test_spec_samples_agree_with_the_cpu_kernel(name):
    spec, taken = ROUTING[name], 0
    for dtype, s in _samples(spec):
        launcher = LAUNCHERS[name]
        with mock.patch.object(_routing, launcher, wraps=getattr(_routing, launcher)) as launch:
            got = getattr(kernels, name)(*s.args)
        assert launch.called == _takes(name, s), (name, s.name, dtype)
        taken += launch.called
        _assert_agrees(name, got, spec.op(*s.args), f"{s.name} {dtype}")
    assert taken


def _strided(x: torch.Tensor, strided: bool) -> torch.Tensor:
    return torch.cat([x, x], 1)[:, ::2] if strided and x.dim() == 2 else x


@INTERPRETED
@settings(max_examples=30, deadline=None)  # the interpreter runs each program in Python: small tensors
@given(
    t=st.integers(0, 12),
    h=st.integers(0, 40),
    k=st.integers(1, 4),
    e=st.integers(1, 9),
    alignment=st.sampled_from([1, 2, 8]),
    id_dtype=st.sampled_from([torch.int32, torch.int64]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.float64]),
    weighted=st.booleans(),
    with_bias=st.booleans(),
    strided=st.booleans(),
    special=st.sampled_from([None, "nan", "inf", "-inf", "-0.0"]),
    seed=st.integers(0, 2**16),
)
def test_random_permute_and_unpermute_bitwise(
    t, h, k, e, alignment, id_dtype, dtype, weighted, with_bias, strided, special, seed
):
    g = torch.Generator().manual_seed(seed)
    k = min(k, e)
    x = _strided((torch.randn(t, h, generator=g) * 100).to(dtype), strided)
    idx = _strided(random_topk(t, k, e, g, drop=0.3).to(id_dtype), strided)
    got, ours = kernels.moe_permute(x, idx, e, alignment), torch.ops.ascend_moe.moe_permute(x, idx, e, alignment)
    _assert_agrees("moe_permute", got, ours)
    y = torch.randn(permute_capacity(t, k, e, alignment), h, generator=g).to(dtype)
    w = _strided(torch.randn(t, k, generator=g).to(dtype), strided) if weighted else None
    if special is not None and y.numel():
        y.view(-1)[seed % y.numel()] = float(special)
        if w is not None and w.numel():  # a special weight on an unrouted slot must vanish, as in the C++ kernel
            w.view(-1)[seed % w.numel()] = float(special)
    row_map = _strided(ours[1], strided)
    bias = None
    if with_bias:  # a -0.0 among it must survive unrouted slots, as in the C++ kernel
        bias = _strided(torch.randn(t, h, generator=g).to(dtype), strided)
        if bias.numel():
            bias[0, 0] = -0.0
    got = kernels.moe_unpermute(y, row_map, w, bias)
    _assert_agrees("moe_unpermute", got, torch.ops.ascend_moe.moe_unpermute(y, row_map, w, bias))


@INTERPRETED
@settings(max_examples=40, deadline=None)
@given(
    t=st.integers(1, 6),
    groups=st.sampled_from([1, 2, 3, 4, 8]),
    per_group=st.integers(1, 8),
    data=st.data(),
    func=st.sampled_from(["softmax", "sigmoid"]),
    with_bias=st.booleans(),
    renorm=st.booleans(),
    scale=st.sampled_from([1.0, 2.5]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    values=st.sampled_from(["random", "ties", "special"]),
    seed=st.integers(0, 2**16),
)
def test_random_gating_choice_exact(t, groups, per_group, data, func, with_bias, renorm, scale, dtype, values, seed):
    """Random routings, exact ties (a few distinct logits), NaN / inf / -0.0 among them: the same experts in the
    same order as the C++ kernel, including a top-k larger than the kept groups' experts."""
    g = torch.Generator().manual_seed(seed)
    e = groups * per_group
    kept = data.draw(st.integers(1, groups))
    topk = data.draw(st.integers(1, e))
    if values == "ties":
        logits = torch.randint(-2, 2, (t, e), generator=g).float()
    else:
        logits = torch.randn(t, e, generator=g) * 4
    if values == "special":
        for v in ("nan", "inf", "-inf", "-0.0", "0.0"):
            logits.view(-1)[int(torch.randint(0, t * e, (1,), generator=g))] = float(v)
    bias = (torch.randint(-1, 2, (e,), generator=g) * 0.5).float() if with_bias else None
    args = (logits.to(dtype), topk, bias, func, groups, kept, renorm, scale)
    _assert_agrees("moe_gating_topk", kernels.moe_gating_topk(*args), torch.ops.ascend_moe.moe_gating_topk(*args))


@INTERPRETED
@pytest.mark.parametrize("name", LAUNCHERS)
def test_no_host_read_while_capturing(name):
    for _, s in _samples(ROUTING[name]):
        if not _takes(name, s):
            continue
        eager = getattr(kernels, name)(*s.args)
        with capturing_everywhere(), no_host_reads():
            captured = getattr(kernels, name)(*s.args)
        _assert_agrees(name, captured, eager, s.name)


@INTERPRETED
def test_ids_out_of_range_route_nowhere_while_capturing():
    """Unchecked during a capture, an id >= E (or < -1) routes nowhere instead of writing out of bounds."""
    x, idx = torch.randn(3, 8), torch.tensor([[0, 5], [1, -7], [2, 0]])
    with capturing_everywhere(), no_host_reads():
        out, row_map, offs = kernels.moe_permute(x, idx, 3, 1)
    assert row_map.tolist() == [[0, -1], [2, -1], [3, 1]] and offs.tolist() == [2, 3, 4]
    assert torch.equal(out[:4], x[[0, 2, 1, 2]])


@pytest.mark.parametrize("name", LAUNCHERS)
def test_bad_inputs_raise_our_errors(name):
    for bad in ROUTING[name].bad_inputs("cpu"):
        with pytest.raises(bad.error, match=bad.match):
            getattr(kernels, name)(*bad.args)


@INTERPRETED
@pytest.mark.parametrize("name", LAUNCHERS)
def test_hostile_inputs_agree_with_the_cpu_kernel(name):
    spec = ROUTING[name]
    samples = spec.sample_inputs("cpu", torch.float32, small=True)[:2]
    problems, count = campaign.kernel_problems(spec, getattr(kernels, name), samples)
    assert count and not problems, "\n".join(problems[:5])


@INTERPRETED
@pytest.mark.parametrize("name", LAUNCHERS)
def test_opcheck_and_compile_through_an_opaque_op(name):
    samples = [s for _, s in _samples(ROUTING[name]) if _takes(name, s) and s.args[0].dtype == torch.float32]
    check_opaque(name, getattr(kernels, name), samples[:2])


@GPU
@pytest.mark.parametrize("name", LAUNCHERS)
def test_cuda_values_agree_with_the_cpu_kernel(name):
    """The compiled kernels: permute and unpermute bit for bit the C++ kernel (no FMA in the slot sums), the gating's
    choice exactly, on CUDA tensors through the dispatcher."""
    spec = ROUTING[name]
    for dtype, s in _samples(spec):
        got = spec.op(*_on("cuda", s))
        got = tuple(o.cpu() for o in got) if isinstance(got, tuple) else got.cpu()
        _assert_agrees(name, got, spec.op(*s.args), f"{s.name} {dtype}")


@GPU
@pytest.mark.parametrize("name", LAUNCHERS)
def test_cuda_graph_capture_and_replay(name):
    spec = ROUTING[name]
    for dtype, s in _samples(spec):
        if not _takes(name, s) or dtype != torch.float32:
            continue
        args = _on("cuda", s)
        spec.op(*args)  # warm-up outside the capture (allocator, Triton's compile)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = spec.op(*args)
        if args[0].is_floating_point():
            args[0].copy_(torch.randn_like(args[0]))
        graph.replay()
        torch.cuda.synchronize()
        _assert_agrees(name, out, spec.op(*args), s.name)
