"""CUDA kernels of the moe_routing family (``_routing``'s Triton kernels): ``moe_permute`` as a device counting sort
(three launches, no sort, the C++ kernel's row order), ``moe_unpermute`` as one launch (slot-order FP32 sums, bit for
bit the C++ kernel), ``moe_gating_topk`` as ATen's softmax / sigmoid plus one launch for the selection and weights,
instead of the portable kernels' chains of sorts, gathers and scatters. The value checks read ids on the host only
when that is allowed (not while a CUDA graph is captured: there ids outside their range route nowhere).

Refused (the portable kernels take them), and why: more than ``_routing.MAX_EXPERTS`` experts (one program holds a
token's experts), FP64 gating logits (FP64 selection: gradcheck's path), GPUs before sm80, builds without Triton.
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.chain import first_refusal, kernel
from torch_ascend_moe.backends.cuda import triton_available, triton_module
from torch_ascend_moe.backends.portable import moe_routing as portable
from torch_ascend_moe.checks.moe_routing import (
    PERMUTE,
    UNPERMUTE,
    gating_signature,
    permute_signature,
    unpermute_signature,
)
from torch_ascend_moe.routing_math import gate_scores

_routing = triton_module("_routing")


def _takes_permute(x, topk_idx, num_experts, alignment):
    permute_signature(x, topk_idx, num_experts, alignment)
    return first_refusal(_routing.refusal(x, num_experts))


def _takes_unpermute(y, row_map, topk_weights, bias):
    unpermute_signature(y, row_map, topk_weights, bias)
    return first_refusal(_routing.refusal(y, 0))


def _takes_gating(logits, topk, bias, score_func, num_groups, topk_groups, renormalize, routed_scaling_factor):
    acc = gating_signature(logits, topk, bias, score_func, num_groups, topk_groups)
    fp64 = "FP64 selection (gradcheck's path)" if acc == torch.float64 else None
    return first_refusal(fp64, _routing.refusal(logits, logits.shape[1]))


@kernel(device="cuda", library="triton", calls="_routing", takes=_takes_permute, available=triton_available)
def moe_permute(x, topk_idx, num_experts, alignment):
    capacity = permute_signature(x, topk_idx, num_experts, alignment)
    portable.check_ids(PERMUTE, "topk_idx", topk_idx, num_experts, "expert ids")
    return _routing.permute(x, topk_idx, num_experts, alignment, capacity)


@kernel(device="cuda", library="triton", calls="_routing", takes=_takes_unpermute, available=triton_available)
def moe_unpermute(y, row_map, topk_weights, bias):
    portable.check_ids(UNPERMUTE, "row_map", row_map, y.shape[0], "rows of y")
    return _routing.unpermute(y, row_map, topk_weights, bias)


@kernel(
    device="cuda",
    library="triton",
    calls="ATen softmax / sigmoid, then _routing",
    takes=_takes_gating,
    available=triton_available,
)
def moe_gating_topk(logits, topk, bias, score_func, num_groups, topk_groups, renormalize, routed_scaling_factor):
    acc = gating_signature(logits, topk, bias, score_func, num_groups, topk_groups)
    scores = gate_scores(logits.to(acc), score_func)
    return _routing.gating(scores, bias, topk, num_groups, topk_groups, renormalize, routed_scaling_factor)
