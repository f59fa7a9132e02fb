"""The "cuda" flavor's attention, hyper-connection and einsum APIs (DeepGEMM 2.6.1, deepseek-ai/DeepGEMM @ 54e2261).

Sources: ``csrc/apis/{attention,hyperconnection,einsum}.hpp`` and the JIT entry functions they call
(``csrc/jit_kernels/impls/{sm90_fp8_mqa_logits,sm100_mqa_logits,smxx_clean_logits,sm90_tf32_hc_prenorm_gemm,
sm100_tf32_hc_prenorm_gemm,sm90_bmk_bnk_mn,sm100_bmk_bnk_mn,sm90_bf16_gemm,sm90_fp8_gemm_1d2d,
sm100_fp8_fp4_gemm_1d1d}.hpp``), the kernels ``deep_gemm/include/deep_gemm/impls/{sm90_fp8_mqa_logits,
sm90_fp8_paged_mqa_logits,sm100_mqa_logits,smxx_clean_logits,sm90_tf32_hc_prenorm_gemm,sm100_tf32_hc_prenorm_gemm}.cuh``
and the schedulers ``deep_gemm/include/deep_gemm/scheduler/{sm100_mqa_logits,sm90_paged_mqa_logits,
sm100_paged_mqa_logits}.cuh``. Host checks quote ``file:line`` of that snapshot, in upstream's order.

Conventions of the stand-in (what the real kernels leave unspecified):

* MQA logits are computed in float64 and cast to ``logits_dtype``. The logits buffer is allocated as upstream does
  (``[align(S, 128 / H), stride]`` with the 1024-byte aligned row stride; the returned tensor is the
  ``[S, S_kv]`` / ``[S, max_seqlen_k]`` / ``[B * next_n, max_context_len]`` view of it). Every entry the kernels do
  not define is **NaN** here: positions outside ``[ks, ke)`` when ``clean_logits=False`` (the real kernel leaves
  logits of neighbouring rows' KV ranges or ``torch.empty`` garbage there), compressed positions
  ``t >= ke - ks``, paged positions ``j >= context_lens``. ``clean_logits=True`` writes exactly ``-inf`` outside
  ``[ks, ke)`` as ``smxx_clean_logits`` does.
* FP8 logits apply the per-token KV scale after the head reduction, as both kernels do:
  ``(sum_h w * relu(q . k)) * kv_sf[j]`` (equal to using dequantised K only for non-negative scales).
* The BF16-weight path of SM100 reduces in BF16 on hardware; the stand-in's value is the float64 one.
* ``Panic`` where a kernel would read or write past its tensors or silently compute garbage: ``ks``/``ke`` outside
  ``0 <= ks <= ke <= S_kv``, compressed rows longer than the row stride, negative context lengths, a token's
  context length above its request's last token's (the kernels schedule KV up to the last token), block-table
  entries outside ``[0, num_blocks)`` or past the table's row, a ``schedule_meta`` that is not the metadata of these
  ``context_lens`` (the kernel would skip or repeat work), SM90 weights with a row stride other than ``H`` (its TMA
  descriptor assumes ``H``), SM100 HC-prenorm splits without a K block (the TMEM accumulator is never written).
"""

from __future__ import annotations

import operator

import torch

from . import _mqa, _ref
from ._cuda import (
    BF16,
    F32,
    FP4,
    FP8,
    I32,
    K_MAJOR,
    PREFIX,
    RUNTIME_UTILS,
    _check_cd,
    _check_validity,
    _early_return,
    _major_ab,
    _major_check,
    _num_sms,
    _opt_tensor,
    _pair,
    _shape,
    _sm90_1d2d_n_trap,
    _store,
    _tensor,
    _tma,
    _transform_pair,
    at,
)
from ._ref import F64, align, ceil_div
from ._standin import STATE, check, fail, incompatible, panic, public

ATTN = "csrc/apis/attention.hpp"
SM100_MQA = "csrc/jit_kernels/impls/sm100_mqa_logits.hpp"
SM90_MQA = "csrc/jit_kernels/impls/sm90_fp8_mqa_logits.hpp"
HC = "csrc/apis/hyperconnection.hpp"
SM90_HC = "csrc/jit_kernels/impls/sm90_tf32_hc_prenorm_gemm.hpp"
SM100_HC = "csrc/jit_kernels/impls/sm100_tf32_hc_prenorm_gemm.hpp"
EINSUM = "csrc/apis/einsum.hpp"
SM90_BMK = "csrc/jit_kernels/impls/sm90_bmk_bnk_mn.hpp"
SM100_BMK = "csrc/jit_kernels/impls/sm100_bmk_bnk_mn.hpp"
SM90_1D2D = "csrc/jit_kernels/impls/sm90_fp8_gemm_1d2d.hpp"
# csrc/jit_kernels/heuristics/sm{90,100}.hpp: SM{90,100}ArchSpec::smem_capacity
SMEM_CAPACITY = 232448
MQA_HEADS = "num_heads == 8 or num_heads == 16 or num_heads == 32 or num_heads == 64"
MQA_HEADS_ARCH = (
    "(arch_major == 10 and (num_heads == 8 or num_heads == 16 or num_heads == 32 or num_heads == 64)) or "
    "(arch_major == 9 and (num_heads == 32 or num_heads == 64))"
)
NAN = float("nan")


# ---------------------------------------------------------------------------------------------------------------------
# Argument conversion (pybind11)
# ---------------------------------------------------------------------------------------------------------------------


def _int(x, api, arg):
    try:
        return operator.index(x)
    except TypeError:
        incompatible(api, f"'{arg}' must be an int, got {type(x).__name__}")


def _dtype(x, api, arg):
    if not isinstance(x, torch.dtype):
        incompatible(api, f"'{arg}' must be a torch.dtype, got {x!r}")
    return x


def _q(q, api):
    """``std::tuple<Tensor, std::optional<Tensor>>``."""
    if not (isinstance(q, (tuple, list)) and len(q) == 2 and isinstance(q[0], torch.Tensor)):
        incompatible(api, "'q' must be a (Tensor, Tensor | None) pair")
    if q[1] is not None and not isinstance(q[1], torch.Tensor):
        incompatible(api, "'q' must be a (Tensor, Tensor | None) pair")
    return q[0], q[1]


def _size0(t):
    if t.dim() == 0:
        raise IndexError(f"{PREFIX}dimension specified as 0 but tensor has no dimensions")
    return int(t.size(0))


def _tma_raw(address, strides_bytes, what, desc="make_tma_3d_desc"):
    """``cuTensorMapEncodeTiled``: 16-byte aligned address, every outer stride a multiple of 16 bytes (surfaced by
    upstream's ``DG_CUDA_DRIVER_CHECK`` as a "CUDA driver error")."""
    if address % 16 != 0 or any(int(b) % 16 for b in strides_bytes):
        raise RuntimeError(
            f"{PREFIX}CUDA driver error ({RUNTIME_UTILS} {desc} -> cuTensorMapEncodeTiled): "
            f"CUDA_ERROR_INVALID_VALUE for the TMA descriptor of {what}: requires globalAddress % 16 == 0 and "
            f"globalStrides[i] % 16 == 0 (address % 16 = {address % 16}, outer strides = {list(strides_bytes)} bytes)"
        )


def _tma_nd(t, strides, what):
    """A 3D TMA descriptor of ``t`` with the given outer strides (in elements)."""
    _tma_raw(t.data_ptr(), [int(s) * t.element_size() for s in strides], what)


