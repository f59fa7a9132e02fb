"""Hugging Face transformers (v5) integration (``pip install 'torch_ascend_moe[hf]'``). Importing this module
registers two experts implementations with transformers' ``ExpertsInterface``; ``import torch_ascend_moe`` does it
too, in either import order, as soon as transformers' ``integrations.moe`` is imported (``_hf_hook``):

- ``"ascend_moe"``: the experts of any ``@use_experts_implementation`` model (Mixtral, Qwen3-MoE, DeepSeek-V3,
  GPT-OSS, ...; every layout transformers' ``grouped_mm`` runs) as ``moe_permute`` -> ``m_grouped_bf16_gemm``
  (+ bias) -> gate / activation -> ``m_grouped_bf16_gemm`` (+ bias) -> ``moe_unpermute``;
- ``"ascend_moe_fp8"``: the same with both GEMMs in FP8 (``m_grouped_fp8_linear``, DeepSeek-V3's recipe; the
  model's weights stay as they are, quantized on the fly; any hidden and intermediate sizes),

so ``from_pretrained(..., experts_implementation="ascend_moe")`` or ``model.set_experts_implementation("ascend_moe")``
runs them on our ops (trainable, ``torch.compile``-able, exportable). ``swap_moe_blocks(model)`` goes further:
it replaces whole MoE blocks (router + experts + shared experts) with ``torch_ascend_moe.nn.MoE``, optionally in
FP8 and expert-parallel, or with ``MegaMoE`` (the fused op).
"""

from __future__ import annotations

import types

import torch
from torch import nn
from transformers import initialization as hf_init
from transformers.integrations.moe import ExpertsInterface, grouped_mm_experts_forward
from transformers.utils import output_capturing
from transformers.utils.output_capturing import OutputRecorder

from torch_ascend_moe import checks as ck
from torch_ascend_moe import inductor_lowerings
from torch_ascend_moe.backends import cpu_gemm
from torch_ascend_moe.checks import GEMM_DTYPES
from torch_ascend_moe.nn import GroupedExperts, MegaMoE, MoE
from torch_ascend_moe.nn.moe import MoEGate
from torch_ascend_moe.ops.grouped import m_grouped_bf16_gemm, m_grouped_fp8_linear
from torch_ascend_moe.ops.moe_routing import moe_permute, moe_unpermute

# Only modules that are complete while transformers.modeling_utils is still initialising are imported at the top:
# torch_ascend_moe's import hook imports this module the moment modeling_utils imports integrations.moe, so
# PreTrainedModel is imported where it is used.

IMPLEMENTATION = "ascend_moe"
IMPLEMENTATION_FP8 = "ascend_moe_fp8"


def _expert_of_rows(offs: torch.Tensor, rows: int) -> torch.Tensor:
    """The expert of each permuted row (psum ``offs``); padding rows past the last segment get the last expert,
    whose bias lands in rows the grouped GEMMs and ``moe_unpermute`` never read."""
    rows_idx = torch.arange(rows, device=offs.device, dtype=offs.dtype)
    return torch.searchsorted(offs, rows_idx, right=True).clamp_(max=offs.numel() - 1)


