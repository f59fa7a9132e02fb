"""The "ascend_moe" / "ascend_moe_fp8" experts implementations on every experts layout transformers'
``@use_experts_implementation`` declares, each on the real experts class of a tiny config built locally, against
that class's ``eager`` forward: transposed weights (Aria), transposed + biases (OpenAI privacy filter), transposed
+ biases + interleaved gate/up with GPT-OSS's clamped SwiGLU (GPT-OSS), no gate (Nemotron-H, relu2 up
projection), post-expert norm (Muse Spark); ragged sizes in FP8 (the op zero-pads K)."""

import importlib

import pytest
import torch

transformers = pytest.importorskip("transformers")

import torch_ascend_moe.hf as hf  # noqa: E402
from torch_ascend_moe.testing import calc_diff  # noqa: E402

# (model module, experts class, config class, config overrides); sizes tiny and ragged (not multiples of 128).
LAYOUTS = {
    "aria": (
        "aria",
        "AriaExperts",
        "AriaTextConfig",
        dict(num_attention_heads=4, num_key_value_heads=4, hidden_size=48, intermediate_size=40, moe_num_experts=4),
    ),
    "openai_privacy_filter": (
        "openai_privacy_filter",
        "OpenAIPrivacyFilterExperts",
        "OpenAIPrivacyFilterConfig",
        dict(num_attention_heads=4, num_key_value_heads=4, hidden_size=48, intermediate_size=40, num_local_experts=4),
    ),
    "gpt_oss": (
        "gpt_oss",
        "GptOssExperts",
        "GptOssConfig",
        dict(num_attention_heads=4, num_key_value_heads=4, hidden_size=48, intermediate_size=40, num_local_experts=4),
    ),
    "nemotron_h": (
        "nemotron_h",
        "NemotronHExperts",
        "NemotronHConfig",
        dict(
            num_attention_heads=4,
            num_key_value_heads=4,
            hidden_size=48,
            moe_intermediate_size=40,
            n_routed_experts=4,
            moe_latent_size=None,
        ),
    ),
    "muse_spark": (
        "muse_spark",
        "MuseSparkExperts",
        "MuseSparkTextConfig",
        dict(
            num_attention_heads=4,
            num_key_value_heads=4,
            hidden_size=48,
            moe_hidden_size=48,
            moe_intermediate_size=40,
            num_local_experts=4,
        ),
    ),
}


def _experts(name, dtype):
    module, cls_name, config_name, overrides = LAYOUTS[name]
    mod = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    config = getattr(mod, config_name)(**overrides)
    torch.manual_seed(0)
    experts = getattr(mod, cls_name)(config)
    with torch.no_grad():
        for p in experts.parameters():  # HF leaves them uninitialised (torch.empty): random, non-trivial values
            p.normal_(0, 0.3)
    return experts.to(dtype)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_eager(name):
    experts = _experts(name, torch.float64)
    g = torch.Generator().manual_seed(1)
    tokens, k, num_experts = 10, 2, 4
    hidden = experts.down_proj.shape[1 if not experts.is_transposed else 2]
    x = torch.randn(tokens, hidden, generator=g, dtype=torch.float64)
    idx = torch.stack([torch.randperm(num_experts, generator=g)[:k] for _ in range(tokens)])
    w = torch.rand(tokens, k, generator=g, dtype=torch.float64)
    experts.config._experts_implementation = "eager"
    expected = experts(x, idx, w)
    experts.config._experts_implementation = hf.IMPLEMENTATION
    x_ours = x.clone().requires_grad_()
    got = experts(x_ours, idx, w)
    assert calc_diff(got, expected) < 1e-12
    got.sum().backward()  # trains through the ops, biases included
    assert all(p.grad is not None for p in experts.parameters() if p.requires_grad)
    experts.config._experts_implementation = hf.IMPLEMENTATION_FP8
    with torch.no_grad():  # FP32 model: the ragged K (48, 40) zero-padded to 128 in the op; two FP8 GEMMs
        assert calc_diff(experts.float()(x.float(), idx, w.float()), expected) < 5e-3
