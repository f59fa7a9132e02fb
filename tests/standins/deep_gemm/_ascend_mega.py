"""The "ascend" flavor's Mega MoE (DeepGEMM-Ascend 0.1.0, public fork Afloat16/DeepGEMM-Ascend @ 8491bbb): fused EP
dispatch -> shared and routed L1 GEMMs -> SwiGLU (clamp, routing weight, per-32 UE8M0 FP8 requantisation) -> L2 GEMMs
-> combine, on CPU tensors.

Sources (all of the fork @ 8491bbb; line numbers counted in the stored text): ``deep_gemm/mega/__init__.py`` (the
Python API, ported line for line: ``BLOCK_N``, ``SymmBuffer``, ``_transform_fp8_nz``, ``_interleave_weights``,
``_reshape_weights``, ``_scale_fp4_weight_sf``, ``transform_weights_for_mega_moe``, ``fp8_fp4_mega_moe``),
``csrc/apis/mega_moe.hpp`` (host checks: ``get_workspace`` :30-38, ``SymmBuffer`` :50, ``slice_buffer`` :66/:68,
``get_symm_buffer_size_for_mega_moe`` :76/:80 and its 13 views, ``check_weights`` :116-124, ``fp8_fp4_mega_moe``
:147-191), ``csrc/backends/hccl.hpp`` (the allocation: zeroed, pooled), ``deep_gemm/include/deep_gemm/layout/
{mega_moe,sym_buffer}.hpp`` and ``common.hpp`` (``BLOCK_M = BLOCK_N = 256``, ``kNumAICores = 32``, ``MX_SF_DIVISOR =
64``, ``kCountArrivalBit = 1 << 24``, ``Config::shared_intermediate_hidden = num_shared_experts *
intermediate_hidden``, ``num_input_sf_pairs = hidden / 64``, the ``Workspace`` byte layout, 2 MiB-aligned size),
``csrc/jit_kernels/mega_moe.hpp`` (launch), ``deep_gemm/include/deep_gemm/mega_moe.hpp`` (``aic_gemm_pipeline``,
``aiv0_weight_pipeline``, ``aiv1_epilogue_comm``, ``advance_combine_reduce``, ``mega_moe_impl``),
``simd/mega_moe.hpp`` (``vf_fp4_to_fp8_nz`` :10-55, ``vf_swiglu_quant`` :57-165, ``vf_combine_reduce`` :167-),
``comm/mega_moe.hpp`` (``build_dispatch_metadata``, ``wait_dispatch_metadata``), ``scheduler/mega_moe.hpp``,
``deep_gemm/__init__.py`` (top-level re-exports) and ``tests/test_mega_moe.py`` (how callers build the weights and fill
the buffer).

API modelled
------------
* ``deep_gemm.mega`` (an attribute, not an importable submodule): ``BLOCK_N = 256``, ``SymmBuffer``,
  ``transform_weights_for_mega_moe``, ``fp8_fp4_mega_moe``; the last three are also top-level names.
* ``SymmBuffer(group, num_experts, num_max_tokens_per_rank, num_topk, hidden, intermediate_hidden,
  num_shared_experts=0, mma_type='fp8xfp4', activation='swiglu', base=None)``: the fork's asserts, then
  ``get_symm_buffer_size_for_mega_moe`` (no rounding of ``num_max_tokens_per_rank``), then either a new zeroed CPU
  ``int8`` buffer of exactly ``num_bytes`` (collective: upstream asks ``group._get_backend(torch.device('npu'))
  .get_hccl_comm_name(rank)`` and registers HCCL memory; a gloo group has no such backend, so the stand-in
  ``all_gather``s the buffers' addresses over ``group`` as ``buffer_ptrs`` and then ``dist.barrier(group)``; a group of
  size 1, or any object with ``size() == 1``, ``rank()`` and ``barrier()``, uses no collective) or, with ``base=``,
  ``base``'s buffer and handle (not re-zeroed). Views at the ``Workspace`` byte offsets: ``x [T, H]`` FP8, ``x_sf
  [T, H/64]`` int16, ``topk_idx [T, K]`` int64, ``topk_weights [T, K]`` FP32, ``shared_l1_acts`` (the very ``x``
  tensor), ``shared_l1_acts_sf`` (``x_sf`` when ``num_shared_experts > 0``, else None), ``shared_l2_acts [T, SI]``
  FP8, ``shared_l2_acts_sf [align(T, 256) * SI/64]`` int16 (None without shared experts), ``l1_acts [R_ring, H]`` FP8,
  ``l1_acts_sf [R_ring, H/64]`` int16, ``l2_acts [R_ring, I]`` FP8, ``l2_acts_sf [R_ring * I/64]`` int16 and the
  private ``_expert_recv_count [R, E/R]`` int32 (property ``expert_recv_count``); ``num_bytes`` property,
  ``destroy()`` (drops the handle, buffer, group and every view). ``R_ring = min(ceil(R*T*K/256) + E/R, 4*32 if
  H/256 <= 16 else 32) * 256``. Allocation pooling (``hccl.hpp``: same memory handed out again after the last owner
  is gone) is not modelled: every ``base=None`` buffer is a fresh tensor.
* ``transform_weights_for_mega_moe(l1_weights, l2_weights, activation='swiglu')``: the fork's pure-torch code.
* ``fp8_fp4_mega_moe(y, l1_weights, l2_weights, sym_buffer, shared_l1_weights=None, shared_l2_weights=None,
  cumulative_local_expert_recv_stats=None, recipe=(1, 1, 32), activation='swiglu', activation_clamp=None,
  fast_math=True)``: collective (every rank of the buffer's group calls it); each rank's tokens are the first
  ``y.shape[0]`` rows of ITS buffer's ``x`` / ``x_sf`` / ``topk_idx`` / ``topk_weights`` (read at the workspace
  offsets of the ``sym_buffer.buffer`` passed); ``y`` is written in place. The fork's Python assert, pybind11
  conversion (``TypeError``), then ``mega_moe.hpp``'s host checks in order with their line numbers (a check spread over
  two lines is reported at its first line; the CPU stand-in has no device, so the device-placement checks :118, :165,
  :168, :176 always pass). ``fast_math`` must be True (:148). ``get_num_sms()`` must be 32 (:159). The kernel's
  ``static_assert``s that the JIT compile of the launch's template arguments can fail (``mega_moe.hpp``
  ``mega_moe_impl``: ``H/256``, ``I/128``, ``SI/128 <= 255``; ``comm/mega_moe.hpp`` "Metadata UB overflow")
  raise ``RuntimeError("DeepGEMM stand-in: JIT compilation failed (...): static_assert(...)")`` (the text of
  deep_jit's compile error is not in the sources: the stand-in's own words). The AIV UB-overflow asserts (only
  reachable at ``H`` above ~12K) are not modelled.

Math (per (token t, slot k) with ``e = topk_idx[t, k]`` read as uint64 and ``e < E``, i.e. ``0 <= e < E``; other ids,
``-1`` and ids ``>= E`` alike, are no route: ``build_dispatch_metadata`` and ``advance_combine_reduce`` both skip them
with that comparison). Computed on rank ``e // E_r`` with local expert ``e % E_r``; weights read in their TRANSFORMED
layout exactly as the kernel reads them (so untransformed weights or scales give a different, wrong result)
---------------------------------------------------------------------------------------------------------------------
* ``x`` decoded exactly: E4M3 times ``2 ** (byte - 127)`` of byte ``(c // 32) % 2`` (low byte first) of ``x_sf[t, c //
  64]``.
* Routed weights: ``l1 [E_r, I/128, 256, H/2]`` int8, rows ``0..127`` of block ``q`` are gate rows ``128q ..``, rows
  ``128..255`` up rows ``128q ..`` (``_interleave_weights``, gran ``BLOCK_N / 2``), packed E2M1 along K (element
  ``2i`` in the low nibble); scales ``[E_r, I/128, H/64, 256]`` int16, byte ``j`` of pair ``p`` scales K block ``2p+j``
  of the block's row ``n``. ``vf_fp4_to_fp8_nz`` (simd:10-55) turns each code into the E4M3 whose bits are ``s 00 e1 e0
  m 00`` = the E2M1 value / 64 exactly, and the transform added 6 to every scale byte but 255: the MMA's value is
  ``e2m1 / 64 * 2 ** (byte - 127)`` (= ``e2m1 * 2 ** (orig - 127)`` after the transform; byte 255 is NaN). L2
  ``[E_r, H/256, 256, I/2]`` / ``[E_r, H/256, I/64, 256]`` likewise without interleave.
* Shared weights (FP8 E4M3, no expert dimension, one FFN of width ``SI = num_shared_experts * I``): ``[SI/128, 256,
  H]`` in NZ order (``_transform_fp8_nz``: the bytes of block ``q`` are ``[H/32][256][32]``), gate/up interleaved like
  the routed L1; scales ``[SI/128, H/64, 256]`` int16, NOT biased; value ``e4m3 * 2 ** (byte - 127)``. L2 ``[H/256,
  256, SI]`` NZ / ``[H/256, SI/64, 256]``.
* ``h = bf16(fp32(x_deq @ W1^T))``: float64 dot products rounded once to FP32 (L0C), then RN to BF16 (FIX pipe
  ``F322BF16`` into UB, ``aic_gemm_pipeline`` ``copy_l0c_to_ub``; its rounding mode is not in the sources: RN assumed);
  ``gate``, ``up`` in the original (de-interleaved) order.
* ``vf_swiglu_quant`` (simd:57-165), in FP32: ``gate = min(gate, c)``, ``up = max(min(up, c), -c)`` with ``c`` the
  clamp rounded to FP32 then RN to BF16 (``mega_moe.hpp:190-191`` and the launch's ``c10::BFloat16``; ``+inf`` when
  None, so the min/max always run; NaN operands are taken to propagate, which the sources do not pin); ``v =
  exp(0 - gate)`` (``asc_exp_sub``), ``v = v + 1``, ``v = gate / v``, ``v = v * up``, routed only ``v = v *
  topk_weights[t, k]`` (the FP32 bits shipped in the dispatch metadata); every step rounded to FP32; ``exp`` is
  modelled as correctly rounded and ``/`` as IEEE division (``fast_math`` must be True upstream and the vector unit's
  ``exp`` / ``div`` accuracy is not in the sources, so the stand-in can differ from the device by a few FP32 ulps here).
* Requantisation per token and 32 consecutive intermediate columns (simd:124-162, integer ops on the FP32 bits):
  ``b = max(max_j bits(|v_j|), bits(1e-4f) = 0x38d1b717)`` (uint compare: NaN wins), ``b = ((b + 0x1fffff) &
  0x7f800000) - 0x04000000``, ``b = min(b, 0x7f000000)``: the scale ``sf = float(b)`` is the smallest power of two with
  ``max(amax, 1e-4f) / sf <= 448``; ``q = e4m3_rn_satfinite(fp32(v * float(0x7f000000 - b)))``, UE8M0 byte ``b >> 23``;
  the L2 input is ``q * sf``.
* ``y_k = bf16(fp32(act_deq @ W2_e^T))`` (routed, ``copy_l0c_to_gm`` into the ring, then pushed to the home rank's
  combine slot ``k``); shared: the same steps from the home rank's own ``x`` with no routing weight, over ``SI``
  columns at once (so two shared experts are ONE FP32 accumulation, rounded to BF16 once), written straight into the
  combine slot ``num_topk``.
* Combine on the home rank (``advance_combine_reduce`` + ``vf_combine_reduce``, simd:167-): ``y[t] = bf16(((0 +
  y_k0) + y_k1) + ... + y_shared)`` in FP32 (``+0.0f`` start, valid slots in increasing ``k``, then the shared slot
  when ``num_shared_experts > 0``), RN to BF16 (``asc_float2bfloat16_rn``).
* ``cumulative_local_expert_recv_stats[e_local] += routes from all ranks to it`` (int32, wraps;
  ``wait_dispatch_metadata``); the buffer's ``expert_recv_count[s, e_local]`` = routes from rank ``s`` to local expert
  ``e_local`` of this call (written for every expert, 0 included, by ``build_dispatch_metadata``).

Simplifications (documented, not upstream behaviour)
----------------------------------------------------
* Only ``expert_recv_count`` is written into the buffer; the rings, the shared L2 activations, the combine slots and the
  other workspace fields (the kernel's scratch and counters) are never written; inputs stay as the caller left them.
* Communication is ``torch.distributed`` collectives on the buffer's group: ``all_gather_object`` of each rank's
  configuration, ``all_gather`` of each rank's first ``max T`` input rows (x, x_sf, topk_idx, topk_weights as bytes)
  and of the per-slot BF16 outputs. Ranks whose buffers or calls disagree (``R``, ``T``, ``E``, ``K``, ``H``, ``I``,
  ``num_shared_experts``) or that share a rank index raise ``Panic`` on every rank. A rank failing a HOST check raises
  alone, as upstream, and the other ranks then block in the collective until the group's timeout (upstream: in the
  kernel's rank barrier, 60 s then a trap).
* ``dry_run`` (``runtime->get_dry_run()``: compile only) is honoured only through the stand-in's ``STATE.dry_run``.
"""

