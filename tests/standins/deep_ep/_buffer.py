"""``deep_ep.Buffer``: upstream's Python class (``deep_ep/buffers/legacy.py``) over the stand-in runtime
(``_runtime.Runtime`` for ``deep_ep._C.Buffer``). Same signatures, defaults, attributes, Python asserts and call
sequence (including the collective ``all_gather_object`` calls of the constructor); ``check_nvlink_connections`` is
skipped (no GPU to query), ``check_torch_deterministic`` is kept.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from . import _standin as S
from ._config import Config, get_low_latency_rdma_size_hint
from ._event import EventHandle, EventOverlap
from ._runtime import Runtime
from ._standin import LEGACY_PY, py_assert


def check_torch_deterministic() -> None:
    """deep_ep/utils/envs.py:183-189."""
    assert not (torch.are_deterministic_algorithms_enabled() and torch.utils.deterministic.fill_uninitialized_memory)


class _GroupComm:
    """The collectives the stand-in's kernels use, on the group given to ``Buffer`` (or an mpi4py communicator)."""

    def __init__(self, group, comm):
        self.group, self.comm = group, comm

    def allgather(self, obj):
        if self.group is not None:
            out = [None] * self.group.size()
            dist.all_gather_object(out, obj, group=self.group)
            return out
        return self.comm.allgather(obj)

    def exchange(self, items: list) -> list:
        """All-to-all of Python objects: ``items[r]`` goes to rank ``r``; returns what every rank sent here. One
        ``scatter_object_list`` per source rank, so each rank only receives its own share."""
        if self.group is None:
            return self.comm.alltoall(items)
        out = []
        for src in range(self.group.size()):
            slot = [None]
            mine = items if self.group.rank() == src else None
            dist.scatter_object_list(slot, mine, src=dist.get_global_rank(self.group, src), group=self.group)
            out.append(slot[0])
        return out

    def barrier(self):
        if self.group is not None:
            dist.barrier(group=self.group)
        else:
            self.comm.Barrier()


