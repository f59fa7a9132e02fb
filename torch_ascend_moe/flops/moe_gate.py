"""FLOP formula of ``moe_topk_gate``: about 4 per logit (scoring, bias) and 3 per routed slot (the weights);
sorts are not FLOPs."""

from __future__ import annotations

from torch_ascend_moe._registry import flop_formula


@flop_formula
def moe_topk_gate(logits_shape, bias_shape, num_topk, *args, out_shape=None, **kwargs) -> int:
    return 4 * logits_shape[0] * logits_shape[1] + 3 * logits_shape[0] * num_topk
