"""Benchmark cases of the MoE layer: ``python -m torch_ascend_moe bench moe`` (needs transformers: the ``hf``
extra). ``nn.MoE`` (router, ``moe_permute``, grouped GEMMs, ``moe_unpermute``) against Hugging Face's
``MixtralSparseMoeBlock`` with its ``eager`` and ``grouped_mm`` experts implementations, on the same weights
and tokens, forward and forward+backward, in the same run. Options: ``--tokens --hidden --topk --experts``.
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


def cases(quick: bool = False) -> list[Case]:
    return [_case(quick, impl, grad) for grad in (False, True) for impl in ("eager", "grouped_mm")]
