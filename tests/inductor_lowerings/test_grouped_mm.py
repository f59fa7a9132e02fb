"""The grouped_mm rewrite (inductor_lowerings/grouped_mm.py): ``aten._grouped_mm`` and transformers'
``grouped_mm_fallback`` become our grouped GEMMs where ours is the better kernel (``grouped_mm.applies``: Ascend, CPUs
without BF16 dot products, FP32 on CPU). Every test here says which CPU it stands for (``backends.cpu_gemm.NATIVE``
patched), so both choices are checked on every machine: the golden graph, values against fp64 and the unrewritten
compile, an unmodified transformers Mixtral block compiled with the passes (forward, and the backward's input and
weight gradients, through ``enable()`` and through the ``"ascend_moe"`` backend), the weight-gradient form alone, and
BF16 left to ATen where the CPU multiplies it natively."""

from __future__ import annotations

import contextlib

import pytest
import torch
from expecttest import assert_expected_inline

from tests.inductor_lowerings.graphs import compiled
from torch_ascend_moe import inductor_lowerings
from torch_ascend_moe.backends import cpu_gemm
from torch_ascend_moe.testing import calc_diff

pytest.importorskip("transformers")


@pytest.fixture
def emulated_bf16(monkeypatch):
    """A CPU without BF16 / FP16 dot products, whatever this one has: ours is the better grouped GEMM there."""
    monkeypatch.setitem(cpu_gemm.NATIVE, torch.bfloat16, False)
    monkeypatch.setitem(cpu_gemm.NATIVE, torch.float16, False)


