"""transformers' own model-test checks in spirit, with our experts against HF's ``eager`` ones, on tiny random
configs built locally (no downloads), for Mixtral, Qwen3-MoE, Qwen2-MoE, DeepSeek-V3 and OLMoE: logits,
``output_router_logits`` (router logits and the load-balancing aux loss), one training step (loss and
gradients), greedy generation. Then ``swap_moe_blocks`` keeping HF's behaviour: router logits / aux loss,
non-SiLU activations, ``_init_weights`` after a meta-device build, DeepSeek-V3 with ``num_experts_per_tok``
above the kept groups' experts; and the registration in any import order (fresh interpreters)."""

import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

import torch_ascend_moe.hf as hf  # noqa: E402
from torch_ascend_moe.bench.moe import randomize_routing  # noqa: E402
from torch_ascend_moe.nn import MoE  # noqa: E402
from torch_ascend_moe.testing import calc_diff  # noqa: E402

COMMON = dict(
    vocab_size=96,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=64,
)
MOE = dict(num_experts_per_tok=2, output_router_logits=True, router_aux_loss_coef=0.01)


def _config(family: str, **extra):
    return getattr(transformers, CONFIGS[family])(**{**COMMON, **MOE, **SIZES[family], **extra})


CONFIGS = {
    "mixtral": "MixtralConfig",
    "qwen3_moe": "Qwen3MoeConfig",
    "qwen2_moe": "Qwen2MoeConfig",
    "olmoe": "OlmoeConfig",
    "deepseek_v3": "DeepseekV3Config",
}
SIZES = {
    "mixtral": dict(intermediate_size=48, num_local_experts=4),
    "qwen3_moe": dict(
        intermediate_size=96, moe_intermediate_size=48, num_experts=4, head_dim=16, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[],
    ),
    "qwen2_moe": dict(
        intermediate_size=96, moe_intermediate_size=48, shared_expert_intermediate_size=48, num_experts=4,
        decoder_sparse_step=1, mlp_only_layers=[],
    ),
    "olmoe": dict(intermediate_size=48, num_experts=4),
    "deepseek_v3": dict(
        intermediate_size=96, moe_intermediate_size=48, n_routed_experts=8, n_group=2, topk_group=1,
        n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.5, kv_lora_rank=16,
        q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
    ),
}  # fmt: skip


CLASSES = {
    "mixtral": "MixtralForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "olmoe": "OlmoeForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
}
FAMILIES = list(CLASSES)
SWAPPABLE = ["mixtral", "qwen3_moe", "olmoe", "deepseek_v3"]


def _randomize_routing(model):
    return randomize_routing(model, std=0.2)


def _tiny(family: str, **extra):
    torch.manual_seed(0)
    model = getattr(transformers, CLASSES[family])(_config(family, **extra)).double()
    model.set_experts_implementation("eager")  # the reference (the default may be grouped_mm: no FP64 on CPU)
    return _randomize_routing(model).eval()


def _ids(seed=1):
    return torch.randint(0, 96, (2, 10), generator=torch.Generator().manual_seed(seed))


def _run(model, ids):
    """Logits, router logits and aux loss, then one training step's loss and gradients."""
    with torch.no_grad():
        out = model(ids)
    model.train()
    model.zero_grad()
    train = model(ids, labels=ids)
    train.loss.backward()
    model.eval()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, train.loss.detach(), grads


@pytest.mark.parametrize("family", FAMILIES)
def test_model_with_ascend_moe_experts_matches_eager(family):
    model = _tiny(family)
    ids = _ids()
    model.set_experts_implementation("eager")
    ref, ref_loss, ref_grads = _run(model, ids)
    ref_generated = model.generate(ids[:, :4], max_new_tokens=4, do_sample=False)
    model.set_experts_implementation(hf.IMPLEMENTATION)
    got, loss, grads = _run(model, ids)
    assert calc_diff(got.logits, ref.logits) < 1e-12
    assert len(got.router_logits) == len(ref.router_logits) > 0
    for a, b in zip(got.router_logits, ref.router_logits):
        assert calc_diff(a, b) < 1e-12
    if ref.aux_loss is not None:  # DeepSeek-V3 has none (auxiliary-loss-free balancing)
        assert torch.allclose(got.aux_loss, ref.aux_loss, rtol=1e-10)
    assert torch.allclose(loss, ref_loss, rtol=1e-10)
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        assert calc_diff(grad, ref_grads[name]) < 1e-10, name
    assert torch.equal(model.generate(ids[:, :4], max_new_tokens=4, do_sample=False), ref_generated)


