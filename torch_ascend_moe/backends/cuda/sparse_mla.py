"""CUDA kernel of the sparse_mla family: ``sparse_mla_prefill`` as one launch of the Triton kernel (``_sparse_mla``:
a program per query token and block of heads, an online softmax over the token's top-k, the selected KV rows
gathered block by block) instead of the portable kernel's chunks of gathered ``[chunk, topk, d_qk]`` copies and
``[chunk, h_q, topk]`` logits. BF16, FP16 and FP32; sinks, ``topk_length``, any strides. No value is read on the
host (the op has no value checks: invalid indices are left out, not rejected), so a CUDA graph captures it.

Portable, and why: FP64 (gradcheck's path; the kernel accumulates in FP32), empty operands (nothing to launch; an
empty kv or top-k is all lonely tokens), GPUs before sm80, builds without Triton. ``sparse_mla_decode`` stays
portable: it dequantizes the selected records and calls the prefill op, so its attention runs here.
"""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import cuda_kernel
from torch_ascend_moe.backends.portable import sparse_mla as portable
from torch_ascend_moe.meta.sparse_mla import sparse_mla_prefill_signature

try:
    from torch_ascend_moe.backends.cuda import _sparse_mla
except ImportError:  # no triton: the portable kernel serves CUDA
    _sparse_mla = None


if _sparse_mla is not None:

    @cuda_kernel(calls="triton: _sparse_mla")
    def sparse_mla_prefill(q, kv, indices, sm_scale, d_v, attn_sink, topk_length):
        args = (q, kv, indices, sm_scale, d_v, attn_sink, topk_length)
        sparse_mla_prefill_signature(*args)
        empty = min(q.shape[0], q.shape[1], kv.shape[0], indices.shape[2]) == 0
        if q.dtype == torch.float64 or empty or not _sparse_mla.usable(q):
            return portable.sparse_mla_prefill(*args)
        return _sparse_mla.sparse_mla_prefill(*args)
