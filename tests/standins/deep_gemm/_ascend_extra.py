"""The "ascend" flavor's attention, hyper-connection and einsum APIs (DeepGEMM-Ascend 0.1.0).

Sources (the public fork Afloat16/DeepGEMM-Ascend @ 8491bbb, see ``_ascend``): ``csrc/apis/attention.hpp``,
``csrc/jit_kernels/mqa_logits.hpp``, the kernels ``deep_gemm/include/deep_gemm/mqa_logits.hpp`` and
``scheduler/{mqa_logits,paged_mqa_logits,paged_mqa_logits_metadata}.hpp``, ``csrc/apis/einsum.hpp`` and the TileLang
``deep_gemm/tilelang_ops/hc_prenorm.py``. Host checks (``DJ_HOST_ASSERT`` / ``DJ_PANIC``) raise ``RuntimeError``
quoting the condition (and upstream's message) and the file, as in ``_ascend``; the Python ``assert``s of the TileLang
wrapper raise ``AssertionError`` as they do upstream.

Differences from CUDA DeepGEMM that the stand-in models (``shared/specs/deepgemm_api.md`` §16.2): MQA logits need Q
scale factors even for FP8 (int16 UE8M0 pairs, ``[S, H, D / 64]`` or ``[S * H, D / 64]``, KV ``[S_kv, D / 64]``),
BF16 weights and BF16 logits, compressed output only (``max_seqlen_k > 0``) with the row stride padded to 512 bytes
(``torch.empty_strided``: the last row has no padding), ``4 <= H <= 64``, ``H % 4 == 0``, ``D`` in {64, 128}; the
paged kernel takes ``next_n == 1`` with mandatory ``indices`` (a request is a run of equal indices), page size 64 or
128 and the fused cache ``uint8 [pages, page, 1, D_storage + (D / 64) * 2]`` whose every page is
``[page * D_storage bytes of KV | page * D / 64 int16 SF]`` (token-major; with ``use_ascend_kv_layout=True`` the data
is in 32-byte NZ fragments ``[D_storage / 32][page][32]`` and, for ``D = 128``, the SF pairs of each 16 tokens are
stored pair-major).

Conventions (as in ``_cuda_extra``): logits are float64 reference values cast to BF16 (the kernel rounds each head's
ReLU score to BF16 and accumulates in BF16); entries the kernel does not write are NaN (compressed positions
``t >= ke - ks``, paged positions ``j >= context_lens``); ``Panic`` where the kernel would read or write past its
tensors or compute garbage.
"""

from __future__ import annotations

import torch

from . import _mqa, _ref
from ._ascend import (
    BF16,
    EINSUM,
    F32,
    FP4,
    FP8,
    I16,
    _bf16_bmm,
    _epilogue_arg,
    _fp8_bmm,
    _opt_tensor,
    _pair,
    _tensor,
)
from ._cuda import _ints
from ._ref import F64, ceil_div
from ._standin import ASCEND_AI_CORES, PREFIX, STATE, check, fail, incompatible, panic, public

ATTN = "DeepGEMM-Ascend csrc/apis/attention.hpp"
MQA_JIT = "DeepGEMM-Ascend csrc/jit_kernels/mqa_logits.hpp"
HC_PY = "DeepGEMM-Ascend deep_gemm/tilelang_ops/hc_prenorm.py"
I32 = torch.int32
NAN = float("nan")
HEADS_COND = "num_heads >= 4 and num_heads <= 64 and num_heads % 4 == 0"


def _num_cores():
    return STATE.num_sms or ASCEND_AI_CORES


def _uint32(x, api, arg):
    """pybind11's ``uint32_t`` caster: negative or too large values do not convert."""
    try:
        v = int(x.__index__())
    except (AttributeError, TypeError):
        incompatible(api, f"'{arg}' must be an unsigned 32-bit int, got {x!r}")
    if not 0 <= v < 1 << 32:
        incompatible(api, f"'{arg}' must be an unsigned 32-bit int, got {v}")
    return v