@pytest.mark.parametrize("family", SWAPPABLE)
def test_swapped_model_keeps_router_logits_and_aux_loss(family):
    """Before: the swapped model returned router_logits=() (Mixtral's aux loss raised IndexError)."""
    model = _tiny(family)
    ids = _ids()
    ref, ref_loss, _ = _run(model, ids)
    hf.swap_moe_blocks(model)
    got, loss, _ = _run(model, ids)
    assert len(got.router_logits) == len(ref.router_logits) > 0
    for a, b in zip(got.router_logits, ref.router_logits):
        assert a.shape == b.shape and a.dtype == b.dtype and calc_diff(a, b) < 1e-12
    if ref.aux_loss is not None:  # HF computes it in FP32 here: logits within 1e-12 may round differently
        assert torch.allclose(got.aux_loss, ref.aux_loss, rtol=1e-6)
    assert torch.allclose(loss, ref_loss, rtol=1e-10)


@pytest.mark.parametrize("act", ["gelu", "gelu_pytorch_tanh", "relu"])
@pytest.mark.parametrize("family", SWAPPABLE)
def test_swapped_model_any_activation(family, act):
    """Before: swap_moe_blocks raised for hidden_act != "silu"; now HF's own activation runs in our experts."""
    model = _tiny(family, hidden_act=act)
    ids = _ids()
    with torch.no_grad():
        expected = model(ids).logits
        hf.swap_moe_blocks(model)
        assert calc_diff(model(ids).logits, expected) < 1e-12


def test_moe_module_named_activation():
    torch.manual_seed(0)
    moe = MoE(32, 16, 4, 2, num_shared_experts=1, activation="gelu", dtype=torch.float64)
    x = torch.randn(5, 32, dtype=torch.float64)
    idx, w, _ = moe.gate(x)
    expected = moe.shared_experts.down_proj(
        torch.nn.functional.gelu(moe.shared_experts.gate_proj(x)) * moe.shared_experts.up_proj(x)
    )
    for t in range(5):
        for j in range(2):
            gate, up = (moe.experts.gate_up_proj[idx[t, j]] @ x[t]).chunk(2)
            expected[t] += w[t, j] * (moe.experts.down_proj[idx[t, j]] @ (torch.nn.functional.gelu(gate) * up))
    assert calc_diff(moe(x), expected) < 1e-12


def test_deepseek_v3_topk_above_kept_groups():
    """num_experts_per_tok=8 > the kept group's 4 experts: HF's router takes every expert of the kept group and
    fills up from the masked ones (here all experts: the result does not depend on its tie order). Before: the
    swap succeeded and every forward raised."""
    model = _tiny("deepseek_v3", num_experts_per_tok=8)
    ids = _ids()
    with torch.no_grad():
        expected = model(ids).logits
        hf.swap_moe_blocks(model)
        assert calc_diff(model(ids).logits, expected) < 1e-12
    # 6 of 8: the kept group's 4 experts first, then the 2 best others; weights = the unbiased scores at them.
    model = _tiny("deepseek_v3", num_experts_per_tok=6)
    router = next(m for m in model.modules() if type(m).__name__ == "DeepseekV3TopkRouter")
    x = torch.randn(7, 64, dtype=torch.float64)
    with torch.no_grad():
        _, ref_w, ref_idx = router(x)
        hf.swap_moe_blocks(model)
        gate = next(m for m in model.modules() if isinstance(m, MoE)).gate
        idx, w, _ = gate(x)
    for t in range(7):
        kept = set(ref_idx[t][ref_w[t] > 0].tolist()) & set(idx[t, :4].tolist())
        assert len(kept) == 4 and set(idx[t, :4].tolist()) <= set(ref_idx[t].tolist())
    scores = (x @ gate.weight.T).sigmoid()
    picked = scores.gather(1, idx)
    assert calc_diff(w, picked / picked.sum(-1, keepdim=True) * 2.5) < 1e-12


