"""Benchmark cases of the MoE layer: ``python -m torch_ascend_moe bench moe`` (needs transformers: the ``hf``
extra). ``nn.MoE`` (router, ``moe_permute``, grouped GEMMs, ``moe_unpermute``) against Hugging Face's
``MixtralSparseMoeBlock`` with its ``eager`` and ``grouped_mm`` experts implementations, on the same weights
and tokens, forward and forward+backward, in the same run; and ``nn.MegaMoE`` (the routed and shared experts in one
``mega_moe`` op) against ``nn.MoE`` with the same weights, BF16 forward and forward+backward, FP8 forward (``fp8=True``
on both: MegaMoE's FP8 mode serves inference), with page faults per step (issue 51: the fused
module at least as fast as the unfused one, touching no more fresh pages). Options: ``--tokens --hidden --topk
--experts``.
"""

from __future__ import annotations

import copy

import torch

from torch_ascend_moe.bench import OPTIONS, Case, layer_call


def _shape(quick: bool):
    t = OPTIONS.get("tokens", 64 if quick else 2048)
    h = OPTIONS.get("hidden", 128 if quick else 1024)
    k = OPTIONS.get("topk", 2)
    e = OPTIONS.get("experts", 4 if quick else 8)
    return t, h, k, e


def models(shape, implementation: str, device="cpu", dtype=torch.float32):
    """(HF ``MixtralSparseMoeBlock`` with ``implementation`` experts, our ``nn.MoE`` with its weights, tokens ``x``)
    for ``shape = (T, H, k, E)`` (intermediate size H), on ``device`` in ``dtype``."""
    try:
        import transformers
    except ImportError as e:
        raise RuntimeError("bench moe: needs transformers (pip install 'torch_ascend_moe[hf]')") from e
    from torch_ascend_moe.hf import _hf_state, _moe_for

    t, h, k, e = shape
    config = transformers.MixtralConfig(
        hidden_size=h, intermediate_size=h, num_local_experts=e, num_experts_per_tok=k, num_hidden_layers=1
    )
    config._experts_implementation = implementation
    torch.manual_seed(0)
    block = transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock(copy.deepcopy(config))
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, h**-0.5)
    block.experts.config._experts_implementation = implementation
    ours = _moe_for(block, config, False, None, None, False)
    ours.load_state_dict(_hf_state(block))
    x = torch.randn(1, t, h, generator=torch.Generator().manual_seed(1))
    return block.to(device, dtype), ours.to(device, dtype), x.to(device, dtype)


def tiny_model(family: str, hidden: int = 256, layers: int = 2, experts: int = 8, top_k: int = 2):
    """A random-weight transformers causal LM of ``family`` (``"mixtral"``, ``"qwen3_moe"``, ``"deepseek_v3"``)
    built locally (no download), every layer MoE except DeepSeek-V3's first (dense, as the real model), with the
    experts implementation transformers picks by default, in FP32 and eval mode."""
    try:
        import transformers
    except ImportError as e:
        raise RuntimeError("bench: needs transformers (pip install 'torch_ascend_moe[hf]')") from e
    common = dict(
        vocab_size=1024,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        num_experts_per_tok=top_k,
    )
    if family == "mixtral":
        config = transformers.MixtralConfig(**common, intermediate_size=hidden, num_local_experts=experts)
        cls = transformers.MixtralForCausalLM
    elif family == "qwen3_moe":
        config = transformers.Qwen3MoeConfig(
            **common,
            intermediate_size=2 * hidden,
            moe_intermediate_size=hidden,
            num_experts=experts,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            head_dim=hidden // 4,
        )
        cls = transformers.Qwen3MoeForCausalLM
    elif family == "deepseek_v3":
        config = transformers.DeepseekV3Config(
            **common,
            intermediate_size=2 * hidden,
            moe_intermediate_size=hidden,
            n_routed_experts=experts,
            n_group=2,
            topk_group=1,
            n_shared_experts=1,
            first_k_dense_replace=1,
            routed_scaling_factor=2.5,
            kv_lora_rank=hidden // 4,
            q_lora_rank=None,
            qk_rope_head_dim=16,
            qk_nope_head_dim=32,
            v_head_dim=hidden // 4,
        )
        cls = transformers.DeepseekV3ForCausalLM
    else:
        raise ValueError(f"tiny_model: family must be one of 'mixtral', 'qwen3_moe', 'deepseek_v3', got {family!r}")
    torch.manual_seed(0)
    return randomize_routing(cls(config).eval())


