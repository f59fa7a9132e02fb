"""CUDA kernels of the moe_routing family (``_routing``'s Triton kernels): ``moe_permute`` as a device counting sort
(three launches, no sort, the C++ kernel's row order), ``moe_unpermute`` as one launch (slot-order FP32 sums, bit for
bit the C++ kernel), ``moe_gating_topk`` as ATen's softmax / sigmoid plus one launch for the selection and weights,
instead of the portable kernels' chains of sorts, gathers and scatters. The value checks read ids on the host only
when that is allowed (not while a CUDA graph is captured: there ids outside their range route nowhere).

Portable, and why: more than ``_routing.MAX_EXPERTS`` experts (one program holds a token's experts), FP64 gating
logits (FP64 selection: gradcheck's path), GPUs before sm80, builds without Triton.
"""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import cuda_kernel
from torch_ascend_moe.backends.portable import moe_routing as portable
from torch_ascend_moe.meta.moe_routing import (
    PERMUTE,
    UNPERMUTE,
    gating_signature,
    permute_signature,
    unpermute_signature,
)

try:
    from torch_ascend_moe.backends.cuda import _routing
except ImportError:  # no triton: the portable kernels serve CUDA
    _routing = None


if _routing is not None:

    @cuda_kernel(calls="triton: _routing")
    def moe_permute(x, topk_idx, num_experts, alignment):
        capacity = permute_signature(x, topk_idx, num_experts, alignment)
        if not _routing.usable(x, num_experts):
            return portable.moe_permute(x, topk_idx, num_experts, alignment)
        portable.check_range(PERMUTE, "topk_idx", topk_idx, num_experts, "expert ids")
        return _routing.permute(x, topk_idx, num_experts, alignment, capacity)

    @cuda_kernel(calls="triton: _routing")
    def moe_unpermute(y, row_map, topk_weights, bias):
        unpermute_signature(y, row_map, topk_weights, bias)
        if not _routing.usable(y, 0):
            return portable.moe_unpermute(y, row_map, topk_weights, bias)
        portable.check_range(UNPERMUTE, "row_map", row_map, y.shape[0], "rows of y")
        return _routing.unpermute(y, row_map, topk_weights, bias)

    @cuda_kernel(calls="ATen softmax / sigmoid, then triton: _routing")
    def moe_gating_topk(logits, topk, bias, score_func, num_groups, topk_groups, renormalize, routed_scaling_factor):
        args = (logits, topk, bias, score_func, num_groups, topk_groups, renormalize, routed_scaling_factor)
        acc = gating_signature(logits, topk, bias, score_func, num_groups, topk_groups)
        if acc == torch.float64 or not _routing.usable(logits, logits.shape[1]):
            return portable.moe_gating_topk(*args)
        scores = portable.gating_scores(logits, score_func, acc)
        return _routing.gating(scores, bias, topk, num_groups, topk_groups, renormalize, routed_scaling_factor)