@pytest.mark.parametrize("family", SWAPPABLE)
def test_swapped_modules_initialised_by_transformers(family):
    """Built on the meta device, swapped, materialised: init_weights() initialises the new gates and experts as
    HF's _init_weights does its blocks (normal(0, initializer_range), expert bias zeros). Before: left as
    torch.empty memory."""
    with torch.device("meta"):
        model = getattr(transformers, CLASSES[family])(_config(family))
    hf.swap_moe_blocks(model)
    model.to_empty(device="cpu")
    for m in model.modules():
        m._is_hf_initialized = False
    for t in list(model.parameters()) + list(model.buffers()):
        t._is_hf_initialized = False
        with torch.no_grad():
            t.fill_(float("nan"))
    model.init_weights()
    std = model.config.initializer_range
    moes = [m for m in model.modules() if isinstance(m, MoE)]
    assert moes
    for moe in moes:
        for p in (moe.gate.weight, moe.experts.gate_up_proj, moe.experts.down_proj):
            assert torch.isfinite(p).all() and abs(p.std().item() - std) < 0.2 * std
        if moe.gate.e_score_correction_bias is not None:
            assert torch.equal(moe.gate.e_score_correction_bias, torch.zeros_like(moe.gate.e_score_correction_bias))
    with torch.no_grad():
        assert torch.isfinite(model(_ids()).logits).all()


@pytest.mark.parametrize(
    "imports",
    [
        # modeling_utils imports integrations.moe half-way through its own initialisation: the hook fires then.
        "import torch_ascend_moe\nassert 'transformers' not in sys.modules\nfrom transformers import PreTrainedModel",
        "import transformers\nimport torch_ascend_moe",
        "import transformers.models.mixtral.modeling_mixtral\nimport torch_ascend_moe",
    ],
    ids=["ours-first", "bare-transformers-first", "modeling-first"],
)
def test_registered_in_any_import_order(imports):
    """Before: "ascend_moe" was only available after `import torch_ascend_moe.hf`."""
    code = f"""
import sys
{imports}
import torch
import transformers
config = transformers.MixtralConfig(vocab_size=32, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
    num_attention_heads=2, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)
model = transformers.MixtralForCausalLM(config)
model.set_experts_implementation("ascend_moe")
model(torch.zeros(1, 3, dtype=torch.long))
assert "torch_ascend_moe.hf" in sys.modules
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("family", ["mixtral", "deepseek_v3"])
def test_fp8_experts_any_model_size(family):
    """hidden 64, intermediate 48 (not multiples of 128): zero-padded inside m_grouped_fp8_linear. Before: the
    op raised."""
    model = _tiny(family).float()
    ids = _ids()
    with torch.no_grad():
        expected = model(ids).logits
        model.set_experts_implementation(hf.IMPLEMENTATION_FP8)
        assert calc_diff(model(ids).logits, expected) < 2e-3


def test_swap_keeps_fp32_router_of_bf16_model():
    """DeepSeek-V3 keeps gate.weight in FP32 in a BF16 model (_keep_in_fp32_modules_strict); the swapped gate must
    too, or its logits (and choices) round differently from HF's. Before: the gate was cast to BF16."""
    model = _tiny("deepseek_v3").to(torch.bfloat16)
    router = next(m for m in model.modules() if type(m).__name__ == "DeepseekV3TopkRouter")
    router.weight.data = torch.randn(8, 64, generator=torch.Generator().manual_seed(3)) * 0.2  # FP32, as loaded
    weight = router.weight.detach().clone()
    x = torch.randn(7, 64).bfloat16()
    with torch.no_grad():
        ref_logits, ref_w, ref_idx = router(x)
        hf.swap_moe_blocks(model)
        gate = next(m for m in model.modules() if isinstance(m, MoE)).gate
        idx, w, logits = gate(x)
    assert gate.weight.dtype == torch.float32 and torch.equal(gate.weight, weight)
    assert torch.equal(logits, ref_logits)
    assert torch.equal(idx.sort(-1).values, ref_idx.sort(-1).values)


def test_swapped_mixtral_router_jitter():
    """Mixtral's router_jitter_noise (training only) multiplies the block's tokens by uniform noise before the
    router and the experts; the swapped MoE draws the same noise (same call on the same shape). Before: ignored."""
    model = _tiny("mixtral", router_jitter_noise=0.1)
    ids = _ids()
    model.train()
    torch.manual_seed(5)
    expected = model(ids).logits
    hf.swap_moe_blocks(model)
    torch.manual_seed(5)
    assert calc_diff(model(ids).logits, expected) < 1e-12
    model.eval()
    with torch.no_grad():  # no noise in eval
        assert torch.equal(model(ids).logits, model(ids).logits)