def _logits_type(dtype):
    """``to_string(logits_dtype)`` in the JIT code generation (runtime_utils.hpp:54-63)."""
    if dtype in (F32, BF16):
        return
    if dtype in (I32, FP8, FP4):
        panic(
            f"logits_dtype = {dtype} is not a logits type: upstream does not check it and instantiates the MQA "
            f"kernel with it (runtime_utils.hpp:54-63 knows the name), which either fails to compile or converts "
            f"the logits to {dtype}"
        )
    fail(at(RUNTIME_UTILS, 61), "Unsupported dtype")


def _empty_2d(rows, cols, dtype, where):
    if rows < 0 or cols < 0:
        raise RuntimeError(
            f"{PREFIX}Trying to create tensor with negative dimension {min(rows, cols)}: [{rows}, {cols}] "
            f"(torch::empty in {where})"
        )
    if dtype.is_floating_point:
        return torch.full((rows, cols), NAN, dtype=dtype)
    return torch.zeros((rows, cols), dtype=dtype)


def _fp4_deq(data, words, d):
    """Packed FP4 ``[..., d / 2]`` with one int32 word of four UE8M0 scales (32 elements each) per row."""
    return _ref.fp4_values(data, -1) * _mqa.group_scales(_ref.unpack_bytes(words.unsqueeze(-1), 4), d)


# ---------------------------------------------------------------------------------------------------------------------
# fp8_fp4_mqa_logits / fp8_mqa_logits (csrc/apis/attention.hpp:76-196, 405-416)
# ---------------------------------------------------------------------------------------------------------------------


def _mqa_logits(q, kv, weights, ks, ke, clean_logits, max_seqlen_k, logits_dtype):
    q_fp, q_sf = q
    kv_fp, kv_sf = kv
    is_fp4 = q_sf is not None
    arch = STATE.arch
    if is_fp4:
        seq_len, num_heads, head_dim = _shape(q_fp, 3)
        head_dim *= 2
        check(arch == 10, at(ATTN, 94), "arch_major == 10")
        check(num_heads in (8, 16, 32, 64), at(ATTN, 95), MQA_HEADS)
        check(head_dim in (64, 128), at(ATTN, 96), "head_dim == 64 or head_dim == 128")
        check(q_fp.is_contiguous(), at(ATTN, 97), "q_fp.is_contiguous()")
        check(q_fp.dtype == FP4, at(ATTN, 98), "q_fp.scalar_type() == kPackedFP4")
        seq_len_, num_heads_ = _shape(q_sf, 2)
        check(
            seq_len == seq_len_ and num_heads == num_heads_,
            at(ATTN, 102),
            "seq_len == _seq_len and num_heads == _num_heads",
        )
        check(q_sf.is_contiguous(), at(ATTN, 103), "q_sf.value().is_contiguous()")
        check(q_sf.dtype == I32, at(ATTN, 104), "q_sf.value().scalar_type() == torch::kInt32")
        seq_len_kv, head_dim_ = _shape(kv_fp, 2)
        check(head_dim == head_dim_ * 2, at(ATTN, 110), "head_dim == _head_dim")
        check(kv_fp.is_contiguous(), at(ATTN, 111), "kv_fp.is_contiguous()")
        check(kv_fp.dtype == FP4, at(ATTN, 112), "kv_fp.scalar_type() == kPackedFP4")
        (seq_len_kv_,) = _shape(kv_sf, 1)
        check(seq_len_kv == seq_len_kv_, at(ATTN, 116), "seq_len_kv == _seq_len_kv")
        check(kv_sf.is_contiguous(), at(ATTN, 117), "kv_sf.is_contiguous()")
        check(kv_sf.dtype == I32, at(ATTN, 118), "kv_sf.scalar_type() == torch::kInt32")
    else:
        seq_len, num_heads, head_dim = _shape(q_fp, 3)
        check(
            (arch == 10 and num_heads in (8, 16, 32, 64)) or (arch == 9 and num_heads in (32, 64)),
            at(ATTN, 122),
            MQA_HEADS_ARCH,
        )
        check(head_dim in (32, 64, 128), at(ATTN, 124), "head_dim == 32 or head_dim == 64 or head_dim == 128")
        check(q_fp.is_contiguous(), at(ATTN, 125), "q_fp.is_contiguous()")
        check(q_fp.dtype == FP8, at(ATTN, 126), "q_fp.scalar_type() == torch::kFloat8_e4m3fn")
        seq_len_kv, head_dim_ = _shape(kv_fp, 2)
        check(head_dim == head_dim_, at(ATTN, 131), "head_dim == _head_dim")
        check(kv_fp.is_contiguous(), at(ATTN, 132), "kv_fp.is_contiguous()")
        check(kv_fp.dtype == FP8, at(ATTN, 133), "kv_fp.scalar_type() == torch::kFloat8_e4m3fn")
        (seq_len_kv_,) = _shape(kv_sf, 1)
        check(seq_len_kv == seq_len_kv_, at(ATTN, 136), "seq_len_kv == _seq_len_kv")
        check(kv_sf.is_contiguous(), at(ATTN, 137), "kv_sf.is_contiguous()")
        check(kv_sf.dtype == F32, at(ATTN, 139), "kv_sf.scalar_type() == torch::kFloat")

    seq_len_, num_heads_ = _shape(weights, 2)
    check(
        seq_len == seq_len_ and num_heads == num_heads_,
        at(ATTN, 144),
        "seq_len == _seq_len and num_heads == _num_heads",
    )
    check(weights.stride(1) == 1, at(ATTN, 145), "weights.stride(1) == 1")
    check(
        weights.dtype == F32 or (arch == 10 and weights.dtype == BF16),
        at(ATTN, 146),
        "weights.scalar_type() == torch::kFloat or (arch_major == 10 and weights.scalar_type() == torch::kBFloat16)",
    )
    check(
        weights.dtype != BF16 or logits_dtype == BF16,
        at(ATTN, 147),
        "weights.scalar_type() != torch::kBFloat16 or logits_dtype == torch::kBFloat16",
    )
    for t, name, line in ((ks, "cu_seq_len_k_start", 150), (ke, "cu_seq_len_k_end", 155)):
        check(_size0(t) == seq_len, at(ATTN, line), f"{name}.size(0) == seq_len")
        check(t.is_contiguous(), at(ATTN, line + 1), f"{name}.is_contiguous()")
        check(t.dtype == I32, at(ATTN, line + 2), f"{name}.scalar_type() == torch::kInt")

    block_qh, block_kv = 128, 256
    block_q = block_qh // num_heads
    check(block_qh % num_heads == 0, at(ATTN, 163), "block_qh % num_heads == 0")
    elem = torch.empty((), dtype=logits_dtype).element_size()
    alignment = 1024 // elem
    aligned_seq_len = align(seq_len, block_q)
    if max_seqlen_k == 0:
        stride = align(seq_len_kv + block_kv, alignment)
        buf = _empty_2d(aligned_seq_len, stride, logits_dtype, at(ATTN, 171))
        cols = seq_len_kv
    else:
        stride = _mqa.c_align(_mqa.c_align(max_seqlen_k, block_kv), alignment)
        buf = _empty_2d(aligned_seq_len, stride, logits_dtype, at(ATTN, 175))
        cols = max(0, min(max_seqlen_k, stride))
        check(not clean_logits, at(ATTN, 177), "not clean_logits")
    if max_seqlen_k < 0:
        panic(
            f"max_seqlen_k = {max_seqlen_k} < 0: upstream allocates {stride} logits columns and launches the "
            f"non-compressed kernel (max_seqlen_k > 0 is false), which writes every row's KV range past them"
        )
    logits = buf[:seq_len, :cols]

    if arch == 10:
        if is_fp4:
            _tma(q_fp, q_fp.stride(1), "Q")
            _tma(q_sf, q_sf.stride(0), "SF Q")
        else:
            _tma(q_fp, head_dim, "Q")
        _tma(kv_fp, kv_fp.stride(0), "KV")
        _tma(kv_sf, 0, "SF KV")
        _tma(weights, weights.stride(0), "weights")
        check(128 % num_heads == 0, at(SM100_MQA, 120), "128 % args.num_heads == 0")
        _logits_type(logits_dtype)
    elif arch == 9 and not is_fp4:
        check(weights.dtype == F32, at(ATTN, 185), "weights.scalar_type() == torch::kFloat")
        check(head_dim in (32, 64, 128), at(SM90_MQA, 101), "head_dim == 32 or head_dim == 64 or head_dim == 128")
        _tma(q_fp, head_dim, "Q")
        _tma(kv_fp, head_dim, "KV")
        _tma(kv_sf, 0, "KV scales")
        _tma(weights, num_heads, "weights")
        check(128 % num_heads == 0, at(SM90_MQA, 43), "128 % args.num_heads == 0")
        _logits_type(logits_dtype)
        if seq_len > 1 and weights.stride(0) != num_heads:
            panic(
                f"weights has row stride {weights.stride(0)} != num_heads = {num_heads}: the SM90 kernel builds its "
                f"TMA descriptor with outer stride num_heads ({SM90_MQA}:109-110) and would read the wrong rows"
            )
    else:
        fail(at(ATTN, 189), "Unsupported architecture")

    starts = ks.reshape(-1)[:seq_len].tolist()
    ends = ke.reshape(-1)[:seq_len].tolist()
    compressed = max_seqlen_k > 0
    for i, (s, e) in enumerate(zip(starts, ends)):
        if not 0 <= s <= e <= seq_len_kv:
            panic(
                f"cu_seq_len_k_start/end[{i}] = [{s}, {e}) is not a range inside [0, seq_len_kv = {seq_len_kv}]: "
                f"the kernel reads them as unsigned and clamps only the end to seq_len_kv, so it would schedule KV "
                f"blocks past the tensors or leave part of the row unwritten"
            )
        if compressed and e - s > stride:
            panic(
                f"row {i} has ke - ks = {e - s} logits but the compressed rows are {stride} wide "
                f"(align(max_seqlen_k = {max_seqlen_k}, ...)): the kernel would write them into the next row"
            )

    if is_fp4:
        q_v = _fp4_deq(q_fp, q_sf, head_dim)
        k_v = _fp4_deq(kv_fp, kv_sf, head_dim)
    else:
        q_v, k_v = q_fp.to(F64), kv_fp.to(F64)
    full = _mqa.relu_logits(q_v, k_v, weights.to(F64))
    if not is_fp4:
        full = full * kv_sf.to(F64)
    out = torch.full((seq_len, cols), float("-inf") if clean_logits else NAN, dtype=F64)
    for i, (s, e) in enumerate(zip(starts, ends)):
        if compressed:
            n = min(e - s, cols)
            out[i, :n] = full[i, s : s + n]
        else:
            out[i, s:e] = full[i, s:e]
    logits.copy_(out.to(logits_dtype))
    return logits