def _experts_forward(self, hidden_states, top_k_index, top_k_weights, fp8: bool):
    """Every layout ``@use_experts_implementation`` declares, as transformers' ``grouped_mm_experts_forward``:
    ``is_transposed`` weights ``[E, in, out]`` are passed as strided ``[E, out, in]`` views; ``has_bias`` adds the
    row's expert bias after each grouped GEMM; ``has_gate`` runs the module's own ``_apply_gate`` (concatenated
    or interleaved [gate; up], GPT-OSS's clamped SwiGLU, ...), otherwise ``up_proj`` and ``act_fn``;
    ``has_post_expert_norm`` applies ``post_expert_norm`` before the routing weights."""
    up_name = "gate_up_proj" if getattr(self, "has_gate", True) else "up_proj"
    up_weight, down_weight = getattr(self, up_name), self.down_proj
    if getattr(self, "is_transposed", False):
        up_weight, down_weight = up_weight.transpose(-2, -1), down_weight.transpose(-2, -1)
    num_experts = up_weight.shape[0]
    # Expert parallelism in transformers marks other ranks' experts with ids >= num_experts: unrouted (-1) here.
    idx = torch.where(top_k_index < num_experts, top_k_index, -1)
    permuted, row_map, offs = moe_permute(hidden_states, idx, num_experts)
    has_bias = getattr(self, "has_bias", False)
    expert_of_row = _expert_of_rows(offs, permuted.shape[0]) if has_bias else None

    def grouped(x, w, bias):
        if fp8:
            out = m_grouped_fp8_linear(x, w.to(x.dtype), offs)
        else:
            out = m_grouped_bf16_gemm(x, w.to(x.dtype), offs)
        return out if bias is None else out + bias[expert_of_row].to(out.dtype)

    up = grouped(permuted, up_weight, getattr(self, f"{up_name}_bias") if has_bias else None)
    hidden = self._apply_gate(up) if getattr(self, "has_gate", True) else self.act_fn(up)
    out = grouped(hidden, down_weight, self.down_proj_bias if has_bias else None)
    if getattr(self, "has_post_expert_norm", False):
        out = self.post_expert_norm(out)
    return moe_unpermute(out, row_map, top_k_weights.to(out.dtype)).to(hidden_states.dtype)


def ascend_moe_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """transformers' experts forward signature: ``hidden_states [T, H]``, ``top_k_index [T, k]``,
    ``top_k_weights [T, k]`` -> ``[T, H]``."""
    return _experts_forward(self, hidden_states, top_k_index, top_k_weights, fp8=False)


def ascend_moe_fp8_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    return _experts_forward(self, hidden_states, top_k_index, top_k_weights, fp8=True)


def _decorated_forward(cls: type):
    """The experts class's own forward: the one ``@use_experts_implementation`` wrapped (``functools.wraps`` keeps
    it as ``__wrapped__``), found in the MRO so a subclass overriding ``forward`` and calling ``super()`` works."""
    for klass in cls.__mro__:
        wrapped = getattr(klass.__dict__.get("forward"), "__wrapped__", None)
        if wrapped is not None:
            return wrapped
    raise TypeError(f"{cls.__name__} is not a @use_experts_implementation experts class")


def eager_experts_forward(self, hidden_states, *args, **kwargs):
    """transformers' ``"eager"`` experts implementation, registered under that name: the model's own per-expert
    loop, except while ``torch.compile`` traces it with ``inductor_lowerings.enable()`` on. The loop cannot be
    compiled (its ``nonzero`` and ``where`` have data-dependent shapes: a graph break per expert, the experts run
    one by one in eager) and no post-grad rewrite can see it, so the substitution happens at trace time, by an
    implementation of the same experts that compiles to one graph: ``ascend_moe_experts_forward`` (our grouped ops,
    which the post-grad passes then fuse), or, for BF16 on a CPU with BF16 dot products, transformers' own
    ``grouped_mm`` experts (ATen's oneDNN grouped GEMM multiplies BF16 natively there and the traced graph of
    transformers' implementation measured faster than ours as a whole; the ``grouped_mm`` rewrite leaves those CPUs
    alone too, ``backends.cpu_gemm``). Outside compilation or with the passes off it is exactly the model's loop."""
    if torch.compiler.is_compiling() and inductor_lowerings.SUBSTITUTE_EAGER_EXPERTS:
        if hidden_states.device.type == "cpu" and cpu_gemm.native(hidden_states.dtype):
            return grouped_mm_experts_forward(self, hidden_states, *args, **kwargs)
        if hidden_states.dtype in GEMM_DTYPES:
            return ascend_moe_experts_forward(self, hidden_states, *args, **kwargs)
    return _decorated_forward(type(self))(self, hidden_states, *args, **kwargs)


def register() -> None:
    """Register both implementations, and the ``"eager"`` entry above, with transformers (done on import;
    idempotent)."""
    ExpertsInterface.register(IMPLEMENTATION, ascend_moe_experts_forward)
    ExpertsInterface.register(IMPLEMENTATION_FP8, ascend_moe_fp8_experts_forward)
    ExpertsInterface.register("eager", eager_experts_forward)


register()


# ---- swapping whole blocks ----


