"""The "cuda" flavor's Mega MoE (DeepGEMM 2.6.1, deepseek-ai/DeepGEMM @ 54e2261): fused EP dispatch -> L1 GEMM ->
SwiGLU (clamp, routing weight, per-32 UE8M0 FP8 quantisation) -> L2 GEMM -> combine, on CPU tensors.

Sources: ``deep_gemm/mega/__init__.py`` (the Python API: ``SymmBuffer``, ``get_symm_buffer_for_mega_moe``,
``_interleave_weights``, ``_transpose_sf_for_utccp``, ``transform_weights_for_mega_moe``, ``fp8_fp4_mega_moe``,
``bf16_mega_moe``, ported line for line), ``csrc/apis/mega.hpp`` (host checks, ``get_token_alignment_for_mega_moe``,
``get_ring_limit_for_mega_moe``, ``get_symm_buffer_size_for_mega_moe`` and its ``slice_input_buffers``),
``csrc/jit_kernels/heuristics/mega_moe.hpp`` (``get_num_wave_pool_tokens``, ``get_mega_moe_config``'s host asserts),
``csrc/jit_kernels/impls/sm100_{fp8_fp4,bf16}_mega_moe.hpp``, ``deep_gemm/include/deep_gemm/layout/{mega_moe,
sym_buffer}.cuh`` (buffer layout, byte for byte), ``deep_gemm/include/deep_gemm/scheduler/mega_moe.cuh`` and the
kernels ``deep_gemm/include/deep_gemm/impls/sm100_{fp8_fp4,bf16}_mega_moe.cuh`` (what is computed, rounding points,
static asserts), ``deep_gemm/include/deep_gemm/common/math.cuh`` (``get_e4m3_sf_and_sf_inv``), and
``tests/test_mega_moe.py`` (how callers fill the buffer and transform the weights).

API modelled
------------
* ``get_symm_buffer_for_mega_moe(group, num_experts, num_max_tokens_per_rank, num_topk, hidden,
  intermediate_hidden, use_fp8_dispatch=None, mma_type='fp8xfp4', activation='swiglu') -> SymmBuffer``: rounds
  ``num_max_tokens_per_rank`` up to 384 (``get_token_alignment_for_mega_moe``), picks ``num_ring_tokens`` exactly as
  upstream (768 * 1024 tokens when ``T_max >= 6144``, else the EP72 / 4K-token decode size, clamped into
  ``get_ring_limit_for_mega_moe``), ``DeprecationWarning`` for ``use_fp8_dispatch``.
* ``SymmBuffer(group, num_experts, num_max_tokens_per_rank, num_topk, hidden, intermediate_hidden, num_ring_tokens,
  mma_type='fp8xfp4', activation='swiglu')``: one zeroed CPU ``int8`` buffer of exactly
  ``get_symm_buffer_size_for_mega_moe`` bytes (workspace, inputs, rings, combine buffer: the upstream byte layout)
  and upstream's views into it, at upstream's byte offsets: ``x [T_max, H]`` (FP8 E4M3 / BF16), ``x_sf [T_max,
  H / 128]`` int32 K-major (fp8xfp4; ``None`` in bf16xbf16), ``topk_idx [T_max, K]`` int64, ``topk_weights [T_max,
  K]`` float32, ``l1_acts [R_ring, H]``, ``l1_acts_sf [R_sf, H / 128]`` int32 strides ``(1, R_sf)``, ``l2_acts
  [R_ring, I]``, ``l2_acts_sf [R_sf, I / 128]`` strides ``(1, R_sf)``. Construction is collective on ``group``
  (gloo process groups: an ``all_gather`` of the buffers' addresses stands for ``symm_mem.rendezvous``; a group of
  size 1, or any object with ``size() == 1``, ``rank()`` and ``barrier()``, uses no collective), then
  ``group.barrier()``. ``destroy()`` drops exactly what upstream drops (``handle``, ``buffer``, ``group``, ``x``,
  ``x_sf``).
* ``transform_weights_for_mega_moe(l1_weights, l2_weights, activation='swiglu')``: upstream's pure-torch code.
* ``fp8_fp4_mega_moe(y, l1_weights, l2_weights, sym_buffer, cumulative_local_expert_recv_stats=None,
  recipe=(1, 1, 32), activation='swiglu', activation_clamp=None, fast_math=True)`` and ``bf16_mega_moe(y, l1_weights,
  l2_weights, sym_buffer, cumulative_local_expert_recv_stats=None, activation='swiglu', activation_clamp=None,
  fast_math=True)``: collective (every rank of the buffer's group calls it); each rank's tokens are the first
  ``y.shape[0]`` rows of its buffer's ``x`` / ``x_sf`` / ``topk_idx`` / ``topk_weights``; ``y`` is written in place.
  Host checks of ``mega.hpp`` in order with its line numbers; the host asserts of the heuristics
  (``mega_moe.hpp:82,144,241,283``, ``mega_moe.cuh:208``); the kernels' static asserts surface as upstream's JIT
  failure ``Assertion error (csrc/jit/compiler.hpp:228): false and "NVCC compilation failed"`` (the failing
  ``static_assert`` printed first, as upstream prints NVCC's output). SM90: ``fp8_fp4_mega_moe`` with packed FP4
  weights stops at ``csrc/utils/layout.hpp:57`` (``check_grouped_ab_fp8_fp4``), anything that gets further at
  ``mega.hpp:247`` / ``mega.hpp:327`` ``Unsupported architecture`` (``DG_HOST_UNREACHABLE``).

Math (per (token t, slot k) with ``e = topk_idx[t, k] >= 0``, computed on rank ``e // E_r`` with local expert
``e % E_r``, weights read in their TRANSFORMED layout exactly as the kernel reads them)
---------------------------------------------------------------------------------------------------------------------
* ``x`` decoded exactly: E4M3 times ``2 ** (byte - 127)`` of byte ``c // 32 % 4`` of ``x_sf[t, c // 128]``; BF16 as is.
* L1 weights: row ``j`` of the transformed ``[E_r, 2I, H/2]`` int8 (packed E2M1, element ``2i`` in the low nibble)
  is gate/up-interleaved (``_interleave_weights``: rows ``16q .. 16q+7`` are gate ``8q ..``, ``16q+8 .. 16q+15`` are
  up ``8q ..``); its 1x32 UE8M0 scales are read from the int32 MN-major scale tensor at row ``128c + 4b + a`` for
  logical row ``128c + 32a + b`` (the UTCCP 4x32 transposition ``_transpose_sf_for_utccp`` undoes), byte ``kb % 4``
  of word ``kb // 4``. The same for L2 (``[E_r, H, I/2]``, no interleave). BF16: the interleaved ``[E_r, 2I, H]``.
  So untransformed weights or scales give a different (wrong) result, as on the device.
* ``h = bf16(fp32(x_deq @ W1_e^T))`` (float64 dot products rounded once to FP32, then RN to BF16; the MMA
  accumulates in FP32, ``sm100_fp8_fp4_mega_moe.cuh:997-998``); ``gate = h[:I]``, ``up = h[I:]`` in the original
  (de-interleaved) order.
* Clamp (``activation_clamp`` not None / not +inf; the value arrives as a C++ ``float``, and the kernel compares
  with ``__nv_bfloat16(c)``, i.e. ``c`` rounded to FP32 then RN to BF16, ``.cuh:1001-1005``): ``gate =
  fmin(gate, c)``, ``up = fmin(fmax(up, -c), c)`` (``__hmin2`` / ``__hmax2`` return the non-NaN operand).
* SwiGLU in FP32, each step rounded to FP32 as the kernel's ``__fadd2_rn`` / ``__fmul2_rn`` do (``.cuh:1008-1019``):
  ``e = exp(-gate)``, ``d = 1 + e``, ``s = gate / d``, ``act = (s * up) * topk_weights[t, k]``. ``exp`` is
  modelled as correctly rounded and ``/`` as IEEE division for BOTH values of ``fast_math``: the kernel uses
  ``__expf`` + ``rcp.approx.ftz`` (``fast_math=True``) or CUDA ``expf`` (up to 2 ulp) + IEEE division
  (``fast_math=False``); none of them is pinned bit-exactly by the source, so the stand-in's SwiGLU can differ
  from the device's by a few FP32 ulps before quantisation.
* fp8xfp4 (``.cuh:1022-1100``, ``math.cuh:78-99``): per token and 32 consecutive intermediate columns ``amax =
  max |act|`` (no floor: an all-zero group gets ``sf = 0`` bits, UE8M0 byte 0), ``scaled = fp32(amax *
  fp32(1/448))``, ``ex = (bits(scaled) >> 23) - 127 + (mantissa != 0)``, ``sf = bits((ex + 127) << 23)``,
  ``sf_inv = bits((127 - ex) << 23)``, ``act_q = e4m3_satfinite_rn(fp32(act * sf_inv))``, L2 scale byte
  ``bits(sf) >> 23``; the L2 input is ``act_q * 2 ** (byte - 127)``. bf16xbf16: ``act_q = bf16(act)`` (``sm100_bf16_
  mega_moe.cuh:928``).
* ``y_k = bf16(fp32(act_deq @ W2_e^T))``; combine on the token's home rank (``.cuh:1336-1362``):
  ``y[t] = bf16(((0 + y_k0) + y_k1) + ...)`` in FP32, slots in increasing ``k``, negative ids skipped (all
  negative -> +0).
* ``cumulative_local_expert_recv_stats[e_local] += (token, slot) pairs of every rank routed to it`` (int32 add).
* ``DG_COMM_KERNEL_DEBUG`` set to a non-zero int: the whole buffer is zeroed after the call (``mega.hpp:252``).

Simplifications (documented, not upstream behaviour)
----------------------------------------------------
* The ring views ``l1_acts`` / ``l1_acts_sf`` / ``l2_acts`` / ``l2_acts_sf``, the workspace and the combine buffer
  are never written (the kernel uses them as scratch and leaves the workspace zeroed); inputs stay as the caller
  left them.
* Communication is ``torch.distributed`` collectives on the buffer's group: ``all_gather_object`` of each rank's
  configuration (and of any local Panic, so every rank raises it), ``all_gather`` of each rank's first ``max T``
  input rows, ``all_gather`` of the per-slot L2 outputs. Ranks whose buffers or calls disagree (``T_max``, ``E``,
  ``K``, ``H``, ``I``, mode, ring size, rank count) raise ``Panic`` on every rank. A rank failing a HOST check raises
  alone, as upstream, and the other ranks then block in the collective until the group's timeout (upstream: in the
  kernel's NVLink barrier).
* ``get_mega_moe_config``'s combine chunk count is taken as 1 for ``H <= 4096`` and 2 above (upstream also bounds it
  by the kernel's reusable shared memory, which is never the limit at ``H <= 4096``).
* Only the stand-in's own ``int8`` buffer can be sliced (Panic otherwise).

``Panic`` (the kernel would not raise but write or compute garbage): ``y`` not a contiguous BF16 ``[T, H]`` tensor
(the kernel TMA-stores dense BF16 rows at ``y.data_ptr()``); a buffer built for another mode / ``H`` / ``I`` than the
call's weights (the kernel slices it with another layout); FP8 E4M3 weights given to ``fp8_fp4_mega_moe`` (the
kernel reads them as unpacked E2M1); ``topk_idx`` values ``>= num_experts`` or outside int32 (out-of-range expert
counters / truncation).
"""