@public("fp8_fp4_mqa_logits")
def fp8_fp4_mqa_logits(
    q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True, max_seqlen_k=0, logits_dtype=torch.float32
):
    """Ragged MQA ("lightning indexer") logits: ``[S, S_kv]`` (``max_seqlen_k == 0``) or compressed
    ``[S, max_seqlen_k]`` with ``out[i, t] = logit(i, ks[i] + t)``; FP8 (``q = (q, None)``, per-token FP32 KV scales)
    or SM100 packed FP4 (``q = (q, sf_q)``, int32 packed UE8M0 scales per 32 of the head dim)."""
    api = "fp8_fp4_mqa_logits"
    return _mqa_logits(
        _q(q, api),
        _pair(kv, api, "kv"),
        _tensor(weights, api, "weights"),
        _tensor(cu_seq_len_k_start, api, "cu_seq_len_k_start"),
        _tensor(cu_seq_len_k_end, api, "cu_seq_len_k_end"),
        bool(clean_logits),
        _int(max_seqlen_k, api, "max_seqlen_k"),
        _dtype(logits_dtype, api, "logits_dtype"),
    )


@public("fp8_mqa_logits")
def fp8_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True, max_seqlen_k=0):
    """Legacy FP8-only form (attention.hpp:406-416): ``q`` is the FP8 tensor, FP32 logits."""
    api = "fp8_mqa_logits"
    return _mqa_logits(
        (_tensor(q, api, "q"), None),
        _pair(kv, api, "kv"),
        _tensor(weights, api, "weights"),
        _tensor(cu_seq_len_k_start, api, "cu_seq_len_k_start"),
        _tensor(cu_seq_len_k_end, api, "cu_seq_len_k_end"),
        bool(clean_logits),
        _int(max_seqlen_k, api, "max_seqlen_k"),
        F32,
    )


# ---------------------------------------------------------------------------------------------------------------------
# get_paged_mqa_logits_metadata (attention.hpp:198-231)
# ---------------------------------------------------------------------------------------------------------------------


def _lens_list(context_lens, what="context_lens"):
    lens = context_lens.reshape(-1).tolist()
    for i, v in enumerate(lens):
        if v < 0:
            panic(
                f"{what} holds {v} at flat index {i}: the kernels read context lengths as unsigned, so the request "
                f"would span ~2^32 KV tokens (reads far past the block table and the cache)"
            )
    return lens


def _expected_metadata(lens, batch, next_n, indices, num_sms):
    if STATE.arch == 10:
        return _mqa.sm100_metadata(lens, next_n, indices, num_sms)
    return _mqa.sm90_metadata(lens, batch, next_n, num_sms)