class Buffer:
    """The core expert-parallel (EP) communication buffers (deep_ep/buffers/legacy.py:14-713)."""

    num_sms: int = 20

    @S.logged("Buffer.__init__")
    def __init__(
        self,
        group: dist.ProcessGroup | None,
        num_nvl_bytes: int = 0,
        num_rdma_bytes: int = 0,
        low_latency_mode: bool = False,
        num_qps_per_rank: int = 24,
        allow_nvlink_for_low_latency_mode: bool = True,
        allow_mnnvl: bool = False,
        explicitly_destroy: bool = False,
        enable_shrink: bool = False,
        comm=None,
    ) -> None:
        if group is not None:
            self.rank = group.rank()
            self.group = group
            self.group_size = group.size()
        elif comm is not None:
            self.rank = comm.Get_rank()
            self.group = comm
            self.group_size = comm.Get_size()
        else:
            raise ValueError("Either 'group' or 'comm' must be provided.")
        transport = _GroupComm(group, comm if group is None else None)

        def all_gather_object(obj):
            return transport.allgather(obj)

        self.num_nvl_bytes = num_nvl_bytes
        self.num_rdma_bytes = num_rdma_bytes
        self.low_latency_mode = low_latency_mode
        self.explicitly_destroy = explicitly_destroy
        self.enable_shrink = enable_shrink
        self.runtime = Runtime(
            self.rank,
            self.group_size,
            num_nvl_bytes,
            num_rdma_bytes,
            low_latency_mode,
            explicitly_destroy,
            enable_shrink,
            allow_mnnvl,
            transport,
        )

        # Synchronize device IDs and IPC handles (legacy.py:95-101)
        device_ids = all_gather_object(self.runtime.get_local_device_id())
        ipc_handles = all_gather_object(self.runtime.get_local_ipc_handle())

        # Synchronize NVSHMEM unique IDs (legacy.py:103-132)
        root_unique_id = None
        if self.runtime.get_num_rdma_ranks() > 1 or low_latency_mode:
            py_assert(num_qps_per_rank > 0, None, f"{LEGACY_PY}:107", "num_qps_per_rank > 0")
            os.environ["NVSHMEM_DISABLE_P2P"] = "0" if allow_nvlink_for_low_latency_mode else "1"
            os.environ["NVSHMEM_IB_ENABLE_IBGDA"] = "1"
            os.environ["NVSHMEM_IBGDA_NUM_RC_PER_PE"] = f"{num_qps_per_rank}"
            self.nvshmem_qp_depth = int(os.environ.get("NVSHMEM_QP_DEPTH", "1024"))
            os.environ["NVSHMEM_QP_DEPTH"] = str(self.nvshmem_qp_depth)
            os.environ["NVSHMEM_MAX_TEAMS"] = "7"
            os.environ["NVSHMEM_DISABLE_NVLS"] = "1"
            os.environ["NVSHMEM_CUMEM_GRANULARITY"] = f"{2**29}"
            if not allow_mnnvl:
                os.environ["NVSHMEM_DISABLE_MNNVL"] = "1"
            if (low_latency_mode and self.rank == 0) or (not low_latency_mode and self.runtime.get_rdma_rank() == 0):
                root_unique_id = self.runtime.get_local_nvshmem_unique_id()
            nvshmem_unique_ids = all_gather_object(root_unique_id)
            root_unique_id = nvshmem_unique_ids[0 if low_latency_mode else self.runtime.get_root_rdma_rank(True)]

        self.runtime.sync(device_ids, ipc_handles, root_unique_id)
        py_assert(self.runtime.is_available(), None, f"{LEGACY_PY}:136", "self.runtime.is_available()")

    @S.logged("Buffer.destroy")
    def destroy(self):
        py_assert(self.explicitly_destroy, "`explicitly_destroy` flag must be set")
        self.runtime.destroy()
        self.runtime = None

    @staticmethod
    @S.logged("Buffer.is_sm90_compiled")
    def is_sm90_compiled():
        return True

    @staticmethod
    @S.logged("Buffer.set_num_sms")
    def set_num_sms(new_num_sms: int) -> None:
        py_assert(new_num_sms % 2 == 0, "The SM count must be even")
        Buffer.num_sms = new_num_sms

    @staticmethod
    @S.logged("Buffer.capture")
    def capture() -> EventOverlap:
        return EventOverlap(EventHandle())

    @staticmethod
    @S.logged("Buffer.get_low_latency_rdma_size_hint")
    def get_low_latency_rdma_size_hint(
        num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int, num_experts: int
    ) -> int:
        return get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts)

    @S.logged("Buffer.get_comm_stream")
    def get_comm_stream(self) -> torch.Stream:
        return self.runtime.get_comm_stream()

    @S.logged("Buffer.get_local_buffer_tensor")
    def get_local_buffer_tensor(
        self, dtype: torch.dtype, size: torch.Size | None = None, offset: int = 0, use_rdma_buffer: bool = False
    ) -> torch.Tensor:
        return self.runtime.get_local_buffer_tensor(dtype, offset, use_rdma_buffer)

    @staticmethod
    def _unpack_bias(bias):
        bias_0, bias_1 = None, None
        if isinstance(bias, torch.Tensor):
            bias_0 = bias
        elif isinstance(bias, tuple):
            py_assert(len(bias) == 2, None, f"{LEGACY_PY}:228", "len(bias) == 2")
            bias_0, bias_1 = bias
        return bias_0, bias_1

    @staticmethod
    @S.logged("Buffer.get_dispatch_config")
    def get_dispatch_config(num_ranks: int) -> Config:
        config_map = {
            2: (24, 256, 6, 128),
            4: (6, 256, 6, 128),
            8: (6, 256, 6, 128),
            16: (36, 288, 20, 128),
            24: (32, 288, 8, 128),
            32: (32, 288, 8, 128),
            48: (32, 288, 8, 128),
            64: (32, 288, 8, 128),
            96: (20, 480, 12, 128),
            128: (20, 560, 12, 128),
            144: (32, 720, 12, 128),
            160: (28, 720, 12, 128),
        }
        py_assert(num_ranks in config_map, f"Unsupported number of EP ranks: {num_ranks}")
        return Config(Buffer.num_sms, *config_map[num_ranks])

    @staticmethod
    @S.logged("Buffer.get_combine_config")
    def get_combine_config(num_ranks: int) -> Config:
        config_map = {
            2: (10, 256, 6, 128),
            4: (9, 256, 6, 128),
            8: (4, 256, 6, 128),
            16: (4, 288, 12, 128),
            24: (1, 288, 8, 128),
            32: (1, 288, 8, 128),
            48: (1, 288, 8, 128),
            64: (1, 288, 8, 128),
            96: (1, 480, 8, 128),
            128: (1, 560, 8, 128),
            144: (2, 720, 8, 128),
            160: (2, 720, 8, 128),
        }
        py_assert(num_ranks in config_map, f"Unsupported number of EP ranks: {num_ranks}")
        return Config(Buffer.num_sms, *config_map[num_ranks])

    @S.logged("Buffer.get_dispatch_layout")
    def get_dispatch_layout(
        self,
        topk_idx: torch.Tensor,
        num_experts: int,
        previous_event: EventOverlap | None = None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ):
        num_tokens_per_rank, num_tokens_per_rdma_rank, num_tokens_per_expert, is_token_in_rank, event = (
            self.runtime.get_dispatch_layout(
                topk_idx, num_experts, getattr(previous_event, "event", None), async_finish, allocate_on_comm_stream
            )
        )
        return (
            num_tokens_per_rank,
            num_tokens_per_rdma_rank,
            num_tokens_per_expert,
            is_token_in_rank,
            EventOverlap(event),
        )

    @S.logged("Buffer.dispatch")
    def dispatch(
        self,
        x,
        handle: tuple | None = None,
        num_tokens_per_rank: torch.Tensor | None = None,
        num_tokens_per_rdma_rank: torch.Tensor | None = None,
        is_token_in_rank: torch.Tensor | None = None,
        num_tokens_per_expert: torch.Tensor | None = None,
        topk_idx: torch.Tensor | None = None,
        topk_weights: torch.Tensor | None = None,
        expert_alignment: int = 1,
        num_worst_tokens: int = 0,
        config: Config | None = None,
        previous_event: EventOverlap | None = None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ):
        check_torch_deterministic()
        config = self.get_dispatch_config(self.group_size) if config is None else config

        # Internode
        if self.runtime.get_num_rdma_ranks() > 1:
            py_assert(num_worst_tokens == 0, "Internode dispatch does not support `num_worst_tokens > 0`")
            return self.internode_dispatch(
                x,
                handle,
                num_tokens_per_rank,
                num_tokens_per_rdma_rank,
                is_token_in_rank,
                num_tokens_per_expert,
                topk_idx,
                topk_weights,
                expert_alignment,
                config,
                previous_event,
                async_finish,
                allocate_on_comm_stream,
            )

        x, x_scales = x if isinstance(x, tuple) else (x, None)
        prev = getattr(previous_event, "event", None)
        if handle is not None:
            py_assert(
                topk_idx is None and topk_weights is None,
                None,
                f"{LEGACY_PY}:387",
                "topk_idx is None and topk_weights is None",
            )
            (
                rank_prefix_matrix,
                channel_prefix_matrix,
                recv_channel_prefix_matrix,
                recv_src_idx,
                is_token_in_rank,
                send_head,
            ) = handle
            num_recv_tokens = recv_src_idx.size(0)
            recv_x, recv_x_scales, _, _, _, _, _, _, _, _, event = self.runtime.intranode_dispatch(
                x,
                x_scales,
                None,
                None,
                None,
                is_token_in_rank,
                None,
                num_recv_tokens,
                rank_prefix_matrix,
                channel_prefix_matrix,
                expert_alignment,
                num_worst_tokens,
                config,
                prev,
                async_finish,
                allocate_on_comm_stream,
            )
            return (
                (recv_x, recv_x_scales) if x_scales is not None else recv_x,
                None,
                None,
                None,
                None,
                EventOverlap(event),
            )
        py_assert(
            num_tokens_per_rank is not None and is_token_in_rank is not None and num_tokens_per_expert is not None,
            None,
            f"{LEGACY_PY}:395",
            "num_tokens_per_rank is not None and is_token_in_rank is not None and num_tokens_per_expert is not None",
        )
        (
            recv_x,
            recv_x_scales,
            recv_topk_idx,
            recv_topk_weights,
            num_recv_tokens_per_expert_list,
            rank_prefix_matrix,
            channel_prefix_matrix,
            recv_channel_prefix_matrix,
            recv_src_idx,
            send_head,
            event,
        ) = self.runtime.intranode_dispatch(
            x,
            x_scales,
            topk_idx,
            topk_weights,
            num_tokens_per_rank,
            is_token_in_rank,
            num_tokens_per_expert,
            0,
            None,
            None,
            expert_alignment,
            num_worst_tokens,
            config,
            prev,
            async_finish,
            allocate_on_comm_stream,
        )
        handle = (
            rank_prefix_matrix,
            channel_prefix_matrix,
            recv_channel_prefix_matrix,
            recv_src_idx,
            is_token_in_rank,
            send_head,
        )
        return (
            (recv_x, recv_x_scales) if x_scales is not None else recv_x,
            recv_topk_idx,
            recv_topk_weights,
            num_recv_tokens_per_expert_list,
            handle,
            EventOverlap(event),
        )

    @S.logged("Buffer.combine")
    def combine(
        self,
        x: torch.Tensor,
        handle: tuple,
        topk_weights: torch.Tensor | None = None,
        bias=None,
        config: Config | None = None,
        previous_event: EventOverlap | None = None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ):
        check_torch_deterministic()
        config = self.get_combine_config(self.group_size) if config is None else config
        if self.runtime.get_num_rdma_ranks() > 1:
            return self.internode_combine(
                x, handle, topk_weights, bias, config, previous_event, async_finish, allocate_on_comm_stream
            )
        # NOTES: the second `_` is for the sending side, so we should use the third one
        rank_prefix_matrix, _, channel_prefix_matrix, src_idx, is_recv_token_in_rank, send_head = handle
        bias_0, bias_1 = Buffer._unpack_bias(bias)
        recv_x, recv_topk_weights, event = self.runtime.intranode_combine(
            x,
            topk_weights,
            bias_0,
            bias_1,
            src_idx,
            rank_prefix_matrix,
            channel_prefix_matrix,
            send_head,
            config,
            getattr(previous_event, "event", None),
            async_finish,
            allocate_on_comm_stream,
        )
        return recv_x, recv_topk_weights, EventOverlap(event)

    @S.logged("Buffer.internode_dispatch")
    def internode_dispatch(
        self,
        x,
        handle=None,
        num_tokens_per_rank=None,
        num_tokens_per_rdma_rank=None,
        is_token_in_rank=None,
        num_tokens_per_expert=None,
        topk_idx=None,
        topk_weights=None,
        expert_alignment: int = 1,
        config: Config | None = None,
        previous_event=None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ):
        py_assert(config is not None, None, f"{LEGACY_PY}:472", "config is not None")
        return self.runtime.internode_dispatch()

    @S.logged("Buffer.internode_combine")
    def internode_combine(
        self,
        x,
        handle,
        topk_weights=None,
        bias=None,
        config: Config | None = None,
        previous_event=None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ):
        py_assert(config is not None, None, f"{LEGACY_PY}:520", "config is not None")
        return self.runtime.internode_combine()

    @S.logged("Buffer.clean_low_latency_buffer")
    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank: int, hidden: int, num_experts: int) -> None:
        self.runtime.clean_low_latency_buffer(num_max_dispatch_tokens_per_rank, hidden, num_experts)

    @S.logged("Buffer.low_latency_dispatch")
    def low_latency_dispatch(
        self,
        x: torch.Tensor,
        topk_idx: torch.Tensor,
        num_max_dispatch_tokens_per_rank: int,
        num_experts: int,
        cumulative_local_expert_recv_stats: torch.Tensor | None = None,
        dispatch_wait_recv_cost_stats: torch.Tensor | None = None,
        use_fp8: bool = True,
        round_scale: bool = False,
        use_ue8m0: bool = False,
        async_finish: bool = False,
        return_recv_hook: bool = False,
    ):
        check_torch_deterministic()
        py_assert(
            self.nvshmem_qp_depth >= (num_max_dispatch_tokens_per_rank + 1) * 2,
            None,
            f"{LEGACY_PY}:609",
            "self.nvshmem_qp_depth >= (num_max_dispatch_tokens_per_rank + 1) * 2",
        )
        (
            packed_recv_x,
            packed_recv_x_scales,
            packed_recv_count,
            packed_recv_src_info,
            packed_recv_layout_range,
            event,
            hook,
        ) = self.runtime.low_latency_dispatch(
            x,
            topk_idx,
            cumulative_local_expert_recv_stats,
            dispatch_wait_recv_cost_stats,
            num_max_dispatch_tokens_per_rank,
            num_experts,
            use_fp8,
            round_scale,
            use_ue8m0,
            async_finish,
            return_recv_hook,
        )
        handle = (
            packed_recv_src_info,
            packed_recv_layout_range,
            num_max_dispatch_tokens_per_rank,
            x.size(1),
            num_experts,
        )
        tensors_to_record = (
            x,
            topk_idx,
            packed_recv_x,
            packed_recv_x_scales,
            packed_recv_count,
            packed_recv_src_info,
            packed_recv_layout_range,
            cumulative_local_expert_recv_stats,
        )
        return (
            (packed_recv_x, packed_recv_x_scales) if use_fp8 else packed_recv_x,
            packed_recv_count,
            handle,
            EventOverlap(event, tensors_to_record if async_finish else None),
            hook,
        )

    @S.logged("Buffer.low_latency_combine")
    def low_latency_combine(
        self,
        x: torch.Tensor,
        topk_idx: torch.Tensor,
        topk_weights: torch.Tensor,
        handle: tuple,
        use_logfmt: bool = False,
        zero_copy: bool = False,
        async_finish: bool = False,
        return_recv_hook: bool = False,
        out: torch.Tensor | None = None,
        combine_wait_recv_cost_stats: torch.Tensor | None = None,
    ):
        check_torch_deterministic()
        src_info, layout_range, num_max_dispatch_tokens_per_rank, hidden, num_experts = handle
        py_assert(
            self.nvshmem_qp_depth >= (num_max_dispatch_tokens_per_rank + 1) * 2,
            None,
            f"{LEGACY_PY}:665",
            "self.nvshmem_qp_depth >= (num_max_dispatch_tokens_per_rank + 1) * 2",
        )
        combined_x, event, hook = self.runtime.low_latency_combine(
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
            async_finish,
            return_recv_hook,
            out,
        )
        tensors_to_record = (x, topk_idx, topk_weights, src_info, layout_range, combined_x)
        return combined_x, EventOverlap(event, tensors_to_record if async_finish else None), hook

    @S.logged("Buffer.low_latency_update_mask_buffer")
    def low_latency_update_mask_buffer(self, rank_to_mask: int, mask: bool = False):
        self.runtime.low_latency_update_mask_buffer(rank_to_mask, mask)

    @S.logged("Buffer.low_latency_query_mask_buffer")
    def low_latency_query_mask_buffer(self, mask_status: torch.Tensor):
        self.runtime.low_latency_query_mask_buffer(mask_status)

    @S.logged("Buffer.low_latency_clean_mask_buffer")
    def low_latency_clean_mask_buffer(self):
        self.runtime.low_latency_clean_mask_buffer()

    @S.logged("Buffer.get_next_low_latency_combine_buffer")
    def get_next_low_latency_combine_buffer(self, handle: object):
        src_info, layout_range, num_max_dispatch_tokens_per_rank, hidden, num_experts = handle
        return self.runtime.get_next_low_latency_combine_buffer(num_max_dispatch_tokens_per_rank, hidden, num_experts)


S._BUFFER_CLASSES.append(Buffer)
