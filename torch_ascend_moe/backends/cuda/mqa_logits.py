"""CUDA kernels of the mqa_logits family: ``mqa_logits`` as one launch of the tiled Triton kernel (``_mqa``: no
``[S, H, S_kv]`` scores, key blocks nobody sees skipped) instead of the portable kernel's chunked einsums over
dequantized copies. Every operand format (BF16, FP32, FP8 and packed FP4 with FP32 or E8M0 block scales), full
and compressed outputs, FP32 or BF16 logits. No host read while a CUDA graph is captured (the range checks are
skipped then, as in the portable kernel).

``mqa_logits_topk``: the portable kernel's static query blocks with this kernel's logits for each block (``[chunk,
S_kv]`` at a time, never ``[S, S_kv]``), then the portable selection: bitwise ``mqa_topk(mqa_logits(...))`` on CUDA.

``paged_mqa_logits`` (decode): one launch of the paged kernel, a program per (query row, page): the page found
through the block table, its FP8/FP4 token rows and their scales (FP32 per token, or UE8M0 per 32 elements, both
layouts) read straight from the cache bytes, never gathered into a dequantized copy of every request's KV.

Refused (the portable kernels take them), and why: FP64 operands (gradcheck's path), empty operands, GPUs before
sm89, builds without Triton, pages of fewer than 16 tokens or not a power of two. No kernel here:
``mqa_logits_backward``, ``paged_mqa_logits_metadata`` (integer bookkeeping on the host), ``mqa_topk`` (a sort:
ATen's).
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.chain import first_refusal, kernel
from torch_ascend_moe.backends.cuda import triton_available, triton_module
from torch_ascend_moe.backends.portable import mqa_logits as portable
from torch_ascend_moe.checks import mqa_logits as mqa_checks
from torch_ascend_moe.distributed.capture import host_readable

_mqa = triton_module("_mqa")


def _refusal(q, rows: int, columns: int) -> str | None:
    if q.dtype == torch.float64:
        return "FP64 operands (gradcheck's path; the kernel sums in FP32)"
    if rows == 0 or columns == 0:
        return "empty operands: nothing to launch"
    return _mqa.refusal(q)


def _takes_logits(q, q_sf, k, k_sf, weights, ks, ke, max_seqlen_k, logits_dtype):
    sh = mqa_checks.mqa_signature(mqa_checks.OP, q, q_sf, k, k_sf, weights, ks, ke, max_seqlen_k, logits_dtype)
    return first_refusal(_refusal(q, sh.S, sh.S_kv))


def _takes_topk(q, q_sf, k, k_sf, weights, ks, ke, topk, logits_dtype):
    sh = mqa_checks.fused_signature(q, q_sf, k, k_sf, weights, ks, ke, topk, logits_dtype)
    return first_refusal(_refusal(q, sh.S, sh.S_kv))


def _takes_paged(
    q, q_sf, kv_cache, weights, context_lens, block_table, max_context_len, indices, ascend_kv_layout, logits_dtype
):
    _, fmt, _ = mqa_checks.paged_signature(
        q, q_sf, kv_cache, weights, context_lens, block_table, max_context_len, indices, ascend_kv_layout, logits_dtype
    )
    why = _refusal(q, q.shape[0] * q.shape[1], max_context_len)
    return first_refusal(why or _mqa.paged_refusal(q, fmt))


@kernel(device="cuda", library="triton", calls="_mqa", takes=_takes_logits, available=triton_available)
def mqa_logits(q, q_sf, k, k_sf, weights, ks, ke, max_seqlen_k, logits_dtype):
    sh = mqa_checks.mqa_signature(mqa_checks.OP, q, q_sf, k, k_sf, weights, ks, ke, max_seqlen_k, logits_dtype)
    if host_readable(ks):
        mqa_checks.check_range_values(mqa_checks.OP, ks, ke, sh.S_kv, max_seqlen_k)
    columns = max_seqlen_k if max_seqlen_k > 0 else sh.S_kv
    out = torch.full((sh.S, columns), float("-inf"), dtype=sh.out_dtype, device=q.device)
    return _mqa.mqa_logits(q, q_sf, k, k_sf, weights, ks, ke, columns, max_seqlen_k > 0, out)


@kernel(
    device="cuda",
    library="triton",
    calls="_mqa, then the portable selection",
    takes=_takes_topk,
    available=triton_available,
)
def mqa_logits_topk(q, q_sf, k, k_sf, weights, ks, ke, topk, logits_dtype):
    args = (q, q_sf, k, k_sf, weights, ks, ke, topk, logits_dtype)
    sh = mqa_checks.fused_signature(*args)

    def block_logits(rows):
        out = torch.full((len(range(sh.S)[rows]), sh.S_kv), float("-inf"), dtype=sh.out_dtype, device=q.device)
        q_rows, sf_rows = q[rows], None if q_sf is None else q_sf[rows]
        return _mqa.mqa_logits(q_rows, sf_rows, k, k_sf, weights[rows], ks[rows], ke[rows], sh.S_kv, False, out)

    return portable.mqa_logits_topk(*args, block_logits=block_logits)


@kernel(device="cuda", library="triton", calls="_mqa (paged)", takes=_takes_paged, available=triton_available)
def paged_mqa_logits(
    q, q_sf, kv_cache, weights, context_lens, block_table, max_context_len, indices, ascend_kv_layout, logits_dtype
):
    _, fmt, out_dtype = mqa_checks.paged_signature(
        q, q_sf, kv_cache, weights, context_lens, block_table, max_context_len, indices, ascend_kv_layout, logits_dtype
    )
    if host_readable(context_lens):
        mqa_checks.check_paged_values(
            context_lens, block_table, max_context_len, fmt.block_kv, kv_cache.shape[0], indices
        )
    rows = q.shape[0] * q.shape[1]
    out = torch.full((rows, max_context_len), float("-inf"), dtype=out_dtype, device=q.device)
    return _mqa.paged_mqa_logits(q, q_sf, kv_cache, fmt, weights, context_lens, block_table, out)