@public("get_paged_mqa_logits_metadata")
def get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms, indices=None):
    """int32 ``[num_sms + 1, 2]`` per-SM starts of the paged kernel's work, exactly as upstream's metadata kernels
    write them (``(q_token_or_atom_idx, kv_split_idx)``, then the end sentinel)."""
    api = "get_paged_mqa_logits_metadata"
    context_lens = _tensor(context_lens, api, "context_lens")
    block_kv = _int(block_kv, api, "block_kv")
    num_sms = _int(num_sms, api, "num_sms")
    indices = _opt_tensor(indices, api, "indices")
    check(context_lens.dim() == 2, at(ATTN, 200), "context_lens.dim() == 2")
    batch, next_n = (int(s) for s in context_lens.shape)
    check(context_lens.dtype == I32, at(ATTN, 205), "context_lens.scalar_type() == torch::kInt")
    check(context_lens.is_contiguous(), at(ATTN, 206), "context_lens.is_contiguous()")
    if num_sms + 1 < 0:
        raise RuntimeError(
            f"{PREFIX}Trying to create tensor with negative dimension {num_sms + 1}: [{num_sms + 1}, 2] "
            f"(torch::empty in {at(ATTN, 209)})"
        )
    arch = STATE.arch
    if indices is not None:
        check(
            arch == 10 and next_n == 1 and block_kv in (64, 32),
            at(ATTN, 215),
            "arch_major == 10 and next_n == 1 and (block_kv == 64 or block_kv == 32)",
        )
        check(
            indices.dim() == 1 and indices.size(0) == batch,
            at(ATTN, 216),
            "indices_tensor.dim() == 1 and indices_tensor.size(0) == batch_size",
        )
        check(indices.is_contiguous(), at(ATTN, 217), "indices_tensor.is_contiguous()")
        check(indices.dtype == I32, at(ATTN, 218), "indices_tensor.scalar_type() == torch::kInt")
        check(2 * batch * 4 <= SMEM_CAPACITY, at(SM100_MQA, 65), "smem_size <= SM100ArchSpec::smem_capacity")
    elif arch == 10:
        check(block_kv in (64, 32), at(ATTN, 221), "block_kv == 64 or block_kv == 32")
        check(2 * batch * 4 <= SMEM_CAPACITY, at(SM100_MQA, 65), "smem_size <= SM100ArchSpec::smem_capacity")
    else:
        check(block_kv == 64, at(ATTN, 224), "block_kv == 64")
        check(256 % block_kv == 0, at(SM90_MQA, 208), "split_kv % block_kv == 0")
        check(align(batch, 32) * 4 <= SMEM_CAPACITY, at(SM90_MQA, 212), "smem_size <= SM90ArchSpec::smem_capacity")
    lens = _lens_list(context_lens)
    if next_n < 1 and batch > 0:
        panic(f"context_lens has next_n = {next_n} columns: the metadata kernel indexes request * next_n - 1")
    if num_sms <= 0:
        panic(f"num_sms = {num_sms}: the metadata kernel divides the work by num_sms (device division by zero)")
    meta = _expected_metadata(lens, batch, next_n, None if indices is None else indices.tolist(), num_sms)
    return torch.tensor(meta, dtype=I32).reshape(num_sms + 1, 2)


# ---------------------------------------------------------------------------------------------------------------------
# fp8_fp4_paged_mqa_logits / fp8_paged_mqa_logits (attention.hpp:233-402, 418-430)
# ---------------------------------------------------------------------------------------------------------------------


def _fused_pages(cache, num_blocks, block_kv, data_bytes, sf_bytes):
    """The "[KV data | SF]" pages: per block, ``block_kv * data_bytes`` bytes of token-major data, then
    ``block_kv`` scale words (attention.hpp:283-294 / 317-328 from_blob views), blocks ``cache.stride(0)`` apart."""
    stride0 = int(cache.stride(0))
    span = block_kv * (data_bytes + sf_bytes)
    raw = torch.as_strided(cache, (num_blocks, span), (stride0, 1)).contiguous()
    data = raw[:, : block_kv * data_bytes].reshape(num_blocks, block_kv, data_bytes)
    sf = raw[:, block_kv * data_bytes :].contiguous()
    return data, sf


def _check_pages(block_table, reqs, block_kv, num_blocks, lens, api_file):
    width = int(block_table.size(1))
    for start, count, row, ctx in reqs:
        for t in range(start, start + count):
            if lens[t] > ctx:
                panic(
                    f"context_lens of query token {t} is {lens[t]} > {ctx}, the length of its request's last token: "
                    f"the kernel schedules the request's KV up to the last token's length ({api_file}), so logits "
                    f"{ctx}..{lens[t] - 1} of that token would be garbage"
                )
        npages = ceil_div(ctx, block_kv)
        if npages > width:
            panic(
                f"the request at query token {start} has {ctx} KV tokens = {npages} blocks of {block_kv}, but "
                f"block_table has {width} columns: the kernel reads past block_table row {row}"
            )
        ids = block_table[row, :npages].tolist()
        bad = [(p, v) for p, v in enumerate(ids) if not 0 <= v < num_blocks]
        if bad:
            p, v = bad[0]
            panic(
                f"block_table[{row}, {p}] = {v} is not a block of the cache (num_blocks = {num_blocks}): the kernel "
                f"would read KV past the cache"
            )


def _paged_values(q_v, w, pages, post, block_table, reqs, lens, cols):
    out = torch.full((len(lens), cols), NAN, dtype=F64)
    for start, count, row, ctx in reqs:
        if ctx == 0 or cols == 0:
            continue
        k = _mqa.gather_tokens(pages, block_table[row], ctx)
        full = _mqa.relu_logits(q_v[start : start + count], k, w[start : start + count])
        if post is not None:
            full = full * _mqa.gather_tokens(post, block_table[row], ctx)
        for t in range(start, start + count):
            n = min(lens[t], cols)
            out[t, :n] = full[t - start, :n]
    return out