# HF block class name -> how its config maps onto MoE's routing options.
def _mixtral(config) -> dict:
    return dict(
        num_experts=config.num_local_experts,
        score_func="softmax",
        renormalize=True,
        router_dtype=None,
        input_jitter=config.router_jitter_noise,
    )


def _qwen3(config) -> dict:
    return dict(
        num_experts=config.num_experts, score_func="softmax", renormalize=config.norm_topk_prob, router_dtype=None
    )


def _deepseek_v3(config) -> dict:
    return dict(
        num_experts=config.n_routed_experts,
        score_func="sigmoid",
        renormalize=config.norm_topk_prob,
        use_expert_bias=True,
        num_groups=config.n_group,
        topk_groups=config.topk_group,
        routed_scaling_factor=config.routed_scaling_factor,
        num_shared_experts=config.n_shared_experts,
        router_dtype=torch.float32,
    )


BLOCKS = {
    "MixtralSparseMoeBlock": _mixtral,
    "Qwen3MoeSparseMoeBlock": _qwen3,
    "OlmoeSparseMoeBlock": _qwen3,  # OLMoE's router is Qwen3-MoE's (softmax top-k, norm_topk_prob)
    "DeepseekV3MoE": _deepseek_v3,
}


def _block_config(block: nn.Module, model_config):
    return getattr(block, "config", None) or model_config


def _moe_for(block: nn.Module, config, fp8: bool, ep_group, ep_static_tokens, mega: bool) -> MoE:
    options = BLOCKS[type(block).__name__](config)
    experts = block.experts
    num_experts, two_i, hidden = experts.gate_up_proj.shape
    # HF's own activation module (ACT2FN[hidden_act]: exactly its semantics, whatever it names); MegaMoE's fused
    # op computes SiLU only and checks the name.
    act = getattr(config, "hidden_act", "silu") if mega else experts.act_fn
    if num_experts != options["num_experts"]:
        op, expected = f"swap_moe_blocks: {type(block).__name__}", f"{options['num_experts']} experts (the config's)"
        raise ValueError(ck.message(op, "experts.gate_up_proj", "shape", expected, list(experts.gate_up_proj.shape)))
    shared = getattr(block, "shared_experts", None)
    if shared is not None:
        options["shared_intermediate_size"] = shared.gate_proj.weight.shape[0]
    param = experts.gate_up_proj
    moe = (MegaMoE if mega else MoE)(
        hidden,
        two_i // 2,
        topk=config.num_experts_per_tok,
        fp8=fp8,
        ep_group=ep_group,
        ep_static_tokens=ep_static_tokens,
        activation=act,
        device=param.device,
        dtype=param.dtype,
        **options,
    )
    # The router keeps its own dtype (DeepSeek-V3's gate.weight stays FP32 in a BF16 model:
    # _keep_in_fp32_modules_strict), so the swapped gate holds the same values.
    moe.gate.weight.data = moe.gate.weight.data.to(block.gate.weight.dtype)
    return moe


def _hf_state(block: nn.Module) -> dict[str, torch.Tensor]:
    """The block's weights under MoE's names (gate.weight, gate.e_score_correction_bias, experts.*,
    shared_experts.*): HF's names are the same for these blocks, so this is the block's own state dict."""
    state = block.state_dict()
    return {k: v for k, v in state.items() if k.split(".")[0] in ("gate", "experts", "shared_experts")}


def _records_router_logits(model: nn.Module, router: nn.Module) -> bool:
    """Whether transformers' output capturing (``_can_record_outputs["router_logits"]`` of a ``PreTrainedModel``
    in ``model``) records ``router``'s output."""
    from transformers.modeling_utils import PreTrainedModel

    for sub in model.modules():
        if not isinstance(sub, PreTrainedModel):
            continue
        specs = (sub._can_record_outputs or {}).get("router_logits", [])
        for spec in specs if isinstance(specs, list) else [specs]:
            target = spec.target_class if isinstance(spec, OutputRecorder) else spec
            if isinstance(target, type) and isinstance(router, target):
                return True
    return False


