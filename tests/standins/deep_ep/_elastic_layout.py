"""Constants, topology, buffer-size arithmetic and small helpers of the stand-in's V2 runtime
(``csrc/elastic/buffer.hpp``, ``csrc/kernels/backend/nccl.cu``, ``csrc/kernels/elastic/{dispatch,combine}.hpp``,
``deep_ep/include/deep_ep/common/{layout,compiled}.cuh``)."""

from __future__ import annotations

import sys

import torch

from . import _standin as S
from ._config import align_up, ceil_div
from ._event import EventHandle
from ._standin import ELASTIC_HPP, ELASTIC_UTILS_HPP, LAYOUT_CUH, NCCL_CU, check

NUM_ALIGNMENT_BYTES = 2 * 1024 * 1024  # symmetric::kNumAlignmentBytes (csrc/kernels/backend/symmetric.hpp:16)
TMA_ALIGN_BYTES = 32  # ptx::kNumTMAAlignBytes (deep_ep/include/deep_ep/common/ptx.cuh:16)
SF_PACK_BYTES = 4  # sizeof(sf_pack_t) (deep_ep/include/deep_ep/common/compiled.cuh:74-77)
NUM_ALIGNED_SF_PACKS = 4  # kNumAlignedSFPacks = 16 / sizeof(sf_pack_t) (compiled.cuh:80)
NUM_MAX_CHANNELS = 8 * 160  # ElasticBuffer::kNumMaxChannels = kNumMaxChannelsPerSM * kNumMaxSMs (buffer.hpp:57-59)
MAX_TOPK = 32  # EP_STATIC_ASSERT(kNumTopk <= 32, ...) (dispatch.cuh:93, combine_reduce_epilogue.cuh:65)
WORKSPACE_MAX_RANKS, WORKSPACE_MAX_EXPERTS, WORKSPACE_MAX_EXPERTS_PER_RANK = 1024, 2048, 256  # layout.cuh:19-21
BF16 = torch.bfloat16


# ---------------------------------------------------------------------------------------------------------------------
# Topology and buffer sizes
# ---------------------------------------------------------------------------------------------------------------------


def physical_domain_size(num_ranks: int) -> tuple[int, int]:
    """``nccl::get_physical_domain_size`` (nccl.cu:49-54): (RDMA ranks, NVLink ranks). The NVLink (LSA) team is
    ``configure(num_nvlink_ranks=)`` ranks, or the whole group (one node)."""
    nvl = S.STATE.num_nvlink_ranks
    nvl = num_ranks if nvl is None else min(nvl, num_ranks)
    check(num_ranks % nvl == 0, f"{NCCL_CU}:52", "num_ranks % num_nvl_ranks == 0")
    return num_ranks // nvl, nvl


def logical_domain_size(num_ranks: int, allow_hybrid_mode: bool) -> tuple[int, int]:
    """``nccl::get_logical_domain_size`` (nccl.cu:56-60): (scale-out ranks, scale-up ranks)."""
    rdma, nvl = physical_domain_size(num_ranks)
    return (rdma, nvl) if allow_hybrid_mode else (1, rdma * nvl)


def token_layout_bytes(num_hidden_bytes: int, num_sf_bytes: int, num_topk: int, with_metadata: bool) -> int:
    """``layout::TokenLayout(...).get_num_bytes<false>()`` (layout.cuh:186-208): hidden, SF and metadata (top-k ids and
    weights, plus the source token id and ``num_topk`` linked-list ints with metadata) each aligned to 32 bytes."""
    check(
        num_hidden_bytes % TMA_ALIGN_BYTES == 0, f"{LAYOUT_CUH}:198", "num_hidden_bytes % ptx::kNumTMAAlignBytes == 0"
    )
    num_metadata_bytes = num_topk * 8 + ((1 + num_topk) * 4 if with_metadata else 0)
    return sum(align_up(n, TMA_ALIGN_BYTES) for n in (num_hidden_bytes, num_sf_bytes, num_metadata_bytes))