from __future__ import annotations

import operator
import os
import types
import warnings

import torch

from . import _ref
from ._cuda import (
    BF16,
    F32,
    FP8,
    I32,
    K_MAJOR,
    _check_grouped_ab_fp8_fp4,
    _check_sf_layout,
    _major_ab,
    _num_sms,
    _opt_tensor,
    _pair,
    _shape,
    _tensor,
    _tma,
    at,
)
from ._ref import F64, align
from ._standin import CALLS, PREFIX, STATE, check, describe, fail, incompatible, panic, public

I64, U8, I8 = torch.int64, torch.uint8, torch.int8

MEGA = "csrc/apis/mega.hpp"
HEUR = "csrc/jit_kernels/heuristics/mega_moe.hpp"
LAYOUT_MEGA = "deep_gemm/include/deep_gemm/layout/mega_moe.cuh"
SYM_BUFFER = "deep_gemm/include/deep_gemm/layout/sym_buffer.cuh"
SCHED = "deep_gemm/include/deep_gemm/scheduler/mega_moe.cuh"
KERNEL = {
    "fp8xfp4": "deep_gemm/include/deep_gemm/impls/sm100_fp8_fp4_mega_moe.cuh",
    "bf16xbf16": "deep_gemm/include/deep_gemm/impls/sm100_bf16_mega_moe.cuh",
}
COMPILER = "csrc/jit/compiler.hpp"

# deep_gemm/include/deep_gemm/layout/mega_moe.cuh:10-14
CANDIDATE_BLOCK_M = (8, 16, 32, 64, 96, 128, 192)
MAX_CANDIDATE_BLOCK_M, MIN_CANDIDATE_BLOCK_M, LCM_CANDIDATE_BLOCK_M = 192, 8, 384
# layout/mega_moe.cuh:55, TokenSrcMetadata (3 x uint32), sym_buffer.cuh:7
NUM_BARRIER_SIGNAL_BYTES, TOKEN_SRC_METADATA_BYTES, MAX_RANKS = 32, 12, 72
# csrc/jit_kernels/heuristics/sm100.hpp:15
SM100_SMEM_CAPACITY = 232448


# ---------------------------------------------------------------------------------------------------------------------
# pybind11 argument conversion
# ---------------------------------------------------------------------------------------------------------------------


def _cint(x, api, arg):
    """pybind11's ``int`` caster: ints and objects with ``__index__``, never floats."""
    if isinstance(x, float):
        incompatible(api, f"'{arg}' must be an int, got {x!r}")
    try:
        return operator.index(x)
    except TypeError:
        incompatible(api, f"'{arg}' must be an int, got {type(x).__name__}")


def _cstr(x, api, arg):
    if not isinstance(x, str):
        incompatible(api, f"'{arg}' must be a str, got {type(x).__name__}")
    return x


def _cfloat_opt(x, api, arg):
    """``std::optional<float>``: None, or a Python number rounded to a C++ float."""
    if x is None:
        return None
    try:
        return float(torch.tensor(float(x), dtype=torch.float64).to(F32))
    except (TypeError, ValueError):
        incompatible(api, f"'{arg}' must be a float or None, got {x!r}")