from __future__ import annotations

import operator
import types

import torch

from . import _ref
from ._cuda import _opt_tensor, _pair, _tensor, at
from ._cuda_mega import _FP4_BYTE_VALUES, _all_gather_bytes, _as_bytes, _bits_to_f32, _cfloat_opt, _cstr, _py_assert
from ._ref import F64, align, ceil_div
from ._standin import ASCEND_AI_CORES, CALLS, PREFIX, STATE, check, describe, incompatible, panic, public

FP8, BF16, F32 = torch.float8_e4m3fn, torch.bfloat16, torch.float32
I8, U8, I16, I32, I64 = torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64

API = "DeepGEMM-Ascend csrc/apis/mega_moe.hpp"
KERNEL = "DeepGEMM-Ascend deep_gemm/include/deep_gemm/mega_moe.hpp"
COMM = "DeepGEMM-Ascend deep_gemm/include/deep_gemm/comm/mega_moe.hpp"

# deep_gemm/include/deep_gemm/layout/mega_moe.hpp + common.hpp
BLOCK_M = BLOCK_N = 256
NUM_BUFFER_ALIGNMENT_BYTES = 512
L2_SECTOR_BYTES = 128
COUNT_ARRIVAL_BIT = 1 << 24
NUM_PROGRESS_STAGES = 4
MX_SF_DIVISOR = 64
NUM_AI_CORES = ASCEND_AI_CORES  # kNumAICores = 32 (Ascend 950DT)
UB_SIZE_BYTES = 256 * 1024
HCCL_ALIGNMENT_BYTES = 2 * 1024 * 1024
RANK_BARRIER_BYTES = 16  # struct RankBarrier { uint64_t epoch; int32_t signals[2]; }
FP4_DEQUANT_EXPONENT_BIAS = 6  # vf_fp4_to_fp8_nz emits E2M1 / 2^6; _scale_fp4_weight_sf adds 6