def get_dispatch_buffer_size(
    num_max_tokens_per_rank, hidden, num_sf_packs, num_topk, elem_size, num_scaleout_ranks, num_scaleup_ranks, nvlink
):
    """``ElasticBuffer::get_dispatch_buffer_size`` (buffer.hpp:586-614)."""
    num_ranks = num_scaleup_ranks * num_scaleout_ranks
    token = token_layout_bytes(hidden * elem_size, num_sf_packs * SF_PACK_BYTES, num_topk, True)
    if num_scaleout_ranks == 1:
        send = token * (0 if nvlink else 1) * num_max_tokens_per_rank
        recv = token * num_ranks * num_max_tokens_per_rank
        return send + recv
    scaleup_recv = token * num_scaleup_ranks * num_scaleout_ranks * num_max_tokens_per_rank
    scaleout_send = token * 1 * num_max_tokens_per_rank
    scaleout_recv = token * num_scaleout_ranks * (num_max_tokens_per_rank + NUM_MAX_CHANNELS)
    return scaleup_recv + scaleout_send + scaleout_recv


def get_combine_buffer_size(
    num_max_tokens_per_rank, hidden, num_topk, num_scaleout_ranks, num_scaleup_ranks, nvlink, allow_multiple_reduction
):
    """``ElasticBuffer::get_combine_buffer_size`` (buffer.hpp:616-650)."""
    num_ranks = num_scaleup_ranks * num_scaleout_ranks
    token = token_layout_bytes(hidden * 2, 0, num_topk, False)
    if num_scaleout_ranks == 1:
        num_tokens_in_layout = min(num_ranks, num_topk) if allow_multiple_reduction else num_topk
        send = (
            token
            * (0 if nvlink else num_ranks)
            * num_max_tokens_per_rank
            * (1 if allow_multiple_reduction else num_topk)
        )
        recv = token * num_tokens_in_layout * num_max_tokens_per_rank
        return send + recv
    up = min(num_scaleup_ranks, num_topk) if allow_multiple_reduction else num_topk
    out = min(num_scaleout_ranks, num_topk) if allow_multiple_reduction else num_topk
    scaleup_recv = token * up * num_scaleout_ranks * num_max_tokens_per_rank
    scaleout_recv = token * out * num_max_tokens_per_rank
    scaleout_send = (
        token
        * (1 if allow_multiple_reduction else num_topk)
        * num_scaleout_ranks
        * (num_max_tokens_per_rank + NUM_MAX_CHANNELS)
    )
    return scaleup_recv + scaleout_send + scaleout_recv


def calculate_buffer_size(
    num_ranks, num_max_tokens_per_rank, hidden, num_topk, use_fp8_dispatch, allow_hybrid_mode, allow_multiple_reduction
) -> int:
    """``ElasticBuffer::calculate_buffer_size`` (buffer.hpp:652-686), ``_C.calculate_elastic_buffer_size``."""
    ints(
        "calculate_elastic_buffer_size",
        num_max_tokens_per_rank=num_max_tokens_per_rank,
        hidden=hidden,
        num_topk=num_topk,
    )
    check(
        num_max_tokens_per_rank > 0 and hidden > 0, f"{ELASTIC_HPP}:657", "num_max_tokens_per_rank > 0 and hidden > 0"
    )
    check(
        ceil_div(hidden, 32) * 4 <= hidden, f"{ELASTIC_HPP}:660", "math::ceil_div(hidden, 32) * sizeof(float) <= hidden"
    )
    num_topk = 32 if num_topk == 0 else num_topk
    rdma, nvl = physical_domain_size(num_ranks)
    scaleout, scaleup = logical_domain_size(num_ranks, allow_hybrid_mode)
    nvlink = scaleup == nvl
    elem_size = 1 if use_fp8_dispatch else 2
    num_sf_packs = ceil_div(hidden, 32) if use_fp8_dispatch else 0
    dispatch_bytes = get_dispatch_buffer_size(
        num_max_tokens_per_rank, hidden, num_sf_packs, num_topk, elem_size, scaleout, scaleup, nvlink
    )
    combine_bytes = get_combine_buffer_size(
        num_max_tokens_per_rank, hidden, num_topk, scaleout, scaleup, nvlink, allow_multiple_reduction
    )
    return align_up(max(dispatch_bytes, combine_bytes), NUM_ALIGNMENT_BYTES)


