"""``mqa_logits`` (the sparse-attention indexer's ragged logits) on DeepGEMM's ``fp8_fp4_mqa_logits`` (deepgemm_api.md
§8.1; DeepGEMM 2.6.1 ``csrc/apis/attention.hpp`` and its SM90/SM100 kernels), and ``paged_mqa_logits`` (decode) on
``fp8_fp4_paged_mqa_logits`` with the schedule of ``get_paged_mqa_logits_metadata`` made per call (below).

What it takes: FP8 ``q`` without scales and FP8 ``k`` with one scale per token (our ``k_sf`` of ``[S_kv, 1]``, FP32
or UE8M0 widened exactly), or on SM100 packed FP4 ``q`` and ``k`` with UE8M0 scales per 32 of the head dim (packed
four to an int32, a short row padded with 1.0 as upstream's casts do); heads 32 or 64 (SM90) / 8, 16, 32, 64
(SM100); head dim 32, 64, 128 (FP4: 64, 128); contiguous ``q``, ``k`` and ``weights``; FP32 weights (BF16 weights go
through a BF16 multiply-add in the kernel: looser than our op's bound), FP32 or BF16 logits.

Full logits ask the library to clean the positions outside ``[ks, ke)`` to -inf (ours); compressed logits leave
the columns past ``ke - ks`` unspecified upstream, so they are set to -inf here. The library returns rows padded to
1024 bytes: our op's logits are row-major, so they are copied out (the one extra pass over the output; a padded
logits layout of our own would save it). ``ks`` / ``ke`` go as int32; while a graph is captured (no host check of
their values) they are clamped on the device into ``0 <= ks <= ke <= S_kv`` (and within ``max_seqlen_k``) so no
row is read or written past the tensors.
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.chain import first_refusal, kernel
from torch_ascend_moe.backends.portable import mqa_logits as portable_mqa
from torch_ascend_moe.backends.upstream.deep_gemm import (
    CUDA,
    SM90,
    SM100,
    as_library_fp4,
    cuda_arch,
    cuda_refusal,
    real_refusal,
    tma_refusal,
)
from torch_ascend_moe.checks import mqa_logits as mqa_checks
from torch_ascend_moe.distributed.capture import host_readable

_FP8 = torch.float8_e4m3fn
_UE8M0_ONE = 127  # the code of 1.0: what a short row of packed scales is padded with


def _refusal(q, q_sf, k, k_sf, weights, sh) -> str | None:
    if not mqa_checks.is_quantized(q):
        return f"{q.dtype} q (the library's logits are FP8 or FP4)"
    if not (sh.S and sh.S_kv):
        return "empty operands: nothing to hand the library"
    why = cuda_refusal() or real_refusal(q, q_sf, k, k_sf, weights)
    if why:
        return why
    sm90 = cuda_arch() == SM90
    heads = (32, 64) if sm90 else (8, 16, 32, 64)
    if sh.H not in heads:
        return f"{sh.H} heads (the kernel takes {heads})"
    if q.dtype == _FP8:
        if q_sf is not None:
            return "a scaled FP8 q (the FP8 kernel takes q without scales)"
        if k_sf is None or sh.gk != sh.D:
            return "k without one scale per token (the FP8 kernel's KV scales)"
        if sh.D not in (32, 64, 128):
            return f"head dim {sh.D} (FP8: 32, 64 or 128)"
    else:
        if sm90:
            return "packed FP4 on SM90 (FP4 kernels are SM100's)"
        if sh.D not in (64, 128) or sh.gq != 32 or sh.gk != 32:
            return "FP4 q and k need UE8M0 scales per 32 of a head dim of 64 or 128"
        if q_sf.dtype != torch.float8_e8m0fnu or k_sf.dtype != torch.float8_e8m0fnu:
            return "FP32 scales of FP4 operands (the kernel reads packed UE8M0)"
    if weights.dtype != torch.float32:
        return "BF16 weights (the kernel's BF16 multiply-add is looser than our op's bound)"
    if not (q.is_contiguous() and k.is_contiguous() and weights.is_contiguous()):
        return "q, k or weights not contiguous"
    return tma_refusal(q=q, k=k, weights=weights)


def _takes(q, q_sf, k, k_sf, weights, ks, ke, max_seqlen_k, logits_dtype):
    sh = mqa_checks.mqa_signature(mqa_checks.OP, q, q_sf, k, k_sf, weights, ks, ke, max_seqlen_k, logits_dtype)
    return first_refusal(_refusal(q, q_sf, k, k_sf, weights, sh))


def packed_ue8m0(sf: torch.Tensor) -> torch.Tensor:
    """``float8_e8m0fnu [..., G]`` -> int32 ``[...]``: four codes per word, the first in the low byte, a short row
    padded with 1.0 (DeepGEMM's packing of per-32 scales of a head dim of 64 or 128, ``G`` <= 4)."""
    codes = sf.view(torch.uint8)
    pad = 4 - codes.shape[-1]
    if pad:
        codes = torch.cat([codes, codes.new_full((*codes.shape[:-1], pad), _UE8M0_ONE)], -1)
    return codes.contiguous().view(torch.int32).squeeze(-1)


def _ranges(ks, ke, s_kv: int, max_seqlen_k: int):
    """int32 ``ks`` / ``ke`` within ``0 <= ks <= ke <= S_kv`` (``ke - ks <= max_seqlen_k`` when compressed): the
    identity on ranges our checks accept."""
    ks = ks.long().clamp(0, s_kv)
    ke = torch.maximum(ke.long().clamp(max=s_kv), ks)
    if max_seqlen_k > 0:
        ke = torch.minimum(ke, ks + max_seqlen_k)
    return ks.int().contiguous(), ke.int().contiguous()


@kernel(
    device="cuda",
    library="deep_gemm",
    calls="deep_gemm.fp8_fp4_mqa_logits",
    takes=_takes,
    available=CUDA.available,
)
def mqa_logits(q, q_sf, k, k_sf, weights, ks, ke, max_seqlen_k, logits_dtype):
    sh = mqa_checks.mqa_signature(mqa_checks.OP, q, q_sf, k, k_sf, weights, ks, ke, max_seqlen_k, logits_dtype)
    if host_readable(ks):
        mqa_checks.check_range_values(mqa_checks.OP, ks, ke, sh.S_kv, max_seqlen_k)  # our op's value errors
    ks32, ke32 = _ranges(ks, ke, sh.S_kv, max_seqlen_k)
    if q.dtype == _FP8:
        q_pair, kv = (q, None), (k, k_sf.float().reshape(-1).contiguous())
    else:
        q_pair, kv = (as_library_fp4(q), packed_ue8m0(q_sf)), (as_library_fp4(k), packed_ue8m0(k_sf))
    compressed = max_seqlen_k > 0
    logits = CUDA.module().fp8_fp4_mqa_logits(
        q_pair,
        kv,
        weights,
        ks32,
        ke32,
        clean_logits=not compressed,
        max_seqlen_k=max_seqlen_k,
        logits_dtype=sh.out_dtype,
    )
    if compressed:  # the columns past each row's range are unspecified upstream: -inf in our op
        width = torch.arange(max_seqlen_k, device=q.device)
        logits = torch.where(width.unsqueeze(0) < (ke32 - ks32).unsqueeze(1), logits, float("-inf"))
    return logits.contiguous()


def _paged_refusal(q, q_sf, kv_cache, weights, context_lens, block_table, indices, ascend, fmt, max_len):
    """What ``fp8_fp4_paged_mqa_logits`` takes (deepgemm_api.md §8.2; ``attention.hpp`` 253-398): DeepGEMM's own
    cache layout (``[blocks, block_kv, 1, D + 4]`` FP8 with FP32 token scales, or SM100 ``D/2 + 4`` FP4 with packed
    UE8M0), pages of 64 tokens (SM100: 32 or 64), FP8 q without scales (SM100 FP4 with UE8M0 per-32 scales), next_n
    1 or 2 on SM90, FP32 weights; varlen ``indices`` on SM100 with one query token per row (a request is a run of
    equal ids; our check has made its block-table rows equal). The kernel schedules a request's KV up to its last
    query token's length (varlen: the run's last row): every other token's must not exceed it (a host read, so not
    while capturing)."""
    b, next_n, heads = q.shape[0], q.shape[1], q.shape[2]
    if not mqa_checks.is_quantized(q):
        return f"{q.dtype} q (the library's logits are FP8 or FP4)"
    if ascend:
        return "the Ascend cache layout (not mapped to the CUDA kernel)"
    if not (b and max_len):
        return "empty operands: nothing to hand the library"
    why = cuda_refusal() or real_refusal(q, q_sf, kv_cache, weights, context_lens, block_table)
    if why:
        return why
    sm90 = cuda_arch() == SM90
    if indices is not None and (sm90 or next_n != 1):
        return "varlen indices on SM90 or with next_n > 1 (the kernel's varlen mode: SM100, one query token per row)"
    if heads not in ((32, 64) if sm90 else (8, 16, 32, 64)):
        return f"{heads} heads"
    if fmt.block_kv not in ((64,) if sm90 else (32, 64)) or (sm90 and next_n > 2):
        return f"pages of {fmt.block_kv} tokens or next_n {next_n} (SM90: 64 and 1-2; SM100: 32 or 64)"
    if q.dtype == _FP8:
        if q_sf is not None or fmt.fp4 or not fmt.fp32_scale or mqa_checks.head_dim(q) not in (32, 64, 128):
            return "FP8 q needs no scales, an FP8 cache with FP32 token scales and a head dim of 32, 64 or 128"
    elif (
        sm90
        or not fmt.fp4
        or q_sf is None
        or q_sf.dtype != torch.float8_e8m0fnu
        or mqa_checks.head_dim(q) not in (64, 128)
    ):
        return "FP4 (SM100): an FP4 cache, UE8M0 q scales per 32 of a head dim of 64 or 128"
    if weights.dtype != torch.float32 or not (q.is_contiguous() and weights.is_contiguous()):
        return "BF16 or non-contiguous weights, or a non-contiguous q"
    if kv_cache.stride(0) % 16 or block_table.stride(1) != 1 or not context_lens.is_contiguous():
        return "a cache block stride not a multiple of 16 bytes, or strided lengths / block table"
    if not host_readable(context_lens):
        return "the lengths' order is a host read: not while capturing"
    if not bool((context_lens <= _last_of_request(context_lens, indices)).all()):
        return "a query token with a longer context than its request's last token (the kernel's schedule)"
    return None


def _last_of_request(context_lens: torch.Tensor, indices: torch.Tensor | None) -> torch.Tensor:
    """Each query token's request's last token's length: the row's last entry, or (varlen) the length of the last
    row of its run of equal ``indices``."""
    if indices is None:
        return context_lens[:, -1:]
    rows = indices.shape[0]
    ends = torch.nonzero(torch.cat([indices[1:] != indices[:-1], indices.new_ones(1, dtype=torch.bool)])).flatten()
    last = ends[torch.searchsorted(ends, torch.arange(rows, device=indices.device))]
    return context_lens[last]


def _takes_paged(
    q, q_sf, kv_cache, weights, context_lens, block_table, max_context_len, indices, ascend_kv_layout, logits_dtype
):
    _, fmt, _ = mqa_checks.paged_signature(
        q, q_sf, kv_cache, weights, context_lens, block_table, max_context_len, indices, ascend_kv_layout, logits_dtype
    )
    why = _paged_refusal(
        q, q_sf, kv_cache, weights, context_lens, block_table, indices, ascend_kv_layout, fmt, max_context_len
    )
    return first_refusal(why)


@kernel(
    device="cuda",
    library="deep_gemm",
    calls="deep_gemm.fp8_fp4_paged_mqa_logits",
    takes=_takes_paged,
    available=CUDA.available,
)
def paged_mqa_logits(
    q, q_sf, kv_cache, weights, context_lens, block_table, max_context_len, indices, ascend_kv_layout, logits_dtype
):
    _, fmt, out_dtype = mqa_checks.paged_signature(
        q, q_sf, kv_cache, weights, context_lens, block_table, max_context_len, indices, ascend_kv_layout, logits_dtype
    )
    mqa_checks.check_paged_values(context_lens, block_table, max_context_len, fmt.block_kv, kv_cache.shape[0], indices)
    dg = CUDA.module()
    schedule = dg.get_paged_mqa_logits_metadata(context_lens, fmt.block_kv, dg.get_num_sms(), indices)
    q_pair = (q, None) if q.dtype == _FP8 else (as_library_fp4(q), packed_ue8m0(q_sf))
    logits = dg.fp8_fp4_paged_mqa_logits(
        q_pair,
        kv_cache,
        weights,
        context_lens,
        block_table,
        schedule,
        max_context_len,
        clean_logits=False,
        logits_dtype=out_dtype,
        indices=indices,
    )
    # Columns at or past each query token's length are unspecified upstream: -inf in our op.
    lens = context_lens.reshape(-1, 1)
    visible = torch.arange(max_context_len, device=q.device).unsqueeze(0) < lens
    return torch.where(visible, logits, float("-inf")).contiguous()


# ---- DeepGEMM 2.8's sparse indexer (specs/upstream_2609.md §1) behind sparse_mqa_logits / paged_sparse_mqa_logits --
#
# SM100 only, 32 heads of 128, MX operands (packed FP4 or E4M3 with UE8M0 scales per 32, int32-packed for the
# library), BF16 weights and logits, SBK 8 or 16, 0 < NB <= 4096 with NB % 4 == 0. The schedule is built per call
# (upstream's callers build it once per step: our op's inputs are the ranges and blocks themselves). The columns the
# kernel leaves unwritten (slots past a query's blocks, tokens outside its range) are set to -inf, our op's value.

_SPARSE_MAX_TOKENS = 1 << 20


def _mx_refusal(q, q_sf, sh_gq, k_fp4: bool | None, k_sf, sh_gk) -> str | None:
    """MXFP4 or MXFP8 operands with UE8M0 scales per 32 (``k_fp4`` None: a paged cache, checked by the caller)."""
    fp4 = mqa_checks.is_fp4(q)
    if q_sf is None or q_sf.dtype != torch.float8_e8m0fnu or sh_gq != 32:
        return "q without UE8M0 scales per 32 (the sparse kernel's MXFP4 / MXFP8 operands)"
    if k_fp4 is not None and (k_fp4 != fp4 or k_sf is None or k_sf.dtype != torch.float8_e8m0fnu or sh_gk != 32):
        return "k not in q's MX format (UE8M0 scales per 32)"
    return None


def _sparse_shape_refusal(heads, d, weights, logits_dtype, sbk, nb, rows) -> str | None:
    if heads != 32 or d != 128:
        return f"{heads} heads of {d} (the sparse kernel: 32 heads of 128)"
    if weights.dtype != torch.bfloat16 or logits_dtype != torch.bfloat16:
        return "FP32 weights or logits (the sparse kernel takes BF16 weights and writes BF16 logits)"
    if sbk not in (8, 16) or not (0 < nb <= 4096 and nb % 4 == 0):
        return f"sparse_block_kv {sbk} or {nb} blocks (the kernel: SBK 8 or 16, 0 < NB <= 4096, NB % 4 == 0)"
    if rows > _SPARSE_MAX_TOKENS:
        return f"{rows} query tokens (the kernel's workspace holds 2^20)"
    return None


def _sparse_library_refusal() -> str | None:
    why = cuda_refusal()
    if why:
        return why
    if not hasattr(CUDA.module(), "fp8_fp4_sparse_mqa_logits"):
        return "deep_gemm older than 2.8 (no sparse indexer)"
    if cuda_arch() != SM100:
        return "not SM100 (the sparse indexer is SM100's)"
    return None


def _takes_sparse(q, q_sf, k, k_sf, weights, ks, ke, block_indices, sparse_block_kv, unaligned_ks, logits_dtype):
    sh, nb = mqa_checks.sparse_signature(
        q, q_sf, k, k_sf, weights, ks, ke, block_indices, sparse_block_kv, logits_dtype
    )
    if not mqa_checks.is_quantized(q):
        return first_refusal(f"{q.dtype} q (the library's logits are MXFP4 or MXFP8)")
    if not (sh.S and sh.S_kv):
        return first_refusal("empty operands: nothing to hand the library")
    why = (
        _sparse_library_refusal()
        or real_refusal(q, q_sf, k, k_sf, weights, block_indices)
        or _mx_refusal(q, q_sf, sh.gq, mqa_checks.is_fp4(k), k_sf, sh.gk)
        or _sparse_shape_refusal(sh.H, sh.D, weights, sh.out_dtype, sparse_block_kv, nb, sh.S)
    )
    if not why and not (q.is_contiguous() and k.is_contiguous() and weights.is_contiguous()):
        why = "q, k or weights not contiguous"
    return first_refusal(why)


def _qk_dtype(q) -> torch.dtype:
    return torch.int8 if mqa_checks.is_fp4(q) else torch.float8_e4m3fn


def _q_pair(q, q_sf):
    return (as_library_fp4(q) if mqa_checks.is_fp4(q) else q, packed_ue8m0(q_sf))


@kernel(
    device="cuda",
    library="deep_gemm",
    calls="deep_gemm.fp8_fp4_sparse_mqa_logits",
    takes=_takes_sparse,
    available=CUDA.available,
)
def sparse_mqa_logits(q, q_sf, k, k_sf, weights, ks, ke, block_indices, sparse_block_kv, unaligned_ks, logits_dtype):
    sh, nb = mqa_checks.sparse_signature(
        q, q_sf, k, k_sf, weights, ks, ke, block_indices, sparse_block_kv, logits_dtype
    )
    if host_readable(ks):
        mqa_checks.check_sparse_values(ks, ke, block_indices, sparse_block_kv, unaligned_ks, sh.S_kv)
    ks32, ke32 = _ranges(ks, ke, sh.S_kv, 0)
    blocks = block_indices.contiguous()
    dg = CUDA.module()
    schedule = dg.get_sparse_mqa_logits_metadata(
        ks32, ke32, sh.S_kv, blocks, _qk_dtype(q), sparse_block_kv, bool(unaligned_ks)
    )
    logits = dg.fp8_fp4_sparse_mqa_logits(
        _q_pair(q, q_sf),
        (as_library_fp4(k) if mqa_checks.is_fp4(k) else k, packed_ue8m0(k_sf)),
        weights,
        schedule,
        nb,
        sparse_block_kv,
        bool(unaligned_ks),
    )
    shift = portable_mqa.sparse_shift(ks32, sparse_block_kv, unaligned_ks)
    _, valid = portable_mqa.sparse_columns(ks32, ke32, shift, blocks, sparse_block_kv)
    return torch.where(valid, logits, float("-inf")).contiguous()


def _takes_paged_sparse(
    q,
    q_sf,
    kv_cache,
    weights,
    context_lens,
    block_table,
    block_indices,
    sparse_block_kv,
    ascend_kv_layout,
    logits_dtype,
):
    gq, fmt, out, nb = mqa_checks.paged_sparse_signature(
        q, q_sf, kv_cache, weights, context_lens, block_table, block_indices, sparse_block_kv, ascend_kv_layout,
        logits_dtype,
    )  # fmt: skip
    b, next_n, heads = q.shape[0], q.shape[1], q.shape[2]
    if not mqa_checks.is_quantized(q):
        return first_refusal(f"{q.dtype} q (the library's logits are MXFP4 or MXFP8)")
    if not b:
        return first_refusal("empty operands: nothing to hand the library")
    why = (
        _sparse_library_refusal()
        or real_refusal(q, q_sf, kv_cache, weights, context_lens, block_table, block_indices)
        or _mx_refusal(q, q_sf, gq, None, None, 0)
        or _sparse_shape_refusal(heads, mqa_checks.head_dim(q), weights, out, sparse_block_kv, nb, b)
    )
    if not why and next_n != 1:
        why = f"next_n {next_n} (the paged sparse kernel takes one query token per row)"
    if not why and (fmt.fp32_scale or fmt.fp4 != mqa_checks.is_fp4(q)):
        why = "a cache in another format than q's MX one (FP32 token scales, or FP4 and FP8 mixed)"
    if not why and kv_cache.stride(0) % 512:
        why = "a cache page stride not a multiple of 512 bytes (the kernel's)"
    if not why and not (q.is_contiguous() and weights.is_contiguous() and block_table.stride(1) == 1):
        why = "a non-contiguous q or weights, or a strided block table"
    return first_refusal(why)


@kernel(
    device="cuda",
    library="deep_gemm",
    calls="deep_gemm.fp8_fp4_paged_sparse_mqa_logits",
    takes=_takes_paged_sparse,
    available=CUDA.available,
)
def paged_sparse_mqa_logits(
    q,
    q_sf,
    kv_cache,
    weights,
    context_lens,
    block_table,
    block_indices,
    sparse_block_kv,
    ascend_kv_layout,
    logits_dtype,
):
    _, fmt, _, nb = mqa_checks.paged_sparse_signature(
        q, q_sf, kv_cache, weights, context_lens, block_table, block_indices, sparse_block_kv, ascend_kv_layout,
        logits_dtype,
    )  # fmt: skip
    if host_readable(context_lens):
        mqa_checks.check_paged_sparse_values(
            context_lens, block_table, block_indices, sparse_block_kv, fmt.block_kv, kv_cache.shape[0]
        )
    rows = q.shape[0]
    lens = context_lens.reshape(-1).contiguous()
    blocks = block_indices.contiguous()
    # One row per query token: each its own request for the library's token pairing (our op reads each row's table).
    requests = torch.arange(rows, dtype=torch.int32, device=q.device)
    dg = CUDA.module()
    schedule = dg.get_paged_sparse_mqa_logits_metadata(
        lens, block_table, requests, fmt.block_kv, blocks, _qk_dtype(q), sparse_block_kv
    )
    logits = dg.fp8_fp4_paged_sparse_mqa_logits(_q_pair(q, q_sf), kv_cache, weights, schedule, nb, sparse_block_kv)
    zero = torch.zeros_like(lens)
    _, valid = portable_mqa.sparse_columns(zero, lens, zero, blocks, sparse_block_kv)
    return torch.where(valid, logits, float("-inf")).contiguous()