# ---------------------------------------------------------------------------------------------------------------------
# pybind11 argument conversion
# ---------------------------------------------------------------------------------------------------------------------


def _cinteger(x, api, arg, lo, hi, what):
    if isinstance(x, float):
        incompatible(api, f"'{arg}' must be {what}, got {x!r}")
    try:
        v = operator.index(x)
    except TypeError:
        incompatible(api, f"'{arg}' must be {what}, got {type(x).__name__}")
    if not lo <= v < hi:
        incompatible(api, f"'{arg}' must be {what}, got {v}")
    return v


def _cuint32(x, api, arg):
    """pybind11's ``uint32_t`` caster: non-negative ints below 2**32, never floats."""
    return _cinteger(x, api, arg, 0, 2**32, "an unsigned 32-bit int")


def _cint32(x, api, arg):
    """pybind11's ``int`` caster (``const int&``)."""
    return _cinteger(x, api, arg, -(2**31), 2**31, "a 32-bit int")


def _opt_pair(x, api, arg):
    return None if x is None else _pair(x, api, arg)


# ---------------------------------------------------------------------------------------------------------------------
# layout/mega_moe.hpp: Config and Workspace (byte layout)
# ---------------------------------------------------------------------------------------------------------------------


class _Cursor:
    """``layout::Buffer``'s constructor: ``offset = aligned(next_offset, alignment)``, then ``next_offset = offset +
    num_elements * kStrideBytes`` (``alignment`` defaults to ``kStrideBytes``)."""

    def __init__(self):
        self.next = 0

    def buffer(self, num_elements, stride, alignment=None):
        offset = align(self.next, stride if alignment is None else alignment)
        self.next = offset + num_elements * stride
        return offset

    def fp8(self, num_rows, num_cols):
        """``Workspace::FP8Buffer``: (data offset, sf offset)."""
        data = self.buffer(num_rows * num_cols, 1, NUM_BUFFER_ALIGNMENT_BYTES)
        sf = self.buffer(num_rows * ceil_div(num_cols, MX_SF_DIVISOR), 2, NUM_BUFFER_ALIGNMENT_BYTES)
        return data, sf


def _workspace(num_ranks, num_experts, num_shared_experts, t_max, num_topk, hidden, inter):
    """``layout::Workspace`` for a Config (field order = placement order)."""
    ws = types.SimpleNamespace()
    shared_inter = num_shared_experts * inter
    ws.shared_intermediate_hidden = shared_inter
    ws.num_input_sf_pairs = hidden // MX_SF_DIVISOR
    experts_per_rank = num_experts // num_ranks
    num_src_slots_per_expert = t_max * num_topk
    num_src_indices = num_experts * num_src_slots_per_expert
    ws.num_padded_shared_rows = align(t_max, BLOCK_M)
    num_max_shared_m_blocks = ceil_div(t_max, BLOCK_M) if num_shared_experts > 0 else 0
    num_max_m_blocks = ceil_div(num_ranks * t_max * num_topk, BLOCK_M) + experts_per_rank
    num_progress_counters_per_stage = num_max_shared_m_blocks + num_max_m_blocks
    num_full_pool_rows = num_max_m_blocks * BLOCK_M
    num_windows = 4 if hidden // BLOCK_N <= NUM_AI_CORES // 2 else 1
    ws.num_ring_blocks = min(num_max_m_blocks, num_windows * NUM_AI_CORES)
    ws.num_ring_rows = ws.num_ring_blocks * BLOCK_M

    c = _Cursor()
    # sync
    c.buffer(3, 4, NUM_BUFFER_ALIGNMENT_BYTES)  # grid_sync_count
    c.buffer(2, RANK_BARRIER_BYTES, NUM_BUFFER_ALIGNMENT_BYTES)  # rank_barriers
    # metadata
    c.buffer(NUM_AI_CORES * num_experts, 4, NUM_BUFFER_ALIGNMENT_BYTES)  # worker_expert_count
    c.buffer(num_experts, 4)  # total_expert_count
    c.buffer(num_ranks, L2_SECTOR_BYTES)  # combine_ready_prefix (uint64_t, 128-byte stride)
    ws.expert_recv_count = c.buffer(num_experts, 4)
    c.buffer(experts_per_rank, NUM_BUFFER_ALIGNMENT_BYTES)  # expert_recv_count_sum (512-byte stride)
    c.buffer(1, 4, L2_SECTOR_BYTES)  # num_m_blocks_certificate
    c.buffer(num_src_indices, 8, NUM_BUFFER_ALIGNMENT_BYTES)  # src_token_metadata
    c.buffer(num_src_indices, 4, NUM_BUFFER_ALIGNMENT_BYTES)  # staged_token_topk_idx
    # input
    ws.x, ws.x_sf = c.fp8(t_max, hidden)
    ws.topk_idx = c.buffer(t_max * num_topk, 8, NUM_BUFFER_ALIGNMENT_BYTES)
    ws.topk_weights = c.buffer(t_max * num_topk, 4, NUM_BUFFER_ALIGNMENT_BYTES)
    # progress (128-byte strides)
    c.buffer(NUM_PROGRESS_STAGES * num_progress_counters_per_stage, L2_SECTOR_BYTES)  # blocks
    c.buffer(NUM_AI_CORES, L2_SECTOR_BYTES)  # num_issued_gemms
    c.buffer(NUM_AI_CORES, L2_SECTOR_BYTES)  # metadata_ready
    # routed
    ws.l1_acts, ws.l1_acts_sf = c.fp8(ws.num_ring_rows, hidden)
    c.buffer(num_full_pool_rows, 4, NUM_BUFFER_ALIGNMENT_BYTES)  # routed.topk_weights
    c.buffer(num_full_pool_rows, 4, NUM_BUFFER_ALIGNMENT_BYTES)  # routed.src_metadata
    ws.l2_acts, ws.l2_acts_sf = c.fp8(ws.num_ring_rows, inter)
    c.buffer(ws.num_ring_rows * hidden, 2, NUM_BUFFER_ALIGNMENT_BYTES)  # routed.output (BF16)
    # combine_input: one BF16 slot per route plus one combined shared slot
    c.buffer((num_topk + (num_shared_experts > 0)) * t_max * hidden, 2, NUM_BUFFER_ALIGNMENT_BYTES)
    ws.shared_l2_acts, ws.shared_l2_acts_sf = c.fp8(
        ws.num_padded_shared_rows if num_shared_experts > 0 else 0, shared_inter
    )
    c.buffer(t_max * num_topk, 4, NUM_BUFFER_ALIGNMENT_BYTES)  # route_m_blocks
    ws.num_bytes = align(c.next, HCCL_ALIGNMENT_BYTES)  # get_num_bytes: HCCL registration uses 2 MiB alignment
    return ws