# ---------------------------------------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------------------------------------


def ints(api: str, **values) -> None:
    """pybind11's int caster: anything with ``__index__`` (not a float); otherwise "incompatible function arguments"."""
    for name, value in values.items():
        if isinstance(value, float) or not hasattr(value, "__index__"):
            S.incompatible(api, f"{name}={value!r} is not convertible to int")


def get_shape(t: torch.Tensor, n: int) -> tuple[int, ...]:
    """``get_shape<n>(t)`` (csrc/elastic/utils.hpp:15-21)."""
    check(t.dim() == n, f"{ELASTIC_UTILS_HPP}:17", "t.dim() == kNumDims")
    return tuple(int(v) for v in t.shape)


def event_arg(api: str, name: str, value) -> None:
    if value is not None and not isinstance(value, EventHandle):
        S.incompatible(api, f"{name}={value!r} is not a deep_ep.EventHandle (std::optional<EventHandle>)")


def cdiv(a: int, b: int) -> int:
    """C++ integer division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def cmod(a: int, b: int) -> int:
    """C++ ``%`` (the sign of the dividend)."""
    return a - b * cdiv(a, b)


def raw_int32(t: torch.Tensor) -> torch.Tensor:
    """What ``t.data_ptr<int>()[j]`` reads: the tensor's memory from its first element to the end of its storage."""
    n = t.untyped_storage().nbytes() // 4 - t.storage_offset()
    return torch.as_strided(t, (max(n, 0),), (1,), t.storage_offset()).to(torch.int64)


def generator(call: int, rank: int, role: int):
    seed = S.STATE.elastic_shuffle_seed
    if seed is None:
        return None
    mixed = (seed * 1_000_003 + call * 7_919 + rank * 104_729 + role * 15_485_863 + 0x5EED) % (2**62)
    return torch.Generator().manual_seed(mixed)


def perm(n: int, gen) -> torch.Tensor:
    return torch.arange(n) if gen is None else torch.randperm(n, generator=gen)


def highest_lane_mask(key: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``ptx::deduplicate(key, lane)`` and ``valid``: the highest lane of each key value, per row."""
    k = key.size(1)
    later = torch.triu(torch.ones(k, k, dtype=torch.bool), diagonal=1)
    dup_later = ((key.unsqueeze(2) == key.unsqueeze(1)) & later).any(2)
    return valid & ~dup_later


def garbage_sf(num_tokens: int, num_sf_packs: int, dtype, col_major: bool) -> torch.Tensor:
    """``torch::empty_strided({N, P}, {P, 1} | {1, align(N, 4)})`` (buffer.hpp:1089-1099)."""
    if not col_major:
        return S.garbage((num_tokens, num_sf_packs), dtype)
    stride = align_up(num_tokens, NUM_ALIGNED_SF_PACKS)
    base = S.garbage((max(stride * num_sf_packs, 1),), dtype)
    return torch.as_strided(base, (num_tokens, num_sf_packs), (1, stride))


def graph_capturing() -> bool:
    """A device graph is being captured on the current stream: CUDA's or torch_npu's check, or the project's check
    (``distributed.capture``, which the tests' ``capture_emulation.capturing_everywhere()`` replaces; read through
    the module, only if already imported)."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return True
    npu = getattr(torch, "npu", None)
    if npu is not None and hasattr(npu, "is_current_stream_capturing") and npu.is_current_stream_capturing():
        return True
    project = sys.modules.get("torch_ascend_moe.distributed.capture")
    return bool(project is not None and project.capturing_current_stream())
