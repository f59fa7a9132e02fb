"""CUDA kernel of the sparse_mla family: ``sparse_mla_prefill`` as one launch of the Triton kernel (``_sparse_mla``:
a program per query token and block of heads, an online softmax over the token's top-k, the selected KV rows
gathered block by block) instead of the portable kernel's chunks of gathered ``[chunk, topk, d_qk]`` copies and
``[chunk, h_q, topk]`` logits. BF16, FP16 and FP32; sinks, ``topk_length``, any strides. No value is read on the
host (the op has no value checks: invalid indices are left out, not rejected), so a CUDA graph captures it.

Refused (the portable kernel takes them), and why: FP64 (gradcheck's path; the kernel accumulates in FP32), empty
operands (nothing to launch; an empty kv or top-k is all lonely tokens), GPUs before sm80, builds without Triton.
``sparse_mla_decode`` has no kernel here: its portable kernel dequantizes the selected records and calls the
prefill op, so its attention runs here.
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.chain import first_refusal, kernel
from torch_ascend_moe.backends.cuda import triton_available, triton_module
from torch_ascend_moe.checks.sparse_mla import sparse_mla_prefill_signature

_sparse_mla = triton_module("_sparse_mla")


def _takes(q, kv, indices, sm_scale, d_v, attn_sink, topk_length):
    sparse_mla_prefill_signature(q, kv, indices, sm_scale, d_v, attn_sink, topk_length)
    empty = min(q.shape[0], q.shape[1], kv.shape[0], indices.shape[2]) == 0
    return first_refusal(
        "FP64 (the kernel accumulates in FP32)" if q.dtype == torch.float64 else None,
        "empty operands: nothing to launch" if empty else None,
        _sparse_mla.refusal(q),
    )


@kernel(device="cuda", library="triton", calls="_sparse_mla", takes=_takes, available=triton_available)
def sparse_mla_prefill(q, kv, indices, sm_scale, d_v, attn_sink, topk_length):
    return _sparse_mla.sparse_mla_prefill(q, kv, indices, sm_scale, d_v, attn_sink, topk_length)
