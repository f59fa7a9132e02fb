"""DeepEP V2's ``ElasticBuffer`` and ``EPHandle`` (the only API of DeepEP-Ascend) on the ep ops.

One transport and one set of semantics with V1: ``dispatch`` is ``ep_dispatch`` (compact, or static worst-case
rows without a CPU sync), ``do_expand`` is ``ep_expand`` on its output, cached dispatch is
``ep_dispatch_cached``, ``combine`` is ``ep_combine`` in V2's top-k slot order (``copy_order``) after the local
``ep_reduce_slots``. So the V2 path differentiates (dispatch's adjoint is combine, expand's is the slot
reduction), and compiles and exports as those ops do.

What is emulated, and how it differs (specs/deepep_api.md §2.4, §4.5-§5.4):

* No symmetric memory, QPs or SMs: ``num_bytes``, ``num_cpu_bytes``, ``num_allocated_qps``, ``sl_idx``,
  ``num_sms``/``num_qps`` and the size hints are validated and reported with upstream's formulas, and
  ``torch.distributed`` moves the data. The ops finish before they return (events have nothing to wait for).
* Rows always arrive in V2's deterministic order (sorted by ``src_token_global_idx``: source rank, then token),
  with or without ``deterministic=True``; upstream's default order is arrival order, which callers must not
  rely on. In hybrid mode ``psum_num_recv_tokens_per_scaleup_rank`` counts each scale-up index's sources as
  upstream's, over rows that stay in that order.
* Every reduction is upstream's: a rank's slots of a token are summed in FP32 in slot order and rounded once
  (``allow_multiple_reduction``), the per-rank partials in slot order from the FP32 bias sum; hybrid mode adds
  the per-scale-up-domain rounding; ``allow_multiple_reduction=False`` reduces every (token, expert) row once,
  at the destination (its rows travel as ``[K, H]`` per token, zero where another rank owns the slot).
* Engram storage is replicated on every rank at ``engram_write`` (an all_gather), so ``engram_fetch`` stays
  one-sided as upstream's RDMA get; PP send/recv are ``isend``/``irecv``; AGRS ``all_gather`` is
  ``torch.distributed.all_gather``.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections import deque

import torch
import torch.distributed as dist

from torch_ascend_moe import checks as ck
from torch_ascend_moe.backends.portable.ep.v2 import expand_capacity, grouped_reduce, handle_fields
from torch_ascend_moe.deep_ep.utils import envs
from torch_ascend_moe.deep_ep.utils.event import EventHandle, EventOverlap
from torch_ascend_moe.deep_ep.utils.math import align
from torch_ascend_moe.distributed import agreement, payload, waits
from torch_ascend_moe.ops.ep import (
    ep_combine,
    ep_copy_order,
    ep_dispatch,
    ep_dispatch_cached,
    ep_expand,
    ep_reduce_slots,
)

_ALIGNMENT = 2 << 20  # upstream's buffer granularity (get_elastic_buffer_alignment): 2 MiB


def get_elastic_buffer_alignment() -> int:
    return _ALIGNMENT


# Upstream's kernel names as profiler ranges, so DeepEP's bench_kineto(kernel_names=("dispatch_impl",
# "dispatch_copy_epilogue_impl")) and its combine pair time our phases (the transport op; the local epilogue).
_kernel = torch.profiler.record_function


def _value_or(value, default):
    return default if value is None else value


class EPHandle:
    """``ElasticBuffer.dispatch``'s handle: every field upstream's has (specs §4.6), plus the route of the ep ops
    (``route``) and the dispatch's local top-k ids (``recv_topk_idx``), which combine and cached dispatch replay.

    ``recv_src_metadata [N, K + 2]`` int32: column 0 ``src_token_global_idx = src_rank · num_max_tokens_per_rank +
    t``, column 1 ``src_rank · K + first local top-k lane``, columns 2.. each slot's expanded row (expand mode)
    or -1. ``dst_buffer_slot_idx [T, K]``: the token's row among those this rank sent to the slot's rank (-1 for
    an empty slot). ``token_metadata_at_forward`` and ``channel_linked_list`` are None (no forwarding channels).
    """

    def __init__(
        self,
        do_expand,
        num_experts,
        expert_alignment,
        num_max_tokens_per_rank,
        num_sms,
        topk_idx,
        num_recv_tokens,
        num_expanded_tokens,
        num_recv_tokens_per_expert_list,
        psum_num_recv_tokens_per_scaleup_rank,
        psum_num_recv_tokens_per_expert,
        num_unaligned_recv_tokens_per_expert,
        recv_src_metadata,
        dst_buffer_slot_idx,
        token_metadata_at_forward=None,
        channel_linked_list=None,
        *,
        route=None,
        recv_topk_idx=None,
    ):
        self.do_expand = do_expand
        self.num_experts = num_experts
        self.expert_alignment = expert_alignment
        self.num_max_tokens_per_rank = num_max_tokens_per_rank
        self.num_sms = num_sms
        self.topk_idx = topk_idx
        self.num_recv_tokens = num_recv_tokens
        self.num_expanded_tokens = num_expanded_tokens
        self.num_recv_tokens_per_expert_list = num_recv_tokens_per_expert_list
        self.psum_num_recv_tokens_per_scaleup_rank = psum_num_recv_tokens_per_scaleup_rank
        self.psum_num_recv_tokens_per_expert = psum_num_recv_tokens_per_expert
        self.num_unaligned_recv_tokens_per_expert = num_unaligned_recv_tokens_per_expert
        self.recv_src_metadata = recv_src_metadata
        self.dst_buffer_slot_idx = dst_buffer_slot_idx
        self.token_metadata_at_forward = token_metadata_at_forward
        self.channel_linked_list = channel_linked_list
        self.cached_recv_src_metadata_before_sort = None
        self.route = route
        self.recv_topk_idx = recv_topk_idx

    def deterministic_sort(
        self,
        do_cpu_sync,
        is_cached_dispatch,
        recv_x,
        recv_sf,
        recv_topk_idx,
        recv_topk_weights,
        channel_linked_list=None,
    ) -> None:
        """Upstream sorts the received rows by ``src_token_global_idx``; ours already arrive in that order."""
        if not is_cached_dispatch:
            self.cached_recv_src_metadata_before_sort = self.recv_src_metadata


class ElasticBuffer:
    """DeepEP V2's buffer on a ``torch.distributed`` group (gloo, NCCL or HCCL)."""

    def __init__(
        self,
        group: dist.ProcessGroup,
        num_bytes: int | None = None,
        num_cpu_bytes: int = 0,
        num_max_tokens_per_rank: int = 0,
        hidden: int = 0,
        num_topk: int = 0,
        use_fp8_dispatch: bool = False,
        deterministic: bool = False,
        allow_hybrid_mode: bool = True,
        allow_multiple_reduction: bool = True,
        prefer_overlap_with_compute: bool = True,
        sl_idx: int = 3,
        num_allocated_qps: int = 0,
        num_cpu_timeout_secs: int = 300,
        num_gpu_timeout_secs: int = 100,
        explicitly_destroy: bool = False,
    ):
        api = "deep_ep.ElasticBuffer"
        ck.check_arg(group is not None, api, "group", "value", "a torch.distributed ProcessGroup", "None")
        for name, value in (
            ("num_cpu_timeout_secs", num_cpu_timeout_secs),
            ("num_gpu_timeout_secs", num_gpu_timeout_secs),
        ):
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(ck.message(api, name, "value", "a positive number of seconds", repr(value)))
        for name, value in (
            ("num_max_tokens_per_rank", num_max_tokens_per_rank),
            ("hidden", hidden),
            ("num_topk", num_topk),
            ("num_cpu_bytes", num_cpu_bytes),
            ("num_allocated_qps", num_allocated_qps),
        ):
            if not isinstance(value, int) or value < 0:
                raise ValueError(ck.message(api, name, "value", "a non-negative integer", repr(value)))
        if num_cpu_bytes > 0 and num_bytes is None:
            raise ValueError(ck.message(api, "num_bytes", "value", "the total bytes when num_cpu_bytes > 0", "None"))
        for name, value in (("num_bytes", num_bytes), ("num_cpu_bytes", num_cpu_bytes)):
            if value is not None and (value < 0 or value % _ALIGNMENT):
                expected = f"a non-negative multiple of {_ALIGNMENT} (2 MiB)"
                raise ValueError(ck.message(api, name, "value", expected, str(value)))
        self.group = group
        self.group_name = group.group_name
        self.rank_idx, self.num_ranks = group.rank(), group.size()
        self.allow_hybrid_mode = allow_hybrid_mode
        self.allow_multiple_reduction = allow_multiple_reduction
        self.prefer_overlap_with_compute = prefer_overlap_with_compute
        self.deterministic = deterministic
        self.num_cpu_timeout_secs = float(num_cpu_timeout_secs)
        self.num_gpu_timeout_secs = float(num_gpu_timeout_secs)
        self.explicitly_destroy = explicitly_destroy
        self.num_max_tokens_per_rank = num_max_tokens_per_rank
        self.hidden = hidden
        self.sl_idx = int(os.environ.get("EP_OVERRIDE_RDMA_SL", sl_idx))
        self.num_rdma_ranks, self.num_nvlink_ranks = envs.get_physical_domain_size(group)
        self.num_scaleout_ranks, self.num_scaleup_ranks = envs.get_logical_domain_size(group, allow_hybrid_mode)
        self.scaleout_rank_idx = self.rank_idx // self.num_scaleup_ranks
        self.scaleup_rank_idx = self.rank_idx % self.num_scaleup_ranks
        if num_bytes is None:
            num_bytes = ElasticBuffer.get_buffer_size_hint(
                group,
                num_max_tokens_per_rank,
                hidden,
                num_topk,
                use_fp8_dispatch,
                allow_hybrid_mode,
                allow_multiple_reduction,
            )
        self.num_bytes, self.num_cpu_bytes = num_bytes, num_cpu_bytes
        if num_allocated_qps == 0:
            num_allocated_qps = (65 if envs.check_fast_rdma_atomic_support() else 129) if allow_hybrid_mode else 17
        self.num_allocated_qps = num_allocated_qps
        self._destroyed = False
        self._num_sms: dict[tuple, int] = {}
        self._engram = None  # (storage of every rank [R * entries, hidden], sf or None)
        self._pp = None  # (max tensor bytes, max in-flight) once pp_set_config ran
        self._pp_sends: dict[int, deque] = {}
        self._agrs = None  # (max session bytes, max all-gathers per session)
        self._agrs_session = None  # [bytes used, all-gathers, pending works] while a session is open
        self.barrier()  # construction is collective, as upstream's

    # ---- sizes and topology ----

    @staticmethod
    def get_buffer_size_hint(
        group,
        num_max_tokens_per_rank: int,
        hidden: int,
        num_topk: int = 0,
        use_fp8_dispatch: bool = False,
        allow_hybrid_mode: bool = True,
        allow_multiple_reduction: bool = True,
    ) -> int:
        """``align_2MiB(max(dispatch, combine))`` bytes of a direct-mode receive area of ``R · num_max`` token
        slots (``num_topk = 0`` counts as 32, FP8 as ``ceil(H / 32)`` 4-byte SF packs); hybrid mode doubles it
        for the forwarding area. An estimate of upstream's (its exact per-channel layout is not modelled);
        nothing is allocated from it here."""
        r, k = group.size(), num_topk or 32
        token = (hidden + 4 * math.ceil(hidden / 32)) if use_fp8_dispatch else 2 * hidden
        dispatch_bytes = r * num_max_tokens_per_rank * (token + k * 12 + 16)
        combine_rows = num_max_tokens_per_rank * (k if not allow_multiple_reduction else 1)
        combine_bytes = r * combine_rows * (2 * hidden + 4 * k)
        total = max(dispatch_bytes, combine_bytes) * (2 if allow_hybrid_mode and r > 8 else 1)
        return align(max(total, 1), _ALIGNMENT)

    @staticmethod
    def get_engram_storage_size_hint(
        num_entries: int, hidden: int, num_max_tokens_per_rank: int, dtype: torch.dtype = torch.bfloat16
    ) -> tuple[int, int]:
        entry = align(hidden * dtype.itemsize, 32)
        return align(entry * num_max_tokens_per_rank, _ALIGNMENT), align(entry * num_entries, _ALIGNMENT)

    @staticmethod
    def get_pp_buffer_size_hint(num_max_tensor_bytes: int, num_max_inflight_tensors: int) -> int:
        return align(align(num_max_tensor_bytes, 32) * num_max_inflight_tensors * 2 * 2, _ALIGNMENT)

    @staticmethod
    def get_agrs_num_max_session_bytes(group, shapes, dtype: torch.dtype) -> int:
        if not isinstance(shapes[0], (tuple, list, torch.Size)):
            shapes = (shapes,)
        return sum(align(group.size() * math.prod(s) * dtype.itemsize, 32) for s in shapes)

    @staticmethod
    def get_agrs_buffer_size_hint(group, num_max_session_bytes: int) -> int:
        return align(num_max_session_bytes, _ALIGNMENT)

    def get_physical_domain_size(self) -> tuple[int, int]:
        return self.num_rdma_ranks, self.num_nvlink_ranks

    def get_logical_domain_size(self) -> tuple[int, int]:
        return self.num_scaleout_ranks, self.num_scaleup_ranks

    def get_theoretical_num_sms(
        self,
        num_experts: int,
        num_topk: int,
        num_scaleout_topk: int = 0,
        rdma_gbs: float = 0,
        nvlink_gbs: float = 0,
        sm_read_gbs: float = 200,
        sm_write_gbs: float = 50,
    ) -> int:
        """Upstream's balanced-gate traffic model (even, at least 4, at most the device's SMs), cached per buffer.
        Off CUDA the "device" is an H800's 132 SMs and missing link speeds count as 1 GB/s (only ratios matter)."""
        key = (num_experts, num_topk, num_scaleout_topk, rdma_gbs, nvlink_gbs, sm_read_gbs, sm_write_gbs)
        if key not in self._num_sms:
            self._num_sms[key] = self._theoretical_num_sms(*key)
        return self._num_sms[key]

    def _theoretical_num_sms(
        self, num_experts, num_topk, num_scaleout_topk, rdma_gbs, nvlink_gbs, sm_read_gbs, sm_write_gbs
    ) -> int:
        if num_scaleout_topk != 0:
            api = "deep_ep.ElasticBuffer.get_theoretical_num_sms"
            expected = "0 (reserved, as upstream)"
            raise ValueError(ck.message(api, "num_scaleout_topk", "value", expected, str(num_scaleout_topk)))
        if rdma_gbs == 0 and self.num_rdma_ranks > 1:
            rdma_gbs = envs.get_rdma_gbs()
        if nvlink_gbs == 0:
            nvlink_gbs = envs.get_nvlink_gbs()
        rdma_gbs, nvlink_gbs = rdma_gbs or 1.0, nvlink_gbs or 1.0

        def expected_topk(groups: int) -> float:
            return groups * (
                1 - math.comb(num_experts - num_experts // groups, num_topk) / math.comb(num_experts, num_topk)
            )

        so, r = self.num_scaleout_ranks, self.num_ranks
        expected_so = expected_topk(so) if so > 1 else 0
        expected = expected_topk(r)
        sm_read, sm_write, rdma, nvlink = 1 / expected, 0.0, 0.0, 0.0
        if so > 1:
            sm_write += 1 / expected + (1 / expected) * (expected_so / so)
            rdma += (1 / expected) * (expected_so * (1 - 1 / so))
            sm_read += expected_so / expected
            sm_write += 1
            nvlink += 1 - 1 / self.num_scaleup_ranks
        else:
            if self.num_rdma_ranks > 1:
                sm_write += 1 / expected
            sm_write += self.num_nvlink_ranks / r
            nvlink += self.num_nvlink_ranks / r * (1 - 1 / self.num_nvlink_ranks)
            rdma += (r - self.num_nvlink_ranks) / r
        if so > 1 and rdma / rdma_gbs > nvlink / nvlink_gbs:
            traffic, gbs = rdma, rdma_gbs
        else:
            traffic, gbs = nvlink, nvlink_gbs
        device_sms = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132
        num_sms = device_sms
        if traffic > 0:
            num_sms = max(gbs / traffic * sm_read / sm_read_gbs, gbs / traffic * sm_write / sm_write_gbs)
        num_sms = align(max(4, math.ceil(num_sms * 1.25)), 2)
        num_sms = num_sms if self.prefer_overlap_with_compute else max(num_sms, 64)
        return min(num_sms, device_sms)

    def get_theoretical_num_qps(self, num_sms: int) -> int:
        num_qps = num_sms * 16 + 1 if self.allow_hybrid_mode else min(num_sms, 8 + 1)
        return min(num_qps, self.num_allocated_qps)

    # ---- lifecycle ----

    def destroy(self) -> None:
        if not self.explicitly_destroy:
            raise RuntimeError("deep_ep.ElasticBuffer.destroy: the buffer was built with explicitly_destroy=False")
        if not self._destroyed:
            self._drain_pp_sends("deep_ep.ElasticBuffer.destroy")
        self._destroyed = True

    def _alive(self, api: str) -> None:
        if self._destroyed:
            raise RuntimeError(f"deep_ep.ElasticBuffer.{api}: the buffer was destroyed")

    def barrier(self, use_comm_stream: bool = True, with_cpu_sync: bool = False, sequential: bool = True) -> None:
        work = dist.barrier(group=self.group, async_op=True)
        waits.wait("deep_ep.ElasticBuffer.barrier", self.group, work, self.num_cpu_timeout_secs, "the barrier")

    @staticmethod
    def capture() -> EventHandle:
        return EventHandle()

    def get_comm_stream(self):
        return torch.cuda.current_stream() if torch.cuda.is_available() else None

    # ---- dispatch ----

    def _check(self, api: str, x, check) -> None:
        """A local argument check that, on failure, also fails the other ranks at once (they are waiting in
        the op's header exchange) instead of leaving them to their timeout."""
        agreement.checked(api, self.group_name, x, self.num_cpu_timeout_secs, check)

    def _check_events(self, api: str, previous_event, allocate_on_comm_stream: bool, num_qps: int) -> None:
        if previous_event is not None and not allocate_on_comm_stream:
            expected = "True when previous_event is given (upstream's rule)"
            raise ValueError(ck.message(api, "allocate_on_comm_stream", "value", expected, "False"))
        if num_qps > self.num_allocated_qps:
            expected = f"at most the {self.num_allocated_qps} allocated QPs"
            raise ValueError(ck.message(api, "num_qps", "value", expected, str(num_qps)))

    def dispatch(
        self,
        x,
        topk_idx: torch.Tensor | None = None,
        topk_weights: torch.Tensor | None = None,
        cumulative_local_expert_recv_stats: torch.Tensor | None = None,
        num_experts: int | None = None,
        num_max_tokens_per_rank: int | None = None,
        expert_alignment: int | None = None,
        num_sms: int = 0,
        num_qps: int = 0,
        previous_event=None,
        previous_event_before_epilogue=None,
        async_with_compute_stream: bool = False,
        allocate_on_comm_stream: bool = False,
        handle: EPHandle | None = None,
        do_handle_copy: bool = True,
        do_cpu_sync: bool | None = None,
        do_expand: bool = False,
        do_zero_padding: bool = False,
        use_tma_aligned_col_major_sf: bool = False,
    ):
        """``(recv_x, recv_topk_idx, recv_topk_weights, handle, event)`` (specs §4.5)."""
        api = "deep_ep.ElasticBuffer.dispatch"
        self._alive("dispatch")
        data, sf = x if isinstance(x, tuple) else (x, None)
        event = EventOverlap(EventHandle() if async_with_compute_stream else None)
        if handle is not None:
            return self._cached_dispatch(
                api,
                data,
                sf,
                topk_idx,
                topk_weights,
                num_experts,
                num_max_tokens_per_rank,
                expert_alignment,
                previous_event,
                allocate_on_comm_stream,
                num_qps,
                handle,
                do_cpu_sync,
                do_expand,
                use_tma_aligned_col_major_sf,
                event,
            )
        num_max = _value_or(num_max_tokens_per_rank, self.num_max_tokens_per_rank)
        alignment = _value_or(expert_alignment, 1)
        do_cpu_sync = _value_or(do_cpu_sync, True)

        def check():
            if not isinstance(data, torch.Tensor) or data.dim() != 2:
                expected = "a [T, H] tensor or an (FP8 [T, H], sf) pair"
                raise ValueError(ck.message(api, "x", "value", expected, type(data).__name__))
            ck.check_arg(
                topk_idx is not None,
                api,
                "topk_idx",
                "value",
                "the [T, K] expert ids (required without a cached handle)",
                "None",
            )
            ck.check_arg(
                num_experts is not None,
                api,
                "num_experts",
                "value",
                "the number of experts (required without a cached handle)",
                "None",
            )
            if not isinstance(num_max, int) or num_max < 1:
                expected = "a positive integer (here or at construction)"
                raise ValueError(ck.message(api, "num_max_tokens_per_rank", "value", expected, repr(num_max)))
            if data.shape[0] > num_max:
                expected = f"at most num_max_tokens_per_rank={num_max}"
                raise ValueError(ck.message(api, "x", "size(0) (T)", expected, data.shape[0]))
            if self.hidden and data.shape[1] > self.hidden:
                expected = f"at most {self.hidden} (the buffer was sized for it)"
                raise ValueError(ck.message(api, "x", "size(1) (hidden)", expected, data.shape[1]))
            if not isinstance(alignment, int) or alignment < 1:
                raise ValueError(ck.message(api, "expert_alignment", "value", "a positive integer", repr(alignment)))
            if do_zero_padding and not do_expand:
                raise ValueError(ck.message(api, "do_zero_padding", "value", "False unless do_expand", "True"))
            if cumulative_local_expert_recv_stats is not None and (
                cumulative_local_expert_recv_stats.dim() != 1
                or cumulative_local_expert_recv_stats.shape[0] != num_experts // self.num_ranks
            ):
                expected = f"[{num_experts // self.num_ranks}] (local experts)"
                got = list(cumulative_local_expert_recv_stats.shape)
                raise ValueError(ck.message(api, "cumulative_local_expert_recv_stats", "shape", expected, got))
            self._check_events(api, previous_event, allocate_on_comm_stream, num_qps)

        self._check(api, data, check)
        r, k = self.num_ranks, topk_idx.shape[1]
        with _kernel("dispatch_impl"):  # upstream's kernel names: bench_kineto times them
            out = ep_dispatch(
                data,
                topk_idx,
                topk_weights,
                num_experts=num_experts,
                group=self.group_name,
                x_scales=sf,
                expert_alignment=alignment,
                num_worst_tokens=0 if do_cpu_sync else r * num_max,
                timeout_s=self.num_cpu_timeout_secs,
            )
        with _kernel("dispatch_copy_epilogue_impl"):
            route, recv_idx = out.handle, out.recv_topk_idx
            # After the op validated num_experts (the SM model divides by it).
            num_sms = self.get_theoretical_num_sms(num_experts, k) if num_sms == 0 else num_sms
            local = num_experts // r
            psum_scaleup, meta, unaligned, dst_slots = handle_fields(
                route.recv_counts,
                route.recv_gather,
                out.recv_src_idx,
                recv_idx,
                topk_idx,
                num_max,
                self.num_scaleup_ranks,
                local,
                not do_cpu_sync,
            )
            n = recv_idx.shape[0]
            aligned = out.num_recv_tokens_per_expert
            counts_list = aligned.tolist() if do_cpu_sync else []
            recv_x, recv_sf, recv_w = out.recv_x, out.recv_x_scales, out.recv_topk_weights
            if do_expand:
                rows = 0 if do_cpu_sync else expand_capacity(r, num_max, k, local, alignment)
                ex = ep_expand(
                    recv_x,
                    recv_idx,
                    recv_w,
                    num_local_experts=local,
                    x_scales=recv_sf,
                    expert_alignment=alignment,
                    num_rows=rows,
                )
                recv_x, recv_sf, recv_w = ex.x, ex.x_scales, ex.weights
                meta[:, 2:] = ex.expand_rows.int()
                psum_expert, num_expanded = ex.psum, ex.x.shape[0]
            else:
                psum_expert, num_expanded = torch.cumsum(aligned, 0).int(), 0
            if cumulative_local_expert_recv_stats is not None:
                cumulative_local_expert_recv_stats += unaligned.to(cumulative_local_expert_recv_stats.dtype)
        handle = EPHandle(
            do_expand,
            num_experts,
            alignment,
            num_max,
            num_sms,
            topk_idx.clone() if do_handle_copy else topk_idx,
            n,
            num_expanded,
            counts_list,
            psum_scaleup,
            psum_expert,
            unaligned,
            meta,
            dst_slots,
            route=route,
            recv_topk_idx=recv_idx,
        )
        if self.deterministic:
            handle.deterministic_sort(do_cpu_sync, False, recv_x, recv_sf, recv_idx, recv_w)
        recv_sf = _sf_layout(recv_sf, use_tma_aligned_col_major_sf)
        return (
            ((recv_x, recv_sf) if sf is not None else recv_x),
            (None if do_expand else recv_idx),
            recv_w,
            handle,
            event,
        )

    def _cached_dispatch(
        self,
        api,
        data,
        sf,
        topk_idx,
        topk_weights,
        num_experts,
        num_max,
        alignment,
        previous_event,
        allocate_on_comm_stream,
        num_qps,
        handle,
        do_cpu_sync,
        do_expand,
        use_tma_aligned_col_major_sf,
        event,
    ):
        def check():
            if not isinstance(handle, EPHandle) or handle.route is None:
                expected = "the EPHandle a dispatch of this package returned"
                raise ValueError(ck.message(api, "handle", "value", expected, type(handle).__name__))
            if topk_idx is not None:
                expected = "None with a cached handle (it reuses handle.topk_idx)"
                raise ValueError(ck.message(api, "topk_idx", "value", expected, "a tensor"))
            if do_cpu_sync:
                expected = "None or False with a cached handle"
                raise ValueError(ck.message(api, "do_cpu_sync", "value", expected, "True"))
            given = (
                _value_or(num_experts, handle.num_experts),
                _value_or(alignment, handle.expert_alignment),
                _value_or(num_max, handle.num_max_tokens_per_rank),
            )
            held = (handle.num_experts, handle.expert_alignment, handle.num_max_tokens_per_rank)
            if given != held:
                raise ValueError(
                    f"{api}: arguments (num_experts, expert_alignment, num_max_tokens_per_rank) value: "
                    f"expected the handle's {held}, got {given}"
                )
            if do_expand != handle.do_expand:
                expected = f"the handle's {handle.do_expand}"
                raise ValueError(ck.message(api, "do_expand", "value", expected, str(do_expand)))
            self._check_events(api, previous_event, allocate_on_comm_stream, num_qps)

        self._check(api, data, check)
        route, recv_idx = handle.route, handle.recv_topk_idx
        timeout = self.num_cpu_timeout_secs
        with _kernel("dispatch_impl"):
            recv_x, recv_sf = ep_dispatch_cached(data, route, sf, timeout_s=timeout)
            recv_w = None
            if topk_weights is not None:
                # V2's cached dispatch carries weights too (an expanded backward needs them); masked to the
                # local slots as the first dispatch's, which makes its gradient the exact adjoint.
                recv_w = torch.where(recv_idx >= 0, ep_dispatch_cached(topk_weights, route, timeout_s=timeout)[0], 0)
        with _kernel("dispatch_copy_epilogue_impl"):
            if handle.do_expand:
                ex = ep_expand(
                    recv_x,
                    recv_idx,
                    recv_w,
                    num_local_experts=handle.num_experts // self.num_ranks,
                    x_scales=recv_sf,
                    expert_alignment=handle.expert_alignment,
                    num_rows=handle.num_expanded_tokens,
                )
                recv_x, recv_sf, recv_w = ex.x, ex.x_scales, ex.weights
            recv_sf = _sf_layout(recv_sf, use_tma_aligned_col_major_sf)
        out_x = (recv_x, recv_sf) if sf is not None else recv_x
        return out_x, (None if handle.do_expand else recv_idx), recv_w, handle, event

    # ---- combine ----

    def combine(
        self,
        x: torch.Tensor,
        handle: EPHandle,
        topk_weights: torch.Tensor | None = None,
        bias=None,
        num_sms: int = 0,
        num_qps: int = 0,
        previous_event=None,
        previous_event_before_epilogue=None,
        async_with_compute_stream: bool = False,
        allocate_on_comm_stream: bool = False,
    ):
        """``(combined_x [T, H], combined_topk_weights [T, K] or None, event)`` (specs §5.4): unweighted, each
        rank's slots of a token reduced locally (FP32, slot order, one rounding), then the partials in slot
        order from the FP32 bias sum."""
        api = "deep_ep.ElasticBuffer.combine"
        self._alive("combine")

        def check():
            if not isinstance(handle, EPHandle) or handle.route is None:
                expected = "the EPHandle a dispatch of this package returned"
                raise ValueError(ck.message(api, "handle", "value", expected, type(handle).__name__))
            if isinstance(bias, tuple) and len(bias) != 2:
                raise ValueError(ck.message(api, "bias", "value", "a tensor or a pair", f"{len(bias)} tensors"))
            rows = handle.num_expanded_tokens if handle.do_expand else handle.recv_topk_idx.shape[0]
            if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[0] != rows:
                expected = f"[{rows}, H] (the handle's {'expanded' if handle.do_expand else 'received'} rows)"
                got = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise ValueError(ck.message(api, "x", "shape", expected, got))
            if handle.do_expand and topk_weights is not None:
                if not self.allow_multiple_reduction:
                    expected = "None in expand mode unless the buffer allows multiple reductions (upstream's rule)"
                    raise ValueError(ck.message(api, "topk_weights", "value", expected, "a tensor"))
                if topk_weights.dim() != 1 or topk_weights.shape[0] != rows:
                    expected = f"[{rows}] (one per expanded row)"
                    raise ValueError(ck.message(api, "topk_weights", "shape", expected, list(topk_weights.shape)))
            self._check_events(api, previous_event, allocate_on_comm_stream, num_qps)

        self._check(api, x, check)
        event = EventOverlap(EventHandle() if async_with_compute_stream else None)
        route, recv_idx, k = handle.route, handle.recv_topk_idx, handle.topk_idx.shape[1]
        local = handle.num_experts // self.num_ranks
        timeout = self.num_cpu_timeout_secs
        w = None
        if topk_weights is not None:
            w = (
                torch.cat([topk_weights, topk_weights.new_zeros(1)])[recv_idx_rows(handle)]
                if handle.do_expand
                else topk_weights
            )
            w = torch.where(recv_idx >= 0, w, 0)  # each slot comes back from its owner only
        hybrid = self.allow_hybrid_mode and self.num_scaleout_ranks > 1
        if handle.do_expand and not self.allow_multiple_reduction:
            # One reduction, at the destination: each (token, expert) row travels on its own ([K, H] per
            # token, zero where another rank owns the slot, so the sum of copies is exact), then all of a
            # token's slots add in slot order from the bias.
            spread = torch.cat([x, x.new_zeros(1, x.shape[1])])[recv_idx_rows(handle)]  # [N, K, H]
            with _kernel("combine_impl"):
                back, cw = ep_combine(spread.reshape(spread.shape[0], -1), route, w, timeout_s=timeout)
            with _kernel("combine_reduce_epilogue_impl"):
                t = back.shape[0]
                slots = torch.arange(t * k, device=back.device).view(t, k)
                slots = torch.where(handle.topk_idx >= 0, slots, -1)
                combined = ep_reduce_slots(back.view(t * k, x.shape[1]), slots, bias)
            return combined, cw, event
        # The local reduction of an expanded combine: upstream's reduce epilogue (the destination's FP32 sum is
        # inside ep_combine).
        with _kernel("combine_reduce_epilogue_impl"):
            partial = ep_reduce_slots(x, recv_idx_rows(handle)) if handle.do_expand else x
        if hybrid:
            combined, cw = self._hybrid_combine(partial, handle, w, bias, local, k)
            return combined, cw, event
        with _kernel("combine_impl"):
            combined, cw = ep_combine(
                partial,
                route,
                w,
                bias,
                timeout_s=timeout,
                copy_order=ep_copy_order(handle.topk_idx, handle.num_experts, self.num_ranks),
            )
        return combined, cw, event

    def _hybrid_combine(self, partial, handle, w, bias, local, k):
        """Upstream's hybrid reduction: rank partials summed per scale-out domain (FP32, slot order, rounded
        where the domain's last slot is), then the domain partials from the bias sum. The rank partials travel
        at their last slot of ``[K, H]`` per token (zero elsewhere: exact) so the destination can regroup them."""
        recv_idx, h = handle.recv_topk_idx, partial.shape[1]
        n = recv_idx.shape[0]
        lanes = torch.arange(k, device=recv_idx.device).expand(n, k)
        last = torch.where(recv_idx >= 0, lanes, -1).amax(1)
        spread = partial.new_zeros(n, k + 1, h)
        spread.scatter_(1, torch.where(last >= 0, last, k).view(n, 1, 1).expand(n, 1, h), partial.unsqueeze(1))
        with _kernel("combine_impl"):
            back, cw = ep_combine(spread[:, :k].reshape(n, k * h), handle.route, w, timeout_s=self.num_cpu_timeout_secs)
        with _kernel("combine_reduce_epilogue_impl"):
            t = back.shape[0]
            y = back.view(t, k, h)
            domain = torch.where(handle.topk_idx >= 0, handle.topk_idx // (local * self.num_scaleup_ranks), -1)
            y = grouped_reduce(y, domain)
            slots = torch.where(handle.topk_idx >= 0, torch.arange(t * k, device=y.device).view(t, k), -1)
            return ep_reduce_slots(y.reshape(t * k, h), slots, bias), cw

    # ---- experimental: Engram, PP, AGRS ----

    def engram_write(self, storage: torch.Tensor, sf: torch.Tensor | None = None) -> None:
        """(Experimental) Every rank's ``[entries, hidden]`` storage becomes fetchable by global index
        ``rank · entries + i``; ``sf`` (FP8 only) is the replicated ``[R · entries, packs]`` scales."""
        api = "deep_ep.ElasticBuffer.engram_write"
        self._alive("engram_write")
        if storage.dim() != 2 or storage.dtype not in (torch.bfloat16, torch.float8_e4m3fn):
            expected = "a [num_entries, hidden] BF16 or FP8 tensor"
            got = f"{storage.dtype} of shape {list(storage.shape)}"
            raise ValueError(ck.message(api, "storage", "value", expected, got))
        fp8 = storage.dtype == torch.float8_e4m3fn
        if fp8 != (sf is not None):
            got = f"{'None' if sf is None else 'a tensor'} for {storage.dtype}"
            raise ValueError(ck.message(api, "sf", "value", "the scales exactly when the storage is FP8", got))
        r = self.num_ranks
        if sf is not None and (sf.dim() != 2 or sf.shape[0] != r * storage.shape[0] or sf.element_size() != 4):
            expected = f"[{r * storage.shape[0]}, packs] of 4-byte packs"
            raise ValueError(ck.message(api, "sf", "shape", expected, f"{list(sf.shape)} {sf.dtype}"))
        self.barrier()
        rows = payload.as_bytes(storage)
        gathered = rows.new_empty(r * rows.shape[0], rows.shape[1])
        work = dist.all_gather(list(gathered.chunk(r)), rows, group=self.group, async_op=True)
        waits.wait(api, self.group, work, self.num_cpu_timeout_secs, "the storage exchange")
        self._engram = (gathered.view(storage.dtype).view(-1, storage.shape[1]), None if sf is None else sf.clone())
        self.barrier()

    def engram_fetch(self, indices: torch.Tensor, num_qps: int = 0, use_tma_aligned_col_major_sf: bool = False):
        """(Experimental) A hook returning ``(data [T, n · hidden], sf [T, n · packs] or None)`` for
        ``indices [T, n]`` int32 global entry ids; one-sided (no other rank takes part)."""
        api = "deep_ep.ElasticBuffer.engram_fetch"
        self._alive("engram_fetch")
        if self._engram is None:
            raise RuntimeError(f"{api}: no storage: call engram_write first")
        storage, sf = self._engram
        if indices.dim() != 2 or indices.dtype != torch.int32:
            expected = "[num_tokens, entries_per_token] torch.int32"
            got = f"{indices.dtype} of shape {list(indices.shape)}"
            raise ValueError(ck.message(api, "indices", "value", expected, got))
        if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= storage.shape[0]):
            expected = f"entry ids in [0, {storage.shape[0]})"
            raise ValueError(ck.message(api, "indices", "values", expected, [int(indices.min()), int(indices.max())]))
        t, n = indices.shape
        flat = indices.reshape(-1).long()
        # Widths spelled out: a view with -1 cannot infer them when there are no tokens.
        data = payload.take_rows(storage, flat, False).view(t, n * storage.shape[1])
        scales = None
        if sf is not None:
            scales = _sf_layout(sf[flat].view(t, n * sf.shape[1]), use_tma_aligned_col_major_sf)
        return lambda: (data, scales)

    def pp_set_config(self, num_max_tensor_bytes: int, num_max_inflight_tensors: int) -> None:
        """(Experimental) Limits of PP send/recv; a barrier flushes what was in flight."""
        api = "deep_ep.ElasticBuffer.pp_set_config"
        self._alive("pp_set_config")
        if num_max_tensor_bytes < 1 or num_max_inflight_tensors < 1:
            raise ValueError(
                f"{api}: arguments 'num_max_tensor_bytes'/'num_max_inflight_tensors' value: expected "
                f"positive integers, got {num_max_tensor_bytes}, {num_max_inflight_tensors}"
            )
        self._drain_pp_sends(api)
        self.barrier()
        self._pp = (num_max_tensor_bytes, num_max_inflight_tensors)

    def _pp_peer(self, api: str, t: torch.Tensor, peer: int, name: str) -> int:
        if self._pp is None:
            raise RuntimeError(f"{api}: call pp_set_config first")
        r = self.num_ranks
        neighbours = {(self.rank_idx - 1) % r, (self.rank_idx + 1) % r}
        if peer not in neighbours or peer == self.rank_idx:
            expected = f"the previous or next rank in the ring {sorted(neighbours - {self.rank_idx})}"
            raise ValueError(ck.message(api, name, "value", expected, str(peer)))
        if not t.is_contiguous() or t.numel() * t.element_size() > self._pp[0]:
            expected = f"a contiguous tensor of at most {self._pp[0]} bytes (pp_set_config)"
            raise ValueError(ck.message(api, "t", "value", expected, f"{t.numel() * t.element_size()} bytes"))
        return dist.get_global_rank(self.group, peer)

    def pp_send(self, t: torch.Tensor, dst_rank_idx: int, num_sms: int = 0) -> None:
        """(Experimental) Send ``t`` to a ring neighbour without waiting for its receive (at most
        ``num_max_inflight_tensors`` in flight per peer: the oldest is waited for first)."""
        api = "deep_ep.ElasticBuffer.pp_send"
        self._alive("pp_send")
        dst = self._pp_peer(api, t, dst_rank_idx, "dst_rank_idx")
        pending = self._pp_sends.setdefault(dst_rank_idx, deque())
        while len(pending) >= self._pp[1]:
            waits.wait(api, self.group, pending.popleft()[0], self.num_cpu_timeout_secs, "an in-flight send")
        copy = t.clone()  # upstream copies into its buffer: the caller may reuse t at once
        pending.append((dist.isend(copy, dst, group=self.group), copy))

    def pp_recv(self, t: torch.Tensor, src_rank_idx: int, num_sms: int = 0) -> None:
        """(Experimental) Receive the next tensor ``src_rank_idx`` sent into ``t``."""
        api = "deep_ep.ElasticBuffer.pp_recv"
        self._alive("pp_recv")
        src = self._pp_peer(api, t, src_rank_idx, "src_rank_idx")
        waits.wait(api, self.group, dist.irecv(t, src, group=self.group), self.num_cpu_timeout_secs, "the receive")

    def _drain_pp_sends(self, api: str) -> None:
        for pending in self._pp_sends.values():
            while pending:
                waits.wait(api, self.group, pending.popleft()[0], self.num_cpu_timeout_secs, "an in-flight send")

    def agrs_set_config(self, num_max_session_bytes: int, num_max_all_gathers_per_session: int) -> None:
        """(Experimental) Limits of an AGRS session; a barrier flushes what was in flight."""
        self._alive("agrs_set_config")
        self.barrier()
        self._agrs = (num_max_session_bytes, num_max_all_gathers_per_session)

    def create_agrs_session(self) -> None:
        api = "deep_ep.ElasticBuffer.create_agrs_session"
        self._alive("create_agrs_session")
        if self._agrs is None:
            raise RuntimeError(f"{api}: call agrs_set_config first")
        if self._agrs_session is not None:
            raise RuntimeError(f"{api}: a session is already open (destroy_agrs_session first)")
        self._agrs_session = [0, 0, []]

    def destroy_agrs_session(self) -> None:
        api = "deep_ep.ElasticBuffer.destroy_agrs_session"
        if self._agrs_session is None:
            raise RuntimeError(f"{api}: no session is open")
        for work in self._agrs_session[2]:
            waits.wait(api, self.group, work, self.num_cpu_timeout_secs, "an all-gather")
        self._agrs_session = None

    @contextlib.contextmanager
    def agrs_new_session(self, enabled: bool = True):
        if not enabled:
            yield
            return
        self.create_agrs_session()
        try:
            yield
        finally:
            self.destroy_agrs_session()

    def agrs_get_inplace_tensor(self, shapes, dtype: torch.dtype):
        """(Experimental) Tensors to fill and pass to ``all_gather`` (upstream's are views of its buffer; ours
        are fresh, and ``all_gather`` takes any tensor)."""
        if self._agrs_session is None:
            raise RuntimeError("deep_ep.ElasticBuffer.agrs_get_inplace_tensor: no session is open")
        batched = isinstance(shapes[0], (tuple, list, torch.Size))
        device = "cuda" if dist.get_backend(self.group) == "nccl" else "cpu"
        out = tuple(torch.empty(tuple(s), dtype=dtype, device=device) for s in (shapes if batched else (shapes,)))
        return out if batched else out[0]

    def all_gather(self, t):
        """(Experimental) ``(gathered [R, ...], wait)`` for one tensor, ``(*gathered, wait)`` for a sequence."""
        api = "deep_ep.ElasticBuffer.all_gather"
        self._alive("all_gather")
        session = self._agrs_session
        if session is None:
            raise RuntimeError(f"{api}: no session is open (create_agrs_session / agrs_new_session)")
        tensors = (t,) if isinstance(t, torch.Tensor) else tuple(t)
        r = self.num_ranks
        needed = sum(align(r * x.numel() * x.element_size(), 32) for x in tensors)
        if session[0] + needed > self._agrs[0] or session[1] + 1 > self._agrs[1]:
            raise RuntimeError(
                f"{api}: the session's limits (agrs_set_config: {self._agrs[0]} bytes, {self._agrs[1]} all-gathers) "
                f"are exceeded ({session[0] + needed} bytes, {session[1] + 1} all-gathers)"
            )
        session[0] += needed
        session[1] += 1
        outs, works = [], []
        for x in tensors:
            if not x.is_contiguous():
                raise ValueError(ck.message(api, "t", "value", "contiguous tensors", f"strides {x.stride()}"))
            out = x.new_empty(r, *x.shape)
            works.append(dist.all_gather(list(out.unbind(0)), x, group=self.group, async_op=True))
            outs.append(out)
        session[2].extend(works)

        def wait():
            for work in works:
                waits.wait(api, self.group, work, self.num_cpu_timeout_secs, "the all-gather")

        return (outs[0], wait) if isinstance(t, torch.Tensor) else (*outs, wait)


def recv_idx_rows(handle: EPHandle) -> torch.Tensor:
    """The expanded row of each received row's slot (``recv_src_metadata[:, 2:]``), int64 for indexing."""
    return handle.recv_src_metadata[:, 2:].long()


def _sf_layout(sf: torch.Tensor | None, col_major: bool) -> torch.Tensor | None:
    """Scales as upstream returns them: row-major, or TMA-aligned column-major (``strides (1, align(N, 4))``)."""
    if sf is None or not col_major:
        return sf
    n, s = sf.shape
    out = torch.empty_strided((n, s), (1, align(max(n, 1), 4)), dtype=sf.dtype, device=sf.device)
    out.copy_(sf)
    return out


__all__ = ["EPHandle", "ElasticBuffer", "get_elastic_buffer_alignment"]