def _q(q, api):
    """``std::pair<Tensor, std::optional<Tensor>>``."""
    ok = isinstance(q, (tuple, list)) and len(q) == 2 and isinstance(q[0], torch.Tensor)
    if not ok or (q[1] is not None and not isinstance(q[1], torch.Tensor)):
        incompatible(api, "'q' must be a (Tensor, Tensor | None) pair")
    return q[0], q[1]


def _logits_stride(n):
    """``get_logits_stride``: 512-byte (256 BF16) aligned rows."""
    return ceil_div(n, 256) * 256


def _deq(data, sf16, d):
    """FP8 / packed-FP4 ``[..., D_storage]`` times its int16 UE8M0 pairs ``[..., D / 64]`` (byte j of pair p scales
    elements ``[64 p + 32 j, 64 p + 32 j + 32)``)."""
    vals = _ref.fp4_values(data, -1) if data.dtype == FP4 else data.to(F64)
    return vals * _mqa.group_scales(_ref.unpack_bytes(sf16, 2), d)


def _lens_list(context_lens):
    lens = context_lens.reshape(-1).tolist()
    for i, v in enumerate(lens):
        if v < 0:
            panic(
                f"context_lens[{i}] = {v}: the kernels read context lengths as uint32, so the request would span "
                f"~2^32 KV tokens (reads far past the block table and the cache)"
            )
    return lens


# ---------------------------------------------------------------------------------------------------------------------
# fp8_fp4_mqa_logits (attention.hpp fp8_fp4_mqa_logits)
# ---------------------------------------------------------------------------------------------------------------------