def _py_assert(ok, msg=None):
    """A Python ``assert`` of ``deep_gemm/mega/__init__.py`` (kept under ``python -O``)."""
    if not ok:
        raise AssertionError(*(() if msg is None else (msg,)))


# ---------------------------------------------------------------------------------------------------------------------
# csrc/apis/mega.hpp + heuristics/mega_moe.hpp + layout/mega_moe.cuh: sizes and layout
# ---------------------------------------------------------------------------------------------------------------------


def _num_wave_pool_tokens(num_ranks, num_topk, num_max_tokens_per_rank, num_experts_per_wave, block_m):
    """``get_num_wave_pool_tokens`` (heuristics/mega_moe.hpp:80-93)."""
    check(num_max_tokens_per_rank % block_m == 0, at(HEUR, 82), "num_max_tokens_per_rank % block_m == 0")
    n = num_max_tokens_per_rank * num_ranks
    if num_experts_per_wave == 1:
        return n
    return min(n * num_experts_per_wave, align(n * num_topk + num_experts_per_wave * (block_m - 1), block_m))


def _ring_limit(num_max_tokens_per_rank, num_experts_per_rank, num_topk, num_ranks):
    """``get_ring_limit_for_mega_moe`` (mega.hpp:22-28)."""
    return (
        _num_wave_pool_tokens(num_ranks, num_topk, num_max_tokens_per_rank, 1, LCM_CANDIDATE_BLOCK_M),
        _num_wave_pool_tokens(
            num_ranks, num_topk, num_max_tokens_per_rank, num_experts_per_rank, LCM_CANDIDATE_BLOCK_M
        ),
    )


def _data(num_bytes, require_tma_alignment=True):
    """``layout::Data`` (layout/mega_moe.cuh:203-209): a host assert on the host side."""
    check(
        num_bytes % 16 == 0 or not require_tma_alignment,
        at(LAYOUT_MEGA, 208),
        "num_bytes % 16 == 0 or not require_tma_alignment",
    )
    return num_bytes


def _workspace_bytes(num_ranks, num_experts, num_max_tokens_per_rank, num_topk, num_ring_tokens):
    """``layout::Workspace::get_num_bytes`` (layout/mega_moe.cuh:58-108)."""
    experts_per_rank = num_experts // num_ranks
    max_recv_per_expert = num_ranks * num_max_tokens_per_rank
    max_pool_tokens = align(
        num_ranks * num_max_tokens_per_rank * min(num_topk, experts_per_rank)
        + experts_per_rank * (MAX_CANDIDATE_BLOCK_M - 1),
        LCM_CANDIDATE_BLOCK_M,
    )
    ring_blocks = num_ring_tokens // MIN_CANDIDATE_BLOCK_M
    n = NUM_BARRIER_SIGNAL_BYTES
    n += num_experts * 8 * 2  # expert send/recv counts
    n += experts_per_rank * 8  # expert recv count sums
    n += 4 * ring_blocks * 4  # L1/L2 full/empty ring counters
    n += experts_per_rank * num_ranks * max_recv_per_expert * 4  # dispatch pull source indices
    n += max_pool_tokens * TOKEN_SRC_METADATA_BYTES  # combine source metadata
    return align(n, 16)