def randomize_routing(model, std: float = 0.1):
    """HF zero-initialises routers (and DeepSeek's correction bias): random ones make routing non-trivial."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("gate.weight"):
                p.normal_(0, std)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(0, 0.01)
    return model


def _case(quick: bool, implementation: str, grad: bool) -> Case:
    t, h, k, e = _shape(quick)
    # Per token: router (2·H·E) and k experts of three H x H projections (gate, up, down): 6·H·I each.
    flops = t * (2 * h * e + k * 6 * h * h) * (3 if grad else 1)

    def setup():
        block, ours, x = models(_shape(quick), implementation)
        return layer_call(ours, x, grad), layer_call(block, x, grad)

    mode = "fwd+bwd" if grad else "fwd"
    return Case(
        f"MoE {mode} T{t} H{h} top-{k} of {e}",
        flops,
        setup,
        f"HF MixtralSparseMoeBlock, {implementation} experts",
        grad=grad,
    )


class _LinearSharedExperts(torch.nn.Module):
    """The baseline of the shared-experts case: the same MoE, its shared MLP called through its ``nn.Linear``
    modules and added after it (``out + down(act(gate(x)) * up(x))``)."""

    def __init__(self, moe):
        super().__init__()
        self.moe = moe

    def forward(self, x):
        m, mlp = self.moe, self.moe.shared_experts
        tokens = x.reshape(-1, m.hidden_size)
        idx, weights, _ = m.gate(tokens)
        out = m.experts(tokens, idx, weights)
        out = out + mlp.down_proj(mlp.act_fn(mlp.gate_proj(tokens)) * mlp.up_proj(tokens))
        return out.view(x.shape)


def _shared_case(quick: bool, grad: bool, dtype=torch.bfloat16) -> Case:
    from torch_ascend_moe.nn import MoE

    t, h, k, e = _shape(quick)
    # router, k routed experts and one shared expert of intermediate size H (three H x H projections each)
    flops = t * (2 * h * e + (k + 1) * 6 * h * h) * (3 if grad else 1)

    def setup():
        torch.manual_seed(0)
        ours = MoE(h, h, num_experts=e, topk=k, num_shared_experts=1, dtype=dtype)
        x = torch.randn(1, t, h, dtype=dtype)
        return layer_call(ours, x, grad), layer_call(_LinearSharedExperts(ours), x, grad)

    mode = "fwd+bwd" if grad else "fwd"
    return Case(
        f"MoE + shared expert {mode} {str(dtype)[6:]} T{t} H{h} top-{k} of {e}",
        flops,
        setup,
        "the same MoE, shared expert on nn.Linear, added after",
        grad=grad,
    )


def _mega_case(quick: bool, grad: bool, shared: int, fp8: bool = False) -> Case:
    from torch_ascend_moe.nn import MegaMoE, MoE

    t, h, k, e = _shape(quick)
    t = OPTIONS.get("tokens", 64 if quick else 512)
    flops = t * (2 * h * e + (k + shared) * 6 * h * h) * (3 if grad else 1)

    def setup():
        torch.manual_seed(0)
        moe = MoE(h, h, num_experts=e, topk=k, num_shared_experts=shared, fp8=fp8, dtype=torch.bfloat16)
        mega = MegaMoE(h, h, num_experts=e, topk=k, num_shared_experts=shared, fp8=fp8, dtype=torch.bfloat16)
        mega.load_state_dict(moe.state_dict())
        x = torch.randn(1, t, h, dtype=torch.bfloat16)
        return layer_call(mega, x, grad), layer_call(moe, x, grad)

    mode = "fwd+bwd" if grad else "fwd"
    extra = f" + {shared} shared" if shared else ""
    return Case(
        f"MegaMoE {mode} {'fp8' if fp8 else 'bf16'} T{t} H{h} top-{k} of {e}{extra}",
        flops,
        setup,
        "nn.MoE, the same weights" + (" (fp8=True)" if fp8 else ""),
        grad=grad,
        faults=True,
    )


def cases(quick: bool = False) -> list[Case]:
    routed = [_case(quick, impl, grad) for grad in (False, True) for impl in ("eager", "grouped_mm")]
    mega = [_mega_case(quick, grad, shared) for shared in (0, 1) for grad in (False, True)]
    # FP8: inference (MegaMoE's FP8 mode carries no gradient; MoE(fp8=True) trains with DeepSeek-V3's recipe).
    mega += [_mega_case(quick, False, shared, fp8=True) for shared in (0, 1)]
    return routed + [_shared_case(quick, grad) for grad in (False, True)] + mega
