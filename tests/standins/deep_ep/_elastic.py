"""``deep_ep.ElasticBuffer`` / ``deep_ep.EPHandle`` (V2): upstream's Python classes (``deep_ep/buffers/elastic.py``)
over the stand-in runtime (``_elastic_runtime.ElasticRuntime`` for ``deep_ep._C.ElasticBuffer``), plus
``deep_ep.get_physical_domain_size`` / ``get_logical_domain_size`` (``deep_ep/utils/envs.py``). Same signatures,
defaults, attributes, Python asserts and call sequence; ``EPHandle.deterministic_sort`` is upstream's code (one
``device='cuda'`` made the tensor's device).

Not from upstream: the NCCL communicator (``nccl_comm_handle`` is a placeholder), ``check_nvlink_connections`` (no GPU
to query), ``torch.cuda.synchronize``, the bandwidths ``get_theoretical_num_sms`` reads (``configure(nvlink_gbs=,
rdma_gbs=)`` instead of ``nvidia-smi`` / ``ibstat``; ``check_fast_rdma_atomic_support`` is False, no ``ibstat``), and
``get_comm_stream`` (returns ``None``: there is no CUDA stream on CPU). The experimental Engram / PP / AGRS methods
exist with upstream's signatures and raise ``NotImplementedError``; their size hints are upstream's arithmetic.

A non-cached ``do_cpu_sync=True`` dispatch while a device graph is captured (``graph_capturing()``: CUDA's or
torch_npu's check, or the project's CPU emulation) raises upstream's "Dispatch CPU wait" timeout at once: the captured
kernel never runs, so the host never sees the counts it waits for.

``configure(platform="ascend")`` makes the class behave as the DeepEP-Ascend V2 port (``yuqitao1024/DeepEP-Ascend``,
``shared/specs/deepep_api.md`` §9.4, from its capability table: the port's source could not be read, so *the
refusals' words and their exact points are the stand-in's*): ``_standin.AscendUnsupported`` (a
``NotImplementedError``) for ``num_cpu_bytes != 0`` and hybrid (multi-node) logical domains at construction; a
``dispatch`` / ``combine`` while a graph is captured; ``do_cpu_sync=False`` on a non-cached dispatch; ``num_sms``
outside ``[1, 72]`` (``0``, automatic SM tuning, included; a combine's ``0`` reuses the handle's); ``num_qps != 0``;
``previous_event_before_epilogue``; ``get_theoretical_num_sms``; the experimental features. ``capture()`` (an event,
not a graph capture) stays: the port lists previous events as supported.
"""

from __future__ import annotations

import functools
import math
import os
from contextlib import contextmanager

import torch
import torch.distributed as dist

from . import _standin as S
from ._buffer import _GroupComm, check_torch_deterministic
from ._config import align_up
from ._elastic_handle import EPHandle
from ._elastic_layout import (
    NUM_ALIGNMENT_BYTES,
    calculate_buffer_size,
    graph_capturing,
    logical_domain_size,
    physical_domain_size,
)
from ._elastic_runtime import ElasticRuntime
from ._event import EventHandle, EventOverlap
from ._standin import ELASTIC_HPP, ELASTIC_PY, check, py_assert

ASCEND_MAX_SMS = 72  # Ascend 950: 72 AI-Vector cores per device (spec §9.4)


def _ascend() -> bool:
    return S.STATE.platform == "ascend"


def _refuse(feature: str) -> None:
    raise S.AscendUnsupported(f"{S.PREFIX}DeepEP-Ascend V2 port: {feature} is unsupported")


def _experimental(name: str):
    if _ascend():
        _refuse(f"{name} (PP / Engram / AGRS / all-gather are excluded from the port)")
    S.not_implemented(f"ElasticBuffer.{name}", "the experimental Engram / PP / AGRS features are not emulated")


class _NoGroupError(NotImplementedError, AttributeError):
    """``ElasticBuffer(None)``: upstream fails on ``group.rank()`` (``AttributeError``); this one is also the
    ``NotImplementedError`` of the stand-in's earlier V2 placeholder (no ``comm=`` path exists in V2)."""