def _num_sf_ring_tokens(num_ring_tokens):
    """mega.hpp:81-87 with ``get_num_sf_ring_tokens`` (layout/mega_moe.cuh:28-31)."""
    return max((num_ring_tokens // bm) * align(bm, 128) for bm in CANDIDATE_BLOCK_M)


def _symm_buffer_size(
    num_ranks, num_experts, num_max_tokens_per_rank, num_topk, hidden, intermediate_hidden, mma_type, activation, ring
):
    """``get_symm_buffer_size_for_mega_moe`` (mega.hpp:30-159): ``(num_bytes, slice_input_buffers)``."""
    check(num_experts % num_ranks == 0, at(MEGA, 37), "num_experts % num_ranks == 0")
    check(activation == "swiglu", at(MEGA, 38), 'activation == "swiglu"')
    experts_per_rank = num_experts // num_ranks
    lo, hi = _ring_limit(num_max_tokens_per_rank, experts_per_rank, num_topk, num_ranks)
    check(ring % LCM_CANDIDATE_BLOCK_M == 0, at(MEGA, 44), "num_ring_tokens % layout::kLCMCandidateBlockM == 0")
    check(
        lo <= ring <= hi,
        at(MEGA, 45),
        "num_min_ring_tokens <= num_ring_tokens and num_ring_tokens <= num_max_ring_tokens",
    )
    if mma_type != "bf16xbf16":  # parse_mma_kind (heuristics/mega_moe.hpp:65-70)
        check(mma_type == "fp8xfp4", at(HEUR, 68), 'mma_type_str == "fp8xfp4"')
    with_sf = mma_type == "fp8xfp4"
    eb = 1 if with_sf else 2
    ws = _workspace_bytes(num_ranks, num_experts, num_max_tokens_per_rank, num_topk, ring)
    # Layouts (mega.hpp:57-64); C++ integer division
    token = _data(hidden * eb)
    bf16_token = _data(hidden * 2)
    inter_token = _data(intermediate_hidden * eb)
    input_sf = _data(hidden // 32 if with_sf else 0)
    inter_sf = _data(intermediate_hidden // 32 if with_sf else 0)
    topk_idx_l = _data(num_topk * 8, False)
    topk_w_l = _data(num_topk * 4, False)
    l1_topk_w_l = _data(4, False)
    # Buffers (mega.hpp:67-111): (base, end)
    x_base = ws
    sf_base = x_base + num_max_tokens_per_rank * token
    sf_end = sf_base + num_max_tokens_per_rank * input_sf
    idx_base = sf_end if with_sf else sf_base
    w_base = idx_base + num_max_tokens_per_rank * topk_idx_l
    l1_base = w_base + num_max_tokens_per_rank * topk_w_l
    num_sf_ring = _num_sf_ring_tokens(ring)
    l1_sf_base = l1_base + ring * token
    l1_sf_end = l1_sf_base + num_sf_ring * input_sf
    l1_w_base = l1_sf_end if with_sf else l1_sf_base
    l2_base = l1_w_base + ring * l1_topk_w_l
    l2_sf_base = l2_base + ring * inter_token
    l2_sf_end = l2_sf_base + num_sf_ring * inter_sf
    combine_base = l2_sf_end if with_sf else l2_sf_base
    num_bytes = combine_base + num_topk * num_max_tokens_per_rank * bf16_token
    if with_sf:
        check(
            hidden % 128 == 0 and intermediate_hidden % 128 == 0,
            at(MEGA, 115),
            "hidden % 128 == 0 and intermediate_hidden % 128 == 0",
        )
        check(num_sf_ring % 4 == 0, at(MEGA, 116), "num_sf_ring_tokens % 4 == 0")
    act_dtype = FP8 if with_sf else BF16

    def region(buffer, base, nbytes, dtype):
        return buffer[base : base + nbytes].view(dtype)

    def slice_input_buffers(buffer):
        own = isinstance(buffer, torch.Tensor) and buffer.dtype == I8 and buffer.dim() == 1
        if not (own and buffer.is_contiguous()):
            panic("the stand-in can only slice a SymmBuffer's own 1-D contiguous int8 buffer")
        t, h, i = num_max_tokens_per_rank, hidden, intermediate_hidden
        x = region(buffer, x_base, t * h * eb, act_dtype).view(t, h)
        x_sf = region(buffer, sf_base, t * (h // 128) * 4, I32).view(t, h // 128) if with_sf else None
        topk_idx = region(buffer, idx_base, t * num_topk * 8, I64).view(t, num_topk)
        topk_weights = region(buffer, w_base, t * num_topk * 4, F32).view(t, num_topk)
        l1_acts = region(buffer, l1_base, ring * h * eb, act_dtype).view(ring, h)
        l2_acts = region(buffer, l2_base, ring * i * eb, act_dtype).view(ring, i)
        l1_acts_sf = l2_acts_sf = None
        if with_sf:
            l1_acts_sf = region(buffer, l1_sf_base, num_sf_ring * (h // 128) * 4, I32).as_strided(
                (num_sf_ring, h // 128), (1, num_sf_ring)
            )
            l2_acts_sf = region(buffer, l2_sf_base, num_sf_ring * (i // 128) * 4, I32).as_strided(
                (num_sf_ring, i // 128), (1, num_sf_ring)
            )
        return x, x_sf, topk_idx, topk_weights, l1_acts, l1_acts_sf, l2_acts, l2_acts_sf

    return num_bytes, slice_input_buffers


# ---------------------------------------------------------------------------------------------------------------------
# deep_gemm/mega/__init__.py
# ---------------------------------------------------------------------------------------------------------------------


def _group_barrier(group):
    work = group.barrier()
    if hasattr(work, "wait"):
        work.wait()


class SymmBuffer:
    """``deep_gemm.mega.SymmBuffer`` (see the module docstring): one zeroed int8 buffer and upstream's views."""

    def __init__(
        self,
        group,
        num_experts,
        num_max_tokens_per_rank,
        num_topk,
        hidden,
        intermediate_hidden,
        num_ring_tokens,
        mma_type="fp8xfp4",
        activation="swiglu",
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
                    "num_ring_tokens": describe(num_ring_tokens),
                    "mma_type": describe(mma_type),
                    "activation": describe(activation),
                },
            )
        )
        _py_assert(activation == "swiglu", f"Only `swiglu` activation is supported, got `{activation}`")
        self.group = group
        self.num_experts = num_experts
        self.num_max_tokens_per_rank = num_max_tokens_per_rank
        self.num_topk = num_topk
        self.hidden = hidden
        self.intermediate_hidden = intermediate_hidden
        self.num_ring_tokens = num_ring_tokens

        api = "get_symm_buffer_size_for_mega_moe"
        num_ranks = group.size()
        num_bytes, slice_input_buffers = _symm_buffer_size(
            _cint(num_ranks, api, "num_ranks"),
            _cint(num_experts, api, "num_experts"),
            _cint(num_max_tokens_per_rank, api, "num_max_tokens_per_rank"),
            _cint(num_topk, api, "num_topk"),
            _cint(hidden, api, "hidden"),
            _cint(intermediate_hidden, api, "intermediate_hidden"),
            _cstr(mma_type, api, "mma_type"),
            _cstr(activation, api, "activation"),
            _cint(num_ring_tokens, api, "num_ring_tokens"),
        )
        # Stand-in bookkeeping (not upstream attributes): what the buffer was sliced for
        self._standin_mma_type = mma_type
        self._standin_num_bytes = num_bytes

        self.buffer = torch.empty(num_bytes, dtype=I8)
        if num_ranks == 1:
            self.handle = types.SimpleNamespace(buffer_ptrs=[self.buffer.data_ptr()])
        else:  # symm_mem.rendezvous: every rank learns every rank's buffer
            import torch.distributed as dist

            ptrs = [torch.zeros(1, dtype=I64) for _ in range(num_ranks)]
            dist.all_gather(ptrs, torch.tensor([self.buffer.data_ptr()], dtype=I64), group=group)
            self.handle = types.SimpleNamespace(buffer_ptrs=[int(p) for p in ptrs])
        self.buffer.zero_()
        _group_barrier(self.group)

        (
            self.x,
            self.x_sf,
            self.topk_idx,
            self.topk_weights,
            self.l1_acts,
            self.l1_acts_sf,
            self.l2_acts,
            self.l2_acts_sf,
        ) = slice_input_buffers(self.buffer)

    def destroy(self):
        CALLS.append(("SymmBuffer.destroy", {}))
        self.handle = None
        self.buffer = None
        self.group = None
        self.x = None
        self.x_sf = None


@public("get_symm_buffer_for_mega_moe")
def get_symm_buffer_for_mega_moe(
    group,
    num_experts,
    num_max_tokens_per_rank,
    num_topk,
    hidden,
    intermediate_hidden,
    use_fp8_dispatch=None,
    mma_type="fp8xfp4",
    activation="swiglu",
):
    """``deep_gemm.mega.get_symm_buffer_for_mega_moe`` (token alignment, ring sizing, deprecation)."""
    api = "get_ring_limit_for_mega_moe"
    num_max_tokens_per_rank = align(num_max_tokens_per_rank, LCM_CANDIDATE_BLOCK_M)
    num_min_ring_tokens, num_max_ring_tokens = _ring_limit(
        _cint(num_max_tokens_per_rank, api, "num_max_tokens_per_rank"),
        _cint(num_experts // group.size(), api, "num_experts_per_rank"),
        _cint(num_topk, api, "num_topk"),
        _cint(group.size(), api, "num_ranks"),
    )
    if num_max_tokens_per_rank >= 6144:
        num_ring_tokens = align(768 * 1024, LCM_CANDIDATE_BLOCK_M)
    else:
        num_ring_tokens = _ring_limit(align(4096, LCM_CANDIDATE_BLOCK_M), 432 // 72, 6, 72)[1]
    num_ring_tokens = max(num_ring_tokens, num_min_ring_tokens)
    num_ring_tokens = min(num_ring_tokens, num_max_ring_tokens)

    if use_fp8_dispatch is not None:
        _py_assert(use_fp8_dispatch == (mma_type.split("x")[0] == "fp8"))
        warnings.warn(
            "`use_fp8_dispatch` will be deprecated in the future, please use `mma_type`",
            DeprecationWarning,
            stacklevel=3,
        )

    return SymmBuffer(
        group,
        num_experts,
        num_max_tokens_per_rank,
        num_topk,
        hidden,
        intermediate_hidden,
        num_ring_tokens,
        mma_type=mma_type,
        activation=activation,
    )


def _interleave_weights(t, gran=8):
    # [gate: 0..7, up: 0..7, gate: 8..15, up: 8..15, ...] instead of [gate | up]
    g, n, *rest = t.shape
    half = n // 2
    gate = t[:, :half].reshape(g, half // gran, gran, *rest)
    up = t[:, half:].reshape(g, half // gran, gran, *rest)
    return torch.empty_like(t).copy_(torch.stack([gate, up], dim=2).reshape(g, n, *rest))


def _transpose_sf_for_utccp(sf):
    num_groups, mn, packed_sf_k = sf.shape
    _py_assert(sf.dtype == torch.int and mn % 128 == 0)
    result = sf.reshape(num_groups, -1, 4, 32, packed_sf_k).transpose(2, 3).reshape(num_groups, mn, packed_sf_k)
    return torch.empty_like(sf).copy_(result)


@public("transform_weights_for_mega_moe")
def transform_weights_for_mega_moe(l1_weights, l2_weights, activation="swiglu"):
    """``deep_gemm.mega.transform_weights_for_mega_moe``: upstream's pure-torch code."""
    _py_assert(activation == "swiglu", f"Only `swiglu` activation is supported, got `{activation}`")
    if isinstance(l1_weights, tuple):
        # FP8: interleave gate/up for weight and SF, then transpose L1 SF for UTCCP
        l1_w = _interleave_weights(l1_weights[0])
        l1_sf = _transpose_sf_for_utccp(_interleave_weights(l1_weights[1]))
        l1_transformed = (l1_w, l1_sf)
        # L2: only transpose SF for UTCCP
        l2_transformed = (l2_weights[0], _transpose_sf_for_utccp(l2_weights[1]))
    else:
        # BF16: L1 interleave gate/up, L2 unchanged
        l1_transformed = _interleave_weights(l1_weights)
        l2_transformed = l2_weights
    return l1_transformed, l2_transformed


# ---------------------------------------------------------------------------------------------------------------------
# Kernel launch host side: heuristics asserts, TMA descriptors, JIT static asserts
# ---------------------------------------------------------------------------------------------------------------------


def _block_config(num_ranks, num_experts, num_topk, num_tokens, mode):
    """``get_block_config_for_mega_moe`` (heuristics/mega_moe.hpp:95-132): (block_m, store_block_m, block_k,
    num_epilogue_threads)."""
    expected = float(torch.tensor(float(num_tokens), dtype=F32)) * num_ranks * num_topk / num_experts
    if expected <= 8.5:
        block_m, store_block_m, block_k, wgs = 16, 8, 256, 2
    elif expected <= 16.5:
        block_m, store_block_m, block_k, wgs = 32, 16, 128, 2
    elif expected <= 32.5:
        block_m, store_block_m, block_k, wgs = 64, 32, 128, 1
    elif expected <= 64.5:
        block_m, store_block_m, block_k, wgs = 96, 16, 128, 2
    elif expected <= 96.5:
        block_m, store_block_m, block_k, wgs = 128, 32, 128, 2
    else:
        block_m, store_block_m, block_k, wgs = 192, 32, 128, 2
    block_k //= 1 if mode == "fp8xfp4" else 2
    return block_m, store_block_m, block_k, wgs * 128


def _mega_moe_config(num_ranks, num_experts, num_max_tokens_per_rank, num_tokens, num_topk, hidden, ring, mode):
    """The host asserts of ``get_mega_moe_config`` (heuristics/mega_moe.hpp:246-320), in order."""
    with_sf = mode == "fp8xfp4"
    eb = 1 if with_sf else 2
    experts_per_rank = num_experts // num_ranks
    block_m, store_block_m, block_k, epi_threads = _block_config(num_ranks, num_experts, num_topk, num_tokens, mode)
    block_n = 128
    sf_block_m, sf_block_n = (align(block_m, 128), align(block_n, 128)) if with_sf else (0, 0)
    # get_num_experts_per_wave_for_mega_moe: the ring must hold one wave
    max_per_wave = experts_per_rank
    while max_per_wave > 0 and (
        _num_wave_pool_tokens(num_ranks, num_topk, num_max_tokens_per_rank, max_per_wave, block_m) > ring
    ):
        max_per_wave -= 1
    check(max_per_wave > 0, at(HEUR, 144), 'num_max_experts_per_wave > 0 and "Buffer size is too small"')
    pull = hidden * eb
    while pull > 4096:
        check(pull % 2 == 0, at(HEUR, 283), "num_bytes_per_pull % 2 == 0")
        pull //= 2
    # get_pipeline_config_for_mega_moe (heuristics/mega_moe.hpp:187-244)
    dispatch_warps, epi_warps = 128 // 32, epi_threads // 32
    smem_dispatch = align(num_experts * 4, 1024) + align(_data(pull) * dispatch_warps, 1024)
    cd_l1 = (epi_warps // 4) * store_block_m * (block_n // 2) * 2 * eb
    cd_l2 = (epi_warps // 4) * store_block_m * block_n * 2
    smem_cd = align(max(cd_l1, cd_l2), 1024)
    barriers = (dispatch_warps + 2 * 2 + epi_warps * 2) * 8
    amax = store_block_m * epi_warps * 4 if with_sf else 0
    sfa = sf_block_m * (block_k // 32) if with_sf else 0
    sfb = sf_block_n * (block_k // 32) if with_sf else 0
    per_stage = (block_m // 2) * block_k * eb + block_n * block_k * eb + sfa + sfb + 2 * 8
    fixed = smem_dispatch + smem_cd + amax + barriers + 4
    num_stages = int((SM100_SMEM_CAPACITY - fixed) / per_stage)
    check(num_stages >= 2, at(HEUR, 241), "num_stages >= 2")
    return {"block_m": block_m, "block_k": block_k, "pull": pull}


def _nvcc(mode, num_ranks, num_topk, hidden, intermediate_hidden, config):
    """The kernels' ``DG_STATIC_ASSERT``s that the JIT compile of these template arguments can fail: upstream prints
    NVCC's output and raises ``DG_HOST_ASSERT(false and "NVCC compilation failed")`` (csrc/jit/compiler.hpp:228)."""
    kernel = KERNEL[mode]
    fp8 = mode == "fp8xfp4"
    num_sms = _num_sms()
    block_n, block_k = 128, config["block_k"]
    hidden_bytes = hidden * (1 if fp8 else 2)
    chunks = 1 if hidden <= 32 * 128 else 2  # combine chunks (see the module docstring)
    chunk_bytes = hidden * 2 // chunks
    asserts = [
        (num_ranks <= MAX_RANKS, SYM_BUFFER, 15, "Too many ranks"),
        (num_topk <= 32, kernel, 336 if fp8 else 293, "Invalid number of topk"),
        (hidden_bytes % config["pull"] == 0, kernel, 521 if fp8 else 479, "kNumBytesPerPull must divide hidden"),
        ((2 * intermediate_hidden) % block_n == 0, SCHED, 31, "Invalid shape"),
        (hidden % block_n == 0, SCHED, 32, "Invalid shape"),
        (hidden % block_k == 0, SCHED, 33, "Invalid shape"),
        (intermediate_hidden % block_k == 0, SCHED, 34, "Invalid shape"),
        (num_sms % 2 == 0, SCHED, 39, "Number of SMs must be even for 2-CTA cluster"),
        ((2 * intermediate_hidden // block_n) % 2 == 0, SCHED, 40, "L1 N block count must be even for 2-CTA cluster"),
        ((hidden // block_n) % 2 == 0, SCHED, 41, "L2 N block count must be even for 2-CTA cluster"),
        (num_sms > 1, kernel, 607 if fp8 else 546, "Invalid SM count"),
        (hidden % chunks == 0, kernel, 1272 if fp8 else 1120, "Hidden must be divisible by number of chunks"),
        (chunk_bytes % 16 == 0, kernel, 1274 if fp8 else 1122, "Combine chunk must be TMA-aligned (16 bytes)"),
        (
            (chunk_bytes // 16) % 32 == 0,
            kernel,
            1276 if fp8 else 1124,
            "Combine chunk must be a multiple of 32 16-byte elements (one per lane)",
        ),
    ]
    for ok, file, line, msg in asserts:
        if not ok:
            print(f'NVCC compilation failed: {file}({line}): error: static assertion failed with "{msg}"', flush=True)
            fail(at(COMPILER, 228), 'false and "NVCC compilation failed"')


# ---------------------------------------------------------------------------------------------------------------------
# Decoding (what the kernel reads)
# ---------------------------------------------------------------------------------------------------------------------


def _utccp_rows(mn):
    """Physical scale row the kernel reads for logical row ``j = 128c + 32a + b``: ``128c + 4b + a``."""
    j = torch.arange(mn)
    c, r = j // 128, j % 128
    return c * 128 + (r % 32) * 4 + r // 32


def _deinterleave_rows(n):
    """For each ORIGINAL L1 row ``o`` (gate ``o < I``, up ``o >= I``): its row in the interleaved layout."""
    half = n // 2
    o = torch.arange(n)
    up = (o >= half).long()
    oo = o - half * up
    return (oo // 8) * 16 + 8 * up + oo % 8


# Both E2M1 values of every byte (``_ref.fp4_values``' decoding, as a lookup table)
_FP4_BYTE_VALUES = _ref.fp4_values(torch.arange(256, dtype=torch.int64).to(U8).view(I8).view(256, 1), -1)


def _fp4_weights(w, sf, e, rows=None):
    """float64 ``[N, K]`` of local expert ``e``: packed E2M1 times the 1x32 UE8M0 scales read through UTCCP (then
    the rows ``rows`` of it, if given)."""
    n, k = w.shape[1], 2 * w.shape[2]
    codes = _ref.unpack_bytes(sf[e], 4)[:, : k // 32]  # [N, K/32]: byte j of word i -> k block 4i + j
    scales = _ref.ue8m0_values(codes)[_utccp_rows(n)]
    data = w[e]
    if rows is not None:
        data, scales = data[rows], scales[rows]
    vals = _FP4_BYTE_VALUES[data.view(U8).to(I64)]  # [N, K/2, 2]: low nibble first
    return (vals.view(len(data), k // 32, 32) * scales.unsqueeze(-1)).view(len(data), k)


def _bits_to_f32(bits):
    b = bits & 0xFFFFFFFF
    return torch.where(b >= 2**31, b - 2**32, b).to(I32).view(F32)


def _quantise_fp8(act):
    """Per token and 32 columns: UE8M0 scale and E4M3 values exactly as the L1 epilogue (sm100_fp8_fp4_mega_moe.cuh:
    1022-1100 with math.cuh:78-99); returns the float64 values the L2 GEMM reads."""
    n, inter = act.shape
    a = act.view(n, inter // 32, 32)
    amax = a.abs().amax(dim=-1)
    scaled = amax * torch.tensor(1.0 / 448.0, dtype=F32)
    bits = scaled.view(I32).to(I64) & 0xFFFFFFFF
    ex = (bits >> 23) - 127 + ((bits & 0x7FFFFF) != 0).to(I64)
    sf_bits = ((ex + 127) << 23) & 0xFFFFFFFF
    sf_inv = _bits_to_f32((127 - ex) << 23)
    q = (a * sf_inv.unsqueeze(-1)).clamp(-448.0, 448.0).to(FP8)  # __nv_fp8x4_e4m3: RN, satfinite
    byte = (sf_bits >> 23) & 0xFF
    return (q.to(F64) * _ref.ue8m0_values(byte).unsqueeze(-1)).view(n, inter)


def _swiglu(h, weights, clamp, inter):
    """FP32 SwiGLU with clamp and routing weight (see the module docstring for the ``exp`` / division model)."""
    gate, up = h[:, :inter].to(F32), h[:, inter:].to(F32)
    if clamp != float("inf"):
        c = torch.tensor(clamp, dtype=F32).to(BF16).to(F32)
        gate = torch.fmin(gate, c)
        up = torch.fmin(torch.fmax(up, -c), c)
    e = torch.exp(-gate.to(F64)).to(F32)
    denom = torch.tensor(1.0, dtype=F32) + e
    silu = gate / denom
    return (silu * up) * weights.to(F32).unsqueeze(-1)


# ---------------------------------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------------------------------


def _local_problems(mode, y, hidden, intermediate_hidden, sym_buffer, l1w, l2w, topk_idx, num_tokens, num_experts):
    """What this rank's kernel would trap on or garble (raised on every rank after the configuration exchange)."""
    if getattr(sym_buffer, "_standin_mma_type", mode) != mode or (
        getattr(sym_buffer, "hidden", hidden),
        getattr(sym_buffer, "intermediate_hidden", intermediate_hidden),
    ) != (hidden, intermediate_hidden):
        return (
            f"the SymmBuffer was built for mma_type={getattr(sym_buffer, '_standin_mma_type', None)!r}, "
            f"hidden={getattr(sym_buffer, 'hidden', None)}, intermediate_hidden="
            f"{getattr(sym_buffer, 'intermediate_hidden', None)}, but this {mode} call's weights give hidden={hidden}, "
            f"intermediate_hidden={intermediate_hidden}: the kernel slices the buffer with another layout"
        )
    if mode == "fp8xfp4" and (l1w.dtype == FP8 or l2w.dtype == FP8):
        return (
            "FP8 E4M3 weights given to fp8_fp4_mega_moe: the kernel's MMA reads the weights as unpacked E2M1 "
            "(MmaKind::MXFP8FP4), so every byte would be misread"
        )
    if (
        y.dtype != BF16
        or y.dim() != 2
        or y.size(1) != hidden
        or not y.is_contiguous()
        or (y.numel() > 0 and y.data_ptr() % 16 != 0)
    ):
        return (
            f"y must be a contiguous, 16-byte aligned BF16 [num_tokens, {hidden}] tensor: the kernel TMA-stores dense "
            f"BF16 rows of {hidden} elements at y.data_ptr() (got {y.dtype}, shape {tuple(y.shape)}, strides "
            f"{tuple(y.stride())}, address % 16 = {y.data_ptr() % 16})"
        )
    ids = topk_idx[:num_tokens]
    bad = (ids >= num_experts) | (ids < -(2**31))
    if bool(bad.any()):
        t, k = (int(v) for v in bad.nonzero()[0])
        return (
            f"topk_idx[{t}, {k}] = {int(ids[t, k])} is not an expert id in [0, {num_experts}) nor negative within "
            f"int32: the dispatch warps count it into shared-memory expert counters past their end"
        )
    return None


def _exchange_config(group, num_ranks, config, problem):
    """all_gather_object of (config, T, problem) over the buffer's group; Panic on every rank if any rank has one."""
    if num_ranks == 1:
        table = [(config, problem)]
    else:
        import torch.distributed as dist

        table = [None] * num_ranks
        dist.all_gather_object(table, (config, problem), group=group)
    problems = [(r, p) for r, (_, p) in enumerate(table) if p is not None]
    if problems:
        panic("; ".join(f"rank {r}: {p}" for r, p in problems))
    configs = {r: c[:-1] for r, (c, _) in enumerate(table)}
    if len(set(configs.values())) > 1:
        panic(
            "the ranks' buffers / calls disagree (num_ranks, num_max_tokens_per_rank, num_experts, num_topk, hidden, "
            f"intermediate_hidden, num_ring_tokens, mma_type): {configs}; the kernels would read each other's "
            f"buffers with different layouts"
        )
    return [c[-1] for c, _ in table]


def _all_gather_bytes(group, num_ranks, tensor):
    """all_gather of a uint8 tensor (same shape on every rank)."""
    if num_ranks == 1:
        return [tensor]
    import torch.distributed as dist

    out = [torch.empty_like(tensor) for _ in range(num_ranks)]
    dist.all_gather(out, tensor.contiguous(), group=group)
    return out


def _as_bytes(t):
    return t.contiguous().view(U8).reshape(t.shape[0], -1)


def _run(mode, y, l1, l2, stats, sym_buffer, views, num_ranks, rank, num_tokens, cfg, clamp):
    """Dispatch, both GEMMs, SwiGLU, quantisation and combine across the group (after all host checks)."""
    fp8 = mode == "fp8xfp4"
    group = sym_buffer.group
    t_max, num_experts, num_topk, hidden, inter, ring = cfg
    experts_per_rank = num_experts // num_ranks
    x, x_sf, topk_idx, topk_weights = views[:4]
    l1w, l1sf = l1 if fp8 else (l1, None)
    l2w, l2sf = l2 if fp8 else (l2, None)

    problem = _local_problems(mode, y, hidden, inter, sym_buffer, l1w, l2w, topk_idx, num_tokens, num_experts)
    all_tokens = _exchange_config(group, num_ranks, (num_ranks, *cfg, mode, num_tokens), problem)
    t_top = max(all_tokens)
    if t_top == 0:  # no token on any rank: nothing to dispatch, compute or combine
        return

    # Dispatch: every rank's first max(T) input rows (x, x_sf, topk_idx, topk_weights) as bytes
    parts = [_as_bytes(x[:t_top])] + ([_as_bytes(x_sf[:t_top])] if fp8 else [])
    parts += [_as_bytes(topk_idx[:t_top]), _as_bytes(topk_weights[:t_top])]
    widths = [p.shape[1] for p in parts]
    rows = _all_gather_bytes(group, num_ranks, torch.cat(parts, dim=1))
    srcs = []
    for s, blob in enumerate(rows):
        cols = torch.split(blob, widths, dim=1)
        n = all_tokens[s]
        xs = cols[0].contiguous().view(FP8 if fp8 else BF16)[:n].to(F64)
        if fp8:
            codes = _ref.unpack_bytes(cols[1].contiguous().view(I32)[:n], 4)[:, : hidden // 32]
            xs = xs * _ref.ue8m0_values(codes).repeat_interleave(32, dim=-1)
        idx = cols[-2].contiguous().view(I64)[:n]
        w = cols[-1].contiguous().view(F32)[:n]
        srcs.append((xs, idx, w))

    # Local experts: L1 -> SwiGLU -> quantisation -> L2 for every (rank, token, slot) routed here
    contrib = torch.zeros((num_ranks, t_top, num_topk, hidden), dtype=BF16)
    counts = torch.zeros(experts_per_rank, dtype=I64)
    orig_rows = _deinterleave_rows(2 * inter)
    for e_local in range(experts_per_rank):
        e = rank * experts_per_rank + e_local
        hits = [(s, (idx == e).nonzero()) for s, (_, idx, _) in enumerate(srcs)]
        n_pairs = sum(h.shape[0] for _, h in hits)
        counts[e_local] = n_pairs
        if n_pairs == 0:
            continue
        xin = torch.cat([srcs[s][0][h[:, 0]] for s, h in hits])
        win = torch.cat([srcs[s][2][h[:, 0], h[:, 1]] for s, h in hits])
        if fp8:  # L1 rows: interleaved -> [gate | up]
            w1 = _fp4_weights(l1w, l1sf, e_local, orig_rows)
            w2 = _fp4_weights(l2w, l2sf, e_local)
        else:
            w1, w2 = l1w[e_local][orig_rows].to(F64), l2w[e_local].to(F64)
        h = _ref.mm_nt(xin, w1).to(F32).to(BF16)
        act = _swiglu(h, win, clamp, inter)
        act_deq = _quantise_fp8(act) if fp8 else act.to(BF16).to(F64)
        yk = _ref.mm_nt(act_deq, w2).to(F32).to(BF16)
        off = 0
        for s, hh in hits:
            contrib[s, hh[:, 0], hh[:, 1]] = yk[off : off + hh.shape[0]]
            off += hh.shape[0]

    # Combine on the home ranks
    gathered = _all_gather_bytes(group, num_ranks, contrib.view(U8).reshape(num_ranks, -1))
    mine = torch.stack([g[rank].view(BF16).view(t_top, num_topk, hidden)[:num_tokens] for g in gathered])
    _, my_idx, _ = srcs[rank]
    tokens = torch.arange(num_tokens)
    acc = torch.zeros((num_tokens, hidden), dtype=F32)
    for k in range(num_topk):  # add.rn.f32.bf16 in slot order, from 0
        ids = my_idx[:, k]
        picked = mine[(ids.clamp(min=0) // experts_per_rank), tokens, k].to(F32)
        acc = torch.where((ids >= 0).unsqueeze(-1), acc + picked, acc)
    y.copy_(acc.to(BF16))
    if stats is not None:
        stats.add_(counts.to(I32))


def _env_int(name):
    try:
        return int(os.environ.get(name, "0") or 0)
    except ValueError:
        return 0


def _mega_moe(api, mode, y, l1_weights, l2_weights, stats, sym_buffer, recipe, activation, clamp_opt, fast_math):
    # deep_gemm/mega/__init__.py: the arguments handed to _C, in upstream's evaluation order
    buffer = sym_buffer.buffer
    buffer_ptrs = sym_buffer.handle.buffer_ptrs
    rank = sym_buffer.group.rank()
    t_max, num_experts, num_topk = sym_buffer.num_max_tokens_per_rank, sym_buffer.num_experts, sym_buffer.num_topk
    ring = sym_buffer.num_ring_tokens

    # pybind11 conversion
    fp8 = mode == "fp8xfp4"
    y = _tensor(y, api, "y")
    if fp8:
        l1 = _pair(l1_weights, api, "l1_weights")
        l2 = _pair(l2_weights, api, "l2_weights")
        l1w, l1sf = l1
        l2w, l2sf = l2
        recipe = tuple(_cint(v, api, "recipe") for v in recipe) if isinstance(recipe, (tuple, list)) else recipe
        if not (isinstance(recipe, tuple) and len(recipe) == 3):
            incompatible(api, f"'recipe' must be a tuple of 3 ints, got {recipe!r}")
    else:
        l1w = l1 = _tensor(l1_weights, api, "l1_weights")
        l2w = l2 = _tensor(l2_weights, api, "l2_weights")
    stats = _opt_tensor(stats, api, "cumulative_local_expert_recv_stats")
    buffer = _tensor(buffer, api, "sym_buffer")
    if not isinstance(buffer_ptrs, (list, tuple)):
        incompatible(api, "'sym_buffer_ptrs' must be a list of ints")
    buffer_ptrs = [_cint(p, api, "sym_buffer_ptrs") for p in buffer_ptrs]
    rank = _cint(rank, api, "rank_idx")
    t_max = _cint(t_max, api, "num_max_tokens_per_rank")
    num_experts = _cint(num_experts, api, "num_experts")
    num_topk = _cint(num_topk, api, "num_topk")
    activation = _cstr(activation, api, "activation")
    clamp_opt = _cfloat_opt(clamp_opt, api, "activation_clamp")
    fast_math = bool(fast_math)
    ring = _cint(ring, api, "num_ring_tokens")

    # csrc/apis/mega.hpp
    if y.dim() == 0:
        raise IndexError("Dimension specified as 0 but tensor has no dimensions")
    num_tokens = int(y.size(0))
    if fp8:
        check(recipe == (1, 1, 32), at(MEGA, 182), "rm == 1 and rn == 1 and rk == 32")
    check(activation == "swiglu", at(MEGA, 183 if fp8 else 272), 'activation == "swiglu"')
    clamp = float("inf") if clamp_opt is None else clamp_opt
    check(clamp >= 0, at(MEGA, 188 if fp8 else 277), "activation_clamp >= 0")
    check(
        _major_ab(l1w) == K_MAJOR,
        at(MEGA, 191 if fp8 else 280),
        "get_major_type_ab(l1_weights) == cute::UMMA::Major::K",
    )
    check(
        _major_ab(l2w) == K_MAJOR,
        at(MEGA, 192 if fp8 else 281),
        "get_major_type_ab(l2_weights) == cute::UMMA::Major::K",
    )
    arch = STATE.arch
    if fp8:
        experts_per_rank, inter2, hidden = _check_grouped_ab_fp8_fp4(l1w, K_MAJOR, arch)
        experts_per_rank_, hidden_, inter = _check_grouped_ab_fp8_fp4(l2w, K_MAJOR, arch)
        base = 198
    else:
        experts_per_rank, inter2, hidden = _shape(l1w, 3)
        experts_per_rank_, hidden_, inter = _shape(l2w, 3)
        check(l1w.dtype == BF16, at(MEGA, 285), "l1_weights.scalar_type() == torch::kBFloat16")
        check(l2w.dtype == BF16, at(MEGA, 286), "l2_weights.scalar_type() == torch::kBFloat16")
        base = 287
    check(num_tokens <= t_max, at(MEGA, base), "num_tokens <= num_max_tokens_per_rank")
    check(experts_per_rank == experts_per_rank_, at(MEGA, base + 1), "num_experts_per_rank == num_experts_per_rank_")
    check(hidden == hidden_, at(MEGA, base + 2), "hidden == hidden_")
    check(inter2 == 2 * inter, at(MEGA, base + 3), "intermediate_hidden_2 == 2 * intermediate_hidden")
    check(
        l1w.is_contiguous() and l2w.is_contiguous(),
        at(MEGA, base + 4),
        "l1_weights.is_contiguous() and l2_weights.is_contiguous()",
    )
    if fp8:
        _check_sf_layout(l1sf, inter * 2, hidden, 1, 32, experts_per_rank, True, False, I32)
        _check_sf_layout(l2sf, hidden, inter, 1, 32, experts_per_rank, True, False, I32)
    s = 213 if fp8 else 295
    if stats is not None:
        check(
            stats.dtype == I32,
            at(MEGA, s),
            "cumulative_local_expert_recv_stats->scalar_type() == torch::kInt",
        )
        check(
            stats.numel() == experts_per_rank,
            at(MEGA, s + 1),
            "cumulative_local_expert_recv_stats->numel() == num_experts_per_rank",
        )
        check(stats.is_contiguous(), at(MEGA, s + 2), "cumulative_local_expert_recv_stats->is_contiguous()")
    num_ranks = len(buffer_ptrs)
    num_required_bytes, slice_input_buffers = _symm_buffer_size(
        num_ranks, num_experts, t_max, num_topk, hidden, inter, mode, activation, ring
    )
    b = 226 if fp8 else 308
    check(
        buffer.nbytes >= num_required_bytes,
        at(MEGA, b),
        "sym_buffer.nbytes() >= static_cast<size_t>(num_required_bytes)",
    )
    check(num_experts == experts_per_rank * num_ranks, at(MEGA, b + 1), "num_experts == num_experts_")
    views = slice_input_buffers(buffer)
    if arch != 10:
        fail(at(MEGA, 247 if fp8 else 327), "Unsupported architecture")

    # sm100_{fp8_fp4,bf16}_mega_moe: heuristics, TMA descriptors of the weights, JIT compile
    config = _mega_moe_config(num_ranks, num_experts, t_max, num_tokens, num_topk, hidden, ring, mode)
    _tma(l1w, l1w.stride(-2), "l1_weights", hidden)
    _tma(l2w, l2w.stride(-2), "l2_weights", inter)
    _nvcc(mode, num_ranks, num_topk, hidden, inter, config)

    cfg = (t_max, num_experts, num_topk, hidden, inter, ring)
    _run(mode, y, l1, l2, stats, sym_buffer, views, num_ranks, rank, num_tokens, cfg, clamp)
    if _env_int("DG_COMM_KERNEL_DEBUG"):
        buffer.zero_()


@public("fp8_fp4_mega_moe")
def fp8_fp4_mega_moe(
    y,
    l1_weights,
    l2_weights,
    sym_buffer,
    cumulative_local_expert_recv_stats=None,
    recipe=(1, 1, 32),
    activation="swiglu",
    activation_clamp=None,
    fast_math=True,
):
    """FP8 tokens (1x32 UE8M0) x FP4 weights (transformed, 1x32 UE8M0): see the module docstring."""
    _mega_moe(
        "fp8_fp4_mega_moe",
        "fp8xfp4",
        y,
        l1_weights,
        l2_weights,
        cumulative_local_expert_recv_stats,
        sym_buffer,
        recipe,
        activation,
        activation_clamp,
        fast_math,
    )


@public("bf16_mega_moe")
def bf16_mega_moe(
    y,
    l1_weights,
    l2_weights,
    sym_buffer,
    cumulative_local_expert_recv_stats=None,
    activation="swiglu",
    activation_clamp=None,
    fast_math=True,
):
    """BF16 tokens x BF16 weights (L1 transformed): see the module docstring."""
    _mega_moe(
        "bf16_mega_moe",
        "bf16xbf16",
        y,
        l1_weights,
        l2_weights,
        cumulative_local_expert_recv_stats,
        sym_buffer,
        None,
        activation,
        activation_clamp,
        fast_math,
    )


EXPORTS = {
    "SymmBuffer": SymmBuffer,
    "get_symm_buffer_for_mega_moe": get_symm_buffer_for_mega_moe,
    "transform_weights_for_mega_moe": transform_weights_for_mega_moe,
    "fp8_fp4_mega_moe": fp8_fp4_mega_moe,
    "bf16_mega_moe": bf16_mega_moe,
}

__all__ = ["EXPORTS", "PREFIX"]