def _paged_mqa_logits(
    q,
    fused_kv_cache,
    weights,
    context_lens,
    block_table,
    schedule_meta,
    max_context_len,
    clean_logits,
    logits_dtype,
    indices,
):
    q_fp, q_sf = q
    is_fp4 = q_sf is not None
    if block_table.dim() == 0:
        raise IndexError(f"{PREFIX}dimension specified as 0 but tensor has no dimensions")
    num_sms = _num_sms()
    arch = STATE.arch
    cache = fused_kv_cache
    if is_fp4:
        batch, next_n, num_heads, head_dim = _shape(q_fp, 4)
        head_dim *= 2
        check(next_n >= 1, at(ATTN, 258), "next_n >= 1")
        check(arch == 10, at(ATTN, 259), "arch_major == 10")
        check(num_heads in (8, 16, 32, 64), at(ATTN, 260), MQA_HEADS)
        check(head_dim in (64, 128), at(ATTN, 261), "head_dim == 64 or head_dim == 128")
        check(q_fp.is_contiguous(), at(ATTN, 262), "q_fp.is_contiguous()")
        check(q_fp.dtype == FP4, at(ATTN, 263), "q_fp.scalar_type() == kPackedFP4")
        batch_, next_n_, num_heads_ = _shape(q_sf, 3)
        check(
            batch == batch_ and next_n == next_n_ and num_heads == num_heads_,
            at(ATTN, 267),
            "batch_size == _batch_size and next_n == _next_n and num_heads == _num_heads",
        )
        check(q_sf.is_contiguous(), at(ATTN, 268), "q_sf.value().is_contiguous()")
        check(q_sf.dtype == I32, at(ATTN, 269), "q_sf.value().scalar_type() == torch::kInt32")
        num_blocks, block_kv, num_heads_kv, row_bytes = _shape(cache, 4)
        check(
            (arch == 10 and block_kv in (32, 64)) or (arch == 9 and block_kv == 64),
            at(ATTN, 274),
            "(arch_major == 10 and (block_kv == 32 or block_kv == 64)) or (arch_major == 9 and block_kv == 64)",
        )
        check(
            num_heads_kv == 1 and row_bytes == head_dim // 2 + 4,
            at(ATTN, 276),
            "num_heads_kv == 1 and fp4_with_sf_bytes == head_dim / 2 + static_cast<int>(sizeof(int))",
        )
        check(
            cache.stride(1) == row_bytes and cache.stride(3) == 1,
            at(ATTN, 277),
            "fused_kv_cache.stride(1) == fp4_with_sf_bytes and fused_kv_cache.stride(3) == 1",
        )
        check(cache.dtype == torch.uint8, at(ATTN, 278), "fused_kv_cache.scalar_type() == torch::kByte")
        check(cache.stride(0) % 4 == 0, at(ATTN, 282), "kv_cache_stride_bytes % sizeof(int) == 0")
        data_bytes = head_dim // 2
    else:
        batch, next_n, num_heads, head_dim = _shape(q_fp, 4)
        check(next_n >= 1, at(ATTN, 298), "next_n >= 1")
        check(
            (arch == 10 and num_heads in (8, 16, 32, 64)) or (arch == 9 and num_heads in (32, 64)),
            at(ATTN, 299),
            MQA_HEADS_ARCH,
        )
        check(head_dim in (32, 64, 128), at(ATTN, 301), "head_dim == 32 or head_dim == 64 or head_dim == 128")
        check(q_fp.is_contiguous(), at(ATTN, 302), "q_fp.is_contiguous()")
        check(q_fp.dtype == FP8, at(ATTN, 303), "q_fp.scalar_type() == torch::kFloat8_e4m3fn")
        num_blocks, block_kv, num_heads_kv, row_bytes = _shape(cache, 4)
        check(
            (arch == 10 and block_kv in (32, 64)) or (arch == 9 and block_kv == 64),
            at(ATTN, 308),
            "(arch_major == 10 and (block_kv == 32 or block_kv == 64)) or (arch_major == 9 and block_kv == 64)",
        )
        check(
            num_heads_kv == 1 and row_bytes == head_dim + 4,
            at(ATTN, 310),
            "num_heads_kv == 1 and head_dim_with_sf == head_dim + static_cast<int>(sizeof(float))",
        )
        check(
            cache.stride(1) == row_bytes and cache.stride(3) == 1,
            at(ATTN, 311),
            "fused_kv_cache.stride(1) == head_dim_with_sf and fused_kv_cache.stride(3) == 1",
        )
        check(cache.dtype == torch.uint8, at(ATTN, 312), "fused_kv_cache.scalar_type() == torch::kByte")
        check(cache.stride(0) % 4 == 0, at(ATTN, 316), "kv_cache_stride_bytes % sizeof(float) == 0")
        check(weights.is_contiguous(), at(ATTN, 331), "weights.is_contiguous()")
        data_bytes = head_dim

    rows_, num_heads_ = _shape(weights, 2)
    check(
        rows_ == batch * next_n and num_heads_ == num_heads,
        at(ATTN, 336),
        "_batch_size_next_n == batch_size * next_n and _num_heads == num_heads",
    )
    check(weights.stride(1) == 1, at(ATTN, 337), "weights.stride(1) == 1")
    check(
        weights.dtype == F32 or (arch == 10 and weights.dtype == BF16),
        at(ATTN, 338),
        "weights.scalar_type() == torch::kFloat or (arch_major == 10 and weights.scalar_type() == torch::kBFloat16)",
    )
    check(
        weights.dtype != BF16 or logits_dtype == BF16,
        at(ATTN, 339),
        "weights.scalar_type() != torch::kBFloat16 or logits_dtype == torch::kBFloat16",
    )
    batch_, _ = _shape(block_table, 2)
    check(batch_ == batch, at(ATTN, 343), "_batch_size == batch_size")
    check(block_table.stride(1) == 1, at(ATTN, 344), "block_table.stride(1) == 1")
    check(block_table.dtype == I32, at(ATTN, 345), "block_table.scalar_type() == torch::kInt")
    if indices is not None:
        check(arch == 10 and next_n == 1, at(ATTN, 351), "arch_major == 10 and next_n == 1")
        check(
            indices.dim() == 1 and indices.size(0) == batch,
            at(ATTN, 352),
            "indices_tensor.dim() == 1 and indices_tensor.size(0) == batch_size",
        )
        check(indices.is_contiguous(), at(ATTN, 353), "indices_tensor.is_contiguous()")
        check(indices.dtype == I32, at(ATTN, 354), "indices_tensor.scalar_type() == torch::kInt")
    meta_rows, meta_cols = _shape(schedule_meta, 2)
    check(
        meta_rows == num_sms + 1 and meta_cols == 2,
        at(ATTN, 359),
        "_schedule_meta_size == num_sms + 1 and _meta_info_size == 2",
    )
    check(schedule_meta.is_contiguous(), at(ATTN, 360), "schedule_meta.is_contiguous()")
    check(schedule_meta.dtype == I32, at(ATTN, 361), "schedule_meta.scalar_type() == torch::kInt")
    check(context_lens.dim() == 2, at(ATTN, 365), "context_lens.dim() == 2")
    batch_, next_n_ = _shape(context_lens, 2)
    check(batch == batch_ and next_n == next_n_, at(ATTN, 368), "batch_size == __batch_size and next_n == _next_n")
    check(context_lens.is_contiguous(), at(ATTN, 369), "context_lens.is_contiguous()")
    check(context_lens.dtype == I32, at(ATTN, 370), "context_lens.scalar_type() == torch::kInt")
    check(
        logits_dtype in (F32, BF16),
        at(ATTN, 373),
        "logits_dtype == torch::kFloat32 or logits_dtype == torch::kBFloat16",
    )
    split_kv = 256
    alignment = 1024 // torch.empty((), dtype=logits_dtype).element_size()
    stride = _mqa.c_align(_mqa.c_align(max_context_len, split_kv), alignment)
    buf = _empty_2d(batch * next_n, stride, logits_dtype, at(ATTN, 378))
    cols = max(0, min(max_context_len, stride))
    logits = buf[:, :cols]
    stride_bytes = int(cache.stride(0))
    if arch == 10:
        check(
            split_kv == 256 and stride % split_kv == 0,
            at(SM100_MQA, 395),
            "split_kv == 256 and logits_stride % split_kv == 0",
        )
        check(128 % num_heads == 0, at(SM100_MQA, 401), "128 % num_heads == 0")
        _tma(q_fp, q_fp.stride(2), "Q")
        if is_fp4:
            _tma(q_sf, q_sf.stride(1), "SF Q")
        _tma_raw(cache.data_ptr(), (data_bytes, stride_bytes), "KV cache")
        _tma_raw(cache.data_ptr() + block_kv * data_bytes, (stride_bytes,), "KV cache SF", "make_tma_2d_desc")
        _tma(weights, weights.stride(0), "weights")
    elif arch == 9 and not is_fp4:
        check(weights.dtype == F32, at(ATTN, 388), "weights.scalar_type() == torch::kFloat")
        check(arch == 9, at(SM90_MQA, 332), "device_runtime->get_arch_major() == 9")
        check(
            split_kv % 64 == 0 and stride % split_kv == 0,
            at(SM90_MQA, 333),
            "split_kv % mma_m == 0 and logits_stride % split_kv == 0",
        )
        _tma(q_fp, q_fp.stride(2), "Q")
        _tma_raw(cache.data_ptr(), (data_bytes, stride_bytes), "KV cache")
        _tma_raw(cache.data_ptr() + block_kv * data_bytes, (stride_bytes,), "KV cache scales", "make_tma_2d_desc")
        _tma(weights, weights.stride(0), "weights")
        check(next_n in (1, 2), at(SM90_MQA, 363), "next_n == 1 or next_n == 2")
        check(128 % num_heads == 0, at(SM90_MQA, 268), "128 % args.num_heads == 0")
    else:
        fail(at(ATTN, 393), "Unsupported architecture")

    if max_context_len < 0:
        panic(
            f"max_context_len = {max_context_len} < 0: upstream allocates {stride} logits columns and the kernel "
            f"writes every request's KV range past them"
        )
    lens = _lens_list(context_lens)
    idx = None if indices is None else indices.tolist()
    expected = _expected_metadata(lens, batch, next_n, idx, num_sms)
    if schedule_meta.tolist() != [list(p) for p in expected]:
        panic(
            f"schedule_meta is not the metadata of these context_lens{'/indices' if idx is not None else ''} for "
            f"num_sms = {num_sms} (get_paged_mqa_logits_metadata(context_lens, block_kv, get_num_sms()) gives "
            f"{[list(p) for p in expected][:4]}...): the kernel walks its work from schedule_meta and would skip "
            f"or repeat (query, KV split) tasks"
        )
    reqs = _mqa.requests(lens, next_n, idx)
    sched = (
        "deep_gemm/include/deep_gemm/scheduler/sm100_paged_mqa_logits.cuh RequestInfo::from_q_token"
        if arch == 10
        else "deep_gemm/include/deep_gemm/scheduler/sm90_paged_mqa_logits.cuh refresh_num_kv_and_advance"
    )
    _check_pages(block_table, reqs, block_kv, num_blocks, lens, sched)
    for start, _, _, ctx in reqs:
        if ceil_div(ctx, split_kv) * split_kv > stride:
            panic(
                f"the request at query token {start} has {ctx} KV tokens: the kernel writes its logits in "
                f"{split_kv}-wide splits up to column {ceil_div(ctx, split_kv) * split_kv}, past the row stride "
                f"{stride} (max_context_len = {max_context_len}), into the next row"
            )

    data, sf = _fused_pages(cache, num_blocks, block_kv, data_bytes, 4)
    q_rows = q_fp.reshape(batch * next_n, num_heads, -1)
    if is_fp4:
        pages = _fp4_deq(data.view(FP4), sf.view(I32).reshape(num_blocks, block_kv), head_dim)
        q_v = _fp4_deq(q_rows, q_sf.reshape(batch * next_n, num_heads), head_dim)
        post = None
    else:
        pages = data.view(FP8).to(F64)
        q_v = q_rows.to(F64)
        post = sf.view(F32).reshape(num_blocks, block_kv).to(F64)
    out = _paged_values(q_v, weights.to(F64), pages, post, block_table, reqs, lens, cols)
    logits.copy_(out.to(logits_dtype))
    if clean_logits:
        check(False, at(ATTN, 398), "not is_context_lens_2d")
    return logits