def _get_workspace(num_ranks, num_experts, t_max, num_topk, hidden, inter, num_shared_experts):
    """``get_workspace`` (csrc/apis/mega_moe.hpp:27-42); arguments already ``uint32_t``."""
    check(0 < num_ranks < 256, at(API, 30), "num_ranks > 0 and num_ranks < 256")
    check(
        num_experts > 0 and num_experts % num_ranks == 0,
        at(API, 31),
        "num_experts > 0 and num_experts % num_ranks == 0",
    )
    check(t_max > 0, at(API, 32), "num_max_tokens_per_rank > 0")
    check(0 < num_topk <= 32, at(API, 33), "num_topk > 0 and num_topk <= 32")
    check(num_shared_experts <= 2, at(API, 34), "num_shared_experts <= 2")
    check(hidden > 0 and hidden % BLOCK_N == 0, at(API, 35), "hidden > 0 and hidden % layout::BLOCK_N == 0")
    check(
        inter >= 512 and inter % BLOCK_N == 0,
        at(API, 36),
        "intermediate_hidden >= 512 and intermediate_hidden % layout::BLOCK_N == 0",
    )
    check(
        num_ranks * t_max * num_topk < COUNT_ARRIVAL_BIT,
        at(API, 38),
        "static_cast<uint64_t>(num_ranks) * num_max_tokens_per_rank * num_topk < layout::kCountArrivalBit",
    )
    return _workspace(num_ranks, num_experts, num_shared_experts, t_max, num_topk, hidden, inter)


def _slice_buffer(buffer, offset, shape, dtype):
    """``slice_buffer`` (csrc/apis/mega_moe.hpp:64-70): a view of ``buffer``'s bytes at ``offset``."""
    check(
        buffer.dim() == 1 and buffer.dtype == I8 and buffer.is_contiguous(),
        at(API, 66),
        "buffer.dim() == 1 and buffer.scalar_type() == torch::kInt8 and buffer.is_contiguous()",
    )
    num_bytes = 1
    for s in shape:
        num_bytes *= s
    num_bytes *= torch.empty((), dtype=dtype).element_size()
    check(
        offset <= buffer.nbytes and num_bytes <= buffer.nbytes - offset,
        at(API, 68),
        "offset <= buffer.nbytes() and num_bytes <= buffer.nbytes() - offset",
    )
    return buffer[offset : offset + num_bytes].view(dtype).view(shape)


