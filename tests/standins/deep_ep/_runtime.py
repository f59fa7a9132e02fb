"""The C++ half of ``deep_ep.Buffer`` (``csrc/legacy/buffer.hpp`` ``struct Buffer``, what ``deep_ep._C.Buffer``
binds) and what its kernels do, as seen from the host: host checks in upstream's order with upstream's words, then
one all-to-all exchange (a ``scatter_object_list`` per source rank) on the process group standing for the kernels'
NVLink / NVSHMEM traffic, then the results.

Conventions:

* every ``EP_HOST_ASSERT`` on the modelled paths raises ``RuntimeError("DeepEP stand-in: Assertion exception
  (<file>:<line>): <condition>")`` (``_standin.check``); launch failures ("Unsupported ranks/type/hidden") come from
  the ``SWITCH_*`` macros of ``csrc/kernels/legacy/launch.cuh``;
* a host check that fails on one rank only leaves the other ranks waiting in the exchange until the group's timeout,
  as the real kernels would wait on their barriers;
* what the kernels would trap on, hang on, or turn into garbage raises ``Panic`` *after* the exchange (so every rank
  finishes the collective) on the rank that would observe it;
* tensors the kernels leave unwritten hold ``_standin.garbage`` (NaN / 0x7f... bytes), as ``torch::empty`` memory.
"""

from __future__ import annotations

import os

import torch

from . import _standin as S
from ._config import (
    INT_MAX,
    NUM_BUFFER_ALIGNMENT_BYTES,
    NUM_MAX_LOCAL_EXPERTS,
    NUM_MAX_NVL_PEERS,
    NUM_MAX_RDMA_PEERS,
    NUM_WORKSPACE_BYTES,
    LowLatencyLayout,
    ceil_div,
)
from ._event import EventHandle
from ._standin import BUFFER_HPP, INTERNODE_LL_CU, INTRANODE_CU, LAUNCH_CUH, check, panic

FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16
KFP8_MARGIN = S.fp32(1e-4)  # kFP8Margin (csrc/kernels/legacy/utils.cuh:477)
KFINFO_AMAX_INV_E4M3 = S.fp32(1 / 448.0)  # kFinfoAmaxInvE4M3 (utils.cuh:479)
LL_HIDDENS = (2048, 2560, 3072, 4096, 5120, 6144, 7168, 8192)  # SWITCH_HIDDEN (launch.cuh:113-133)
LL_MAX_TOPK = 11  # kNumMaxTopK (internode_ll.cu:493, :1166)


def channel_range(num_tokens: int, num_channels: int, channel: int) -> tuple[int, int]:
    """``get_channel_task_range`` (csrc/kernels/legacy/utils.cuh:444-448)."""
    per = ceil_div(num_tokens, num_channels)
    start = min(per * channel, num_tokens)
    return start, min(start + per, num_tokens)


def switch_ranks(num_ranks: int) -> None:
    # SWITCH_RANKS / SWITCH_RANKS_WITH_DTYPE: kernels are instantiated for 2, 4 and 8 ranks only
    check(num_ranks in (2, 4, 8), f"{LAUNCH_CUH}:62", 'false and "Unsupported ranks"')


def switch_hidden(hidden: int) -> None:
    check(hidden in LL_HIDDENS, f"{LAUNCH_CUH}:132", 'false and "Unsupported hidden"')


def _event(async_: bool):
    return EventHandle() if async_ else None


def _ints(api: str, **values) -> None:
    """pybind11's int caster: anything with ``__index__`` (not a float); otherwise "incompatible function arguments"."""
    for name, value in values.items():
        if isinstance(value, float) or not hasattr(value, "__index__"):
            S.incompatible(api, f"{name}={value!r} is not convertible to int")


def _int32(t: torch.Tensor) -> list[int]:
    return [int(v) for v in t.reshape(-1).tolist()]


