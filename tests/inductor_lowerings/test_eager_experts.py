"""transformers' ``"eager"`` experts under ``torch.compile`` (``torch_ascend_moe.hf.eager_experts_forward``): its
per-expert loop graph-breaks on every expert and no post-grad rewrite can see it, so with
``inductor_lowerings.enable()`` Dynamo traces our grouped ops in its place. Unmodified tiny HF models (FP64, eager
experts) compile in one graph that runs our grouped GEMMs and matches the uncompiled model (logits, and a training
step's gradients); without the switch the loop is what runs; outside compilation nothing changes; Dynamo guards
on the switch."""

from __future__ import annotations

import pytest
import torch
from torch._inductor import config

from tests.inductor_lowerings.graphs import Recorder
from torch_ascend_moe import inductor_lowerings
from torch_ascend_moe.testing import calc_diff

pytest.importorskip("transformers")

from tests.hf.test_hf_models import _ids  # noqa: E402
from tests.hf.test_hf_models import _tiny as _tiny_model  # noqa: E402
from torch_ascend_moe import hf  # noqa: E402


def _tiny(family: str):
    """One decoder layer (compiling a second identical one only doubles the compile time), except DeepSeek-V3,
    whose first layer is dense (``first_k_dense_replace=1``): two there."""
    return _tiny_model(family, num_hidden_layers=2 if family == "deepseek_v3" else 1)


def _compiled_logits(model, ids, passes: bool):
    """Logits of ``torch.compile(model, fullgraph=True)`` and the post-grad graphs' text."""
    torch._dynamo.reset()
    recorder = Recorder()
    with config.patch(post_grad_custom_post_pass=recorder):
        if passes:
            with inductor_lowerings.enabled(), torch.no_grad():
                logits = torch.compile(model, fullgraph=True)(ids).logits
        else:
            with torch.no_grad():
                logits = torch.compile(model, fullgraph=True)(ids).logits
    torch._dynamo.reset()
    return logits, "\n".join(recorder.graphs)


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe", "deepseek_v3"])
def test_unmodified_model_with_eager_experts_compiles_to_our_grouped_ops(family):
    model = _tiny(family)
    assert set(model.get_experts_implementation().values()) == {"eager"}
    ids = _ids()
    with torch.no_grad():
        want = model(ids).logits
    got, graph = _compiled_logits(model, ids, passes=True)
    moe_layers = sum(1 for m in model.modules() if hasattr(m, "gate_up_proj"))
    # L1 + SwiGLU fused by swiglu_epilogue, L2 plain: two grouped GEMMs per MoE layer, no per-expert loop.
    assert graph.count("m_grouped_bf16_gemm_swiglu(") == moe_layers, graph
    assert graph.count("m_grouped_bf16_gemm(") == moe_layers, graph
    assert "nonzero" not in graph
    assert calc_diff(got, want) < 1e-12


def test_without_the_switch_the_loop_runs():
    model = _tiny("mixtral")
    with pytest.raises(torch._dynamo.exc.Unsupported):  # the loop's data-dependent shapes: not one graph
        _compiled_logits(model, _ids(), passes=False)


def test_outside_compilation_it_is_the_models_own_loop():
    model = _tiny("mixtral")
    experts = next(m for m in model.modules() if hasattr(m, "gate_up_proj"))
    x = torch.randn(7, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    e = experts.num_experts
    index = torch.tensor([[0, 3], [1, 3], [e - 1, 2], [0, 1], [e - 2, e - 1], [e, 0], [2, 2]])  # e: another rank's
    weights = torch.rand(7, 2, dtype=torch.float64)
    with inductor_lowerings.enabled(), torch.no_grad():
        got = experts(x, index, weights)
    with torch.no_grad():
        want = hf._decorated_forward(type(experts))(experts, x, index, weights)
    assert torch.equal(got, want)


def test_training_step_gradients():
    model = _tiny("qwen3_moe").train()
    ids = _ids()
    model(ids, labels=ids).loss.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    torch._dynamo.reset()
    with inductor_lowerings.enabled():
        torch.compile(model, fullgraph=True)(ids, labels=ids).loss.backward()
    torch._dynamo.reset()
    got = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert got.keys() == want.keys()
    for name, grad in want.items():
        assert calc_diff(got[name], grad) < 1e-12, name
    assert got["model.layers.0.mlp.experts.gate_up_proj"].abs().sum() > 0


def test_dynamo_guards_on_the_switch():
    """Compiled with the switch on, called with it off: Dynamo recompiles, tracing the loop again."""
    model = _tiny("mixtral")
    ids = _ids()
    with torch.no_grad():
        model(ids)  # transformers installs its output-capturing hooks at the first call, under a lock Dynamo refuses
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    with inductor_lowerings.enabled(), torch.no_grad():
        compiled(ids)
    # Recompiled: the loop again, whose data-dependent iteration count fullgraph refuses.
    with pytest.raises((torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError)), torch.no_grad():
        compiled(ids)
    torch._dynamo.reset()


@pytest.mark.parametrize("native", [True, False], ids=["bf16-dot", "no-bf16-dot"])
def test_bf16_on_cpu_follows_the_faster_grouped_gemm(monkeypatch, native):
    """BF16 on a CPU with BF16 dot products: ATen's oneDNN grouped GEMM is native there, so the loop becomes
    transformers' own grouped_mm experts (one graph, ``aten._grouped_mm``); without them ATen emulates BF16 and the
    loop becomes our grouped ops (L1 + SwiGLU fused)."""
    from torch_ascend_moe.backends import cpu_gemm

    monkeypatch.setitem(cpu_gemm.NATIVE, torch.bfloat16, native)
    model = _tiny("mixtral").to(torch.bfloat16)
    ids = _ids()
    with torch.no_grad():
        want = model(ids).logits
    got, graph = _compiled_logits(model, ids, passes=True)
    assert "nonzero" not in graph, graph
    if native:
        assert graph.count("aten._grouped_mm") == 2 and "m_grouped" not in graph, graph
    else:
        assert graph.count("m_grouped_bf16_gemm_swiglu(") == 1 and "_grouped_mm" not in graph, graph
    assert calc_diff(got, want) < 1e-4