def _symm_buffer_size(num_ranks, num_experts, t_max, num_topk, hidden, inter, mma_type, activation, num_shared):
    """``get_symm_buffer_size_for_mega_moe`` (csrc/apis/mega_moe.hpp:72-110): ``(num_bytes, slice_input_buffers)``."""
    check(
        mma_type == "fp8xfp4" and activation == "swiglu",
        at(API, 76),
        'mma_type == "fp8xfp4" and activation == "swiglu"',
    )
    ws = _get_workspace(num_ranks, num_experts, t_max, num_topk, hidden, inter, num_shared)

    def slice_input_buffers(buffer):
        check(buffer.nbytes >= ws.num_bytes, at(API, 80), "buffer.nbytes() >= workspace.get_num_bytes()")
        t, si, rr = t_max, ws.shared_intermediate_hidden, ws.num_ring_rows
        x = _slice_buffer(buffer, ws.x, (t, hidden), FP8)
        x_sf = _slice_buffer(buffer, ws.x_sf, (t, ws.num_input_sf_pairs), I16)
        topk_idx = _slice_buffer(buffer, ws.topk_idx, (t, num_topk), I64)
        topk_weights = _slice_buffer(buffer, ws.topk_weights, (t, num_topk), F32)
        shared_l1_acts = x
        shared_l1_acts_sf = x_sf if num_shared > 0 else None
        shared_l2_acts = _slice_buffer(buffer, ws.shared_l2_acts, (t, si), FP8) if num_shared > 0 else None
        shared_l2_acts_sf = (
            _slice_buffer(buffer, ws.shared_l2_acts_sf, (ws.num_padded_shared_rows * (si // MX_SF_DIVISOR),), I16)
            if num_shared > 0
            else None
        )
        l1_acts = _slice_buffer(buffer, ws.l1_acts, (rr, hidden), FP8)
        l1_acts_sf = _slice_buffer(buffer, ws.l1_acts_sf, (rr, ws.num_input_sf_pairs), I16)
        l2_acts = _slice_buffer(buffer, ws.l2_acts, (rr, inter), FP8)
        l2_acts_sf = _slice_buffer(buffer, ws.l2_acts_sf, (rr * (inter // MX_SF_DIVISOR),), I16)
        expert_recv_count = _slice_buffer(buffer, ws.expert_recv_count, (num_ranks, num_experts // num_ranks), I32)
        return (
            x,
            x_sf,
            topk_idx,
            topk_weights,
            shared_l1_acts,
            shared_l1_acts_sf,
            shared_l2_acts,
            shared_l2_acts_sf,
            l1_acts,
            l1_acts_sf,
            l2_acts,
            l2_acts_sf,
            expert_recv_count,
        )

    return ws.num_bytes, slice_input_buffers


# ---------------------------------------------------------------------------------------------------------------------
# deep_gemm/mega/__init__.py
# ---------------------------------------------------------------------------------------------------------------------


def _is_process_group(group):
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover
        return False
    return dist.is_available() and isinstance(group, dist.ProcessGroup)


def _barrier(group):
    """``dist.barrier(group)``; a non-ProcessGroup one-rank object: its own ``barrier()``."""
    if _is_process_group(group):
        import torch.distributed as dist

        dist.barrier(group=group)
        return
    work = group.barrier()
    if hasattr(work, "wait"):
        work.wait()


class _SymmBufferHandle:
    """``_C.SymmBuffer`` (csrc/apis/mega_moe.hpp:45-62): ``buffer`` (zeroed int8, ``hccl.hpp`` ``aclrtMemset``) and
    ``buffer_ptrs`` (every rank's address). Upstream gets them from HCCL memory registration on the group's HCCL
    communicator; the stand-in all_gathers the addresses over the (gloo) group instead."""

    def __init__(self, rank_idx, num_ranks, group, num_bytes):
        check(
            num_bytes > 0 and num_ranks > 0 and rank_idx < num_ranks,
            at(API, 50),
            "num_bytes > 0 and num_ranks > 0 and rank_idx < num_ranks",
        )
        self.buffer = torch.zeros(num_bytes, dtype=I8)
        if num_ranks == 1:
            self.buffer_ptrs = [self.buffer.data_ptr()]
        else:
            import torch.distributed as dist

            ptrs = [torch.zeros(1, dtype=I64) for _ in range(num_ranks)]
            dist.all_gather(ptrs, torch.tensor([self.buffer.data_ptr()], dtype=I64), group=group)
            self.buffer_ptrs = [int(p) for p in ptrs]


class SymmBuffer:
    """``deep_gemm.mega.SymmBuffer`` (see the module docstring): HCCL-registered symmetric buffer and its 13 views."""

    def __init__(
        self,
        group,
        num_experts,
        num_max_tokens_per_rank,
        num_topk,
        hidden,
        intermediate_hidden,
        num_shared_experts=0,
        mma_type="fp8xfp4",
        activation="swiglu",
        base=None,
    ):
        CALLS.append(
            (
                "SymmBuffer",
                {
                    "group": describe(group),
                    "num_experts": describe(num_experts),
                    "num_max_tokens_per_rank": describe(num_max_tokens_per_rank),
                    "num_topk": describe(num_topk),
                    "hidden": describe(hidden),
                    "intermediate_hidden": describe(intermediate_hidden),
                    "num_shared_experts": describe(num_shared_experts),
                    "mma_type": describe(mma_type),
                    "activation": describe(activation),
                    "base": base,
                },
            )
        )
        _py_assert(mma_type == "fp8xfp4", "Ascend MegaMoE currently supports only fp8xfp4")
        _py_assert(activation == "swiglu", "Ascend MegaMoE currently supports only swiglu")
        self.group = group
        self.num_experts = num_experts
        self.num_max_tokens_per_rank = num_max_tokens_per_rank
        self.num_topk = num_topk
        self.hidden = hidden
        self.intermediate_hidden = intermediate_hidden
        self.num_shared_experts = num_shared_experts
        self.mma_type = mma_type
        self.activation = activation

        api = "get_symm_buffer_size_for_mega_moe"
        num_bytes, slice_input_buffers = _symm_buffer_size(
            _cuint32(group.size(), api, "num_ranks"),
            _cuint32(num_experts, api, "num_experts"),
            _cuint32(num_max_tokens_per_rank, api, "num_max_tokens_per_rank"),
            _cuint32(num_topk, api, "num_topk"),
            _cuint32(hidden, api, "hidden"),
            _cuint32(intermediate_hidden, api, "intermediate_hidden"),
            _cstr(mma_type, api, "mma_type"),
            _cstr(activation, api, "activation"),
            _cuint32(num_shared_experts, api, "num_shared_experts"),
        )
        if base is None:
            rank_idx = group.rank()
            self.handle = _SymmBufferHandle(rank_idx, group.size(), group, num_bytes)
            self.buffer = self.handle.buffer
            _barrier(group)  # torch.npu.synchronize(); dist.barrier(group)
        else:
            _py_assert(
                base.buffer is not None and base.handle is not None and base.group is group,
                "Cannot reuse an invalid symmetric buffer",
            )
            _py_assert(
                num_bytes <= base.buffer.nbytes,
                f"Requires {num_bytes} bytes, but the base buffer has {base.buffer.nbytes}",
            )
            # Shared scratch must be used in order, with inputs refilled for each layout
            self.buffer = base.buffer
            self.handle = base.handle

        (
            self.x,
            self.x_sf,
            self.topk_idx,
            self.topk_weights,
            self.shared_l1_acts,
            self.shared_l1_acts_sf,
            self.shared_l2_acts,
            self.shared_l2_acts_sf,
            self.l1_acts,
            self.l1_acts_sf,
            self.l2_acts,
            self.l2_acts_sf,
            self._expert_recv_count,
        ) = slice_input_buffers(self.buffer)

    def destroy(self) -> None:
        """Drop this owner's references; views require another live owner of the allocation."""
        CALLS.append(("SymmBuffer.destroy", {}))
        self.handle = None
        self.buffer = None
        self.group = None
        self.x = self.x_sf = None
        self.topk_idx = self.topk_weights = None
        self.shared_l1_acts = self.shared_l1_acts_sf = None
        self.shared_l2_acts = self.shared_l2_acts_sf = None
        self.l1_acts = self.l1_acts_sf = None
        self.l2_acts = self.l2_acts_sf = None
        self._expert_recv_count = None

    @property
    def expert_recv_count(self) -> torch.Tensor:
        return self._expert_recv_count

    @property
    def num_bytes(self) -> int:
        return self.buffer.nbytes


def _transform_fp8_nz(t):
    # Shared FP8 weights use the NZ order consumed directly by AIC.
    shape = t.shape
    blocks = t.view(torch.uint8).reshape(*shape[:-2], shape[-2], shape[-1] // 32, 32)
    return blocks.transpose(-3, -2).contiguous().view(shape).view(t.dtype)


def _interleave_weights(t):
    # Gate/up pairs occupy one BLOCK_N block in both weight data and scale factors.
    _py_assert(t.dim() in (2, 3))
    dtype = t.dtype
    if dtype == torch.float8_e4m3fn:
        t = t.view(torch.uint8)
    *batch, n, k = t.shape
    half = n // 2
    gran = BLOCK_N // 2
    _py_assert(n % 2 == 0 and half % gran == 0)
    num_n_blocks = half // gran
    gate = t[..., :half, :].reshape(*batch, num_n_blocks, gran, k)
    up = t[..., half:, :].reshape(*batch, num_n_blocks, gran, k)
    result = torch.stack((gate, up), dim=-3).reshape(*batch, num_n_blocks, BLOCK_N, k)
    return _transform_fp8_nz(result.view(dtype)) if dtype == torch.float8_e4m3fn else result


def _reshape_weights(t):
    _py_assert(t.dim() in (2, 3))
    *batch, n, k = t.shape
    _py_assert(n % BLOCK_N == 0)
    result = t.reshape(*batch, n // BLOCK_N, BLOCK_N, k)
    return _transform_fp8_nz(result) if t.dtype == torch.float8_e4m3fn else result


def _scale_fp4_weight_sf(sf):
    # Internal dequant emits FP4 values divided by 64, so compensate once in the weight layout.
    exponent_bias = FP4_DEQUANT_EXPONENT_BIAS
    max_finite_exponent = 254
    exponent = sf.view(torch.uint8)
    valid = (exponent <= max_finite_exponent - exponent_bias) | (exponent == 255)
    if not valid.all().item():
        raise ValueError("FP4 weight scale exponent must be 0..248 or 255")
    # Exponent 0 represents 2^-127; only 255 is a special value
    exponent = torch.where(exponent == 255, exponent, exponent + exponent_bias)
    return exponent.contiguous().view(torch.int16)


@public("transform_weights_for_mega_moe")
def transform_weights_for_mega_moe(l1_weights, l2_weights, activation="swiglu"):
    """Transform routed FP4 or shared FP8 (weight, scale) pairs (the fork's pure-torch code)."""
    _py_assert(activation == "swiglu", f"Only `swiglu` activation is supported, got `{activation}`")
    _py_assert(
        isinstance(l1_weights, tuple) and isinstance(l2_weights, tuple),
        "Ascend MegaMoE requires FP4/FP8 weight-scale pairs",
    )
    _py_assert(len(l1_weights) == len(l2_weights) == 2)
    l1_w, l1_sf = l1_weights
    l2_w, l2_sf = l2_weights
    _py_assert(l1_w.shape[:-2] == l1_sf.shape[:-2] and l1_w.size(-2) == l1_sf.size(-2))
    _py_assert(l2_w.shape[:-2] == l2_sf.shape[:-2] and l2_w.size(-2) == l2_sf.size(-2))
    _py_assert(l1_w.dtype == l2_w.dtype)
    _py_assert(l1_w.dtype in (torch.int8, torch.float8_e4m3fn))
    _py_assert(l1_sf.dtype == l2_sf.dtype == torch.int16)
    _py_assert(l1_w.size(-1) * (2 if l1_w.dtype == torch.int8 else 1) == l1_sf.size(-1) * 64)
    _py_assert(l2_w.size(-1) * (2 if l2_w.dtype == torch.int8 else 1) == l2_sf.size(-1) * 64)
    l1_w = _interleave_weights(l1_w)
    l1_sf = _interleave_weights(l1_sf).transpose(-1, -2).contiguous()
    l2_w = _reshape_weights(l2_w)
    l2_sf = _reshape_weights(l2_sf).transpose(-1, -2).contiguous()
    if l1_w.dtype == torch.int8:
        l1_sf = _scale_fp4_weight_sf(l1_sf)
        l2_sf = _scale_fp4_weight_sf(l2_sf)
    l1_transformed = (l1_w, l1_sf)
    l2_transformed = (l2_w, l2_sf)
    return l1_transformed, l2_transformed


# ---------------------------------------------------------------------------------------------------------------------
# Decoding (what the kernel reads)
# ---------------------------------------------------------------------------------------------------------------------


def _l1_rows(inter):
    """For each ORIGINAL L1 row ``o`` (gate ``o < I``, up ``o >= I``): its row in the BLOCK_N-interleaved layout."""
    gran = BLOCK_N // 2
    o = torch.arange(2 * inter)
    up = (o >= inter).long()
    oo = o - inter * up
    return (oo // gran) * BLOCK_N + gran * up + oo % gran


def _sf_values(sf, exponent_bias):
    """int16 ``[n_blocks, K/64, BLOCK_N]`` (byte ``j`` of pair ``p`` -> K block ``2p + j``) -> float64 ``[n_blocks *
    BLOCK_N, K/32]`` (``2 ** (byte - 127 - exponent_bias)``, byte 255 NaN)."""
    nb, pairs, bn = sf.shape
    codes = _ref.unpack_bytes(sf.transpose(1, 2), 2)  # [nb, BLOCK_N, K/32]
    return (_ref.ue8m0_values(codes) * 2.0**-exponent_bias).reshape(nb * bn, 2 * pairs)


def _routed_weights(w, sf, e, rows=None):
    """float64 ``[N, K]`` of local expert ``e``: ``vf_fp4_to_fp8_nz`` (E2M1 / 64) times the biased UE8M0 scales."""
    nb, bn, kh = w.shape[1:]
    n, k = nb * bn, 2 * kh
    vals = _FP4_BYTE_VALUES[w[e].reshape(n, kh).view(U8).to(I64)].reshape(n, k)  # low nibble first
    scales = _sf_values(sf[e], FP4_DEQUANT_EXPONENT_BIAS)
    out = (vals.view(n, k // 32, 32) * scales.unsqueeze(-1)).view(n, k)
    return out if rows is None else out[rows]


def _shared_weights(w, sf, rows=None):
    """float64 ``[N, K]`` of the shared FFN: E4M3 in NZ order (``[n_blocks][K/32][BLOCK_N][32]`` bytes) times the
    (unbiased) UE8M0 scales."""
    nb, bn, k = w.shape
    n = nb * bn
    data = w.view(U8).reshape(nb, k // 32, bn, 32).transpose(1, 2).reshape(n, k).contiguous().view(FP8).to(F64)
    scales = _sf_values(sf, 0)
    out = (data.view(n, k // 32, 32) * scales.unsqueeze(-1)).view(n, k)
    return out if rows is None else out[rows]


def _decode_tokens(x_bytes, sf_bytes, n, hidden):
    """E4M3 ``[n, H]`` times ``2 ** (byte - 127)`` of the int16 UE8M0 pairs ``[n, H/64]`` (low byte first)."""
    x = x_bytes.contiguous().view(FP8)[:n].to(F64)
    codes = _ref.unpack_bytes(sf_bytes.contiguous().view(I16)[:n], 2)[:, : hidden // 32]
    return x * _ref.ue8m0_values(codes).repeat_interleave(32, dim=-1)


def _swiglu(h, weights, clamp, inter):
    """``vf_swiglu_quant``'s FP32 SwiGLU (simd:105-122): see the module docstring for the ``exp`` / division model."""
    gate, up = h[:, :inter].to(F32), h[:, inter:].to(F32)
    c = torch.tensor(clamp, dtype=F32)
    gate = torch.minimum(gate, c)
    up = torch.maximum(torch.minimum(up, c), -c)
    v = torch.exp((torch.tensor(0.0, dtype=F32) - gate).to(F64)).to(F32)
    v = v + torch.tensor(1.0, dtype=F32)
    v = gate / v
    v = v * up
    if weights is not None:
        v = v * weights.to(F32).unsqueeze(-1)
    return v


def _quantise(act):
    """Per token and 32 columns: the UE8M0 scale and E4M3 values of ``vf_swiglu_quant`` (simd:124-162); returns the
    float64 values the L2 GEMM reads."""
    n, inter = act.shape
    a = act.reshape(n, inter // 32, 32)
    bits = a.view(I32).to(I64) & 0x7FFFFFFF  # asc_abs, compared as uint32
    b = bits.amax(dim=-1).clamp(min=0x38D1B717)  # FP32 bits of 1e-4
    b = ((b + 0x001FFFFF) & 0x7F800000) - 0x04000000  # carry when significand > 1.75, minus 8 from the exponent
    b = b.clamp(max=0x7F000000)
    inv = _bits_to_f32(0x7F000000 - b)
    q = (a * inv.unsqueeze(-1)).clamp(-448.0, 448.0).to(FP8)  # asc_float2e4m3_rn_sat
    return (q.to(F64) * _ref.ue8m0_values(b >> 23).unsqueeze(-1)).reshape(n, inter)


def _ffn(x, w1, w2, weights, clamp, inter):
    """L1 -> SwiGLU -> requantisation -> L2 for rows ``x`` (float64) with float64 weights; BF16 ``[n, H]``."""
    h = _ref.mm_nt(x, w1).to(F32).to(BF16)
    act = _swiglu(h, weights, clamp, inter)
    return _ref.mm_nt(_quantise(act), w2).to(F32).to(BF16)


# ---------------------------------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------------------------------


def _jit_static_asserts(num_ranks, num_experts, hidden, inter, shared_inter):
    """The kernel's ``static_assert``s the JIT compile of this launch's template arguments can fail."""
    asserts = [
        (
            hidden // BLOCK_N <= 255 and inter // (BLOCK_N // 2) <= 255 and shared_inter // (BLOCK_N // 2) <= 255,
            KERNEL,
            "config.hidden / BLOCK_N <= UINT8_MAX and config.intermediate_hidden / (BLOCK_N / 2) <= UINT8_MAX and "
            "config.shared_intermediate_hidden / (BLOCK_N / 2) <= UINT8_MAX",
        ),
        (
            num_experts * 4 + num_ranks * 8 <= UB_SIZE_BYTES,
            COMM,
            'sizeof(expert_token_count) + config.num_ranks * sizeof(int64_t) <= UBSizeBytes, "Metadata UB overflow"',
        ),
    ]
    for ok, file, cond in asserts:
        if not ok:
            raise RuntimeError(f"{PREFIX}JIT compilation failed ({file}): static_assert({cond})")


def _exchange_config(group, num_ranks, rank, config, num_tokens):
    """all_gather_object of (rank, config, T) over the buffer's group; Panic on every rank if they disagree."""
    mine = (rank, config, num_tokens)
    if num_ranks == 1:
        table = [mine]
    else:
        import torch.distributed as dist

        table = [None] * num_ranks
        dist.all_gather_object(table, mine, group=group)
    configs = {r: c for r, c, _ in table}
    if len(set(configs.values())) > 1 or sorted(r for r, _, _ in table) != list(range(num_ranks)):
        panic(
            "the ranks' buffers / calls disagree (rank: (num_ranks, num_max_tokens_per_rank, num_experts, num_topk, "
            f"hidden, intermediate_hidden, num_shared_experts)): {[(r, c) for r, c, _ in table]}; the kernels would "
            "read each other's buffers with different layouts"
        )
    tokens = [0] * num_ranks
    for r, _, t in table:
        tokens[r] = t
    return tokens


def _run(y, l1, l2, shared_l1, shared_l2, stats, buffer, ws, group, cfg, rank, num_tokens, clamp):
    """Dispatch, the routed and shared FFNs and the combine across the group (after all host checks)."""
    num_ranks, t_max, num_experts, num_topk, hidden, inter, num_shared = cfg
    experts_per_rank = num_experts // num_ranks
    all_tokens = _exchange_config(group, num_ranks, rank, cfg, num_tokens)
    t_top = max(all_tokens)

    # Dispatch: every rank's first max(T) input rows (x, x_sf, topk_idx, topk_weights) as bytes
    x_view = _slice_buffer(buffer, ws.x, (t_max, hidden), FP8)
    sf_view = _slice_buffer(buffer, ws.x_sf, (t_max, ws.num_input_sf_pairs), I16)
    idx_view = _slice_buffer(buffer, ws.topk_idx, (t_max, num_topk), I64)
    w_view = _slice_buffer(buffer, ws.topk_weights, (t_max, num_topk), F32)
    srcs = []
    if t_top > 0:
        parts = [_as_bytes(v[:t_top]) for v in (x_view, sf_view, idx_view, w_view)]
        widths = [p.shape[1] for p in parts]
        for s, blob in enumerate(_all_gather_bytes(group, num_ranks, torch.cat(parts, dim=1))):
            cols = torch.split(blob, widths, dim=1)
            n = all_tokens[s]
            xs = _decode_tokens(cols[0], cols[1], n, hidden)
            idx = cols[2].contiguous().view(I64)[:n]
            valid = (idx >= 0) & (idx < num_experts)  # (uint64) expert_idx < num_experts
            w = cols[3].contiguous().view(F32)[:n]
            srcs.append((xs, idx, valid, w))

    # Local experts: L1 -> SwiGLU -> requantisation -> L2 for every (rank, token, slot) routed here
    recv = torch.zeros((num_ranks, experts_per_rank), dtype=I64)
    contrib = torch.zeros((num_ranks, t_top, num_topk, hidden), dtype=BF16)
    rows = _l1_rows(inter)
    for e_local in range(experts_per_rank):
        e = rank * experts_per_rank + e_local
        hits = [(s, ((idx == e) & valid).nonzero()) for s, (_, idx, valid, _) in enumerate(srcs)]
        for s, hh in hits:
            recv[s, e_local] = hh.shape[0]
        if sum(hh.shape[0] for _, hh in hits) == 0:
            continue
        xin = torch.cat([srcs[s][0][hh[:, 0]] for s, hh in hits])
        win = torch.cat([srcs[s][3][hh[:, 0], hh[:, 1]] for s, hh in hits])
        w1 = _routed_weights(l1[0], l1[1], e_local, rows)
        w2 = _routed_weights(l2[0], l2[1], e_local)
        yk = _ffn(xin, w1, w2, win, clamp, inter)
        off = 0
        for s, hh in hits:
            contrib[s, hh[:, 0], hh[:, 1]] = yk[off : off + hh.shape[0]]
            off += hh.shape[0]

    # build_dispatch_metadata: every rank writes its counts into each destination's expert_recv_count[src_rank]
    _slice_buffer(buffer, ws.expert_recv_count, (num_ranks, experts_per_rank), I32).copy_(recv.to(I32))

    if t_top > 0:
        # Shared experts: the home rank's own tokens, no routing weight, one FFN of width SI, combine slot num_topk
        xs, my_idx, my_valid, _ = srcs[rank]
        shared_y = None
        if num_shared > 0 and num_tokens > 0:
            si = num_shared * inter
            sw1 = _shared_weights(shared_l1[0], shared_l1[1], _l1_rows(si))
            sw2 = _shared_weights(shared_l2[0], shared_l2[1])
            shared_y = _ffn(xs, sw1, sw2, None, clamp, si)

        # Combine on the home ranks: valid slots in order from +0.0f, then the shared slot; RN to BF16 once
        gathered = _all_gather_bytes(group, num_ranks, contrib.view(U8).reshape(num_ranks, -1))
        mine = torch.stack([g[rank].view(BF16).view(t_top, num_topk, hidden)[:num_tokens] for g in gathered])
        tokens = torch.arange(num_tokens)
        acc = torch.zeros((num_tokens, hidden), dtype=F32)
        for k in range(num_topk):
            ids = my_idx[:, k]
            picked = mine[ids.clamp(0, num_experts - 1) // experts_per_rank, tokens, k].to(F32)
            acc = torch.where(my_valid[:, k].unsqueeze(-1), acc + picked, acc)
        if shared_y is not None:
            acc = acc + shared_y.to(F32)
        y.copy_(acc.to(BF16))
    if stats is not None:  # wait_dispatch_metadata: atomic int32 add of the received routes
        stats.add_(recv.sum(dim=0).to(I32))


def _c_fp8_fp4_mega_moe(
    y,
    l1_weights,
    l2_weights,
    shared_l1_weights,
    shared_l2_weights,
    stats,
    sym_buffer,
    sym_buffer_ptrs,
    rank_idx,
    num_max_tokens_per_rank,
    num_experts,
    num_topk,
    hidden,
    intermediate_hidden,
    num_shared_experts,
    recipe,
    activation,
    activation_clamp_opt,
    fast_math,
    group,
):
    """``_C.fp8_fp4_mega_moe`` (csrc/apis/mega_moe.hpp:128-204); ``group`` is the stand-in's channel to the peers."""
    api = "fp8_fp4_mega_moe"
    # pybind11 conversion
    y = _tensor(y, api, "y")
    l1 = _pair(l1_weights, api, "l1_weights_tuple")
    l2 = _pair(l2_weights, api, "l2_weights_tuple")
    shared_l1 = _opt_pair(shared_l1_weights, api, "shared_l1_weights_tuple_opt")
    shared_l2 = _opt_pair(shared_l2_weights, api, "shared_l2_weights_tuple_opt")
    stats = _opt_tensor(stats, api, "cumulative_local_expert_recv_stats")
    buffer = _tensor(sym_buffer, api, "sym_buffer")
    if not isinstance(sym_buffer_ptrs, (list, tuple)):
        incompatible(api, "'sym_buffer_ptrs' must be a list of ints")
    ptrs = [_cinteger(p, api, "sym_buffer_ptrs", -(2**63), 2**63, "a 64-bit int") for p in sym_buffer_ptrs]
    rank_idx = _cint32(rank_idx, api, "rank_idx")
    t_max = _cint32(num_max_tokens_per_rank, api, "num_max_tokens_per_rank")
    num_experts = _cint32(num_experts, api, "num_experts")
    num_topk = _cint32(num_topk, api, "num_topk")
    hidden = _cint32(hidden, api, "hidden")
    inter = _cint32(intermediate_hidden, api, "intermediate_hidden")
    num_shared = _cint32(num_shared_experts, api, "num_shared_experts")
    if not (isinstance(recipe, (tuple, list)) and len(recipe) == 3):
        incompatible(api, f"'recipe' must be a tuple of 3 ints, got {recipe!r}")
    recipe = tuple(_cint32(v, api, "recipe") for v in recipe)
    activation = _cstr(activation, api, "activation")
    clamp_opt = _cfloat_opt(activation_clamp_opt, api, "activation_clamp_opt")
    fast_math = bool(fast_math)

    # Config checks
    check(recipe == (1, 1, 32), at(API, 147), "rm == 1 and rn == 1 and rk == 32")
    check(activation == "swiglu" and fast_math, at(API, 148), 'activation == "swiglu" and fast_math')
    check(
        t_max > 0 and num_experts > 0 and num_topk > 0,
        at(API, 149),
        "num_max_tokens_per_rank > 0 and num_experts > 0 and num_topk > 0",
    )
    check(
        hidden > 0 and inter > 0 and num_shared >= 0,
        at(API, 150),
        "hidden > 0 and intermediate_hidden > 0 and num_shared_experts >= 0",
    )
    num_ranks = len(ptrs)
    ws = _get_workspace(num_ranks, num_experts, t_max, num_topk, hidden, inter, num_shared)
    check(
        y.dim() == 2 and y.size(0) <= t_max and y.size(1) == hidden,
        at(API, 155),
        "y.dim() == 2 and y.size(0) <= num_max_tokens_per_rank and y.size(1) == hidden",
    )
    check(
        (shared_l1 is not None) == (num_shared > 0) and (shared_l2 is not None) == (num_shared > 0),
        at(API, 156),
        "shared_l1_weights_tuple_opt.has_value() == (num_shared_experts > 0) and "
        "shared_l2_weights_tuple_opt.has_value() == (num_shared_experts > 0)",
    )
    num_tokens = int(y.size(0))
    check((STATE.num_sms or ASCEND_AI_CORES) == NUM_AI_CORES, at(API, 159), "runtime->get_num_sms() == kNumAICores")

    # Registered allocations must remain valid until completion
    check(0 <= rank_idx < num_ranks, at(API, 162), "rank_idx >= 0 and rank_idx < num_ranks")
    check(
        buffer.dim() == 1 and buffer.dtype == I8 and buffer.is_contiguous(),
        at(API, 163),
        "sym_buffer.dim() == 1 and sym_buffer.scalar_type() == torch::kInt8 and sym_buffer.is_contiguous()",
    )
    check(buffer.nbytes >= ws.num_bytes, at(API, 164), "sym_buffer.nbytes() >= workspace.get_num_bytes()")
    check(
        ptrs[rank_idx] == buffer.data_ptr(),
        at(API, 166),
        "sym_buffer_ptrs[rank_idx] == reinterpret_cast<int64_t>(sym_buffer.data_ptr())",
    )
    check(
        y.dtype == BF16 and y.is_contiguous(),
        at(API, 167),
        "y.scalar_type() == torch::kBFloat16 and y.is_contiguous()",
    )

    # Check stats counter
    experts_per_rank = num_experts // num_ranks
    if stats is not None:
        check(stats.dtype == I32, at(API, 173), "cumulative_local_expert_recv_stats->scalar_type() == torch::kInt32")
        check(
            stats.numel() == experts_per_rank,
            at(API, 174),
            "cumulative_local_expert_recv_stats->numel() == num_experts_per_rank",
        )
        check(stats.is_contiguous(), at(API, 175), "cumulative_local_expert_recv_stats->is_contiguous()")

    # Check transformed weights and scales
    si = ws.shared_intermediate_hidden
    _check_weights(l1, inter // (BLOCK_N // 2), hidden, experts_per_rank)
    _check_weights(l2, hidden // BLOCK_N, inter, experts_per_rank)
    if num_shared > 0:
        _check_weights(shared_l1, si // (BLOCK_N // 2), hidden)
        _check_weights(shared_l2, hidden // BLOCK_N, si)
    clamp = float("inf") if clamp_opt is None else clamp_opt
    check(clamp >= 0, at(API, 191), "activation_clamp >= 0")
    clamp = float(torch.tensor(clamp, dtype=F32).to(BF16).to(F32))  # static_cast<float>(c10::BFloat16(clamp))

    # launch_mega_moe: JIT compile, then (unless dry run) the kernel
    _jit_static_asserts(num_ranks, num_experts, hidden, inter, si)
    if STATE.dry_run:
        return
    cfg = (num_ranks, t_max, num_experts, num_topk, hidden, inter, num_shared)
    _run(y, l1, l2, shared_l1, shared_l2, stats, buffer, ws, group, cfg, rank_idx, num_tokens, clamp)


def _check_weights(weights_tuple, num_n_blocks, num_k, num_experts_per_rank=0):
    """``check_weights`` (csrc/apis/mega_moe.hpp:112-126); shared weights (``num_experts_per_rank == 0``) omit the
    expert dimension and store unpacked FP8 data."""
    weights, weights_sf = weights_tuple
    is_shared = num_experts_per_rank == 0
    check(
        weights.dtype == (FP8 if is_shared else I8) and weights.is_contiguous(),
        at(API, 116),
        "weights.scalar_type() == (is_shared ? torch::kFloat8_e4m3fn : torch::kInt8) and weights.is_contiguous()",
    )
    check(
        weights_sf.dtype == I16 and weights_sf.is_contiguous(),
        at(API, 117),
        "weights_sf.scalar_type() == torch::kInt16 and weights_sf.is_contiguous()",
    )
    weight_shape = (num_experts_per_rank, num_n_blocks, BLOCK_N, num_k // (1 if is_shared else 2))
    sf_shape = (num_experts_per_rank, num_n_blocks, num_k // MX_SF_DIVISOR, BLOCK_N)
    check(
        tuple(weights.shape) == weight_shape[is_shared:],
        at(API, 123),
        "weights.sizes() == torch::IntArrayRef(weight_shape + is_shared, 4 - is_shared)",
    )
    check(
        tuple(weights_sf.shape) == sf_shape[is_shared:],
        at(API, 124),
        "weights_sf.sizes() == torch::IntArrayRef(sf_shape + is_shared, 4 - is_shared)",
    )


@public("fp8_fp4_mega_moe")
def fp8_fp4_mega_moe(
    y,
    l1_weights,
    l2_weights,
    sym_buffer,
    shared_l1_weights=None,
    shared_l2_weights=None,
    cumulative_local_expert_recv_stats=None,
    recipe=(1, 1, 32),
    activation="swiglu",
    activation_clamp=None,
    fast_math=True,
):
    """FP8 tokens (1x32 UE8M0 pairs) x transformed FP4 routed / FP8 shared weights: see the module docstring."""
    _py_assert(sym_buffer.buffer is not None and sym_buffer.handle is not None)
    _c_fp8_fp4_mega_moe(
        y,
        l1_weights,
        l2_weights,
        shared_l1_weights,
        shared_l2_weights,
        cumulative_local_expert_recv_stats,
        sym_buffer.buffer,
        sym_buffer.handle.buffer_ptrs,
        sym_buffer.group.rank(),
        sym_buffer.num_max_tokens_per_rank,
        sym_buffer.num_experts,
        sym_buffer.num_topk,
        sym_buffer.hidden,
        sym_buffer.intermediate_hidden,
        sym_buffer.num_shared_experts,
        recipe,
        activation,
        activation_clamp,
        fast_math,
        sym_buffer.group,
    )


mega = types.ModuleType("deep_gemm.mega", "DeepGEMM-Ascend Mega MoE (stand-in)")
mega.BLOCK_N = BLOCK_N
mega.SymmBuffer = SymmBuffer
mega.transform_weights_for_mega_moe = transform_weights_for_mega_moe
mega.fp8_fp4_mega_moe = fp8_fp4_mega_moe

EXPORTS = {
    "mega": mega,
    "SymmBuffer": SymmBuffer,
    "transform_weights_for_mega_moe": transform_weights_for_mega_moe,
    "fp8_fp4_mega_moe": fp8_fp4_mega_moe,
}

__all__ = ["BLOCK_N", "EXPORTS", "mega"]