@public("fp8_fp4_paged_mqa_logits")
def fp8_fp4_paged_mqa_logits(
    q,
    kv_cache,
    weights,
    context_lens,
    block_table,
    schedule_meta,
    max_context_len,
    clean_logits=False,
    logits_dtype=torch.float32,
    indices=None,
):
    """Paged MQA logits ``[B * next_n, max_context_len]``: row ``b * next_n + t`` holds ``logit(j)`` for
    ``j < context_lens[b, t]`` over the fused ``uint8 [num_blocks, block_kv, 1, D + 4]`` cache (FP8 data then FP32
    scales per block; FP4: packed data then int32 UE8M0 words)."""
    api = "fp8_fp4_paged_mqa_logits"
    return _paged_mqa_logits(
        _q(q, api),
        _tensor(kv_cache, api, "kv_cache"),
        _tensor(weights, api, "weights"),
        _tensor(context_lens, api, "context_lens"),
        _tensor(block_table, api, "block_table"),
        _tensor(schedule_meta, api, "schedule_meta"),
        _int(max_context_len, api, "max_context_len"),
        bool(clean_logits),
        _dtype(logits_dtype, api, "logits_dtype"),
        _opt_tensor(indices, api, "indices"),
    )


@public("fp8_paged_mqa_logits")
def fp8_paged_mqa_logits(
    q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len, clean_logits=False, indices=None
):
    """Legacy FP8-only form (attention.hpp:418-430): FP32 logits."""
    api = "fp8_paged_mqa_logits"
    return _paged_mqa_logits(
        (_tensor(q, api, "q"), None),
        _tensor(kv_cache, api, "kv_cache"),
        _tensor(weights, api, "weights"),
        _tensor(context_lens, api, "context_lens"),
        _tensor(block_table, api, "block_table"),
        _tensor(schedule_meta, api, "schedule_meta"),
        _int(max_context_len, api, "max_context_len"),
        bool(clean_logits),
        F32,
        _opt_tensor(indices, api, "indices"),
    )


# ---------------------------------------------------------------------------------------------------------------------
# tf32_hc_prenorm_gemm (csrc/apis/hyperconnection.hpp:13-58)
# ---------------------------------------------------------------------------------------------------------------------


def _tf32(b):
    """FP32 -> TF32 (10 mantissa bits), round to nearest, ties away from zero [ASSUMED: the kernels read B through a
    TFLOAT32 TMA descriptor into TF32 MMAs; the rounding mode is not stated in the sources]."""
    bits = b.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    rounded = ((bits + 0x1000) & ~0x1FFF) & 0xFFFFFFFF
    rounded = torch.where(rounded >= 1 << 31, rounded - (1 << 32), rounded).to(torch.int32).view(F32)
    return torch.where(torch.isfinite(b), rounded, b)


def _hc_splits(k, num_splits, block_k=64):
    nb = k // block_k
    per, rem = divmod(nb, num_splits)
    out = []
    for s in range(num_splits):
        start = s * per + min(s, rem)
        out.append((start * block_k, (start + per + (s < rem)) * block_k))
    return out


@public("tf32_hc_prenorm_gemm")
def tf32_hc_prenorm_gemm(a, b, d, sqr_sum, num_splits=None):
    """``d = float(a) @ tf32(b)^T`` and ``sqr_sum = sum_k float(a)^2``; with ``num_splits = S`` K is cut into 64-wide
    blocks, split ``s`` covering ``[s * (nb // S) + min(s, nb % S), ...)`` and writing ``d[s]``, ``sqr_sum[s]``."""
    api = "tf32_hc_prenorm_gemm"
    a = _tensor(a, api, "a")
    b = _tensor(b, api, "b")
    d = _tensor(d, api, "d")
    sqr_sum = _tensor(sqr_sum, api, "sqr_sum")
    num_splits = None if num_splits is None else _int(num_splits, api, "num_splits")
    check(_major_ab(a) == K_MAJOR, at(HC, 19), "get_major_type_ab(a) == cute::UMMA::Major::K")
    check(_major_ab(b) == K_MAJOR, at(HC, 20), "get_major_type_ab(b) == cute::UMMA::Major::K")
    _check_cd(d)
    check(sqr_sum.is_contiguous(), at(HC, 24), "sqr_sum.is_contiguous()")
    m, k = _shape(a, 2)
    n, k_ = _shape(b, 2)
    if num_splits is not None:
        splits_, m_, n_ = _shape(d, 3)
        splits__, m__ = _shape(sqr_sum, 2)
        check(
            num_splits == splits_ and num_splits == splits__ and num_splits >= 1,
            at(HC, 32),
            "num_splits.value() == num_splits_ and num_splits.value() == num_splits__ and num_splits.value() >= 1",
        )
        check(m == m_ and m == m__ and n == n_ and k == k_, at(HC, 33), "m == m_ and m == m__ and n == n_ and k == k_")
    else:
        m_, n_ = _shape(d, 2)
        (m__,) = _shape(sqr_sum, 1)
        check(m == m_ and m == m__ and n == n_ and k == k_, at(HC, 37), "m == m_ and m == m__ and n == n_ and k == k_")
    check(n > 0 and k > 0, at(HC, 39), "n > 0 and k > 0")
    check(a.dtype == BF16, at(HC, 40), "a.scalar_type() == torch::kBFloat16")
    check(b.dtype == F32, at(HC, 41), "b.scalar_type() == torch::kFloat")
    check(d.dtype == F32, at(HC, 42), "d.scalar_type() == torch::kFloat")
    check(sqr_sum.dtype == F32, at(HC, 43), "sqr_sum.scalar_type() == torch::kFloat")
    if m == 0:
        return
    splits = num_splits or 1
    block_n = align(n, 16)
    if STATE.arch == 9:
        impl, limit, lines = SM90_HC, 32, (79, 81, 82)
    else:
        impl, limit, lines = SM100_HC, 128, (78, 79, 80)
    check(n <= block_n, at(impl, lines[0]), "n <= block_n")
    check(n <= limit and n % 8 == 0, at(impl, lines[1]), f"n <= {limit} and n % 8 == 0")
    check(k % 64 == 0, at(impl, lines[2]), "k % block_k == 0")
    _tma(a, a.stride(-2), "A")
    _tma(b, b.stride(-2), "B")
    if splits == 1:
        _tma(d, d.stride(-2), "D")
    else:
        _tma_nd(d, (d.stride(-2), d.stride(-3)), "D")
    ranges = _hc_splits(k, splits)
    if STATE.arch == 10:
        for s, (lo, hi) in enumerate(ranges):
            if hi == lo:
                panic(
                    f"num_splits = {splits} > K / 64 = {k // 64}: split {s} has no K block, so the SM100 kernel "
                    f"issues no MMA and stores its never-written TMEM accumulator into d[{s}] (garbage)"
                )
    a64 = a.to(F64)
    b64 = _tf32(b).to(F64)
    d_out = d if num_splits is not None else d.unsqueeze(0)
    s_out = sqr_sum if num_splits is not None else sqr_sum.unsqueeze(0)
    for s, (lo, hi) in enumerate(ranges):
        _store(d_out[s], a64[:, lo:hi] @ b64[:, lo:hi].T)
        _store(s_out[s], a64[:, lo:hi].square().sum(-1))