def _inputs(dtype=torch.bfloat16, g=4, m_per=(5, 0, 9, 3), k=64, n=48, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ends = torch.tensor(m_per, dtype=torch.int32).cumsum(0).to(torch.int32)
    a = torch.randn(int(ends[-1]), k, generator=gen).to(dtype)
    return a, torch.randn(g, k, n, generator=gen).to(dtype), ends


def _aten(a, b, offs):
    return torch._grouped_mm(a, b, offs=offs)


def _reference(a, b, offs):
    out, start = torch.zeros(a.shape[0], b.shape[2], dtype=torch.float64), 0
    for g, end in enumerate(offs.tolist()):
        out[start:end] = a[start:end].double() @ b[g].double()
        start = end
    return out


def test_golden_graph(emulated_bf16):
    _, before = compiled(_aten, *_inputs(), passes=False)
    _, after = compiled(_aten, *_inputs(), passes=True)
    assert_expected_inline(before, """_grouped_mm = aten._grouped_mm(arg0_1, arg1_1, arg2_1)""")
    assert_expected_inline(
        after,
        """\
permute_default = aten.permute(arg1_1, [0, 2, 1])
m_grouped_bf16_gemm_default = m_grouped_bf16_gemm(arg0_1, permute_default, arg2_1, True, 1, torch.bfloat16)""",
    )


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_values(emulated_bf16, dynamic):
    args = _inputs()
    before = inductor_lowerings.MATCHES["grouped_mm"]
    got, graph = compiled(_aten, *args, passes=True, dynamic=dynamic)
    assert "m_grouped_bf16_gemm" in graph and inductor_lowerings.MATCHES["grouped_mm"] > before
    want = _aten(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert calc_diff(got, _reference(*args)) < 1e-5 and calc_diff(got, want) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_transformers_fallback_op(emulated_bf16, monkeypatch, dtype):
    """transformers' own op for non-BF16 experts (``aten._grouped_mm``'s meta function takes BF16 only): FP32 always
    (ours 1.02-1.18x its host loop), FP16 on a CPU without FP16 dot products; FP16 kept where they exist."""
    import transformers.integrations.moe  # noqa: F401  (registers transformers::grouped_mm_fallback)

    args = _inputs(dtype)
    fn = lambda a, b, offs: torch.ops.transformers.grouped_mm_fallback(a, b, offs)  # noqa: E731
    got, graph = compiled(fn, *args, passes=True)
    assert "m_grouped_bf16_gemm" in graph and "grouped_mm_fallback" not in graph, graph
    assert got.dtype == dtype and calc_diff(got, _reference(*args)) < 1e-5
    torch.testing.assert_close(got, fn(*args), **({"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {}))
    if dtype == torch.float16:
        monkeypatch.setitem(cpu_gemm.NATIVE, dtype, True)
        _, graph = compiled(fn, *args, passes=True)
        assert "m_grouped_bf16_gemm" not in graph and "grouped_mm_fallback" in graph, graph


def test_unmodified_transformers_moe_block_runs_our_grouped_gemm(emulated_bf16):
    """transformers' Mixtral block with ``grouped_mm`` experts, compiled as is after ``enable()``: its expert GEMMs
    are ours, the gate-up one with its SwiGLU fused (``swiglu_epilogue`` in the passes' second round); the output
    equals the uncompiled block's."""
    from torch_ascend_moe.bench.moe import models

    block, _, x = models((24, 64, 2, 4), "grouped_mm", "cpu", torch.bfloat16)
    with torch.no_grad():
        got, graph = compiled(block, x, passes=True)
        want = block(x)
    assert graph.count("m_grouped_bf16_gemm(") == 1 and "_grouped_mm(" not in graph, graph
    assert graph.count("m_grouped_bf16_gemm_swiglu(") == 1, graph
    got, want = (o[0] if isinstance(o, tuple) else o for o in (got, want))
    assert calc_diff(got, want) < 1e-4


def _weight_gradient_form(a, b, offs):
    return torch._grouped_mm(a.t(), a, offs=offs)  # A [K, S] @ B [S, K] per column group -> [G, K, K]


def test_weight_gradient_form(emulated_bf16):
    args = _inputs(k=32, m_per=(8, 0, 16, 8))  # 16-byte aligned strides, as ATen's kernel needs
    got, graph = compiled(_weight_gradient_form, *args, passes=True)
    assert "k_grouped_bf16_gemm(" in graph and "_grouped_mm(" not in graph, graph
    a, _, offs = args
    ref, start = torch.zeros(len(offs), a.shape[1], a.shape[1], dtype=torch.float64), 0
    for g, end in enumerate(offs.tolist()):
        ref[g] = a[start:end].double().t() @ a[start:end].double()
        start = end
    assert got.dtype == torch.bfloat16 and calc_diff(got, ref) < 1e-5
    assert calc_diff(got, _weight_gradient_form(*args)) < 1e-5


@pytest.mark.parametrize("through", ["enable", "backend", "recompute_l1"])
def test_training_graphs_of_an_unmodified_transformers_block(emulated_bf16, through):
    """Forward and backward of transformers' Mixtral block compiled with the passes: the forward's expert GEMMs are
    ``m_grouped_bf16_gemm``, the backward's input gradients too and its weight gradients ``k_grouped_bf16_gemm``;
    the gradients match eager's. Through ``backend="ascend_moe"`` too, whose backward graph AOTAutograd compiles
    lazily, after the backend returned (the passes must still be on for it). With ``recompute_l1`` the joint graph's
    stock L1 (``_grouped_mm``) and its SwiGLU are tagged, the forward fuses them, the backward recomputes the L1."""
    from torch._inductor import config

    from tests.inductor_lowerings.graphs import Recorder
    from torch_ascend_moe.bench.moe import models

    block, _, x = models((32, 64, 2, 4), "grouped_mm", "cpu", torch.bfloat16)
    recorder = Recorder()
    torch._dynamo.reset()
    switch = contextlib.nullcontext()
    if through != "backend":
        switch = inductor_lowerings.enabled(recompute_l1=through == "recompute_l1")
    backend = inductor_lowerings.BACKEND if through == "backend" else "inductor"
    with config.patch(post_grad_custom_post_pass=recorder), switch:  # the backward's compile happens in the block
        xg = x.detach().requires_grad_()
        out = torch.compile(block, fullgraph=True, backend=backend)(xg)
        (out[0] if isinstance(out, tuple) else out).float().square().sum().backward()
    torch._dynamo.reset()
    forward, backward = recorder.graphs[-2:]
    fused = through == "recompute_l1"
    assert forward.count("m_grouped_bf16_gemm(") == 2 - fused and "_grouped_mm(" not in forward, forward
    assert forward.count("m_grouped_bf16_gemm_swiglu(") == fused, forward
    assert backward.count("k_grouped_bf16_gemm(") == 2 and "_grouped_mm(" not in backward, backward
    assert backward.count("m_grouped_bf16_gemm(") == 2 + fused, backward  # two input gradients (+ the L1 again)
    xe = x.detach().requires_grad_()
    eager = block(xe)
    (eager[0] if isinstance(eager, tuple) else eager).float().square().sum().backward()
    assert calc_diff(xg.grad, xe.grad) < 1e-3


def test_left_alone_where_the_cpu_multiplies_bf16_natively(monkeypatch):
    """On a CPU with BF16 dot products ATen's grouped GEMM is oneDNN's native one, on par with ours: kept."""
    monkeypatch.setitem(cpu_gemm.NATIVE, torch.bfloat16, True)
    args = _inputs()
    got, graph = compiled(_aten, *args, passes=True)
    assert "m_grouped_bf16_gemm" not in graph and "_grouped_mm(" in graph, graph
    torch.testing.assert_close(got, _aten(*args))