@public("fp8_fp4_mqa_logits")
def fp8_fp4_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, max_seqlen_k):
    """Compressed ragged MQA logits, BF16 ``[S, max_seqlen_k]`` with row stride ``align(max_seqlen_k, 256)``:
    ``out[i, t] = sum_h w[i, h] * relu(q_deq[i, h] . k_deq[ks[i] + t])`` for ``t < ke[i] - ks[i]``."""
    api = "fp8_fp4_mqa_logits"
    q_data, sf_q = _q(q, api)
    kv_data, sf_kv = _pair(kv, api, "kv")
    weights = _tensor(weights, api, "weights")
    ks = _tensor(cu_seq_len_k_start, api, "cu_seq_len_k_start")
    ke = _tensor(cu_seq_len_k_end, api, "cu_seq_len_k_end")
    max_seqlen_k = _uint32(max_seqlen_k, api, "max_seqlen_k")
    check(q_data.dim() == 3, ATTN, "q_data.dim() == 3")
    check(kv_data.dim() == 2, ATTN, "kv_data.dim() == 2")
    check(weights.dim() == 2, ATTN, "weights.dim() == 2")
    check(
        ks.is_contiguous() and ke.is_contiguous(),
        ATTN,
        "cu_seq_len_k_start.is_contiguous() and cu_seq_len_k_end.is_contiguous()",
    )
    check(
        ks.dtype == I32 and ke.dtype == I32,
        ATTN,
        "cu_seq_len_k_start.scalar_type() == torch::kInt and cu_seq_len_k_end.scalar_type() == torch::kInt",
    )
    check(
        weights.dtype == BF16, ATTN, "weights.scalar_type() == torch::kBFloat16: Ascend MQA logits expects bf16 weights"
    )
    seq_len, num_heads = int(q_data.size(0)), int(q_data.size(1))
    is_fp4 = q_data.dtype == FP4
    head_dim = int(q_data.size(2)) * (2 if is_fp4 else 1)
    seq_len_kv = int(kv_data.size(0))
    head_dim_storage = head_dim // 2 if is_fp4 else head_dim
    check(4 <= num_heads <= 64 and num_heads % 4 == 0, ATTN, HEADS_COND)
    check(
        head_dim in (64, 128),
        ATTN,
        "head_dim == 64 or head_dim == 128: Initial Ascend MQA logits kernel supports head_dim=64/128 only",
    )
    check(max_seqlen_k > 0, ATTN, "max_seqlen_k > 0")
    check(
        weights.size(0) == seq_len and weights.size(1) == num_heads and weights.stride(1) == 1,
        ATTN,
        "weights.size(0) == num_q_tokens and weights.size(1) == num_heads and weights.stride(1) == 1",
    )
    check(
        ks.numel() == seq_len and ke.numel() == seq_len,
        ATTN,
        "cu_seq_len_k_start.numel() == num_q_tokens and cu_seq_len_k_end.numel() == num_q_tokens",
    )
    check(
        q_data.is_contiguous() and kv_data.is_contiguous(), ATTN, "q_data.is_contiguous() and kv_data.is_contiguous()"
    )
    check(kv_data.size(1) == head_dim_storage, ATTN, "kv_data.size(1) == head_dim_storage")
    check(
        (q_data.dtype == FP8 and kv_data.dtype == FP8) or (q_data.dtype == FP4 and kv_data.dtype == FP4),
        ATTN,
        "(q_data.scalar_type() == torch::kFloat8_e4m3fn and kv_data.scalar_type() == torch::kFloat8_e4m3fn) or "
        "(q_data.scalar_type() == kPackedFP4 and kv_data.scalar_type() == kPackedFP4)",
    )
    check(sf_q is not None, ATTN, "sf_q.has_value(): MQA logits requires Q scale factors")
    sf_q_view = sf_q
    if sf_q_view.dim() == 3:
        check(
            sf_q_view.size(0) == seq_len and sf_q_view.size(1) == num_heads,
            ATTN,
            "sf_q_view.size(0) == num_q_tokens and sf_q_view.size(1) == num_heads",
        )
        sf_q_view = sf_q_view.reshape(seq_len * num_heads, sf_q_view.size(2))
    check(
        sf_q_view.dtype == I16 and sf_kv.dtype == I16,
        ATTN,
        "sf_q_view.scalar_type() == torch::kShort and sf_kv.scalar_type() == torch::kShort",
    )
    check(
        sf_q_view.dim() == 2 and sf_q_view.size(0) == seq_len * num_heads and sf_q_view.size(1) == head_dim // 64,
        ATTN,
        "sf_q_view.dim() == 2 and sf_q_view.size(0) == num_q_tokens * num_heads and sf_q_view.size(1) == head_dim / 64",
    )
    check(
        sf_kv.dim() == 2 and sf_kv.size(0) == seq_len_kv and sf_kv.size(1) == head_dim // 64,
        ATTN,
        "sf_kv.dim() == 2 and sf_kv.size(0) == num_kv_tokens and sf_kv.size(1) == head_dim / 64",
    )
    stride = _logits_stride(max_seqlen_k)
    logits = torch.empty_strided((seq_len, max_seqlen_k), (stride, 1), dtype=BF16)
    starts, ends = ks.reshape(-1).tolist(), ke.reshape(-1).tolist()
    for i, (s, e) in enumerate(zip(starts, ends)):
        if not 0 <= s <= e <= seq_len_kv:
            panic(
                f"cu_seq_len_k_start/end[{i}] = [{s}, {e}) is not a range inside [0, num_kv_tokens = {seq_len_kv}]: "
                f"the scheduler (scheduler/mqa_logits.hpp) reads them as uint32 and clamps only to num_kv_tokens, so "
                f"it would walk KV splits past the tensors or leave part of the row unwritten"
            )
        if e - s > stride or (i == seq_len - 1 and e - s > max_seqlen_k):
            panic(
                f"row {i} has ke - ks = {e - s} logits but max_seqlen_k = {max_seqlen_k} (row stride {stride}): the "
                f"kernel stores every one of them, past the row into the next one or past the logits allocation"
            )
    q_v = _deq(q_data, sf_q_view.reshape(seq_len, num_heads, -1), head_dim)
    k_v = _deq(kv_data, sf_kv, head_dim)
    full = _mqa.relu_logits(q_v, k_v, weights.to(F64))
    out = torch.full((seq_len, max_seqlen_k), NAN, dtype=F64)
    for i, (s, e) in enumerate(zip(starts, ends)):
        n = min(e - s, max_seqlen_k)
        out[i, :n] = full[i, s : s + n]
    logits.copy_(out.to(BF16))
    return logits