# ---------------------------------------------------------------------------------------------------------------------
# einsum / fp8_einsum (csrc/apis/einsum.hpp)
# ---------------------------------------------------------------------------------------------------------------------


def _bmk_bnk_mn(a, b, d, c):
    """einsum.hpp:23-59: ``d (+)= sum_s a[s] @ b[s]^T``; BF16 ``d`` goes through a zeroed FP32 workspace."""
    if d.dtype == F32:
        if c is None:
            panic(
                "einsum('bmk,bnk->mn') with an FP32 d and c=None: upstream dereferences the empty c "
                "(einsum.hpp:27, c->data_ptr()), undefined behaviour; pass c=d to accumulate"
            )
        check(
            c.data_ptr() == d.data_ptr() and c.shape == d.shape and c.stride() == d.stride(),
            at(EINSUM, 27),
            "c->data_ptr() == d.data_ptr() and c->sizes() == d.sizes() and c->strides() == d.strides()",
        )
    else:
        check(d.dtype == BF16, at(EINSUM, 29), "d.scalar_type() == torch::kBFloat16")
        check(c is None, at(EINSUM, 30), "not c.has_value()")
        workspace = torch.zeros_like(d, dtype=F32)
        _bmk_bnk_mn(a, b, workspace, workspace)
        d.copy_(workspace)
        return
    check(a.is_contiguous(), at(EINSUM, 42), "a.is_contiguous()")
    check(b.is_contiguous(), at(EINSUM, 43), "b.is_contiguous()")
    check(d.is_contiguous(), at(EINSUM, 44), "d.is_contiguous()")
    s, m, k = _shape(a, 3)
    s_, n, k_ = _shape(b, 3)
    check(s == s_ and k == k_, at(EINSUM, 48), "s == s_ and k == k_")
    impl = SM90_BMK if STATE.arch == 9 else SM100_BMK
    check(k % 64 == 0, at(impl, 71), "k % block_k == 0")
    check(m % 64 == 0 and n % 64 == 0, at(impl, 72), "m % 64 == 0 and n % 64 == 0")
    check(
        s * max(m, n) <= 2**31 - 1,
        at(impl, 73),
        "static_cast<int64_t>(s) * static_cast<int64_t>(std::max(m, n)) <= std::numeric_limits<int>::max()",
    )
    if m * n == 0 or s * k == 0:
        panic(
            f"einsum('bmk,bnk->mn') with s = {s}, m = {m}, n = {n}, k = {k}: the host heuristic divides by the "
            f"number of MN blocks / split-K blocks ({impl}:80-82), an integer division by zero (SIGFPE)"
        )
    _tma(a, k, "A")
    _tma(b, k, "B")
    if STATE.arch == 10:
        _tma(d, n, "D")
    if d.numel() < m * n:
        panic(f"d has {d.numel()} elements but the kernel accumulates an [{m}, {n}] result into it (shape unchecked)")
    flat = d.view(-1)[: m * n].view(m, n)
    _store(flat, flat.to(F64) + torch.einsum("smk,snk->mn", a.to(F64), b.to(F64)))


def _bf16_batched(a, b, d, eq, tma):
    _check_validity(a.dtype, b.dtype, d.dtype)
    for t, strides, what in zip((a, b, d), tma, ("A", "B", "D")):
        _tma_nd(t, strides, what)
    _store(d, torch.einsum(eq, a.to(F64), b.to(F64)))


@public("einsum")
def einsum(expr, a, b, d, c=None, use_cublaslt=False):
    """BF16 einsum: ``'bmk,bnk->mn'`` (FP32 ``d`` with ``c is d`` accumulates; BF16 ``d`` without ``c``),
    ``'bhr,hdr->bhd'`` and ``'bhd,hdr->bhr'`` (BF16, no ``c``)."""
    api = "einsum"
    if not isinstance(expr, str):
        incompatible(api, f"'expr' must be a str, got {type(expr).__name__}")
    a = _tensor(a, api, "a")
    b = _tensor(b, api, "b")
    d = _tensor(d, api, "d")
    c = _opt_tensor(c, api, "c")
    use_cublaslt = bool(use_cublaslt)
    check(a.dtype == BF16, at(EINSUM, 113), "a.scalar_type() == torch::kBFloat16")
    check(b.dtype == BF16, at(EINSUM, 114), "b.scalar_type() == torch::kBFloat16")
    check(
        d.dtype in (BF16, F32),
        at(EINSUM, 115),
        "d.scalar_type() == torch::kBFloat16 or d.scalar_type() == torch::kFloat",
    )
    if c is not None:
        check(d.dtype == c.dtype, at(EINSUM, 117), "d.scalar_type() == c->scalar_type()")
    if expr == "bmk,bnk->mn":
        check(not use_cublaslt, at(EINSUM, 124), "not use_cublaslt")
        _bmk_bnk_mn(a, b, d, c)
    elif expr in ("bhr,hdr->bhd", "bhd,hdr->bhr"):
        check(c is None, at(EINSUM, 127 if expr == "bhr,hdr->bhd" else 130), "not c.has_value()")
        line = 62 if expr == "bhr,hdr->bhd" else 85
        bb, h, x = _shape(a, 3)
        h_, y, z = _shape(b, 3)
        b_, h__, w = _shape(d, 3)
        if expr == "bhr,hdr->bhd":  # x = r, y = d, z = r_, w = d_
            ok = bb == b_ and h == h_ and x == z and y == w and h == h__
            cond = "b == b_ and h == h_ and r == r_ and d == d_ and h == h__"
        else:  # x = d, y = d_, z = r, w = r_
            ok = bb == b_ and h == h_ and z == w and x == y and h == h__
            cond = "b == b_ and h == h_ and r == r_ and d == d_ and h == h__"
        check(ok, at(EINSUM, line + 3), cond)
        check(
            a.dtype == BF16 and a.stride(2) == 1,
            at(EINSUM, line + 5),
            "A.scalar_type() == torch::kBFloat16 and A.stride(2) == 1",
        )
        check(
            b.dtype == BF16 and b.stride(2) == 1,
            at(EINSUM, line + 6),
            "B.scalar_type() == torch::kBFloat16 and B.stride(2) == 1",
        )
        check(
            d.dtype == BF16 and d.stride(2) == 1,
            at(EINSUM, line + 7),
            "D.scalar_type() == torch::kBFloat16 and D.stride(2) == 1",
        )
        eq = "bhr,hdr->bhd" if expr == "bhr,hdr->bhd" else "bhd,hdr->bhr"
        if use_cublaslt:  # cublaslt_{bhr_hdr_bhd,bhd_hdr_bhr}: no TMA descriptors
            _store(d, torch.einsum(eq, a.to(F64), b.to(F64)))
        else:
            tma = ((a.stride(0), a.stride(1)), (b.stride(1), b.stride(0)), (d.stride(0), d.stride(1)))
            _bf16_batched(a, b, d, eq, tma)
    else:
        fail(at(EINSUM, 133), f"Unsupported einsum expression: {expr}")