def _record_router_logits(module: nn.Module, args, output) -> None:
    """Forward hook on a swapped gate: what transformers' output-capturing hook records for HF's router (its
    logits ``[T, E]``, our ``MoEGate``'s third output) into the active collector. Unlike transformers' hook, it
    keeps a gate compiled outside a capturing HF forward (e.g. the block alone) free of graph breaks: there
    nothing collects, and ``ContextVar.get`` cannot be traced."""
    collector = output_capturing._active_collector
    if torch.compiler.is_compiling() and not collector.compiling:
        return
    collected = collector.get()
    if collected is not None and "router_logits" in collected:
        collected["router_logits"].append(output[2])


def _init_weights_with_swapped(self, module: nn.Module) -> None:
    """The model's ``_init_weights`` extended to the swapped modules, with the HF blocks' scheme (router and
    experts ``normal(0, initializer_range)``, DeepSeek-V3's ``e_score_correction_bias`` zeros; the shared experts
    are ``nn.Linear`` layers, which HF's own ``_init_weights`` handles). transformers' ``init`` functions skip
    tensors loaded from a checkpoint (``_is_hf_initialized``)."""
    type(self)._init_weights(self, module)
    std = getattr(self.config, "initializer_range", None) or 0.02
    if isinstance(module, MoEGate):
        hf_init.normal_(module.weight, mean=0.0, std=std)
        if module.e_score_correction_bias is not None:
            hf_init.zeros_(module.e_score_correction_bias)
    elif isinstance(module, GroupedExperts):
        hf_init.normal_(module.gate_up_proj, mean=0.0, std=std)
        hf_init.normal_(module.down_proj, mean=0.0, std=std)


def swap_moe_blocks(
    model: nn.Module,
    *,
    fp8: bool = False,
    ep_group=None,
    ep_static_tokens: int | None = None,
    convert_linears_to_fp8: bool = False,
    mega: bool = False,
) -> list[str]:
    """Replace every Mixtral / Qwen3-MoE / OLMoE / DeepSeek-V3 MoE block of ``model`` with
    ``torch_ascend_moe.nn.MoE``, loading the block's weights (router, e_score_correction_bias, experts, shared
    experts; the parameter names are HF's, so ``state_dict`` round trips). ``fp8`` runs the routed experts in
    FP8; ``ep_group`` makes them expert-parallel (each rank keeps its slice of the experts);
    ``convert_linears_to_fp8`` also swaps the model's other ``nn.Linear`` layers (not the LM head) for
    ``FP8Linear``. ``mega=True`` swaps in ``MegaMoE`` instead (routed and shared experts in one fused ``mega_moe``
    op; with ``fp8`` its FP8 mode, which serves inference). Returns the swapped modules' names.

    The swapped model keeps transformers' behaviour: ``output_router_logits`` records the new gates' logits (the
    same values as HF's routers), and ``init_weights()`` / ``from_pretrained``-style initialisation of missing
    weights covers the new modules (e.g. after building on the meta device and ``to_empty``).
    """
    swapped = []
    model_config = getattr(model, "config", None)
    for name, block in list(model.named_modules()):
        if type(block).__name__ not in BLOCKS:
            continue
        config = _block_config(block, model_config)
        moe = _moe_for(block, config, fp8, ep_group, ep_static_tokens, mega)
        state = _hf_state(block)
        missing = set(moe.state_dict()) - set(state)
        if moe.ep_size == 1 and missing:
            raise ValueError(f"swap_moe_blocks: {name}: argument 'state_dict': missing {sorted(missing)}")
        try:
            if moe.ep_size > 1:
                moe.load_full_state_dict(state)
            else:
                moe.load_state_dict(state)
        except RuntimeError as e:
            raise ValueError(f"swap_moe_blocks: {name}: the block's weights do not fit MoE: {e}") from e
        if _records_router_logits(model, block.gate):
            # output_router_logits (and the aux loss) record the gate's logits [T, E], HF's router's index 0.
            moe.gate.register_forward_hook(_record_router_logits)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, moe)
        swapped.append(name)
    if swapped:
        from transformers.modeling_utils import PreTrainedModel

        for sub in model.modules():
            if isinstance(sub, PreTrainedModel):
                sub._init_weights = types.MethodType(_init_weights_with_swapped, sub)
    if convert_linears_to_fp8:
        from torch_ascend_moe.nn import convert_to_fp8_linear

        def keep(fqn, module):
            return "lm_head" not in fqn and module.in_features % 128 == 0

        convert_to_fp8_linear(model, keep)
    return swapped