# ---------------------------------------------------------------------------------------------------------------------
# get_paged_mqa_logits_metadata / fp8_fp4_paged_mqa_logits
# ---------------------------------------------------------------------------------------------------------------------


def _check_indices(indices, num_q_tokens):
    check(
        indices.dim() == 1 and indices.size(0) == num_q_tokens and indices.dtype == I32 and indices.is_contiguous(),
        ATTN,
        "indices.dim() == 1 and indices.size(0) == num_q_tokens and indices.scalar_type() == torch::kInt and "
        "indices.is_contiguous()",
    )


def _check_heads(num_heads):
    check(4 <= num_heads <= 64 and num_heads % 4 == 0, MQA_JIT, HEADS_COND)


@public("get_paged_mqa_logits_metadata")
def get_paged_mqa_logits_metadata(context_lens, num_heads, indices):
    """int32 ``[num_cores + 1, 2]``: per-core (first query token of a request, KV split) starts from DeepGEMM-Ascend's
    cost model; ``(T, 0)`` for cores without work."""
    api = "get_paged_mqa_logits_metadata"
    context_lens = _tensor(context_lens, api, "context_lens")
    num_heads = _uint32(num_heads, api, "num_heads")
    indices = _tensor(indices, api, "indices")
    check(
        context_lens.dim() == 2
        and context_lens.size(1) == 1
        and context_lens.is_contiguous()
        and context_lens.dtype == I32,
        ATTN,
        "context_lens.dim() == 2 and context_lens.size(1) == 1 and context_lens.is_contiguous() and "
        "context_lens.scalar_type() == torch::kInt",
    )
    num_q_tokens = int(context_lens.size(0))
    _check_indices(indices, num_q_tokens)
    _check_heads(num_heads)
    cores = _num_cores()
    offset = _ref.align(2 * num_q_tokens * 4 + 8 * 4, 32)
    ubuf = _ref.align(offset + (cores + 1) * 2 * 4, 32)
    check(ubuf <= 248 * 1024, MQA_JIT, "ubuf_size <= kMaxDynamicUBufSize: Paged MQA metadata exceeds UB capacity")
    lens = _lens_list(context_lens)
    meta = _mqa.ascend_metadata(lens, indices.tolist(), num_heads, cores)
    return torch.tensor(meta, dtype=I32).reshape(cores + 1, 2)