def _fp8_bmm(a, sfa, b, sfb, d, c, recipe, what):
    """einsum.hpp:137-177 (``[B, M, K] @ [B, N, K]^T``)."""
    major_a = K_MAJOR if a.stride(-1) == 1 else "MN"
    major_b = K_MAJOR if b.stride(-1) == 1 else "MN"
    check(a.stride(-1) == 1 or a.stride(-2) == 1, at(EINSUM, 146), "a.stride(-1) == 1 or a.stride(-2) == 1")
    check(b.stride(-1) == 1 or b.stride(-2) == 1, at(EINSUM, 147), "b.stride(-1) == 1 or b.stride(-2) == 1")
    check(d.stride(-1) == 1, at(EINSUM, 148), "d.stride(-1) == 1")
    batch, m, k = _shape(a, 3)
    batch_, n, k_ = _shape(b, 3)
    batch__, m_, n_ = _shape(d, 3)
    check(batch == batch_, at(EINSUM, 154), "batch_size == batch_size_ and batch_size == batch_size_")
    check(m == m_ and n == n_ and k == k_, at(EINSUM, 155), "m == m_ and n == n_ and k == k_")
    check(a.dtype == FP8, at(EINSUM, 156), "a.scalar_type() == torch::kFloat8_e4m3fn")
    check(b.dtype == FP8, at(EINSUM, 157), "b.scalar_type() == torch::kFloat8_e4m3fn")
    check(
        d.dtype in (BF16, F32),
        at(EINSUM, 158),
        "d.scalar_type() == torch::kBFloat16 or d.scalar_type() == torch::kFloat",
    )
    if batch == 0 or _early_return(m, n, k, d, c):
        return
    tsfa, tsfb, _ = _transform_pair(sfa, sfb, m, n, k, recipe, None, None, batch, batch, False)
    if STATE.arch == 10:
        _check_validity(a.dtype, b.dtype, d.dtype)
        _tma_nd(a, (a.stride(1 if major_a == K_MAJOR else 2), a.stride(0)), "A")
        _tma_nd(b, (b.stride(1 if major_b == K_MAJOR else 2), b.stride(0)), "B")
        _tma_nd(d, (d.stride(1), d.stride(0)), "D")
    else:
        _major_check(sfb)  # major_sfb = get_major_type_ab(sfb)
        check(tsfa.gran_k == 128 and tsfb.gran_k == 128, at(EINSUM, 174), "gran_k_a == 128 and gran_k_b == 128")
        check(d.dtype == BF16, at(SM90_1D2D, 298), "d.scalar_type() == torch::kBFloat16")
        check(
            major_a == K_MAJOR and major_b == K_MAJOR,
            at(SM90_1D2D, 299),
            "major_a == cute::UMMA::Major::K and major_b == cute::UMMA::Major::K",
        )
        _check_validity(a.dtype, b.dtype, d.dtype)
        _tma_nd(a, (a.stride(1), a.stride(0)), "A")
        _tma_nd(b, (b.stride(1), b.stride(0)), "B")
        _tma_nd(d, (d.stride(1), d.stride(0)), "D")
        _sm90_1d2d_n_trap(n)
        if tsfa.gran_mn != 1 or tsfb.gran_mn != 128:
            panic(
                f"the SM90 FP8 BMM runs the 1D2D kernel (per-row SFA, 128x128-block SFB), but the recipe gives "
                f"SFA/SFB row granularities {tsfa.gran_mn}/{tsfb.gran_mn}: the scales would be misread"
            )
    if batch__ < batch:
        panic(
            f"d has {batch__} batches ({what}) but A/B have {batch}: einsum.hpp:154 compares batch_size with itself "
            f"instead of d's, so the kernel writes past d"
        )
    a_deq = a.to(F64) * tsfa.element_values(m, k)
    b_deq = b.to(F64) * tsfb.element_values(n, k)
    out = d[:batch]
    acc = out.to(F64) if c is not None else 0.0
    _store(out, acc + _ref.mm_nt(a_deq, b_deq))


@public("fp8_einsum")
def fp8_einsum(expr, a, b, d, c=None, recipe=(1, 128, 128)):
    """FP8 einsum as a batched FP8 GEMM over permuted operands and scales: ``'bhr,hdr->bhd'`` (SM90, SM100),
    ``'bhd,hdr->bhr'`` and ``'bhd,bhr->hdr'`` (SM100)."""
    api = "fp8_einsum"
    if not isinstance(expr, str):
        incompatible(api, f"'expr' must be a str, got {type(expr).__name__}")
    A, sfa = _pair(a, api, "a")
    B, sfb = _pair(b, api, "b")
    d = _tensor(d, api, "d")
    c = _opt_tensor(c, api, "c")
    if not (isinstance(recipe, (tuple, list)) and len(recipe) == 3):
        incompatible(api, f"'recipe' must be a tuple of 3 ints, got {recipe!r}")
    recipe = tuple(_int(v, api, "recipe") for v in recipe)
    arch = STATE.arch
    p = (1, 0, 2)
    if expr == "bhr,hdr->bhd":
        _fp8_bmm(A.permute(p), sfa.permute(p), B, sfb, d.permute(p), None if c is None else c.permute(p), recipe, "h")
    elif expr == "bhd,hdr->bhr" and arch == 10:
        q = (0, 2, 1)
        _fp8_bmm(
            A.permute(p),
            sfa.permute(p),
            B.permute(q),
            sfb.permute(q),
            d.permute(p),
            None if c is None else c.permute(p),
            recipe,
            "h",
        )
    elif expr == "bhd,bhr->hdr" and arch == 10:
        r = (1, 2, 0)
        _fp8_bmm(A.permute(r), sfa.permute(r), B.permute(r), sfb.permute(r), d, c, recipe, "h")
    else:
        fail(at(EINSUM, 212), f"Unsupported einsum expression: {expr}")


EXPORTS = {
    "fp8_fp4_mqa_logits": fp8_fp4_mqa_logits,
    "fp8_mqa_logits": fp8_mqa_logits,
    "get_paged_mqa_logits_metadata": get_paged_mqa_logits_metadata,
    "fp8_fp4_paged_mqa_logits": fp8_fp4_paged_mqa_logits,
    "fp8_paged_mqa_logits": fp8_paged_mqa_logits,
    "tf32_hc_prenorm_gemm": tf32_hc_prenorm_gemm,
    "einsum": einsum,
    "fp8_einsum": fp8_einsum,
}
