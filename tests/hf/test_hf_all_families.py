"""Every transformers model family whose experts take ``@use_experts_implementation`` (found by reading transformers'
own modeling files, so new families join by themselves), built tiny from its own config defaults: with
``experts_implementation="ascend_moe"`` the model's output and a training step's gradients equal its ``eager``
experts' (FP32, relative L2 < 1e-5 and 1e-4), and our ops ran. Families whose tiny build or ``eager`` forward does
not run (vision towers wanting pixels, hybrid caches, configs whose derived sizes do not shrink together) are skipped
with the reason: the reference must run for the comparison to mean anything."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

transformers = pytest.importorskip("transformers")

import torch_ascend_moe.hf  # noqa: E402, F401  (registers "ascend_moe")

_MODELS = Path(transformers.__file__).parent / "models"
FAMILIES = sorted(
    path.parent.name
    for path in _MODELS.glob("*/modeling_*.py")
    if path.stem == f"modeling_{path.parent.name}" and "use_experts_implementation" in path.read_text()
)
# Sizes set where a config has the attribute (on its text config for multimodal ones): two layers, four experts of
# which two per token, one shared, every hidden size a few dozen.
SMALL = dict(
    hidden_size=64, intermediate_size=64, moe_intermediate_size=32, shared_expert_intermediate_size=32, expert_dim=32,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, head_dim=16, vocab_size=128,
    max_position_embeddings=128, num_experts=4, num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2,
    moe_topk=2, top_k=2, n_group=1, topk_group=1, num_shared_experts=1, n_shared_experts=1, first_k_dense_replace=0,
    decoder_sparse_step=1, mlp_only_layers=[], kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=16,
    qk_nope_head_dim=16, v_head_dim=16, pad_token_id=0,
)  # fmt: skip
# Families that must run, not skip (a transformers upgrade breaking the tiny builds must not make the sweep vacuous).
REQUIRED = {
    "mixtral", "qwen2_moe", "qwen3_moe", "qwen3_next", "olmoe", "gpt_oss", "deepseek_v2", "deepseek_v3", "glm4_moe",
    "phimoe", "granitemoe", "minimax", "dots1", "ernie4_5_moe", "hunyuan_v1_moe",
}  # fmt: skip
MAX_PARAMETERS = 20_000_000  # a config whose other sizes stay large (vision towers): not a tiny model


class _OurOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func.namespace == "ascend_moe"
        return func(*args, **(kwargs or {}))


def _model_class(family: str):
    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    ours = [c for c in vars(module).values() if inspect.isclass(c) and c.__module__ == module.__name__]
    for suffix in ("ForCausalLM", "Model"):
        found = [c for c in ours if c.__name__.endswith(suffix) and not c.__name__.endswith("PreTrainedModel")]
        if found:
            return found[0]
    _skip(family, "no causal-LM or base model class")


def _tiny(family: str):
    cls = _model_class(family)
    config = cls.config_class()
    text = getattr(config, "text_config", None)
    target = text if text is not None and not isinstance(config, type(text)) else config
    for name, value in SMALL.items():
        if hasattr(target, name):
            try:
                setattr(target, name, value)
            except Exception:  # noqa: BLE001  (derived or read-only attributes keep their defaults)
                pass
    if getattr(target, "layer_types", None):
        kinds = list(dict.fromkeys(target.layer_types))  # one layer of each kind (hybrid models), as many as layers
        try:
            target.layer_types = (kinds * target.num_hidden_layers)[: target.num_hidden_layers]
        except AttributeError:  # derived from other fields (a property)
            pass
    if getattr(target, "mlp_layer_types", None):  # dense first layers, then MoE ones: every tiny layer an MoE one
        try:
            target.mlp_layer_types = [target.mlp_layer_types[-1]] * target.num_hidden_layers
        except AttributeError:
            pass
    with torch.device("meta"):
        size = sum(p.numel() for p in cls(config).parameters())
    if size > MAX_PARAMETERS:
        _skip(family, f"{size} parameters at the tiny sizes (other parts of its config stay large)")
    torch.manual_seed(0)
    model = cls(config).float().eval()
    for p in model.parameters():  # spread the routing (zero-initialised routers send every token to one expert)
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.2)
    return model, target


def _output(out):
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


def _skip(family: str, reason: str):
    if family in REQUIRED:
        pytest.fail(f"{family} must run: {reason}")
    pytest.skip(f"{family}: {reason}"[:300])


@pytest.mark.parametrize("family", FAMILIES)
def test_family_runs_our_experts_as_eager_does(family):
    try:
        model, config = _tiny(family)
        ids = torch.randint(
            0, min(getattr(config, "vocab_size", 128), 128), (2, 8), generator=torch.Generator().manual_seed(1)
        )
        model.set_experts_implementation("eager")
        with torch.no_grad():
            reference = _output(model(input_ids=ids))
    except (pytest.skip.Exception, pytest.fail.Exception):
        raise
    except Exception as error:  # noqa: BLE001
        _skip(family, f"its tiny eager model does not run here ({type(error).__name__}: {error})")
    model.set_experts_implementation("ascend_moe")
    counter = _OurOps()
    with torch.no_grad(), counter:
        ours = _output(model(input_ids=ids))
    if counter.calls == 0:
        _skip(family, "no expert layer ran at the tiny sizes")
    assert _relative(ours, reference) < 1e-5, family
    grads = {}
    for implementation in ("eager", "ascend_moe"):  # one training step's gradients, every parameter's
        model.set_experts_implementation(implementation)
        model.zero_grad()
        _output(model(input_ids=ids)).square().mean().backward()
        grads[implementation] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    assert _relative(grads["ascend_moe"], grads["eager"]) < 1e-4, family


@pytest.mark.parametrize("family", sorted(REQUIRED))
def test_family_compiles_with_our_experts(family):
    """``torch.compile(model)`` of the stock model with our experts (transformers' own graph breaks allowed)."""
    model, config = _tiny(family)
    ids = torch.randint(0, min(config.vocab_size, 128), (2, 8), generator=torch.Generator().manual_seed(1))
    model.set_experts_implementation("eager")
    with torch.no_grad():
        reference = _output(model(input_ids=ids))
    model.set_experts_implementation("ascend_moe")
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = _output(torch.compile(model)(input_ids=ids))
    torch._dynamo.reset()
    assert _relative(compiled, reference) < 1e-5, family


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def test_the_sweep_finds_the_families():
    """Reading transformers' files finds them: dozens of families, the required ones among them."""
    assert len(FAMILIES) >= 40 and REQUIRED <= set(FAMILIES), sorted(REQUIRED - set(FAMILIES))