class _NCCLCommHandle:
    """Placeholder for ``deep_ep.utils.comm.NCCLCommHandle`` (no NCCL on CPU): ``get()`` returns 0."""

    def __init__(self, group) -> None:
        self.group, self.managed = group, False

    def get(self) -> int:
        return 0


@S.logged("get_physical_domain_size")
def get_physical_domain_size(group: dist.ProcessGroup) -> tuple[int, int]:
    """deep_ep/utils/envs.py:116-127: (RDMA ranks, NVLink ranks)."""
    return physical_domain_size(group.size())


@S.logged("get_logical_domain_size")
def get_logical_domain_size(group: dist.ProcessGroup, allow_hybrid_mode: bool = True) -> tuple[int, int]:
    """deep_ep/utils/envs.py:130-142: (scale-out ranks, scale-up ranks)."""
    return logical_domain_size(group.size(), allow_hybrid_mode)


class ElasticBuffer:
    """The elastic communication buffer (elastic.py:195-1107): expert-parallel dispatch / combine over the group."""

    @S.logged("ElasticBuffer.__init__")
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
        if group is None:
            raise _NoGroupError(
                "'NoneType' object has no attribute 'rank' (DeepEP stand-in: ElasticBuffer needs a process group; "
                "DeepEP V2 has no mpi4py `comm=` path)"
            )
        self.group = group
        self.rank_idx = group.rank()
        self.num_ranks = group.size()
        self.allow_hybrid_mode = allow_hybrid_mode
        self.allow_multiple_reduction = allow_multiple_reduction
        self.prefer_overlap_with_compute = prefer_overlap_with_compute
        self.deterministic = deterministic
        if _ascend():
            if num_cpu_bytes != 0:
                _refuse(f"the CPU buffer (num_cpu_bytes must be 0, got {num_cpu_bytes})")
            if logical_domain_size(self.num_ranks, allow_hybrid_mode)[0] > 1:
                _refuse("hybrid routing (more than one scale-out rank: cross-host scale-out)")
        transport = _GroupComm(group, None)

        if os.environ.get("NCCL_GIN_CROSS_NIC") == "0":
            os.environ.setdefault("NCCL_SYM_REUSE_SYSMEM_HANDLES", "1")

        # For extreme large buffer size, upstream enlarges the NCCL VA space (`NCCL_WIN_STRIDE`): no GPU memory here
        if num_cpu_bytes > 0:
            py_assert(num_bytes is not None, None, f"{ELASTIC_PY}:286", "num_bytes is not None")

        self.nccl_comm_handle = _NCCLCommHandle(group)

        if num_bytes is None:
            num_bytes = calculate_buffer_size(
                self.num_ranks,
                num_max_tokens_per_rank,
                hidden,
                num_topk,
                use_fp8_dispatch,
                allow_hybrid_mode,
                allow_multiple_reduction,
            )
        self.num_bytes = num_bytes

        # Store default values
        self.num_max_tokens_per_rank = num_max_tokens_per_rank

        # `check_nvlink_connections(group)`: skipped (no GPU to query)

        if "EP_OVERRIDE_RDMA_SL" in os.environ:
            sl_idx = int(os.environ["EP_OVERRIDE_RDMA_SL"])

        if num_allocated_qps == 0:
            # `check_fast_rdma_atomic_support()` is False without `ibstat`
            num_allocated_qps = 129 if self.allow_hybrid_mode else 17
        self.num_allocated_qps = num_allocated_qps

        cpu_comm = []
        if allow_hybrid_mode and num_cpu_bytes > 0:
            check(
                num_cpu_bytes > 0 and num_cpu_bytes % NUM_ALIGNMENT_BYTES == 0,
                f"{ELASTIC_HPP}:689",
                "num_cpu_bytes > 0 and num_cpu_bytes % symmetric::kNumAlignmentBytes == 0",
            )
            cpu_comm = transport.allgather((os.getpid(), -1))

        self.explicitly_destroy = explicitly_destroy
        self.runtime = ElasticRuntime(
            group.rank(),
            group.size(),
            transport,
            num_bytes,
            num_cpu_bytes,
            allow_hybrid_mode,
            allow_multiple_reduction,
            prefer_overlap_with_compute,
            sl_idx,
            num_allocated_qps,
            num_cpu_timeout_secs,
            num_gpu_timeout_secs,
            self.explicitly_destroy,
        )
        self._cpu_comm = cpu_comm
        # The NCCL symmetric-memory registration is collective: every rank must ask for the same window
        window = (int(num_bytes), int(num_cpu_bytes), bool(allow_hybrid_mode))
        windows = transport.allgather(window)
        if any(w != window for w in windows):
            S.panic(
                f"ElasticBuffer: ranks register different symmetric windows {windows} (num_bytes, num_cpu_bytes, "
                "allow_hybrid_mode): NCCL's collective registration would fail or hang"
            )

        # Logical rank indices
        self.num_scaleout_ranks, self.num_scaleup_ranks = self.get_logical_domain_size()
        self.scaleout_rank_idx = self.rank_idx // self.num_scaleup_ranks
        self.scaleup_rank_idx = self.rank_idx % self.num_scaleup_ranks

        # Physical rank indices
        self.num_rdma_ranks, self.num_nvlink_ranks = self.get_physical_domain_size()

        self._num_sms_cache: dict = {}
        dist.barrier(group=group)  # `group.barrier()`

    @S.logged("ElasticBuffer.destroy")
    def destroy(self) -> None:
        py_assert(self.explicitly_destroy, None, f"{ELASTIC_PY}:373", "self.explicitly_destroy")
        if self.runtime is not None:
            self.runtime.destroy()
            self.runtime = None  # Cannot use anymore
            self.nccl_comm_handle = None

    @staticmethod
    @S.logged("ElasticBuffer.get_buffer_size_hint")
    def get_buffer_size_hint(
        group: dist.ProcessGroup,
        num_max_tokens_per_rank: int,
        hidden: int,
        num_topk: int = 0,
        use_fp8_dispatch: bool = False,
        allow_hybrid_mode: bool = True,
        allow_multiple_reduction: bool = True,
    ) -> int:
        return calculate_buffer_size(
            group.size(),
            num_max_tokens_per_rank,
            hidden,
            num_topk,
            use_fp8_dispatch,
            allow_hybrid_mode,
            allow_multiple_reduction,
        )

    @staticmethod
    @S.logged("ElasticBuffer.get_engram_storage_size_hint")
    def get_engram_storage_size_hint(
        num_entries: int, hidden: int, num_max_tokens_per_rank: int, dtype: torch.dtype = torch.bfloat16
    ) -> tuple[int, int]:
        num_bytes_per_entry = align_up(hidden * dtype.itemsize, 32)
        num_gpu_bytes = align_up(num_bytes_per_entry * num_max_tokens_per_rank, NUM_ALIGNMENT_BYTES)
        num_cpu_bytes = align_up(num_bytes_per_entry * num_entries, NUM_ALIGNMENT_BYTES)
        return num_gpu_bytes, num_cpu_bytes

    @staticmethod
    @S.logged("ElasticBuffer.get_pp_buffer_size_hint")
    def get_pp_buffer_size_hint(num_max_tensor_bytes: int, num_max_inflight_tensors: int) -> int:
        num_max_tensor_bytes = align_up(num_max_tensor_bytes, 32)
        return align_up(num_max_tensor_bytes * num_max_inflight_tensors * 2 * 2, NUM_ALIGNMENT_BYTES)

    @staticmethod
    @S.logged("ElasticBuffer.get_agrs_num_max_session_bytes")
    def get_agrs_num_max_session_bytes(group: dist.ProcessGroup, shapes, dtype: torch.dtype) -> int:
        if not isinstance(shapes[0], tuple):
            shapes = (shapes,)
        return sum(align_up(group.size() * math.prod(x) * dtype.itemsize, 32) for x in shapes)

    @staticmethod
    @S.logged("ElasticBuffer.get_agrs_buffer_size_hint")
    def get_agrs_buffer_size_hint(group: dist.ProcessGroup, num_max_session_bytes: int) -> int:
        return align_up(num_max_session_bytes, NUM_ALIGNMENT_BYTES)

    @S.logged("ElasticBuffer.barrier")
    def barrier(self, use_comm_stream: bool = True, with_cpu_sync: bool = False, sequential: bool = True) -> None:
        self.runtime.barrier(use_comm_stream, with_cpu_sync, sequential)

    @staticmethod
    def _unpack_handle(handle: EPHandle | None = None):
        if handle is None:
            return None, None, None, None, None, None, None, None, None, None
        return (
            handle.num_recv_tokens,
            handle.num_expanded_tokens,
            handle.num_recv_tokens_per_expert_list,
            handle.psum_num_recv_tokens_per_scaleup_rank,
            handle.psum_num_recv_tokens_per_expert,
            handle.num_unaligned_recv_tokens_per_expert,
            handle.dst_buffer_slot_idx,
            handle.token_metadata_at_forward,
            handle.recv_src_metadata,
            handle.channel_linked_list,
        )

    @staticmethod
    @S.logged("ElasticBuffer.capture")
    def capture() -> EventHandle:
        """An event on the current stream (not a graph capture: the Ascend port supports previous events)."""
        return EventHandle()

    @S.logged("ElasticBuffer.get_comm_stream")
    def get_comm_stream(self):
        """Upstream wraps the runtime's stream in a ``torch.cuda.Stream``; on CPU there is none: ``None``."""
        return self.runtime.get_comm_stream()

    @S.logged("ElasticBuffer.get_physical_domain_size")
    def get_physical_domain_size(self) -> tuple[int, int]:
        return self.runtime.get_physical_domain_size()

    @S.logged("ElasticBuffer.get_logical_domain_size")
    def get_logical_domain_size(self) -> tuple[int, int]:
        return self.runtime.get_logical_domain_size()

    # -- experimental features: not emulated --------------------------------------------------------------------------

    def engram_write(self, storage: torch.Tensor, sf: torch.Tensor | None = None) -> None:
        _experimental("engram_write")

    def engram_fetch(self, indices: torch.Tensor, num_qps: int = 0, use_tma_aligned_col_major_sf: bool = False):
        _experimental("engram_fetch")

    def pp_set_config(self, num_max_tensor_bytes: int, num_max_inflight_tensors: int):
        _experimental("pp_set_config")

    def pp_send(self, t: torch.Tensor, dst_rank_idx: int, num_sms: int = 0) -> None:
        _experimental("pp_send")

    def pp_recv(self, t: torch.Tensor, src_rank_idx: int, num_sms: int = 0) -> None:
        _experimental("pp_recv")

    def create_agrs_session(self) -> None:
        _experimental("create_agrs_session")

    def destroy_agrs_session(self) -> None:
        _experimental("destroy_agrs_session")

    @contextmanager
    def agrs_new_session(self, enabled: bool = True):
        if not enabled:
            yield
            return
        self.create_agrs_session()
        try:
            yield
        finally:
            self.destroy_agrs_session()

    def agrs_set_config(self, num_max_session_bytes: int, num_max_all_gathers_per_session: int) -> None:
        _experimental("agrs_set_config")

    def agrs_get_inplace_tensor(self, shapes, dtype: torch.dtype):
        _experimental("agrs_get_inplace_tensor")

    def all_gather(self, t):
        _experimental("all_gather")

    # -- SM / QP heuristics ------------------------------------------------------------------------------------------

    @S.logged("ElasticBuffer.get_theoretical_num_sms")
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
        """elastic.py:728-834 (a balanced-gate bandwidth model; cached per argument tuple like ``weak_lru``)."""
        if _ascend():
            _refuse("automatic SM tuning (pass num_sms in [1, 72])")
        key = (num_experts, num_topk, num_scaleout_topk, rdma_gbs, nvlink_gbs, sm_read_gbs, sm_write_gbs)
        if key not in self._num_sms_cache:
            self._num_sms_cache[key] = self._theoretical_num_sms(*key)
        return self._num_sms_cache[key]

    def _theoretical_num_sms(
        self, num_experts, num_topk, num_scaleout_topk, rdma_gbs, nvlink_gbs, sm_read_gbs, sm_write_gbs
    ) -> int:
        assert num_scaleout_topk == 0
        if rdma_gbs == 0 and self.num_rdma_ranks > 1:
            rdma_gbs = S.STATE.rdma_gbs  # get_rdma_gbs()
        if nvlink_gbs == 0:
            nvlink_gbs = S.STATE.nvlink_gbs  # get_nvlink_gbs()
        sm_read, sm_write = 0, 0
        rdma_traffic, nvlink_traffic = 0, 0

        def get_expected_topk(num_groups: int) -> float:
            assert num_experts % num_groups == 0
            return num_groups * (
                1 - math.comb(num_experts - num_experts // num_groups, num_topk) / math.comb(num_experts, num_topk)
            )

        num_expected_scaleout_topk = get_expected_topk(self.num_scaleout_ranks) if self.num_scaleout_ranks > 1 else 0
        num_expected_topk = get_expected_topk(self.num_ranks)
        sm_read += 1 / num_expected_topk
        if self.num_scaleout_ranks > 1:
            sm_write += 1 / num_expected_topk
            sm_write += (1 / num_expected_topk) * (num_expected_scaleout_topk / self.num_scaleout_ranks)
            rdma_traffic += (1 / num_expected_topk) * (num_expected_scaleout_topk * (1 - 1 / self.num_scaleout_ranks))
            sm_read += num_expected_scaleout_topk / num_expected_topk
            sm_write += 1
            nvlink_traffic += 1 - (1 / self.num_scaleup_ranks)
        else:
            if self.num_rdma_ranks > 1:
                sm_write += 1 / num_expected_topk
            sm_write += self.num_nvlink_ranks / self.num_ranks
            nvlink_traffic += self.num_nvlink_ranks / self.num_ranks * (1 - 1 / self.num_nvlink_ranks)
            rdma_traffic += (self.num_ranks - self.num_nvlink_ranks) / self.num_ranks
        if self.num_scaleout_ranks > 1 and (rdma_traffic / rdma_gbs) > (nvlink_traffic / nvlink_gbs):
            bounded_traffic, bounded_gbs = rdma_traffic, rdma_gbs
        else:
            bounded_traffic, bounded_gbs = nvlink_traffic, nvlink_gbs
        num_device_sms = S.STATE.num_device_sms
        num_sms = num_device_sms  # No traffic, e.g., EP=1
        if bounded_traffic > 0:
            num_sms = max(
                bounded_gbs / bounded_traffic * sm_read / sm_read_gbs,
                bounded_gbs / bounded_traffic * sm_write / sm_write_gbs,
            )
        num_sms = align_up(max(4, math.ceil(num_sms * 1.25)), 2)
        num_sms = num_sms if self.prefer_overlap_with_compute else max(num_sms, 64)
        return min(num_sms, num_device_sms)

    @S.logged("ElasticBuffer.get_theoretical_num_qps")
    def get_theoretical_num_qps(self, num_sms: int) -> int:
        num_qps = min(num_sms, 8 + 1)
        if self.allow_hybrid_mode:
            num_qps = num_sms * 16 + 1
        return min(num_qps, self.num_allocated_qps)

    # -- dispatch / combine ------------------------------------------------------------------------------------------

    @S.logged("ElasticBuffer.dispatch")
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
        previous_event: EventHandle | None = None,
        previous_event_before_epilogue: EventHandle | None = None,
        async_with_compute_stream: bool = False,
        allocate_on_comm_stream: bool = False,
        handle: EPHandle | None = None,
        do_handle_copy: bool = True,
        do_cpu_sync: bool | None = None,
        do_expand: bool = False,
        do_zero_padding: bool = False,
        use_tma_aligned_col_major_sf: bool = False,
    ):
        """elastic.py:855-1033."""
        check_torch_deterministic()
        if _ascend():
            if graph_capturing():
                _refuse("graph capture (unsupported_graph_capture)")
            if handle is None and do_cpu_sync is not None and not do_cpu_sync:
                _refuse("do_cpu_sync=False on a non-cached dispatch (the full no-CPU-sync flow)")
            if not 1 <= num_sms <= ASCEND_MAX_SMS:
                _refuse(f"num_sms={num_sms} (automatic SM tuning; num_sms must be in [1, {ASCEND_MAX_SMS}])")
            if num_qps != 0:
                _refuse(f"num_qps={num_qps} (automatic QP tuning; num_qps must be 0)")
            if previous_event_before_epilogue is not None:
                _refuse("previous_event_before_epilogue")

        # Automatic decide SM and QP count
        num_topk = (handle.topk_idx if topk_idx is None else topk_idx).shape[1]
        num_sms = self.get_theoretical_num_sms(num_experts, num_topk) if num_sms == 0 else num_sms
        num_qps = self.get_theoretical_num_qps(num_sms) if num_qps == 0 else num_qps
        py_assert(num_qps <= self.num_allocated_qps, "Allocated QPs are not enough")

        # Unpack SF
        x, sf = x if isinstance(x, tuple) else (x, None)

        # Unpack handles
        if handle is not None:
            py_assert(topk_idx is None, None, f"{ELASTIC_PY}:938", "topk_idx is None")
            py_assert(do_cpu_sync is None or not do_cpu_sync, "Cannot do CPU sync with cached handle")
            topk_idx = handle.topk_idx
            num_max_tokens_per_rank = _value_or(num_max_tokens_per_rank, handle.num_max_tokens_per_rank)
            num_experts = _value_or(num_experts, handle.num_experts)
            expert_alignment = _value_or(expert_alignment, handle.expert_alignment)
            do_cpu_sync = False
            py_assert(
                (num_experts, expert_alignment, num_max_tokens_per_rank)
                == (handle.num_experts, handle.expert_alignment, handle.num_max_tokens_per_rank),
                None,
                f"{ELASTIC_PY}:947",
                "(num_experts, expert_alignment, num_max_tokens_per_rank) == "
                "(handle.num_experts, handle.expert_alignment, handle.num_max_tokens_per_rank)",
            )
        (
            cached_num_recv_tokens,
            cached_num_expanded_tokens,
            cached_num_recv_tokens_per_expert_list,
            cached_psum_num_recv_tokens_per_scaleup_rank,
            cached_psum_num_recv_tokens_per_expert,
            cached_num_unaligned_recv_tokens_per_expert,
            cached_dst_buffer_slot_idx,
            cached_token_metadata_at_forward,
            cached_recv_src_metadata,
            cached_channel_linked_list,
        ) = self._unpack_handle(handle)

        # Some default values
        num_max_tokens_per_rank = _value_or(num_max_tokens_per_rank, self.num_max_tokens_per_rank)
        expert_alignment = _value_or(expert_alignment, 1)
        do_cpu_sync = _value_or(do_cpu_sync, True)

        (
            recv_x,
            recv_sf,
            recv_topk_idx,
            recv_topk_weights,
            cloned_topk_idx,
            num_recv_tokens,
            num_expanded_tokens,
            num_recv_tokens_per_expert_list,
            psum_num_recv_tokens_per_scaleup_rank,
            psum_num_recv_tokens_per_expert,
            num_unaligned_recv_tokens_per_expert,
            recv_src_metadata,
            dst_buffer_slot_idx,
            token_metadata_at_forward,
            channel_linked_list,
            event,
        ) = self.runtime.dispatch(
            x,
            sf,
            topk_idx,
            topk_weights,
            cumulative_local_expert_recv_stats,
            cached_num_recv_tokens,
            cached_num_expanded_tokens,
            cached_num_recv_tokens_per_expert_list,
            cached_psum_num_recv_tokens_per_scaleup_rank,
            cached_psum_num_recv_tokens_per_expert,
            cached_num_unaligned_recv_tokens_per_expert,
            cached_dst_buffer_slot_idx,
            cached_token_metadata_at_forward,
            cached_recv_src_metadata,
            cached_channel_linked_list,
            num_max_tokens_per_rank,
            num_experts,
            expert_alignment,
            num_sms,
            num_qps,
            previous_event,
            previous_event_before_epilogue,
            async_with_compute_stream,
            allocate_on_comm_stream,
            do_handle_copy,
            do_cpu_sync,
            do_expand,
            do_zero_padding,
            use_tma_aligned_col_major_sf,
        )

        # Create handle
        is_cached_dispatch = handle is not None
        if not is_cached_dispatch:
            handle = EPHandle(
                do_expand,
                num_experts,
                expert_alignment,
                num_max_tokens_per_rank,
                num_sms,
                cloned_topk_idx if do_handle_copy else topk_idx,
                num_recv_tokens,
                num_expanded_tokens,
                num_recv_tokens_per_expert_list,
                psum_num_recv_tokens_per_scaleup_rank,
                psum_num_recv_tokens_per_expert,
                num_unaligned_recv_tokens_per_expert,
                recv_src_metadata,
                dst_buffer_slot_idx,
                token_metadata_at_forward,
                channel_linked_list,
            )

        event_overlap = EventOverlap(event)

        # Deterministic epilogue
        if self.deterministic:
            epilogue = functools.partial(
                handle.deterministic_sort,
                do_cpu_sync,
                is_cached_dispatch,
                recv_x,
                recv_sf,
                recv_topk_idx,
                recv_topk_weights,
                channel_linked_list,
            )
            event_overlap.register_hook_after_wait(epilogue) if async_with_compute_stream else epilogue()

        recv_x = (recv_x, recv_sf) if recv_sf is not None else recv_x
        return recv_x, recv_topk_idx, recv_topk_weights, handle, event_overlap

    @staticmethod
    def _unpack_bias(bias):
        bias_0, bias_1 = None, None
        if isinstance(bias, torch.Tensor):
            bias_0 = bias
        elif isinstance(bias, tuple):
            py_assert(len(bias) == 2, None, f"{ELASTIC_PY}:1042", "len(bias) == 2")
            bias_0, bias_1 = bias
        return bias_0, bias_1

    @S.logged("ElasticBuffer.combine")
    def combine(
        self,
        x: torch.Tensor,
        handle: EPHandle,
        topk_weights: torch.Tensor | None = None,
        bias=None,
        num_sms: int = 0,
        num_qps: int = 0,
        previous_event: EventHandle | None = None,
        previous_event_before_epilogue: EventHandle | None = None,
        async_with_compute_stream: bool = False,
        allocate_on_comm_stream: bool = False,
    ):
        """elastic.py:1046-1107."""
        check_torch_deterministic()
        if _ascend():
            if graph_capturing():
                _refuse("graph capture (unsupported_graph_capture)")
            if num_sms != 0 and not 1 <= num_sms <= ASCEND_MAX_SMS:
                _refuse(f"num_sms={num_sms} (num_sms must be in [1, {ASCEND_MAX_SMS}], or 0 for the handle's)")
            if num_qps != 0:
                _refuse(f"num_qps={num_qps} (automatic QP tuning; num_qps must be 0)")
            if previous_event_before_epilogue is not None:
                _refuse("previous_event_before_epilogue")

        num_sms = handle.num_sms if num_sms == 0 else num_sms
        num_qps = self.get_theoretical_num_qps(num_sms) if num_qps == 0 else num_qps
        py_assert(num_qps <= self.num_allocated_qps, "Allocated QPs are not enough")

        bias_0, bias_1 = ElasticBuffer._unpack_bias(bias)
        combined_x, combined_topk_weights, event = self.runtime.combine(
            x,
            topk_weights,
            bias_0,
            bias_1,
            handle.recv_src_metadata,
            handle.topk_idx,
            handle.psum_num_recv_tokens_per_scaleup_rank,
            handle.token_metadata_at_forward,
            handle.channel_linked_list,
            handle.num_experts,
            handle.num_max_tokens_per_rank,
            num_sms,
            num_qps,
            previous_event,
            previous_event_before_epilogue,
            async_with_compute_stream,
            allocate_on_comm_stream,
            handle.do_expand,
        )
        return combined_x, combined_topk_weights, EventOverlap(event)


def _value_or(value, default):
    """deep_ep/utils/semantic.py ``value_or``."""
    return default if value is None else value