def _pages(cache, num_pages, page, ds, sf_pairs, ascend_layout):
    """Decode the fused pages: data ``[P, page, ds]`` (uint8) and SF ``[P, page, sf_pairs]`` (int16)."""
    span = page * (ds + 2 * sf_pairs)
    raw = torch.as_strided(cache, (num_pages, span), (int(cache.stride(0)), 1)).contiguous()
    data = raw[:, : page * ds]
    if ascend_layout:
        data = data.reshape(num_pages, ds // 32, page, 32).permute(0, 2, 1, 3).reshape(num_pages, page, ds)
    else:
        data = data.reshape(num_pages, page, ds)
    sf = raw[:, page * ds :].contiguous().view(I16)
    if ascend_layout and sf_pairs == 2:
        sf = sf.reshape(num_pages, page // 16, 2, 16).permute(0, 1, 3, 2).reshape(num_pages, page, 2)
    else:
        sf = sf.reshape(num_pages, page, sf_pairs)
    return data, sf


@public("fp8_fp4_paged_mqa_logits")
def fp8_fp4_paged_mqa_logits(
    q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len, indices, use_ascend_kv_layout=False
):
    """Paged MQA logits, BF16 ``[T, max_context_len]`` (row stride ``align(max_context_len, 256)``): token ``t`` gets
    ``logit(j)`` for ``j < context_lens[t]`` over its request's pages (the block-table row of the request's first
    token; a request is a run of equal ``indices``)."""
    api = "fp8_fp4_paged_mqa_logits"
    q_data, sf_q = _q(q, api)
    cache = _tensor(kv_cache, api, "kv_cache")
    weights = _tensor(weights, api, "weights")
    context_lens = _tensor(context_lens, api, "context_lens")
    block_table = _tensor(block_table, api, "block_table")
    schedule_meta = _tensor(schedule_meta, api, "schedule_meta")
    max_context_len = _uint32(max_context_len, api, "max_context_len")
    indices = _tensor(indices, api, "indices")
    ascend_layout = bool(use_ascend_kv_layout)
    check(
        q_data.dim() == 4 and cache.dim() == 4 and weights.dim() == 2,
        ATTN,
        "q_data.dim() == 4 and fused_kv_cache.dim() == 4 and weights.dim() == 2",
    )
    check(
        context_lens.dim() == 2 and context_lens.is_contiguous(),
        ATTN,
        "context_lens.dim() == 2 and context_lens.is_contiguous()",
    )
    check(
        block_table.dim() == 2 and block_table.stride(1) == 1,
        ATTN,
        "block_table.dim() == 2 and block_table.stride(1) == 1",
    )
    check(
        context_lens.dtype == I32 and block_table.dtype == I32,
        ATTN,
        "context_lens.scalar_type() == torch::kInt and block_table.scalar_type() == torch::kInt",
    )
    check(
        schedule_meta.dim() == 2 and schedule_meta.is_contiguous() and schedule_meta.dtype == I32,
        ATTN,
        "schedule_meta.dim() == 2 and schedule_meta.is_contiguous() and schedule_meta.scalar_type() == torch::kInt",
    )
    check(
        weights.dtype == BF16, ATTN, "weights.scalar_type() == torch::kBFloat16: Ascend MQA logits expects bf16 weights"
    )
    num_q_tokens, num_heads = int(q_data.size(0)), int(q_data.size(2))
    is_fp4 = q_data.dtype == FP4
    ds = int(q_data.size(3))
    head_dim = ds * 2 if is_fp4 else ds
    page = int(cache.size(1))
    check(
        head_dim in (64, 128),
        ATTN,
        "head_dim == 64 or head_dim == 128: Ascend MQA logits kernel supports head_dim=64/128 only",
    )
    check(
        page in (64, 128),
        ATTN,
        "page_size == 64 or page_size == 128: Ascend paged MQA logits supports page_size=64/128",
    )
    sf_pairs = head_dim // 64
    sf_bytes = sf_pairs * 2
    check(
        cache.size(2) == 1 and cache.size(3) == ds + sf_bytes and cache.dtype == torch.uint8,
        ATTN,
        "fused_kv_cache.size(2) == 1 and fused_kv_cache.size(3) == head_dim_storage + sf_bytes and "
        "fused_kv_cache.scalar_type() == torch::kByte",
    )
    check(
        cache.stride(1) == ds + sf_bytes and cache.stride(3) == 1 and cache.stride(0) % sf_bytes == 0,
        ATTN,
        "fused_kv_cache.stride(1) == head_dim_storage + sf_bytes and fused_kv_cache.stride(3) == 1 and "
        "fused_kv_cache.stride(0) % sf_bytes == 0",
    )
    _check_heads(num_heads)
    check(q_data.size(1) == 1, ATTN, "q_data.size(1) == 1")
    check(
        q_data.dtype in (FP8, FP4),
        ATTN,
        "q_data.scalar_type() == torch::kFloat8_e4m3fn or q_data.scalar_type() == kPackedFP4",
    )
    check(q_data.is_contiguous(), ATTN, "q_data.is_contiguous()")
    check(
        sf_q is not None and sf_q.dtype == I16,
        ATTN,
        "sf_q.has_value() and sf_q.value().scalar_type() == torch::kShort",
    )
    _check_indices(indices, num_q_tokens)
    check(
        weights.size(0) == num_q_tokens and weights.size(1) == num_heads and weights.stride(1) == 1,
        ATTN,
        "weights.size(0) == num_q_tokens and weights.size(1) == num_heads and weights.stride(1) == 1",
    )
    check(
        context_lens.size(0) == num_q_tokens and context_lens.size(1) == 1,
        ATTN,
        "context_lens.size(0) == num_q_tokens and context_lens.size(1) == 1",
    )
    check(block_table.size(0) == num_q_tokens, ATTN, "block_table.size(0) == num_q_tokens")
    sf_q_view = sf_q
    if sf_q_view.dim() == 4:
        sf_q_view = sf_q_view.reshape(num_q_tokens * num_heads, sf_q_view.size(3))
    check(
        sf_q_view.dim() == 2 and sf_q_view.size(0) == num_q_tokens * num_heads and sf_q_view.size(1) == sf_pairs,
        ATTN,
        "sf_q_view.dim() == 2 and sf_q_view.size(0) == num_q_tokens * num_heads and sf_q_view.size(1) == sf_pairs",
    )
    cores = _num_cores()
    check(
        schedule_meta.size(0) == cores + 1 and schedule_meta.size(1) == 2,
        ATTN,
        "schedule_meta.size(0) == static_cast<int64_t>(num_cores) + 1 and schedule_meta.size(1) == 2",
    )
    stride = _logits_stride(max_context_len)
    logits = torch.empty_strided((num_q_tokens, max_context_len), (stride, 1), dtype=BF16)

    lens = _lens_list(context_lens)
    idx = indices.tolist()
    meta = schedule_meta.tolist()
    # A schedule computed for another head count is still an exact partition of the same (request, split) tasks.
    candidates = [num_heads] + [h for h in range(4, 65, 4) if h != num_heads]
    if not any(meta == [list(p) for p in _mqa.ascend_metadata(lens, idx, h, cores)] for h in candidates):
        expected = [list(p) for p in _mqa.ascend_metadata(lens, idx, num_heads, cores)]
        panic(
            f"schedule_meta is not the metadata of these context_lens/indices for {cores} cores "
            f"(get_paged_mqa_logits_metadata(context_lens, {num_heads}, indices) gives {expected[:4]}...): the "
            f"kernel walks (request, KV split) tasks from schedule_meta and would skip or repeat some"
        )
    num_pages = int(cache.size(0))
    reqs = _mqa.requests(lens, 1, idx)
    width = int(block_table.size(1))
    for start, count, row, ctx in reqs:
        for t in range(start, start + count):
            if lens[t] > ctx:
                panic(
                    f"context_lens[{t}] = {lens[t]} > {ctx}, the length of its request's last token: the kernel "
                    f"(scheduler/paged_mqa_logits.hpp) walks the request's KV only up to the last token's length, so "
                    f"logits {ctx}..{lens[t] - 1} of token {t} would not be written"
                )
            if lens[t] > stride or (t == num_q_tokens - 1 and lens[t] > max_context_len):
                panic(
                    f"context_lens[{t}] = {lens[t]} > max_context_len = {max_context_len} (row stride {stride}): the "
                    f"kernel stores logits up to the context length, past the row into the next one or past the "
                    f"logits allocation"
                )
        npages = ceil_div(ctx, page)
        if npages > width:
            panic(
                f"the request at query token {start} has {ctx} KV tokens = {npages} pages of {page}, but block_table "
                f"has {width} columns: the kernel reads past block_table row {row}"
            )
        ids = block_table[row, :npages].tolist()
        bad = [(p, v) for p, v in enumerate(ids) if not 0 <= v < num_pages]
        if bad:
            p, v = bad[0]
            panic(
                f"block_table[{row}, {p}] = {v} is not a page of the cache (num_pages = {num_pages}): the kernel "
                f"would read KV and scale factors past the cache"
            )

    data, sf = _pages(cache, num_pages, page, ds, sf_pairs, ascend_layout)
    pages = _deq(data.view(FP4) if is_fp4 else data.view(FP8), sf, head_dim)
    q_v = _deq(q_data.reshape(num_q_tokens, num_heads, ds), sf_q_view.reshape(num_q_tokens, num_heads, -1), head_dim)
    w = weights.to(F64)
    out = torch.full((num_q_tokens, max_context_len), NAN, dtype=F64)
    for start, count, row, ctx in reqs:
        if ctx == 0 or max_context_len == 0:
            continue
        k = _mqa.gather_tokens(pages, block_table[row], ctx)
        full = _mqa.relu_logits(q_v[start : start + count], k, w[start : start + count])
        for t in range(start, start + count):
            n = min(lens[t], max_context_len)
            out[t, :n] = full[t - start, :n]
    logits.copy_(out.to(BF16))
    return logits


# ---------------------------------------------------------------------------------------------------------------------
# tf32_hc_prenorm_gemm (TileLang, deep_gemm/tilelang_ops/hc_prenorm.py)
# ---------------------------------------------------------------------------------------------------------------------


def _hf32(b):
    """FP32 -> HF32 (11 mantissa bits), round to nearest even (``T.set_hf32_mode('nearest_even')``)."""
    bits = b.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    rounded = ((bits + 0x7FF + ((bits >> 12) & 1)) & ~0xFFF) & 0xFFFFFFFF
    rounded = torch.where(rounded >= 1 << 31, rounded - (1 << 32), rounded).to(torch.int32).view(F32)
    return torch.where(torch.isfinite(b), rounded, b)


def _tilelang_arg(t, shape, dtype, name):
    """The ``T.Tensor[(...), dtype]`` annotations of ``tf32_hc_prenorm_gemm_kernel`` [ASSUMED: TileLang's JIT adapter
    rejects a mismatching dtype, shape or a non-compact tensor with an error at call time]."""
    ok = t.dtype == dtype and tuple(t.shape) == tuple(shape) and t.is_contiguous()
    if not ok:
        fail(
            f"{HC_PY} tf32_hc_prenorm_gemm_kernel",
            f"{name}: T.Tensor[{tuple(shape)}, {dtype}] (contiguous) got {tuple(t.shape)} {t.dtype} strides "
            f"{tuple(t.stride())}",
        )


@public("tf32_hc_prenorm_gemm")
def tf32_hc_prenorm_gemm(a, b, d, sqr_sum, num_splits=None):
    """``d = float(a) @ hf32(b)^T``, ``sqr_sum = sum_k float(a)^2``; the K split is reduced inside the kernel, so
    ``num_splits`` must be None or 1 (then ``d`` / ``sqr_sum`` carry a leading dimension of 1)."""
    m, k = a.shape
    n = b.shape[0]
    if num_splits is None:
        out_mul, out_sqr_sum = d, sqr_sum
    else:
        if num_splits != 1:
            raise AssertionError(f"{PREFIX}This backend reduces the K split internally, got {num_splits=}")
        out_mul, out_sqr_sum = d[0], sqr_sum[0]
    if m == 0:
        return
    if not (0 < n <= 64 and n % 8 == 0):
        raise AssertionError(
            f"{PREFIX}HC prenorm fwd requires mhc_mult3 to be 8-aligned and no larger than 64, got {n}"
        )
    if not (k > 0 and k % 256 == 0):
        raise AssertionError(
            f"{PREFIX}HC prenorm fwd requires mhc_hidden_size to be a positive multiple of 256, got {k}"
        )
    _tilelang_arg(a, (m, k), BF16, "x")
    _tilelang_arg(b, (n, k), F32, "fn")
    _tilelang_arg(out_mul, (m, n), F32, "out_mul")
    _tilelang_arg(out_sqr_sum, (m,), F32, "sqrsum")
    a64 = a.to(F64)
    out_mul.copy_((a64 @ _hf32(b).to(F64).T).to(F32))
    out_sqr_sum.copy_(a64.square().sum(-1).to(F32))


# ---------------------------------------------------------------------------------------------------------------------
# einsum / fp8_einsum (csrc/apis/einsum.hpp)
# ---------------------------------------------------------------------------------------------------------------------


@public("einsum")
def einsum(expr, a, b, d, c=None, use_cublaslt=False, epilogue=None):
    """BF16 einsum through ``bf16_bmm`` on permuted views: ``'bhr,hdr->bhd'``, ``'bhd,hdr->bhr'``,
    ``'bhd,bhr->hdr'`` (``c``, when given, must be ``d``: in-place accumulation)."""
    api = "einsum"
    if not isinstance(expr, str):
        incompatible(api, f"'expr' must be a str, got {type(expr).__name__}")
    a = _tensor(a, api, "a")
    b = _tensor(b, api, "b")
    d = _tensor(d, api, "d")
    c = _opt_tensor(c, api, "c")
    epilogue = _epilogue_arg(api, epilogue)
    if use_cublaslt:
        fail(EINSUM, "einsum: use_cublaslt will call ascend einsum kernel, but is not implemented in current version")
    p = (1, 0, 2)
    if expr == "bhr,hdr->bhd":
        _bf16_bmm(api, a.permute(p), b, d.permute(p), None if c is None else c.permute(p), epilogue)
    elif expr == "bhd,hdr->bhr":
        _bf16_bmm(api, a.permute(p), b.permute(0, 2, 1), d.permute(p), None if c is None else c.permute(p), epilogue)
    elif expr == "bhd,bhr->hdr":
        _bf16_bmm(api, a.permute(1, 2, 0), b.permute(1, 2, 0), d, c, epilogue)
    else:
        fail(EINSUM, "false: Unsupported einsum expression")


@public("fp8_einsum")
def fp8_einsum(expr, a, b, d, c=None, recipe=(1, 1, 32), epilogue=None):
    """FP8 einsum through ``fp8_bmm`` on permuted operands and scale factors (UE8M0, gran_k 32)."""
    api = "fp8_einsum"
    if not isinstance(expr, str):
        incompatible(api, f"'expr' must be a str, got {type(expr).__name__}")
    A, sfa = _pair(a, api, "a")
    B, sfb = _pair(b, api, "b")
    is_pair = isinstance(d, (tuple, list))
    if is_pair:
        _pair(d, api, "d")
    else:
        d = _tensor(d, api, "d")
    c = _opt_tensor(c, api, "c")
    recipe = _ints(recipe, 3, api, "recipe", optional=False)
    epilogue = _epilogue_arg(api, epilogue)
    p = (1, 0, 2)
    if expr == "bhr,hdr->bhd":
        if is_pair:
            raise NotImplementedError("DeepGEMM stand-in: FP8 output (D, SFD) pairs are not modelled")
        _fp8_bmm(
            api,
            A.permute(p),
            sfa.permute(p),
            B,
            sfb,
            d.permute(p),
            None if c is None else c.permute(p),
            recipe,
            epilogue,
        )
    elif expr == "bhd,hdr->bhr":
        check(not is_pair, EINSUM, "std::holds_alternative<torch::Tensor>(d)")
        q = (0, 2, 1)
        _fp8_bmm(
            api,
            A.permute(p),
            sfa.permute(p),
            B.permute(q),
            sfb.permute(q),
            d.permute(p),
            None if c is None else c.permute(p),
            recipe,
            epilogue,
        )
    elif expr == "bhd,bhr->hdr":
        check(not is_pair, EINSUM, "std::holds_alternative<torch::Tensor>(d)")
        r = (1, 2, 0)
        _fp8_bmm(api, A.permute(r), sfa.permute(r), B.permute(r), sfb.permute(r), d, c, recipe, epilogue)
    else:
        fail(EINSUM, "false: Unsupported einsum expression")


EXPORTS = {
    "fp8_fp4_mqa_logits": fp8_fp4_mqa_logits,
    "get_paged_mqa_logits_metadata": get_paged_mqa_logits_metadata,
    "fp8_fp4_paged_mqa_logits": fp8_fp4_paged_mqa_logits,
    "tf32_hc_prenorm_gemm": tf32_hc_prenorm_gemm,
    "einsum": einsum,
    "fp8_einsum": fp8_einsum,
}
