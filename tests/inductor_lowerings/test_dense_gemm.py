"""The dense_gemm rewrite (inductor_lowerings/dense_gemm.py): BF16 / FP16 ``aten.mm`` / ``aten.addmm`` become
``bf16_gemm`` on a CPU without dot-product instructions for the type. Every test says which CPU it stands for
(``backends.cpu_gemm.NATIVE`` patched), so both choices are checked on every machine: golden graphs of a linear with
and without bias, values vs fp64 and the unrewritten compile over shapes, strides, dtypes, bias shapes and alpha
(hypothesis), a training step's forward and backward graphs, and the near misses left alone."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from expecttest import assert_expected_inline
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.inductor_lowerings.graphs import compiled
from torch_ascend_moe import inductor_lowerings
from torch_ascend_moe.backends import cpu_gemm
from torch_ascend_moe.testing import calc_diff


@pytest.fixture
def emulated(monkeypatch):
    """A CPU without BF16 / FP16 dot products, whatever this one has."""
    monkeypatch.setitem(cpu_gemm.NATIVE, torch.bfloat16, False)
    monkeypatch.setitem(cpu_gemm.NATIVE, torch.float16, False)


def _linear(x, w, b=None):
    return F.linear(x, w, b)


def _inputs(m=24, n=40, k=64, dtype=torch.bfloat16, bias=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(m, k, generator=g).to(dtype), torch.randn(n, k, generator=g).to(dtype)
    return (x, w, torch.randn(n, generator=g).to(dtype)) if bias else (x, w)


def test_golden_graphs(emulated):
    _, before = compiled(_linear, *_inputs(), passes=False)
    _, after = compiled(_linear, *_inputs(), passes=True)
    assert_expected_inline(
        before,
        """\
permute = aten.permute(arg1_1, [1, 0])
mm = aten.mm(arg0_1, permute)""",
    )
    assert_expected_inline(
        after,
        """\
permute = aten.permute(arg1_1, [1, 0])
permute_default = aten.permute(permute, [1, 0])
bf16_gemm_default = bf16_gemm(arg0_1, permute_default)""",
    )
    _, after = compiled(_linear, *_inputs(bias=True), passes=True)
    assert_expected_inline(
        after,
        """\
permute = aten.permute(arg1_1, [1, 0])
permute_default = aten.permute(permute, [1, 0])
expand_default = aten.expand(arg2_1, [24, 40])
bf16_gemm_default = bf16_gemm(arg0_1, permute_default, expand_default)""",
    )


def _reference(a, m2, bias=None, alpha=1.0):
    out = alpha * (a.double() @ m2.double())
    return out if bias is None else out + bias.double()


@settings(max_examples=12, deadline=None)
@given(
    m=st.integers(1, 40),
    n=st.integers(1, 48),
    k=st.integers(1, 80),
    dtype=st.sampled_from([torch.bfloat16, torch.float16]),
    a_t=st.booleans(),
    m2_t=st.booleans(),
    bias=st.sampled_from([None, "row", "full", "one_row"]),
    alpha=st.sampled_from([1.0, 0.5, -2.0]),
    seed=st.integers(0, 2**16),
)
def test_values(m, n, k, dtype, a_t, m2_t, bias, alpha, seed):
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(cpu_gemm.NATIVE, dtype, False)
        g = torch.Generator().manual_seed(seed)
        a = torch.randn(k, m, generator=g).to(dtype).t() if a_t else torch.randn(m, k, generator=g).to(dtype)
        m2 = torch.randn(n, k, generator=g).to(dtype).t() if m2_t else torch.randn(k, n, generator=g).to(dtype)
        shapes = {None: None, "row": (n,), "full": (m, n), "one_row": (1, n)}
        c = None if bias is None else torch.randn(shapes[bias], generator=g).to(dtype)
        if c is None:
            fn, args, alpha = torch.mm, (a, m2), 1.0
        else:
            fn, args = (lambda c, a, m2: torch.addmm(c, a, m2, alpha=alpha)), (c, a, m2)
        want, unrewritten = compiled(fn, *args, passes=False)
        before = inductor_lowerings.MATCHES["dense_gemm"]
        got, graph = compiled(fn, *args, passes=True)
        if "mm(" in unrewritten:  # Inductor turns degenerate products (a size of 1) into pointwise code itself
            assert "bf16_gemm" in graph and "aten.mm(" not in graph and "addmm" not in graph, graph
            assert inductor_lowerings.MATCHES["dense_gemm"] > before
        ref = _reference(a, m2, c, alpha)
        assert got.dtype == dtype and got.shape == ref.shape
        assert calc_diff(got, ref) < 1e-5 and calc_diff(got, want) < 1e-5


def test_training_graphs_of_a_linear_layer(emulated):
    """Forward and backward of a BF16 MLP compiled with the passes: every GEMM (the projections, the input gradients,
    the weight gradients) is bf16_gemm, and the gradients match eager's."""
    from torch._inductor import config

    from tests.inductor_lowerings.graphs import Recorder

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.SiLU(), torch.nn.Linear(96, 32, bias=False))
    mlp = mlp.to(torch.bfloat16)
    x = torch.randn(40, 64, dtype=torch.bfloat16)
    recorder = Recorder()
    torch._dynamo.reset()
    with config.patch(post_grad_custom_post_pass=recorder):
        out = torch.compile(mlp, fullgraph=True, backend=inductor_lowerings.BACKEND)(x)
        out.float().square().sum().backward()
    torch._dynamo.reset()
    forward, backward = recorder.graphs[-2:]
    assert forward.count("bf16_gemm(") == 2 and "aten.mm(" not in forward and "addmm" not in forward, forward
    assert backward.count("bf16_gemm(") == 3 and "aten.mm(" not in backward, backward  # no input gradient of the first
    got = [p.grad.clone() for p in mlp.parameters()]
    mlp.zero_grad()
    mlp(x).float().square().sum().backward()
    for g, w in zip(got, (p.grad for p in mlp.parameters()), strict=True):
        assert calc_diff(g, w) < 1e-4


def _addmm_half_beta(c, a, m2):
    return torch.addmm(c, a, m2, beta=0.5)


@pytest.mark.parametrize(
    "case",
    ["native", "fp32", "beta"],
)
def test_near_misses_left_alone(emulated, monkeypatch, case):
    x, w, b = _inputs(bias=True)
    fn, args = _linear, (x, w, b)
    if case == "native":  # a CPU with BF16 dot products: ATen's GEMM is oneDNN's native one
        monkeypatch.setitem(cpu_gemm.NATIVE, torch.bfloat16, True)
    elif case == "fp32":  # the same MKL SGEMM on both sides
        args = (x.float(), w.float(), b.float())
    else:  # beta != 1: not our GEMM's C
        fn, args = _addmm_half_beta, (torch.randn(24, 40).to(torch.bfloat16), x, w.t())
    got, graph = compiled(fn, *args, passes=True)
    assert "bf16_gemm" not in graph, graph
    want, _ = compiled(fn, *args, passes=False)
    torch.testing.assert_close(got, want)