class Runtime:
    """``deep_ep._C.Buffer`` (buffer.hpp:22-1749)."""

    def __init__(
        self,
        rank,
        num_ranks,
        num_nvl_bytes,
        num_rdma_bytes,
        low_latency_mode,
        explicitly_destroy,
        enable_shrink,
        use_fabric,
        comm,
    ):
        for name, value in (
            ("rank", rank),
            ("num_ranks", num_ranks),
            ("num_nvl_bytes", num_nvl_bytes),
            ("num_rdma_bytes", num_rdma_bytes),
        ):
            if not isinstance(value, int):
                S.incompatible("Buffer.__init__", f"{name}={value!r} is not convertible to an integer")
        self.rank, self.num_ranks = rank, num_ranks
        self.num_nvl_bytes, self.num_rdma_bytes = num_nvl_bytes, num_rdma_bytes
        self.low_latency_mode, self.explicitly_destroy = bool(low_latency_mode), bool(explicitly_destroy)
        self.enable_shrink = bool(enable_shrink)
        self.comm = comm
        a = NUM_BUFFER_ALIGNMENT_BYTES
        check(
            num_nvl_bytes % a == 0 and (num_nvl_bytes <= INT_MAX or num_rdma_bytes == 0),
            f"{BUFFER_HPP}:107",
            "num_nvl_bytes % LEGACY_NUM_BUFFER_ALIGNMENT_BYTES == 0 and "
            "(num_nvl_bytes <= std::numeric_limits<int>::max() or num_rdma_bytes == 0)",
        )
        check(
            num_rdma_bytes % a == 0 and (low_latency_mode or num_rdma_bytes <= INT_MAX),
            f"{BUFFER_HPP}:109",
            "num_rdma_bytes % LEGACY_NUM_BUFFER_ALIGNMENT_BYTES == 0 and "
            "(low_latency_mode or num_rdma_bytes <= std::numeric_limits<int>::max())",
        )
        check(
            num_nvl_bytes // 16 < INT_MAX,
            f"{BUFFER_HPP}:111",
            "num_nvl_bytes / sizeof(int4) < std::numeric_limits<int>::max()",
        )
        check(
            num_rdma_bytes // 16 < INT_MAX,
            f"{BUFFER_HPP}:112",
            "num_rdma_bytes / sizeof(int4) < std::numeric_limits<int>::max()",
        )
        check(
            0 <= rank < num_ranks and (num_ranks <= NUM_MAX_NVL_PEERS * NUM_MAX_RDMA_PEERS or low_latency_mode),
            f"{BUFFER_HPP}:113",
            "0 <= rank and rank < num_ranks and "
            "(num_ranks <= LEGACY_NUM_MAX_NVL_PEERS * LEGACY_NUM_MAX_RDMA_PEERS or low_latency_mode)",
        )
        check(
            num_ranks < NUM_MAX_NVL_PEERS or num_ranks % NUM_MAX_NVL_PEERS == 0,
            f"{BUFFER_HPP}:114",
            "num_ranks < LEGACY_NUM_MAX_NVL_PEERS or num_ranks % LEGACY_NUM_MAX_NVL_PEERS == 0",
        )
        if num_rdma_bytes > 0:
            check(
                num_ranks > NUM_MAX_NVL_PEERS or low_latency_mode,
                f"{BUFFER_HPP}:116",
                "num_ranks > LEGACY_NUM_MAX_NVL_PEERS or low_latency_mode",
            )
        self.rdma_rank, self.nvl_rank = rank // NUM_MAX_NVL_PEERS, rank % NUM_MAX_NVL_PEERS
        self.num_rdma_ranks = max(1, num_ranks // NUM_MAX_NVL_PEERS)
        self.num_nvl_ranks = min(num_ranks, NUM_MAX_NVL_PEERS)
        half_sms = S.STATE.num_device_sms // 2
        check(
            ceil_div(num_nvl_bytes, half_sms) < INT_MAX,
            f"{BUFFER_HPP}:129",
            "ceil_div<int64_t>(num_nvl_bytes, num_device_sms / 2) < std::numeric_limits<int>::max()",
        )
        check(
            ceil_div(num_rdma_bytes, half_sms) < INT_MAX,
            f"{BUFFER_HPP}:130",
            "ceil_div<int64_t>(num_rdma_bytes, num_device_sms / 2) < std::numeric_limits<int>::max()",
        )
        self.device_id = rank % NUM_MAX_NVL_PEERS  # one GPU per local rank
        self.ipc_handle = bytearray(f"deep_ep stand-in IPC handle of rank {rank}".encode())
        self.available = False
        self.destroyed = False
        self.low_latency_buffer_idx = 0
        self.mask = None  # shrink mode: [num_ranks] int32 mask buffer (allocated in `sync`)
        self.ll_send_buffers = [None, None]  # the combine send areas of the two low-latency halves
        self.ll_send_key = None
        self.ll_calls = 0
        self.num_qps_per_rank = None  # NVSHMEM_IBGDA_NUM_RC_PER_PE, read when NVSHMEM starts (`sync`)

    # -- bindings used by deep_ep/buffers/legacy.py ------------------------------------------------------------------

    def is_available(self) -> bool:
        return self.available

    def is_internode_available(self) -> bool:
        return self.is_available() and self.num_ranks > NUM_MAX_NVL_PEERS

    def get_num_rdma_ranks(self) -> int:
        return self.num_rdma_ranks

    def get_rdma_rank(self) -> int:
        return self.rdma_rank

    def get_root_rdma_rank(self, is_global: bool) -> int:
        return self.nvl_rank if is_global else 0

    def get_local_device_id(self) -> int:
        return self.device_id

    def get_local_ipc_handle(self) -> bytearray:
        return bytearray(self.ipc_handle)

    def get_local_nvshmem_unique_id(self) -> bytearray:
        check(
            self.rdma_rank == 0, f"{BUFFER_HPP}:210", 'rdma_rank == 0 and "Only RDMA rank 0 can get NVSHMEM unique ID"'
        )
        return bytearray(b"deep_ep stand-in NVSHMEM unique id")

    def get_comm_stream(self):
        S.not_implemented("Buffer.get_comm_stream", "there is no CUDA communication stream on CPU")

    def get_local_buffer_tensor(self, dtype, offset, use_rdma_buffer):
        S.not_implemented("Buffer.get_local_buffer_tensor", "the NVLink/NVSHMEM buffers are not materialized")

    def sync(self, device_ids, all_gathered_handles, root_unique_id_opt) -> None:
        check(not self.is_available(), f"{BUFFER_HPP}:230", "not is_available()")
        if self.num_nvl_bytes > 0:
            check(self.num_ranks == len(device_ids), f"{BUFFER_HPP}:234", "num_ranks == device_ids.size()")
            check(
                len(device_ids) == len(all_gathered_handles),
                f"{BUFFER_HPP}:235",
                "device_ids.size() == all_gathered_handles.size()",
            )
            offset = self.rdma_rank * self.num_nvl_ranks
            for i in range(self.num_nvl_ranks):
                check(
                    all_gathered_handles[offset + i] is not None,
                    f"{BUFFER_HPP}:237",
                    "all_gathered_handles[offset + i].has_value()",
                )
                if offset + i == self.rank:
                    check(
                        bytes(all_gathered_handles[offset + i]) == bytes(self.ipc_handle),
                        f"{BUFFER_HPP}:245",
                        "std::memcmp(&ipc_handles[i], handle_str.c_str(), sizeof(shared_memory::MemHandle)) == 0",
                    )
        if self.num_rdma_bytes > 0:
            check(root_unique_id_opt is not None, f"{BUFFER_HPP}:258", "root_unique_id_opt.has_value()")
            self.num_qps_per_rank = int(os.environ.get("NVSHMEM_IBGDA_NUM_RC_PER_PE", "1"))
            if self.enable_shrink:
                self.mask = torch.zeros(self.num_ranks, dtype=torch.int32)
            self.comm.barrier()  # nvshmem::barrier
        self.available = True

    def destroy(self) -> None:
        check(not self.destroyed, f"{BUFFER_HPP}:293", "not destroyed")
        if self.num_nvl_bytes > 0 or (self.is_available() and self.num_rdma_bytes > 0):
            self.comm.barrier()  # intranode::barrier / nvshmem::barrier: collective
        self.destroyed = True
        self.available = False

    # -- layout ------------------------------------------------------------------------------------------------------

    def get_dispatch_layout(self, topk_idx, num_experts, previous_event, async_, allocate_on_comm_stream):
        """buffer.hpp:337-404 + csrc/kernels/legacy/layout.cu."""
        _ints("get_dispatch_layout", num_experts=num_experts)
        num_experts = int(num_experts)
        check(topk_idx.dim() == 2, f"{BUFFER_HPP}:343", "topk_idx.dim() == 2")
        check(topk_idx.is_contiguous(), f"{BUFFER_HPP}:344", "topk_idx.is_contiguous()")
        check(num_experts > 0, f"{BUFFER_HPP}:345", "num_experts > 0")
        if allocate_on_comm_stream:
            check(previous_event is not None and async_, f"{BUFFER_HPP}:351", "previous_event.has_value() and async")
        num_tokens, num_topk = topk_idx.size(0), topk_idx.size(1)
        S.data_ptr_check(topk_idx, torch.int64)
        dev = topk_idx.device
        r, e_count = self.num_ranks, num_experts
        # layout.cu:36, :83: `static_cast<int>(topk_idx[...])`
        idx = topk_idx.cpu().to(torch.int32).to(torch.int64).reshape(num_tokens, num_topk)
        valid = (idx >= 0) & (idx < e_count)
        per_expert = torch.bincount(idx[valid], minlength=e_count)[:e_count].to(torch.int32)
        per_rank_experts = e_count // r
        in_rank = torch.zeros(num_tokens, r, dtype=torch.bool)
        if per_rank_experts > 0:
            ranked = (idx >= 0) & (idx < r * per_rank_experts)
            tok, slot = ranked.nonzero(as_tuple=True)
            in_rank[tok, idx[tok, slot] // per_rank_experts] = True
        per_rank = in_rank.sum(0).to(torch.int32)
        per_rdma = None
        if self.is_internode_available():
            nodes = r // NUM_MAX_NVL_PEERS
            per_rdma = in_rank.view(num_tokens, nodes, NUM_MAX_NVL_PEERS).any(-1).sum(0).to(torch.int32).to(dev)
        return per_rank.to(dev), per_rdma, per_expert.to(dev), in_rank.to(dev), _event(async_)

    # -- intranode dispatch ------------------------------------------------------------------------------------------

    def intranode_dispatch(
        self,
        x,
        x_scales,
        topk_idx,
        topk_weights,
        num_tokens_per_rank,
        is_token_in_rank,
        num_tokens_per_expert,
        cached_num_recv_tokens,
        cached_rank_prefix_matrix,
        cached_channel_prefix_matrix,
        expert_alignment,
        num_worst_tokens,
        config,
        previous_event,
        async_,
        allocate_on_comm_stream,
    ):
        """buffer.hpp:406-717 + intranode.cu notify_dispatch / cached_notify_dispatch / dispatch."""
        _ints("intranode_dispatch", expert_alignment=expert_alignment, num_worst_tokens=num_worst_tokens)
        expert_alignment, num_worst_tokens = int(expert_alignment), int(num_worst_tokens)
        R, me = self.num_ranks, self.rank
        cached = cached_rank_prefix_matrix is not None
        num_sms, nvl_send, ring = config._num_sms, config._nvl_send, config._nvl_recv
        check(num_sms % 2 == 0, f"{BUFFER_HPP}:436", "config.num_sms % 2 == 0")
        C = num_sms // 2
        if cached:
            check(cached_rank_prefix_matrix is not None, f"{BUFFER_HPP}:439", "cached_rank_prefix_matrix.has_value()")
            check(
                cached_channel_prefix_matrix is not None,
                f"{BUFFER_HPP}:440",
                "cached_channel_prefix_matrix.has_value()",
            )
        else:
            check(num_tokens_per_rank is not None, f"{BUFFER_HPP}:442", "num_tokens_per_rank.has_value()")
            check(num_tokens_per_expert is not None, f"{BUFFER_HPP}:443", "num_tokens_per_expert.has_value()")
        check(
            is_token_in_rank.dtype == torch.bool, f"{BUFFER_HPP}:447", "is_token_in_rank.scalar_type() == torch::kBool"
        )
        if cached:
            check(
                cached_rank_prefix_matrix.dtype == torch.int32,
                f"{BUFFER_HPP}:449",
                "cached_rank_prefix_matrix->scalar_type() == torch::kInt32",
            )
            check(
                cached_channel_prefix_matrix.dtype == torch.int32,
                f"{BUFFER_HPP}:450",
                "cached_channel_prefix_matrix->scalar_type() == torch::kInt32",
            )
        else:
            check(
                num_tokens_per_expert.dtype == torch.int32,
                f"{BUFFER_HPP}:452",
                "num_tokens_per_expert->scalar_type() == torch::kInt32",
            )
            check(
                num_tokens_per_rank.dtype == torch.int32,
                f"{BUFFER_HPP}:453",
                "num_tokens_per_rank->scalar_type() == torch::kInt32",
            )
        check(x.dim() == 2 and x.is_contiguous(), f"{BUFFER_HPP}:457", "x.dim() == 2 and x.is_contiguous()")
        check(
            (x.size(1) * x.element_size()) % 16 == 0,
            f"{BUFFER_HPP}:458",
            "(x.size(1) * x.element_size()) % sizeof(int4) == 0",
        )
        check(
            is_token_in_rank.dim() == 2 and is_token_in_rank.is_contiguous(),
            f"{BUFFER_HPP}:459",
            "is_token_in_rank.dim() == 2 and is_token_in_rank.is_contiguous()",
        )
        check(
            is_token_in_rank.size(0) == x.size(0) and is_token_in_rank.size(1) == R,
            f"{BUFFER_HPP}:460",
            "is_token_in_rank.size(0) == x.size(0) and is_token_in_rank.size(1) == num_ranks",
        )
        if cached:
            rpm, cpm = cached_rank_prefix_matrix, cached_channel_prefix_matrix
            check(
                rpm.dim() == 2 and rpm.is_contiguous(),
                f"{BUFFER_HPP}:462",
                "cached_rank_prefix_matrix->dim() == 2 and cached_rank_prefix_matrix->is_contiguous()",
            )
            check(
                rpm.size(0) == R and rpm.size(1) == R,
                f"{BUFFER_HPP}:463",
                "cached_rank_prefix_matrix->size(0) == num_ranks and cached_rank_prefix_matrix->size(1) == num_ranks",
            )
            check(
                cpm.dim() == 2 and cpm.is_contiguous(),
                f"{BUFFER_HPP}:464",
                "cached_channel_prefix_matrix->dim() == 2 and cached_channel_prefix_matrix->is_contiguous()",
            )
            check(
                cpm.size(0) == R and cpm.size(1) == C,
                f"{BUFFER_HPP}:465",
                "cached_channel_prefix_matrix->size(0) == num_ranks and "
                "cached_channel_prefix_matrix->size(1) == num_channels",
            )
        else:
            nte, ntr = num_tokens_per_expert, num_tokens_per_rank
            check(
                nte.dim() == 1 and nte.is_contiguous(),
                f"{BUFFER_HPP}:467",
                "num_tokens_per_expert->dim() == 1 and num_tokens_per_expert->is_contiguous()",
            )
            check(nte.size(0) % R == 0, f"{BUFFER_HPP}:468", "num_tokens_per_expert->size(0) % num_ranks == 0")
            check(
                nte.size(0) // R <= NUM_MAX_LOCAL_EXPERTS,
                f"{BUFFER_HPP}:469",
                "num_tokens_per_expert->size(0) / num_ranks <= LEGACY_NUM_MAX_LOCAL_EXPERTS",
            )
            check(
                ntr.dim() == 1 and ntr.is_contiguous(),
                f"{BUFFER_HPP}:470",
                "num_tokens_per_rank->dim() == 1 and num_tokens_per_rank->is_contiguous()",
            )
            check(ntr.size(0) == R, f"{BUFFER_HPP}:471", "num_tokens_per_rank->size(0) == num_ranks")
        num_tokens, hidden = x.size(0), x.size(1)
        num_experts = 0 if cached else num_tokens_per_expert.size(0)
        num_local_experts = num_experts // R
        num_topk = 0
        check(
            (topk_idx is not None) == (topk_weights is not None),
            f"{BUFFER_HPP}:481",
            "topk_idx.has_value() == topk_weights.has_value()",
        )
        if topk_idx is not None:
            num_topk = topk_idx.size(1)
            check(num_experts > 0, f"{BUFFER_HPP}:484", "num_experts > 0")
            check(
                topk_idx.dim() == 2 and topk_idx.is_contiguous(),
                f"{BUFFER_HPP}:485",
                "topk_idx->dim() == 2 and topk_idx->is_contiguous()",
            )
            check(
                topk_weights.dim() == 2 and topk_weights.is_contiguous(),
                f"{BUFFER_HPP}:486",
                "topk_weights->dim() == 2 and topk_weights->is_contiguous()",
            )
            check(
                num_tokens == topk_idx.size(0) and num_tokens == topk_weights.size(0),
                f"{BUFFER_HPP}:487",
                "num_tokens == topk_idx->size(0) and num_tokens == topk_weights->size(0)",
            )
            check(num_topk == topk_weights.size(1), f"{BUFFER_HPP}:488", "num_topk == topk_weights->size(1)")
            check(
                topk_weights.dtype == torch.float32,
                f"{BUFFER_HPP}:489",
                "topk_weights->scalar_type() == torch::kFloat32",
            )
            S.data_ptr_check(topk_idx, torch.int64)
        num_scales = 0
        if x_scales is not None:
            check(x.element_size() == 1, f"{BUFFER_HPP}:498", "x.element_size() == 1")
            check(
                x_scales.dtype in (torch.float32, torch.int32),
                f"{BUFFER_HPP}:499",
                "x_scales->scalar_type() == torch::kFloat32 or x_scales->scalar_type() == torch::kInt",
            )
            check(x_scales.dim() == 2, f"{BUFFER_HPP}:500", "x_scales->dim() == 2")
            check(x_scales.size(0) == num_tokens, f"{BUFFER_HPP}:501", "x_scales->size(0) == num_tokens")
            num_scales = x_scales.size(1)
        if allocate_on_comm_stream:
            check(previous_event is not None and async_, f"{BUFFER_HPP}:512", "previous_event.has_value() and async")
        if cached:
            switch_ranks(R)  # cached_notify_dispatch launch
        else:
            check(
                R * (R + num_local_experts) * 4 <= self.num_nvl_bytes,
                f"{BUFFER_HPP}:552",
                "num_ranks * (num_ranks + num_local_experts) * sizeof(int) <= num_nvl_bytes",
            )
            check(num_experts % R == 0, f"{INTRANODE_CU}:167", "num_experts % num_ranks == 0")
            check(
                num_experts // R <= 128 and R <= 128,
                f"{INTRANODE_CU}:168",
                "num_experts / num_ranks <= kNumThreads and num_ranks <= kNumThreads",
            )
            switch_ranks(R)  # notify_dispatch launch
            if num_worst_tokens > 0:
                check(topk_idx is not None, f"{BUFFER_HPP}:576", "topk_idx.has_value()")
                check(topk_weights is not None, f"{BUFFER_HPP}:577", "topk_weights.has_value()")
        elem = x.element_size()
        check(
            R * R * 4
            + C * R * 4 * 4
            + C * R * ring * hidden * elem
            + C * R * ring * 4
            + C * R * ring * num_topk * 8
            + C * R * ring * num_topk * 4
            + C * R * ring * 4 * num_scales
            <= self.num_nvl_bytes,
            f"{BUFFER_HPP}:627",
            "num_ranks * num_ranks * sizeof(int) + num_channels * num_ranks * sizeof(int) + "
            "num_channels * num_ranks * sizeof(int) + num_channels * num_ranks * sizeof(int) * 2 + "
            "num_channels * num_ranks * config.num_max_nvl_chunked_recv_tokens * hidden * recv_x.element_size() + "
            "num_channels * num_ranks * config.num_max_nvl_chunked_recv_tokens * sizeof(int) + "
            "num_channels * num_ranks * config.num_max_nvl_chunked_recv_tokens * num_topk * sizeof(topk_idx_t) + "
            "num_channels * num_ranks * config.num_max_nvl_chunked_recv_tokens * num_topk * sizeof(float) + "
            "num_channels * num_ranks * config.num_max_nvl_chunked_recv_tokens * sizeof(float) * num_scales "
            "<= num_nvl_bytes",
        )
        if x_scales is not None:
            check(
                num_scales * x_scales.stride(1) < INT_MAX,
                f"{INTRANODE_CU}:583",
                "static_cast<int64_t>(num_scales) * scale_hidden_stride < std::numeric_limits<int>::max()",
            )
        check(num_sms % 2 == 0, f"{INTRANODE_CU}:620", "num_sms % 2 == 0")
        switch_ranks(R)
        if C == 0:
            raise RuntimeError(
                f"{S.PREFIX}CUDA runtime exception ({INTRANODE_CU}:622): 9 (cudaErrorInvalidConfiguration, "
                "invalid configuration argument)"
            )

        # ---- sender side (this rank's tokens): channels, send_head, rows per destination -------------------------
        problems = []
        if num_topk > 32:
            problems.append(f"{INTRANODE_CU}:251: EP_DEVICE_ASSERT(num_topk <= 32) traps (num_topk = {num_topk})")
        itr = is_token_in_rank.cpu()
        sent = itr.to(torch.int64)
        chan = torch.empty(num_tokens, dtype=torch.int64)
        chan_start = torch.empty(num_tokens, dtype=torch.int64)
        for c in range(C):
            s0, s1 = channel_range(num_tokens, C, c)
            chan[s0:s1], chan_start[s0:s1] = c, s0
        counts = torch.zeros(R, C, dtype=torch.int64)
        if num_tokens:
            counts.index_add_(1, chan, sent.t().contiguous())
        own_cpm = counts.cumsum(1).to(torch.int32)  # notify_dispatch (intranode.cu:105-125)
        used_cpm = cached_channel_prefix_matrix.cpu() if cached else own_cpm
        exclusive = sent.cumsum(0) - sent
        head = exclusive - (exclusive[chan_start] if num_tokens else exclusive)
        send_head = torch.where(itr, head, torch.full_like(head, -1)).to(torch.int32)  # intranode.cu:358-360
        x_bytes = x.detach().cpu().view(torch.uint8).reshape(num_tokens, hidden * elem)
        scales_bits = None
        if x_scales is not None:  # read through the tensor's strides, 4 bytes each (intranode.cu:396-400)
            scales_bits = x_scales.detach().cpu().view(torch.int32)
        idx_cpu = topk_idx.detach().cpu() if topk_idx is not None else None
        w_cpu = topk_weights.detach().cpu() if topk_weights is not None else None
        per_dst = []
        for r in range(R):
            tokens = itr[:, r].nonzero().reshape(-1)
            item = {
                "tokens": tokens.to(torch.int32),
                "counts": counts[r].clone(),
                "cpm": used_cpm[r].to(torch.int64).clone(),
                "x": x_bytes[tokens],
                "scales": scales_bits[tokens] if scales_bits is not None else None,
            }
            if idx_cpu is not None:
                lo, hi = r * num_local_experts, (r + 1) * num_local_experts
                sel = idx_cpu[tokens]
                local = torch.where((sel >= lo) & (sel < hi), sel - lo, torch.full_like(sel, -1))
                item["topk_idx"] = local
                item["topk_weights"] = torch.where(local >= 0, w_cpu[tokens], torch.zeros_like(w_cpu[tokens]))
            if not cached:
                item["num_tokens_per_rank"] = int(num_tokens_per_rank[r])
                item["num_tokens_per_expert"] = _int32(
                    num_tokens_per_expert[r * num_local_experts : (r + 1) * num_local_experts]
                )
            per_dst.append(item)
        meta = {
            "row_bytes": hidden * elem,
            "num_scales": num_scales if x_scales is not None else None,
            "num_topk": num_topk if topk_idx is not None else None,
            "config": (num_sms, nvl_send, ring),
            "cached": cached,
            "num_experts": num_experts,
        }
        gathered = self.comm.exchange([(meta, item) for item in per_dst])

        # ---- receiver side --------------------------------------------------------------------------------------
        if problems:
            panic("; ".join(problems))
        for s, (m, _) in enumerate(gathered):
            for key in meta:
                if m[key] != meta[key]:
                    panic(
                        f"intranode dispatch: rank {s} and rank {me} disagree on {key} ({m[key]!r} vs "
                        f"{meta[key]!r}): the kernels would misread each other's channel buffers or hang"
                    )
        incoming = [g[1] for g in gathered]
        if cached:
            col = _int32(cached_rank_prefix_matrix[:, me].cpu())
            num_recv_tokens = cached_num_recv_tokens
            rank_prefix_matrix = cached_rank_prefix_matrix
        else:
            col, acc = [], 0
            for item in incoming:
                acc = _wrap32(acc + item["num_tokens_per_rank"])
                col.append(acc)
            rank_prefix_matrix = S.garbage((R, R), torch.int32)  # other columns: see the package docstring
            rank_prefix_matrix[:, me] = torch.tensor(col, dtype=torch.int32)
            num_recv_tokens = num_worst_tokens if num_worst_tokens > 0 else col[R - 1]
        recv_list = []
        if not cached and num_worst_tokens == 0:
            if expert_alignment <= 0:
                panic(f"intranode.cu:87 divides by expert_alignment = {expert_alignment}: garbage counts")
            for i in range(num_local_experts):
                total = sum(item["num_tokens_per_expert"][i] for item in incoming)
                recv_list.append(ceil_div(total, expert_alignment) * expert_alignment)

        recv_x = S.garbage((num_recv_tokens, hidden), x.dtype)
        recv_src_idx = S.garbage((num_recv_tokens,), torch.int32)
        recv_cpm = torch.empty(R, C, dtype=torch.int32)
        recv_topk_idx = recv_topk_weights = recv_x_scales = None
        if topk_idx is not None:
            recv_topk_idx = S.garbage((num_recv_tokens, num_topk), topk_idx.dtype)
            recv_topk_weights = S.garbage((num_recv_tokens, num_topk), topk_weights.dtype)
        if x_scales is not None:
            recv_x_scales = S.garbage((num_recv_tokens, num_scales), x_scales.dtype)
        dests, sources = [], []
        for s, item in enumerate(incoming):
            rank_offset = col[s - 1] if s > 0 else 0
            cpm_row = _int32(item["cpm"])
            actual = _int32(item["counts"])
            first = 0
            for c in range(C):
                start = cpm_row[c - 1] if c > 0 else 0
                end = cpm_row[c]
                recv_cpm[s, c] = _wrap32(start)
                if start == -1 or end == -1:
                    panic(
                        f"intranode dispatch: rank {s} channel {c} sends the offset -1, encoded as 0 (intranode.cu:"
                        f"318-324): the receiver of rank {me} spins forever (timeout trap)"
                    )
                if end - start != actual[c]:
                    panic(
                        f"intranode dispatch: rank {s} channel {c} announces {end - start} tokens for rank {me} "
                        f"(channel_prefix_matrix) but its is_token_in_rank selects {actual[c]}: the real kernels "
                        "hang or write past the channel's rows"
                    )
                dest = torch.arange(actual[c], dtype=torch.int64) + (rank_offset + start)
                dests.append(dest)
                sources.append((s, first, actual[c]))
                first += actual[c]
        all_dest = torch.cat(dests) if dests else torch.empty(0, dtype=torch.int64)
        if all_dest.numel():
            if int(all_dest.min()) < 0 or int(all_dest.max()) >= num_recv_tokens:
                panic(
                    f"intranode dispatch: rank {me} would write received rows at [{int(all_dest.min())}, "
                    f"{int(all_dest.max())}] outside its {num_recv_tokens} rows (rank_prefix_matrix / "
                    "num_tokens_per_rank / num_worst_tokens disagree with the routing): out-of-bounds writes"
                )
            if torch.unique(all_dest).numel() != all_dest.numel():
                panic(
                    f"intranode dispatch: two source channels write the same rows of rank {me}'s recv_x "
                    "(inconsistent rank_prefix_matrix): the result would depend on timing"
                )
        recv_bytes = recv_x.view(torch.uint8).reshape(num_recv_tokens, hidden * elem)
        for dest, (s, first, n) in zip(dests, sources):
            if n == 0:
                continue
            item = incoming[s]
            rows = slice(first, first + n)
            recv_bytes[dest] = item["x"][rows]
            recv_src_idx[dest] = item["tokens"][rows]
            if recv_topk_idx is not None:
                recv_topk_idx[dest] = item["topk_idx"][rows]
                recv_topk_weights[dest] = item["topk_weights"][rows]
            if recv_x_scales is not None:
                recv_x_scales.view(torch.int32)[dest] = item["scales"][rows]
        if num_worst_tokens > 0 and recv_topk_idx is not None:  # intranode.cu:535-545
            clean_start = col[R - 1] * num_topk
            if clean_start < 0:
                panic(f"intranode dispatch: recv_topk_idx cleaning starts at {clean_start}: out-of-bounds writes")
            recv_topk_idx.view(-1)[clean_start : num_worst_tokens * num_topk] = -1
        dev = x.device
        outs = [recv_x, recv_x_scales, recv_topk_idx, recv_topk_weights]
        recv_x, recv_x_scales, recv_topk_idx, recv_topk_weights = [o.to(dev) if o is not None else None for o in outs]
        if not cached:
            rank_prefix_matrix = rank_prefix_matrix.to(dev)
            channel_prefix_matrix = own_cpm.to(dev)
        else:
            channel_prefix_matrix = cached_channel_prefix_matrix
        return (
            recv_x,
            recv_x_scales,
            recv_topk_idx,
            recv_topk_weights,
            recv_list,
            rank_prefix_matrix,
            channel_prefix_matrix,
            recv_cpm.to(dev),
            recv_src_idx.to(dev),
            send_head.to(dev),
            _event(async_),
        )

    # -- intranode combine -------------------------------------------------------------------------------------------

    def intranode_combine(
        self,
        x,
        topk_weights,
        bias_0,
        bias_1,
        src_idx,
        rank_prefix_matrix,
        channel_prefix_matrix,
        send_head,
        config,
        previous_event,
        async_,
        allocate_on_comm_stream,
    ):
        """buffer.hpp:719-858 + intranode.cu cached_notify_combine / combine."""
        R, me = self.num_ranks, self.rank
        num_sms, nvl_send, ring = config._num_sms, config._nvl_send, config._nvl_recv
        check(x.dim() == 2 and x.is_contiguous(), f"{BUFFER_HPP}:732", "x.dim() == 2 and x.is_contiguous()")
        check(
            src_idx.dim() == 1 and src_idx.is_contiguous() and src_idx.dtype == torch.int32,
            f"{BUFFER_HPP}:733",
            "src_idx.dim() == 1 and src_idx.is_contiguous() and src_idx.scalar_type() == torch::kInt32",
        )
        check(
            send_head.dim() == 2 and send_head.is_contiguous() and send_head.dtype == torch.int32,
            f"{BUFFER_HPP}:734",
            "send_head.dim() == 2 and send_head.is_contiguous() and send_head.scalar_type() == torch::kInt32",
        )
        rpm, cpm = rank_prefix_matrix, channel_prefix_matrix
        check(
            rpm.dim() == 2 and rpm.is_contiguous() and rpm.dtype == torch.int32,
            f"{BUFFER_HPP}:735",
            "rank_prefix_matrix.dim() == 2 and rank_prefix_matrix.is_contiguous() and "
            "rank_prefix_matrix.scalar_type() == torch::kInt32",
        )
        check(
            cpm.dim() == 2 and cpm.is_contiguous() and cpm.dtype == torch.int32,
            f"{BUFFER_HPP}:737",
            "channel_prefix_matrix.dim() == 2 and channel_prefix_matrix.is_contiguous() and "
            "channel_prefix_matrix.scalar_type() == torch::kInt32",
        )
        check(num_sms % 2 == 0, f"{BUFFER_HPP}:741", "config.num_sms % 2 == 0")
        C = num_sms // 2
        num_tokens, hidden = x.size(0), x.size(1)
        num_recv_tokens = send_head.size(0)
        check(src_idx.size(0) == num_tokens, f"{BUFFER_HPP}:746", "src_idx.size(0) == num_tokens")
        check(send_head.size(1) == R, f"{BUFFER_HPP}:747", "send_head.size(1) == num_ranks")
        check(
            rpm.size(0) == R and rpm.size(1) == R,
            f"{BUFFER_HPP}:748",
            "rank_prefix_matrix.size(0) == num_ranks and rank_prefix_matrix.size(1) == num_ranks",
        )
        check(
            cpm.size(0) == R and cpm.size(1) == C,
            f"{BUFFER_HPP}:749",
            "channel_prefix_matrix.size(0) == num_ranks and channel_prefix_matrix.size(1) == num_channels",
        )
        check(
            (hidden * x.element_size()) % 16 == 0,
            f"{BUFFER_HPP}:750",
            "(hidden * x.element_size()) % sizeof(int4) == 0",
        )
        if allocate_on_comm_stream:
            check(previous_event is not None and async_, f"{BUFFER_HPP}:756", "previous_event.has_value() and async")
        num_topk = 0
        if topk_weights is not None:
            check(
                topk_weights.dim() == 2 and topk_weights.is_contiguous(),
                f"{BUFFER_HPP}:772",
                "topk_weights->dim() == 2 and topk_weights->is_contiguous()",
            )
            check(topk_weights.size(0) == num_tokens, f"{BUFFER_HPP}:773", "topk_weights->size(0) == num_tokens")
            check(
                topk_weights.dtype == torch.float32,
                f"{BUFFER_HPP}:774",
                "topk_weights->scalar_type() == torch::kFloat32",
            )
            num_topk = topk_weights.size(1)
        check(
            C * R * 4 * 2 <= self.num_nvl_bytes,
            f"{BUFFER_HPP}:782",
            "num_channels * num_ranks * sizeof(int) * 2 <= num_nvl_bytes",
        )
        num_threads = max(128, 32 * R)
        check(R <= num_threads, f"{INTRANODE_CU}:697", "num_ranks <= num_threads")
        check(num_threads <= 1024, f"{INTRANODE_CU}:698", "num_threads <= 1024")
        check(1 + C <= C * 2, f"{INTRANODE_CU}:699", "1 + num_channels <= num_channels * 2")
        switch_ranks(R)
        # cached_notify_combine (intranode.cu:626-673) rewrites the -1 entries of send_head IN PLACE
        heads = _rewrite_send_head(send_head.cpu(), C)
        send_head.copy_(heads)
        for bias in (bias_0, bias_1):
            if bias is not None:
                check(
                    bias.dim() == 2 and bias.is_contiguous(),
                    f"{BUFFER_HPP}:799",
                    "bias.dim() == 2 and bias.is_contiguous()",
                )
                check(bias.dtype == x.dtype, f"{BUFFER_HPP}:800", "bias.scalar_type() == x.scalar_type()")
                check(
                    bias.size(0) == num_recv_tokens and bias.size(1) == hidden,
                    f"{BUFFER_HPP}:801",
                    "bias.size(0) == num_recv_tokens and bias.size(1) == hidden",
                )
        check(
            C * R * 4 * 2 + C * R * ring * hidden * x.element_size() + C * R * ring * 4 + C * R * ring * num_topk * 4
            <= self.num_nvl_bytes,
            f"{BUFFER_HPP}:807",
            "num_channels * num_ranks * sizeof(int) * 2 + "
            "num_channels * num_ranks * config.num_max_nvl_chunked_recv_tokens * hidden * x.element_size() + "
            "num_channels * num_ranks * config.num_max_nvl_chunked_recv_tokens * sizeof(int) + "
            "num_channels * num_ranks * config.num_max_nvl_chunked_recv_tokens * num_topk * sizeof(float) "
            "<= num_nvl_bytes",
        )
        check(num_sms % 2 == 0, f"{INTRANODE_CU}:1107", "num_sms % 2 == 0")
        check(768 >= R * 32, f"{INTRANODE_CU}:1108", "kNumThreads >= num_ranks * 32")
        check(x.dtype == BF16, f"{LAUNCH_CUH}:109", 'false and "Unsupported type"')
        switch_ranks(R)

        # ---- sender side: the rows this rank received in dispatch go back, per (original rank, channel) ----------
        problems = []
        if num_topk > 32:
            problems.append(f"{INTRANODE_CU}:730: EP_DEVICE_ASSERT(num_topk <= 32) traps (num_topk = {num_topk})")
        xs = x.detach().cpu()
        ws = topk_weights.detach().cpu() if topk_weights is not None else None
        src_cpu = src_idx.cpu()
        rpm_col = _int32(rpm[:, me].cpu())
        cpm_cpu = [_int32(row) for row in cpm.cpu()]
        per_dst = []
        for s in range(R):
            rank_offset = rpm_col[s - 1] if s > 0 else 0
            num_rank_tokens = rpm_col[s] - rank_offset
            queues = []
            for c in range(C):
                channel_offset = cpm_cpu[s][c]
                end = num_rank_tokens if c == C - 1 else cpm_cpu[s][c + 1]
                n = max(0, end - channel_offset)  # intranode.cu:780-787; a negative count sends nothing
                first = rank_offset + channel_offset
                if n and (first < 0 or first + n > num_tokens):
                    problems.append(
                        f"combine: rank {me} would send rows [{first}, {first + n}) of its {num_tokens}-row x to "
                        f"rank {s} (channel {c}): out-of-bounds reads (inconsistent rank_prefix_matrix / "
                        "recv_channel_prefix_matrix)"
                    )
                    n = 0
                rows = slice(first, first + n)
                queues.append(
                    {
                        "x": xs[rows].clone(),
                        "src_idx": src_cpu[rows].clone(),
                        "w": ws[rows].clone() if ws is not None else None,
                    }
                )
            per_dst.append(queues)
        meta = {"hidden": hidden, "num_topk": num_topk, "config": (num_sms, nvl_send, ring)}
        gathered = self.comm.exchange([(meta, item) for item in per_dst])

        # ---- receiver side: this rank's original tokens --------------------------------------------------------
        if problems:
            panic("; ".join(problems))
        for s, (m, _) in enumerate(gathered):
            if m != meta:
                panic(
                    f"combine: rank {s} and rank {me} disagree ({m!r} vs {meta!r}): the kernels would misread "
                    "each other's channel buffers or hang"
                )
        queues = [g[1] for g in gathered]  # queues[r][c]: what rank r sends back to this rank in channel c
        acc = torch.zeros(num_recv_tokens, hidden, dtype=torch.float32)
        for bias in (bias_0, bias_1):
            acc = acc + (bias.detach().cpu().float() if bias is not None else torch.zeros_like(acc))
        acc_w = torch.zeros(num_recv_tokens, num_topk, dtype=torch.float32)
        strict = []
        for r in range(R):
            row_of = torch.full((num_recv_tokens,), -1, dtype=torch.int64)
            rows_x, rows_w = [], []
            base = 0
            for c in range(C):
                t0, t1 = channel_range(num_recv_tokens, C, c)
                q = queues[r][c]
                n = q["x"].size(0)
                h = heads[t0:t1, r].to(torch.int64)
                read = h >= 0
                hr = h[read]
                if hr.numel() and int(hr.max()) >= n:
                    panic(
                        f"combine: send_head[{t0 + int(h.argmax())}, {r}] = {int(hr.max())} but rank {r} sends "
                        f"{n} rows in channel {c}: the receiver of rank {me} waits forever (timeout trap, "
                        "intranode.cu:926-934)"
                    )
                if n > ring and not torch.equal(hr, torch.arange(n)):
                    panic(
                        f"combine: rank {r} sends {n} rows in channel {c}, more than the queue holds ({ring}), "
                        f"and send_head[:, {r}] of rank {me} does not read them in order: the real kernel reads "
                        "overwritten slots or deadlocks"
                    )
                tok = torch.arange(t0, t1)[read]
                if S.STATE.strict_handle and hr.numel():
                    shipped = q["src_idx"][hr].to(torch.int64)
                    bad = shipped != tok
                    if bool(bad.any()):
                        j = int(bad.nonzero()[0])
                        strict.append(
                            f"token {int(tok[j])} of rank {me} reads slot {int(hr[j])} of rank {r}'s "
                            f"channel {c}, which carries recv_src_idx {int(shipped[j])}"
                        )
                row_of[tok] = hr + base
                rows_x.append(q["x"])
                if q["w"] is not None:
                    rows_w.append(q["w"])
                base += n
            stacked = torch.cat(rows_x) if rows_x else torch.empty(0, hidden, dtype=x.dtype)
            got = row_of >= 0
            contrib = torch.zeros(num_recv_tokens, hidden, dtype=torch.float32)
            contrib[got] = stacked[row_of[got]].float()
            acc = torch.where(got.unsqueeze(1), acc + contrib, acc)
            if num_topk:
                stacked_w = torch.cat(rows_w) if rows_w else torch.empty(0, num_topk)
                cw = torch.zeros(num_recv_tokens, num_topk, dtype=torch.float32)
                cw[got] = stacked_w[row_of[got]]
                acc_w = torch.where(got.unsqueeze(1), acc_w + cw, acc_w)
        if strict:
            raise S.StrictHandleError(
                f"{S.PREFIX}Panic: combine: the handle's recv_src_idx disagrees with the rows send_head selects ("
                + "; ".join(strict[:4])
                + "). Upstream's combine never reads recv_src_idx values and would return the send_head-routed sum;"
                " the stand-in refuses the inconsistent handle (configure(strict_handle=False) to imitate upstream)"
            )
        dev = x.device
        combined = acc.to(x.dtype).to(dev)
        combined_w = acc_w.to(dev) if topk_weights is not None else None
        return combined, combined_w, _event(async_)

    # -- internode (not modelled) ------------------------------------------------------------------------------------

    def internode_dispatch(self, *args):
        S.not_implemented("internode dispatch (more than 8 ranks)", "the NVSHMEM/RDMA path is not emulated")

    def internode_combine(self, *args):
        S.not_implemented("internode combine (more than 8 ranks)", "the NVSHMEM/RDMA path is not emulated")

    # -- low-latency -------------------------------------------------------------------------------------------------

    def _ll_layout_and_toggle(self, t_max, hidden, num_experts, line):
        layout = LowLatencyLayout(t_max, hidden, self.num_ranks, num_experts)
        check(layout.total_bytes <= self.num_rdma_bytes, f"{BUFFER_HPP}:{line}", "layout.total_bytes <= num_rdma_bytes")
        current = self.low_latency_buffer_idx
        self.low_latency_buffer_idx ^= 1
        return layout, current

    def _ll_warp_groups(self, num_experts):
        groups = ceil_div(num_experts, S.STATE.num_device_sms)
        per_group = 32 // groups if groups > 0 else 0
        return groups, per_group

    def _masked(self, rank: int) -> bool:
        return self.mask is not None and int(self.mask[rank]) != 0

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank, hidden, num_experts) -> None:
        """buffer.hpp:1431-1454: barrier, clean both halves' signal areas, barrier."""
        _ints(
            "clean_low_latency_buffer",
            num_max_dispatch_tokens_per_rank=num_max_dispatch_tokens_per_rank,
            hidden=hidden,
            num_experts=num_experts,
        )
        check(self.low_latency_mode, f"{BUFFER_HPP}:1432", "low_latency_mode")
        layout = LowLatencyLayout(num_max_dispatch_tokens_per_rank, hidden, self.num_ranks, num_experts)
        for offset, num_int in layout.clean_meta:
            check(
                0 <= offset and offset + num_int * 4 <= self.num_rdma_bytes,
                f"{BUFFER_HPP}:1440",
                "0 <= offset and offset + num_bytes <= num_rdma_bytes",
            )
        self.comm.barrier()

    def low_latency_dispatch(
        self,
        x,
        topk_idx,
        cumulative_local_expert_recv_stats,
        dispatch_wait_recv_cost_stats,
        num_max_dispatch_tokens_per_rank,
        num_experts,
        use_fp8,
        round_scale,
        use_ue8m0,
        async_,
        return_recv_hook,
    ):
        """buffer.hpp:1456-1596 + internode_ll.cu dispatch."""
        _ints(
            "low_latency_dispatch",
            num_max_dispatch_tokens_per_rank=num_max_dispatch_tokens_per_rank,
            num_experts=num_experts,
        )
        num_max_dispatch_tokens_per_rank, num_experts = int(num_max_dispatch_tokens_per_rank), int(num_experts)
        R, me = self.num_ranks, self.rank
        t_max = num_max_dispatch_tokens_per_rank
        check(self.low_latency_mode, f"{BUFFER_HPP}:1474", "low_latency_mode")
        check(
            x.dim() == 2 and x.is_contiguous() and x.dtype == BF16,
            f"{BUFFER_HPP}:1478",
            "x.dim() == 2 and x.is_contiguous() and x.scalar_type() == torch::kBFloat16",
        )
        check(
            x.size(1) % 16 == 0 and x.size(1) % 128 == 0,
            f"{BUFFER_HPP}:1479",
            "x.size(1) % sizeof(int4) == 0 and x.size(1) % 128 == 0",
        )
        check(
            topk_idx.dim() == 2 and topk_idx.is_contiguous(),
            f"{BUFFER_HPP}:1480",
            "topk_idx.dim() == 2 and topk_idx.is_contiguous()",
        )
        check(
            x.size(0) == topk_idx.size(0) and x.size(0) <= t_max,
            f"{BUFFER_HPP}:1481",
            "x.size(0) == topk_idx.size(0) and x.size(0) <= num_max_dispatch_tokens_per_rank",
        )
        check(
            topk_idx.dtype == torch.int64,
            f"{BUFFER_HPP}:1482",
            "topk_idx.scalar_type() == c10::CppTypeToScalarType<topk_idx_t>::value",
        )
        check(num_experts % R == 0, f"{BUFFER_HPP}:1483", "num_experts % num_ranks == 0")
        stats = cumulative_local_expert_recv_stats
        if stats is not None:
            check(
                stats.dtype == torch.int32,
                f"{BUFFER_HPP}:1487",
                "cumulative_local_expert_recv_stats->scalar_type() == torch::kInt",
            )
            check(
                stats.dim() == 1 and stats.is_contiguous(),
                f"{BUFFER_HPP}:1488",
                "cumulative_local_expert_recv_stats->dim() == 1 and "
                "cumulative_local_expert_recv_stats->is_contiguous()",
            )
            check(
                stats.size(0) == num_experts // R,
                f"{BUFFER_HPP}:1489",
                "cumulative_local_expert_recv_stats->size(0) == num_experts / num_ranks",
            )
        wait_stats = dispatch_wait_recv_cost_stats
        if wait_stats is not None:
            check(
                wait_stats.dtype == torch.int64,
                f"{BUFFER_HPP}:1492",
                "dispatch_wait_recv_cost_stats->scalar_type() == torch::kInt64",
            )
            check(
                wait_stats.dim() == 1 and wait_stats.is_contiguous(),
                f"{BUFFER_HPP}:1493",
                "dispatch_wait_recv_cost_stats->dim() == 1 and dispatch_wait_recv_cost_stats->is_contiguous()",
            )
            check(wait_stats.size(0) == R, f"{BUFFER_HPP}:1494", "dispatch_wait_recv_cost_stats->size(0) == num_ranks")
        num_tokens, hidden = x.size(0), x.size(1)
        num_topk = topk_idx.size(1)
        L = num_experts // R
        self._ll_layout_and_toggle(t_max, hidden, num_experts, 1503)
        check(not (async_ and return_recv_hook), f"{BUFFER_HPP}:1511", "not(async and return_recv_hook)")
        check(
            (R * t_max) % 4 == 0,
            f"{BUFFER_HPP}:1526",
            "(num_ranks * num_max_dispatch_tokens_per_rank) % 4 == 0 and "
            '"TMA requires the number of tokens to be multiple of 4"',
        )
        if use_fp8:
            check(hidden % 512 == 0, f"{BUFFER_HPP}:1530", "hidden % 512 == 0")
            if use_ue8m0:
                check(round_scale, f"{BUFFER_HPP}:1535", "round_scale")
        groups, per_group = self._ll_warp_groups(num_experts)
        check(groups > 0 and per_group > 0, f"{INTERNODE_LL_CU}:496", "num_warp_groups > 0 and num_warps_per_group > 0")
        check(
            LL_MAX_TOPK + 1 <= groups * per_group,
            f"{INTERNODE_LL_CU}:497",
            "kNumMaxTopK + 1 <= num_warp_groups * num_warps_per_group",
        )
        check(num_topk <= LL_MAX_TOPK, f"{INTERNODE_LL_CU}:501", "num_topk <= kNumMaxTopK")
        check(
            num_experts * 4 * 2 <= NUM_WORKSPACE_BYTES,
            f"{INTERNODE_LL_CU}:506",
            "num_experts * sizeof(int) * 2 <= LEGACY_NUM_WORKSPACE_BYTES",
        )
        if use_ue8m0:
            check(round_scale, f"{INTERNODE_LL_CU}:510", 'round_scale and "UE8M0 SF requires `round_scale=True`"')
        switch_hidden(hidden)

        # ---- send phase ------------------------------------------------------------------------------------------
        problems = []
        if ceil_div(num_experts, groups) <= 1:
            problems.append(f"{INTERNODE_LL_CU}:281: EP_DEVICE_ASSERT(num_sms > 1) traps")
        if self.num_qps_per_rank is not None and self.num_qps_per_rank < L:
            problems.append(
                f"{INTERNODE_LL_CU}:284: EP_DEVICE_ASSERT(ibgda_get_state()->num_rc_per_pe >= "
                f"num_local_experts) traps (num_qps_per_rank = {self.num_qps_per_rank} < {L})"
            )
        if not (per_group > 1 and groups < 15):
            problems.append(
                f"{INTERNODE_LL_CU}:382: EP_DEVICE_ASSERT(num_warps_per_group > 1 and num_warp_groups < 15) traps"
            )
        idx = topk_idx.detach().cpu()
        if idx.numel() and int(idx.max()) >= num_experts:
            problems.append(
                f"low_latency_dispatch: topk_idx holds expert {int(idx.max())} >= num_experts = "
                f"{num_experts}: the kernel sends to a rank that does not exist"
            )
        xs = x.detach().cpu()
        if use_fp8:
            data, sf = _ll_cast_fp8(xs, round_scale)
            data = data.view(torch.uint8)
        else:
            data, sf = xs.view(torch.uint8).reshape(num_tokens, hidden * 2), None
        gen = _generator(self.ll_calls, me, 1)
        per_dst = [[None] * L for _ in range(R)]
        for e in range(num_experts):
            tok, _slot = (idx == e).nonzero(as_tuple=True)  # one message per (token, slot) selecting e
            if tok.numel() > 1 and gen is not None:  # slot = atomicAdd in arrival order (internode_ll.cu:255)
                tok = tok[torch.randperm(tok.numel(), generator=gen)]
            dst = e // L
            if self._masked(dst):
                continue  # is_rank_masked: neither the rows nor the count are sent (internode_ll.cu:264, :334)
            per_dst[dst][e % L] = {
                "tokens": tok.to(torch.int32),
                "x": data[tok],
                "sf": sf[tok] if sf is not None else None,
            }
        meta = {
            "t_max": t_max,
            "hidden": hidden,
            "num_experts": num_experts,
            "use_fp8": bool(use_fp8),
            "round_scale": bool(round_scale),
            "use_ue8m0": bool(use_ue8m0),
        }
        gathered = self.comm.exchange([(meta, item) for item in per_dst])
        self.ll_calls += 1
        if problems:
            panic("; ".join(problems))
        for s, (m, _) in enumerate(gathered):
            if m != meta:
                panic(
                    f"low_latency_dispatch: rank {s} and rank {me} disagree ({m!r} vs {meta!r}): the kernels would "
                    "misread each other's messages"
                )

        # ---- receive phase (now, or when the hook is called) ----------------------------------------------------
        slots = R * t_max
        dev = x.device
        packed_recv_x = S.garbage((L, slots, hidden), FP8 if use_fp8 else BF16)
        packed_recv_src_info = S.garbage((L, slots), torch.int32)
        packed_recv_layout_range = S.garbage((L, R), torch.int64)
        packed_recv_count = torch.zeros(L, dtype=torch.int32)  # cleaned in the send phase (internode_ll.cu:347)
        packed_recv_x_scales = None
        if use_fp8:
            storage = S.garbage(
                (L, hidden // (512 if use_ue8m0 else 128), slots), torch.int32 if use_ue8m0 else torch.float32
            )
            packed_recv_x_scales = storage.transpose(1, 2)  # buffer.hpp:1539
        outputs = [
            t.to(dev) if dev.type != "cpu" else t
            for t in (
                packed_recv_x,
                packed_recv_x_scales,
                packed_recv_count,
                packed_recv_src_info,
                packed_recv_layout_range,
            )
        ]
        recv_gen = _generator(self.ll_calls - 1, me, 2)
        incoming = [g[1] for g in gathered]
        state = {"done": False}

        def receive():
            if state["done"]:
                panic(
                    "low_latency_dispatch: the receive hook ran twice: the real kernel would add the counts again "
                    "and copy past the received rows"
                )
            state["done"] = True
            rx = packed_recv_x.view(torch.uint8).reshape(L, slots, -1)
            for i in range(L):
                order = list(range(R))
                if recv_gen is not None:  # segment begin = atomicAdd in arrival order (internode_ll.cu:408)
                    order = torch.randperm(R, generator=recv_gen).tolist()
                begin = 0
                for s in order:
                    item = incoming[s][i]
                    if item is None and self._masked(s):
                        n = 0
                    elif item is None:
                        if self.mask is None:
                            panic(
                                f"low_latency_dispatch: rank {s} masked rank {me} and sent nothing: rank {me} waits "
                                "for its count until the timeout trap (internode_ll.cu:383-403)"
                            )
                        print(
                            f"Warning: DeepEP timeout for dispatch receive, rank {me}, local_expert_idx {i}, "
                            f"src_rank {s}"
                        )
                        self.mask[s] = 1
                        n = 0
                    else:
                        n = item["tokens"].numel()
                    packed_recv_layout_range[i, s] = (begin << 32) | (n & 0xFFFFFFFF)
                    if n:
                        packed_recv_src_info[i, begin : begin + n] = item["tokens"]
                        rx[i, begin : begin + n] = item["x"]
                        if use_fp8:
                            _store_ll_scales(storage, i, begin, item["sf"], use_ue8m0)
                    begin += n
                packed_recv_count[i] = begin
                if stats is not None:
                    stats[i] += begin
            if dev.type != "cpu":
                for dst_t, src_t in zip(
                    outputs,
                    (
                        packed_recv_x,
                        packed_recv_x_scales,
                        packed_recv_count,
                        packed_recv_src_info,
                        packed_recv_layout_range,
                    ),
                ):
                    if dst_t is not None:
                        dst_t.copy_(src_t)

        hook = None
        if return_recv_hook:
            hook = receive
        else:
            receive()
        return (*outputs, _event(async_), hook)

    def low_latency_combine(
        self,
        x,
        topk_idx,
        topk_weights,
        src_info,
        layout_range,
        combine_wait_recv_cost_stats,
        num_max_dispatch_tokens_per_rank,
        num_experts,
        use_logfmt,
        zero_copy,
        async_,
        return_recv_hook,
        out=None,
    ):
        """buffer.hpp:1598-1715 + internode_ll.cu combine."""
        _ints(
            "low_latency_combine",
            num_max_dispatch_tokens_per_rank=num_max_dispatch_tokens_per_rank,
            num_experts=num_experts,
        )
        num_max_dispatch_tokens_per_rank, num_experts = int(num_max_dispatch_tokens_per_rank), int(num_experts)
        R, me = self.num_ranks, self.rank
        t_max = num_max_dispatch_tokens_per_rank
        check(self.low_latency_mode, f"{BUFFER_HPP}:1612", "low_latency_mode")
        check(
            x.dim() == 3 and x.is_contiguous() and x.dtype == BF16,
            f"{BUFFER_HPP}:1615",
            "x.dim() == 3 and x.is_contiguous() and x.scalar_type() == torch::kBFloat16",
        )
        check(x.size(0) == num_experts // R, f"{BUFFER_HPP}:1616", "x.size(0) == num_experts / num_ranks")
        check(x.size(1) == R * t_max, f"{BUFFER_HPP}:1617", "x.size(1) == num_ranks * num_max_dispatch_tokens_per_rank")
        check(
            x.size(2) % 16 == 0 and x.size(2) % 128 == 0,
            f"{BUFFER_HPP}:1618",
            "x.size(2) % sizeof(int4) == 0 and x.size(2) % 128 == 0",
        )
        check(
            topk_idx.dim() == 2 and topk_idx.is_contiguous(),
            f"{BUFFER_HPP}:1619",
            "topk_idx.dim() == 2 and topk_idx.is_contiguous()",
        )
        check(
            topk_idx.size(0) == topk_weights.size(0) and topk_idx.size(1) == topk_weights.size(1),
            f"{BUFFER_HPP}:1620",
            "topk_idx.size(0) == topk_weights.size(0) and topk_idx.size(1) == topk_weights.size(1)",
        )
        check(
            topk_idx.dtype == torch.int64,
            f"{BUFFER_HPP}:1621",
            "topk_idx.scalar_type() == c10::CppTypeToScalarType<topk_idx_t>::value",
        )
        check(
            topk_weights.dim() == 2 and topk_weights.is_contiguous(),
            f"{BUFFER_HPP}:1622",
            "topk_weights.dim() == 2 and topk_weights.is_contiguous()",
        )
        check(
            topk_weights.size(0) <= t_max,
            f"{BUFFER_HPP}:1623",
            "topk_weights.size(0) <= num_max_dispatch_tokens_per_rank",
        )
        check(
            topk_weights.dtype == torch.float32, f"{BUFFER_HPP}:1624", "topk_weights.scalar_type() == torch::kFloat32"
        )
        check(
            src_info.dim() == 2 and src_info.is_contiguous(),
            f"{BUFFER_HPP}:1625",
            "src_info.dim() == 2 and src_info.is_contiguous()",
        )
        check(
            src_info.dtype == torch.int32 and x.size(0) == src_info.size(0),
            f"{BUFFER_HPP}:1626",
            "src_info.scalar_type() == torch::kInt32 and x.size(0) == src_info.size(0)",
        )
        check(
            layout_range.dim() == 2 and layout_range.is_contiguous(),
            f"{BUFFER_HPP}:1627",
            "layout_range.dim() == 2 and layout_range.is_contiguous()",
        )
        check(layout_range.dtype == torch.int64, f"{BUFFER_HPP}:1628", "layout_range.scalar_type() == torch::kInt64")
        check(
            layout_range.size(0) == num_experts // R and layout_range.size(1) == R,
            f"{BUFFER_HPP}:1629",
            "layout_range.size(0) == num_experts / num_ranks and layout_range.size(1) == num_ranks",
        )
        wait_stats = combine_wait_recv_cost_stats
        if wait_stats is not None:
            check(
                wait_stats.dtype == torch.int64,
                f"{BUFFER_HPP}:1632",
                "combine_wait_recv_cost_stats->scalar_type() == torch::kInt64",
            )
            check(
                wait_stats.dim() == 1 and wait_stats.is_contiguous(),
                f"{BUFFER_HPP}:1633",
                "combine_wait_recv_cost_stats->dim() == 1 and combine_wait_recv_cost_stats->is_contiguous()",
            )
            check(wait_stats.size(0) == R, f"{BUFFER_HPP}:1634", "combine_wait_recv_cost_stats->size(0) == num_ranks")
        hidden = x.size(2)
        num_topk = topk_weights.size(1)
        num_combined_tokens = topk_weights.size(0)
        L = num_experts // R
        _, current = self._ll_layout_and_toggle(t_max, hidden, num_experts, 1643)
        check(not (async_ and return_recv_hook), f"{BUFFER_HPP}:1651", "not(async and return_recv_hook)")
        if out is not None:
            check(
                out.dim() == 2 and out.is_contiguous(), f"{BUFFER_HPP}:1658", "out->dim() == 2 and out->is_contiguous()"
            )
            check(
                out.size(0) == num_combined_tokens and out.size(1) == hidden,
                f"{BUFFER_HPP}:1659",
                "out->size(0) == num_combined_tokens and out->size(1) == hidden",
            )
            check(out.dtype == x.dtype, f"{BUFFER_HPP}:1660", "out->scalar_type() == x.scalar_type()")
            combined_x = out
        else:
            combined_x = S.garbage((num_combined_tokens, hidden), x.dtype).to(x.device)
        groups, per_group = self._ll_warp_groups(num_experts)
        recv_per_sm = ceil_div(num_combined_tokens, S.STATE.num_device_sms)
        check(
            groups > 0 and per_group > 0 and recv_per_sm >= 0,
            f"{INTERNODE_LL_CU}:1170",
            "num_warp_groups > 0 and num_warps_per_group > 0 and num_recv_per_sm >= 0",
        )
        check(num_topk <= LL_MAX_TOPK, f"{INTERNODE_LL_CU}:1179", "num_topk <= kNumMaxTopk")
        check(not (zero_copy and use_logfmt), f"{INTERNODE_LL_CU}:1182", "not(zero_copy and use_logfmt)")
        switch_hidden(hidden)
        if use_logfmt:
            S.not_implemented("low_latency_combine(use_logfmt=True)", "the LogFMT-10 transport cast is not emulated")

        # ---- send phase: rows of each local expert go back to their source ranks ---------------------------------
        problems = []
        if not (per_group > 1 and groups < 16):
            problems.append(
                f"{INTERNODE_LL_CU}:916: EP_DEVICE_ASSERT(num_warps_per_group > 1 and num_warp_groups < 16) traps"
            )
        unroll = 4 if hidden % 1024 == 0 else 2
        decode_warps = ceil_div(hidden // 8, 32 * unroll) * (32 * unroll) // 64
        if min(2, groups * per_group // (decode_warps + 1)) <= 0:
            problems.append(f"{INTERNODE_LL_CU}:986: EP_DEVICE_ASSERT(num_groups > 0) traps")
        if zero_copy:
            data = self.get_next_low_latency_combine_buffer(t_max, hidden, num_experts, current).detach().cpu()
        else:
            data = x.detach().cpu()
        src_flat = src_info.cpu().reshape(-1)
        ranges = layout_range.cpu()
        slots = R * t_max
        per_dst = [[] for _ in range(R)]
        for i in range(L):
            g = me * L + i
            for s in range(R):
                packed = int(ranges[i, s])
                count, begin = _signed32(packed & 0xFFFFFFFF), _signed32((packed >> 32) & 0xFFFFFFFF)
                if self._masked(s) or count <= 0:
                    continue
                if begin < 0 or begin + count > slots:
                    problems.append(
                        f"low_latency_combine: layout_range[{i}, {s}] = (begin {begin}, count {count}) "
                        f"runs outside the {slots} rows of expert {i}: out-of-bounds reads"
                    )
                    continue
                pos = i * slots + begin
                if pos + count > src_flat.numel():
                    problems.append(
                        f"low_latency_combine: src_info is read past its end (expert {i}, rows "
                        f"[{begin}, {begin + count}))"
                    )
                    continue
                src = src_flat[pos : pos + count].to(torch.int64)
                bad = (src < 0) | (src >= t_max)
                if bool(bad.any()):
                    problems.append(
                        f"low_latency_combine: src_info of expert {i} holds token {int(src[bad][0])} "
                        f"outside [0, {t_max}): the kernel writes into another expert's slots"
                    )
                    continue
                per_dst[s].append((g, src, data[i, begin : begin + count].clone()))
        meta = {"t_max": t_max, "hidden": hidden, "num_experts": num_experts}
        gathered = self.comm.exchange([(meta, item) for item in per_dst])
        if problems:
            panic("; ".join(problems))
        for s, (m, _) in enumerate(gathered):
            if m != meta:
                panic(
                    f"low_latency_combine: rank {s} and rank {me} disagree ({m!r} vs {meta!r}): the kernels would "
                    "misread each other's messages"
                )

        # ---- receive phase ---------------------------------------------------------------------------------------
        recv = torch.zeros(num_experts, t_max, hidden, dtype=BF16)
        written = torch.zeros(num_experts, t_max, dtype=torch.bool)
        for s in range(R):
            for g, src, rows in gathered[s][1]:
                dup = written[g, src]
                if bool(dup.any()) and not torch.equal(
                    recv[g, src[dup]].view(torch.int16), rows[dup].view(torch.int16)
                ):
                    panic(
                        f"low_latency_combine: two different rows of expert {g} go to the same token slot of rank "
                        f"{me} (duplicated src_info): the result would depend on timing"
                    )
                recv[g, src] = rows
                written[g, src] = True
        idx = topk_idx.detach().cpu()
        w = topk_weights.detach().cpu()
        state = {"done": False}

        def receive():
            if state["done"]:
                panic("low_latency_combine: the receive hook ran twice")
            state["done"] = True
            acc = torch.zeros(num_combined_tokens, hidden, dtype=torch.float32)
            toks = torch.arange(num_combined_tokens)
            for k in range(num_topk):
                e = idx[:, k]
                use = e >= 0
                if L > 0:
                    use = use & ~torch.tensor(
                        [self._masked(int(v) // L) if v >= 0 else False for v in e.tolist()], dtype=torch.bool
                    )
                if not bool(use.any()):
                    continue
                if int(e[use].max()) >= num_experts:
                    panic(
                        f"low_latency_combine: topk_idx holds expert {int(e[use].max())} >= {num_experts}: "
                        "out-of-bounds reads"
                    )
                safe = e.clamp(0, num_experts - 1)
                missing = use & ~written[safe, toks]
                if bool(missing.any()):
                    t = int(missing.nonzero()[0])
                    panic(
                        f"low_latency_combine: token {t} of rank {me} selected expert {int(e[t])} in slot {k}, "
                        "but no row for it came back (handle or topk_idx inconsistent with the dispatch): the real "
                        "kernel reads a stale receive slot"
                    )
                rows = recv[safe, toks].to(torch.float64)
                # fp32 FMA (`accum += float(x) * weight`, contracted by nvcc): exact product, one rounding
                fused = (acc.to(torch.float64) + rows * w[:, k].to(torch.float64).unsqueeze(1)).to(torch.float32)
                acc = torch.where(use.unsqueeze(1), fused, acc)
            combined_x.copy_(acc.to(BF16))

        hook = None
        if return_recv_hook:
            hook = receive
        else:
            receive()
        return combined_x, _event(async_), hook

    def get_next_low_latency_combine_buffer(self, num_max_dispatch_tokens_per_rank, hidden, num_experts, idx=None):
        """buffer.hpp:1717-1729: a bf16 view ``[L, R * T_max, hidden]`` (row stride ``hidden + 2 * hidden / 128``)
        of the combine send area of the half the next low-latency kernel uses."""
        layout = LowLatencyLayout(num_max_dispatch_tokens_per_rank, hidden, self.num_ranks, num_experts)
        check(
            layout.num_bytes_per_combine_msg % 2 == 0,
            f"{BUFFER_HPP}:1724",
            "buffer.num_bytes_per_combine_msg % elementSize(torch::kBFloat16) == 0",
        )
        L, slots = num_experts // self.num_ranks, self.num_ranks * num_max_dispatch_tokens_per_rank
        msg = layout.num_bytes_per_combine_msg // 2
        key = (L, slots, hidden)
        if self.ll_send_key != key:  # the RDMA buffer reinterpreted for another shape: start from zeros
            self.ll_send_buffers = [torch.zeros(max(1, L * slots * msg), dtype=BF16) for _ in range(2)]
            self.ll_send_key = key
        half = self.low_latency_buffer_idx if idx is None else idx
        return torch.as_strided(self.ll_send_buffers[half], (L, slots, hidden), (slots * msg, msg, 1))

    # -- shrink mode -------------------------------------------------------------------------------------------------

    def low_latency_update_mask_buffer(self, rank_to_mask, mask) -> None:
        check(
            self.mask is not None, f"{BUFFER_HPP}:1732", 'mask_buffer_ptr != nullptr and "Shrink mode must be enabled"'
        )
        check(
            0 <= rank_to_mask < self.num_ranks, f"{BUFFER_HPP}:1733", "rank_to_mask >= 0 and rank_to_mask < num_ranks"
        )
        self.mask[rank_to_mask] = 1 if mask else 0

    def low_latency_query_mask_buffer(self, mask_status) -> None:
        check(
            self.mask is not None, f"{BUFFER_HPP}:1738", 'mask_buffer_ptr != nullptr and "Shrink mode must be enabled"'
        )
        check(
            mask_status.numel() == self.num_ranks and mask_status.dtype == torch.int32,
            f"{BUFFER_HPP}:1739",
            "mask_status.numel() == num_ranks && mask_status.scalar_type() == torch::kInt32",
        )
        mask_status.copy_(self.mask.view(mask_status.shape))

    def low_latency_clean_mask_buffer(self) -> None:
        check(
            self.mask is not None, f"{BUFFER_HPP}:1746", 'mask_buffer_ptr != nullptr and "Shrink mode must be enabled"'
        )
        self.mask.zero_()


# ---------------------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------------------


def _wrap32(v: int) -> int:
    return (v + 2**31) % 2**32 - 2**31


def _signed32(v: int) -> int:
    return v - 2**32 if v >= 2**31 else v


def _rewrite_send_head(send_head: torch.Tensor, num_channels: int) -> torch.Tensor:
    """cached_notify_combine (intranode.cu:643-672): within each channel, every negative entry becomes
    ``-(head of the next sent token of that channel) - 1``, or ``-(1 << 25) - 1`` if none follows."""
    out = send_head.clone()
    num_tokens, num_ranks = out.shape
    for c in range(num_channels):
        t0, t1 = channel_range(num_tokens, num_channels, c)
        for r in range(num_ranks):
            last = 1 << 25
            col = out[t0:t1, r].tolist()
            for j in range(len(col) - 1, -1, -1):
                if col[j] < 0:
                    col[j] = -last - 1
                else:
                    last = col[j]
            out[t0:t1, r] = torch.tensor(col, dtype=out.dtype)
    return out


def _generator(call: int, rank: int, role: int):
    seed = S.STATE.ll_shuffle_seed
    if seed is None:
        return None
    mixed = (seed * 1_000_003 + call * 7_919 + rank * 104_729 + role * 15_485_863) % (2**62)
    return torch.Generator().manual_seed(mixed)


def _ll_cast_fp8(x: torch.Tensor, round_scale: bool):
    """internode_ll.cu:212-245 with utils.cuh:477-503: per token and 128 channels, ``amax = max(1e-4, max|x|)``;
    ``scale = 448 / amax`` and ``scale_inv = amax * (1 / 448)`` (float32), or powers of two with ``round_scale``;
    ``fp8 = satfinite_e4m3(x * scale)``. Returns (fp8 rows ``[T, H]``, ``scale_inv`` ``[T, H / 128]`` float32)."""
    num_tokens, hidden = x.shape
    xf = x.float().view(num_tokens, hidden // 128, 128)
    amax = xf.abs().amax(dim=2).clamp(min=KFP8_MARGIN) if num_tokens else torch.zeros(0, hidden // 128)
    prod = amax * torch.tensor(KFINFO_AMAX_INV_E4M3, dtype=torch.float32)
    if round_scale:
        bits = prod.view(torch.int32).to(torch.int64)
        exp = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int64)  # fast_log2_ceil
        scale = ((127 - exp) << 23).to(torch.int32).view(torch.float32)  # fast_pow2(-exp)
        scale_inv = ((exp + 127) << 23).to(torch.int32).view(torch.float32)
    else:
        scale_inv = prod
        scale = torch.tensor(448.0, dtype=torch.float32) / amax
    scaled = (xf * scale.unsqueeze(2)).clamp(-448.0, 448.0)
    return scaled.to(FP8).view(num_tokens, hidden), scale_inv


def _store_ll_scales(storage: torch.Tensor, expert: int, begin: int, scale_inv: torch.Tensor, ue8m0: bool):
    """internode_ll.cu:438-458: float scales at ``[expert, group, token]``; UE8M0 bytes (the exponent field of
    ``scale_inv``) packed 4 per int32, byte ``k`` of pack ``p`` = group ``4p + k``."""
    n = scale_inv.size(0)
    if not ue8m0:
        storage[expert, :, begin : begin + n] = scale_inv.t()
        return
    exps = (scale_inv.view(torch.int32).to(torch.int64) >> 23) & 0xFF  # [n, H/128]
    packs = exps.view(n, -1, 4)
    packed = packs[..., 0] | (packs[..., 1] << 8) | (packs[..., 2] << 16) | (packs[..., 3] << 24)
    storage[expert, :, begin : begin + n] = _wrap_int32(packed).t()


def _wrap_int32(t: torch.Tensor) -> torch.Tensor:
    return torch.where(t >= 2**31, t - 2**32, t).to(torch.int32)
