"""DeepEP V1's ``Buffer`` (upstream's ``deep_ep/buffers/legacy.py``; ``deep_ep.Buffer``) and its ``Config``, over the
``ascend_moe`` ep ops, normal and low-latency modes.

What differs, on purpose (specs/deepep_api.md §2.3): the ops are synchronous on ``torch.distributed``, so
``async_finish`` / ``previous_event`` / ``allocate_on_comm_stream`` are accepted and validated the way
DeepEP validates them, and the returned ``EventOverlap`` holds no event (waiting on it runs its hook only).
``num_nvl_bytes`` / ``num_rdma_bytes`` / ``Config`` size DeepEP's own buffers; they are validated and kept,
not used (``torch.distributed`` owns the transport). The normal-mode handle is DeepEP's tuple (intranode 6
fields, internode 10: prefix matrices, ``recv_src_idx``, ``is_token_in_rank``, ...; exact where upstream's values
are determined by the routing, a faithful model of its channels and ring queues otherwise: ``_DeepEPHandle``),
carrying the ops' ``EPHandle`` as ``.ep`` for ``combine`` and cached ``dispatch``. The low-latency handle is
DeepEP's 5-tuple ``(packed_recv_src_info, packed_recv_layout_range, num_max_dispatch_tokens_per_rank, hidden,
num_experts)``; the buffer adds its own group when it passes it back to the ops.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from torch_ascend_moe import checks as ck
from torch_ascend_moe.deep_ep.buffers import shrink
from torch_ascend_moe.deep_ep.utils.event import EventHandle, EventOverlap
from torch_ascend_moe.distributed import waits
from torch_ascend_moe.ops.ep import EPHandle as _OpHandle
from torch_ascend_moe.ops.ep import (
    EPLowLatencyHandle,
    ep_combine,
    ep_dispatch,
    ep_dispatch_cached,
    ep_dispatch_layout,
    ep_low_latency_combine,
    ep_low_latency_dispatch,
)

# DeepEP's tuned (nvl send, nvl recv, rdma send, rdma recv) chunk sizes per rank count (deep_ep/buffers/legacy.py):
# Megatron and SGLang size their buffers from these configs' hints.
_DISPATCH_CONFIGS = {
    2: (24, 256, 6, 128), 4: (6, 256, 6, 128), 8: (6, 256, 6, 128), 16: (36, 288, 20, 128), 24: (32, 288, 8, 128),
    32: (32, 288, 8, 128), 48: (32, 288, 8, 128), 64: (32, 288, 8, 128), 96: (20, 480, 12, 128),
    128: (20, 560, 12, 128), 144: (32, 720, 12, 128), 160: (28, 720, 12, 128),
}  # fmt: skip
_COMBINE_CONFIGS = {
    2: (10, 256, 6, 128), 4: (9, 256, 6, 128), 8: (4, 256, 6, 128), 16: (4, 288, 12, 128), 24: (1, 288, 8, 128),
    32: (1, 288, 8, 128), 48: (1, 288, 8, 128), 64: (1, 288, 8, 128), 96: (1, 480, 8, 128), 128: (1, 560, 8, 128),
    144: (2, 720, 8, 128), 160: (2, 720, 8, 128),
}  # fmt: skip
_NVL_PEERS = 8
_MAX_TOPK = _MAX_SCALES = 128  # the hints' assumed bounds (config.hpp)
_SOURCE_META_BYTES = 8


class Config:
    """DeepEP's kernel configuration (SM count and ring-buffer chunk sizes; csrc/legacy/config.hpp): its checks and
    its buffer-size hints, which callers size their ``Buffer`` with; our kernels take no configuration."""

    def __init__(
        self,
        num_sms: int = 20,
        num_max_nvl_chunked_send_tokens: int = 6,
        num_max_nvl_chunked_recv_tokens: int = 256,
        num_max_rdma_chunked_send_tokens: int = 6,
        num_max_rdma_chunked_recv_tokens: int = 256,
    ):
        api = "deep_ep.Config"
        nvl_send, nvl_recv = num_max_nvl_chunked_send_tokens, num_max_nvl_chunked_recv_tokens
        rdma_send, rdma_recv = num_max_rdma_chunked_send_tokens, num_max_rdma_chunked_recv_tokens
        ck.check_arg(num_sms >= 0, api, "num_sms", "value", ">= 0", num_sms)
        for arg, value in (("num_max_nvl_chunked_send_tokens", nvl_send), ("num_max_nvl_chunked_recv_tokens", nvl_recv),
                           ("num_max_rdma_chunked_send_tokens", rdma_send),
                           ("num_max_rdma_chunked_recv_tokens", rdma_recv)):  # fmt: skip
            ck.check_arg(value > 0, api, arg, "value", "> 0", value)
        ck.check_arg(nvl_send < nvl_recv, api, "num_max_nvl_chunked_send_tokens", "value",
                     lambda: f"less than num_max_nvl_chunked_recv_tokens={nvl_recv}", nvl_send)  # fmt: skip
        rdma_recv = -(-rdma_recv // rdma_send) * rdma_send  # rounded up to whole sends, as upstream
        ck.check_arg(rdma_send <= rdma_recv // 2, api, "num_max_rdma_chunked_send_tokens", "value",
                     lambda: f"at most half of num_max_rdma_chunked_recv_tokens (rounded up to a multiple of it: "
                     f"{rdma_recv})", rdma_send)  # fmt: skip
        self.num_sms = num_sms
        self.num_max_nvl_chunked_send_tokens = nvl_send
        self.num_max_nvl_chunked_recv_tokens = nvl_recv
        self.num_max_rdma_chunked_send_tokens = rdma_send
        self.num_max_rdma_chunked_recv_tokens = rdma_recv

    def _check_hint(self, api: str, num_ranks: int) -> None:
        ck.check_arg(num_ranks < _NVL_PEERS or num_ranks % _NVL_PEERS == 0, api, "num_ranks", "value",
                     f"below {_NVL_PEERS} or a multiple of it", num_ranks)  # fmt: skip
        ck.check_arg(self.num_sms % 2 == 0, api, "num_sms", "value", "an even number (two blocks per channel)",
                     self.num_sms)  # fmt: skip

    def get_nvl_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        """DeepEP's NVLink buffer size (per rank): per channel and NVLink peer, the ring's counters and
        ``nvl_recv`` slots of a row, its source metadata, top-k ids and weights and scales."""
        self._check_hint("deep_ep.Config.get_nvl_buffer_size_hint", num_ranks)
        channels, rn, rr = self.num_sms // 2, min(num_ranks, _NVL_PEERS), max(num_ranks // _NVL_PEERS, 1)
        size = channels * rn * (2 * rr + 3) * 4
        slot = hidden_bytes + _SOURCE_META_BYTES + _MAX_TOPK * 8 + _MAX_TOPK * 4 + _MAX_SCALES * 4
        size += channels * rn * self.num_max_nvl_chunked_recv_tokens * slot
        return -(-size // 128) * 128

    def get_rdma_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        """0 within a node (R <= 8); across nodes DeepEP's double-buffered RDMA ring per channel and node."""
        if num_ranks <= _NVL_PEERS:
            return 0
        self._check_hint("deep_ep.Config.get_rdma_buffer_size_hint", num_ranks)
        channels, rr = self.num_sms // 2, num_ranks // _NVL_PEERS
        size = channels * rr * (_NVL_PEERS * 2 + 2) * 2 * 4
        slot = hidden_bytes + _SOURCE_META_BYTES + _MAX_TOPK * 8 + _MAX_TOPK * 4 + _MAX_SCALES * 4 + 16
        size += channels * rr * self.num_max_rdma_chunked_recv_tokens * slot * 2
        return -(-size // 128) * 128


def _event(async_finish: bool) -> EventOverlap:
    return EventOverlap(EventHandle() if async_finish else None)


class _LowLatencyHandle(tuple):
    """DeepEP's low-latency handle ``(src_info, layout_range, num_max_dispatch_tokens_per_rank, hidden,
    num_experts)``, plus ``.backend_state``: the dispatch's device routing state (Ascend MC2's; empty elsewhere)
    that ``low_latency_combine`` hands to the combine. A re-packed plain 5-tuple still combines (through the
    handle's fields, on every device)."""

    backend_state: torch.Tensor | None

    def __new__(cls, fields, backend_state):
        self = super().__new__(cls, fields)
        self.backend_state = backend_state
        return self


class _DeepEPHandle(tuple):
    """DeepEP V1's normal-mode handle: upstream's tuple, its fields at upstream's positions, plus ``.ep``, the ops'
    ``EPHandle`` that ``combine`` and cached ``dispatch`` replay (the fields are for code that reads them).

    Intranode (``R <= 8``) 6-tuple ``(rank_prefix_matrix [R, R], channel_prefix_matrix [R, C],
    recv_channel_prefix_matrix [R, C], recv_src_idx [N], is_token_in_rank [T, R], send_head [T, R])``; internode
    (``R > 8``: nodes of 8 ranks, as ``get_dispatch_layout``'s per-node counts) 10-tuple ``(is_token_in_rank,
    rdma_channel_prefix_matrix [R/8, C], gbl_channel_prefix_matrix [R, C], recv_rdma_channel_prefix_matrix
    [R/8, C], recv_rdma_rank_prefix_sum [R/8], recv_gbl_channel_prefix_matrix [R, C], recv_gbl_rank_prefix_sum
    [R], recv_src_meta [N, 8] uint8, send_rdma_head [T, R/8], send_nvl_head [rows received over RDMA, 8])``;
    int32 unless said. ``C = config.num_sms / 2`` channels, as upstream.

    Exact (what upstream computes, and its receive order is ours: source-rank-major, then ascending source
    token): the rank prefix sums, ``recv_src_idx``, ``is_token_in_rank`` and ``recv_src_meta``'s
    ``{src_rdma_rank, NVL-rank bitmask}`` (two int32, little-endian). A model of upstream's kernels, since no
    channels or ring queues exist here: channels are upstream's token-index ranges (``get_channel_task_range``),
    so the channel prefix matrices are what its kernels would count (sender side inclusive; intranode receiver
    side exclusive and within the source's block, internode receiver side with the source's block offset added,
    as the kernels write them); ``send_head`` / ``send_rdma_head`` / ``send_nvl_head`` are each token's index
    among the earlier tokens of its channel going to the same destination (upstream's queue tail before the
    token; its slot is that modulo the ring size), -1 when not sent. With ``num_worst_tokens`` the padding rows
    have ``recv_src_idx`` -1 and a zero ``recv_src_meta`` (upstream leaves them unspecified)."""

    ep: _OpHandle

    def __new__(cls, fields, ep):
        self = super().__new__(cls, fields)
        self.ep = ep
        return self

    @staticmethod
    def intranode(
        rank: int,
        num_channels: int,
        is_token_in_rank: torch.Tensor,
        sent: torch.Tensor,
        num_tokens: torch.Tensor,
        recv_src_idx: torch.Tensor,
    ) -> tuple:
        """The 6 fields from this rank's ``is_token_in_rank [T, R]``, every rank's layout counts ``sent [R, R]``
        (``sent[i][j]``: tokens rank i sends to rank j), every rank's token count and the rows' source tokens."""
        dev = is_token_in_rank.device
        rank_prefix = sent.to(torch.int64).cumsum(0)
        channel_prefix = _DeepEPHandle._channel_counts(is_token_in_rank, num_channels).cumsum(1)
        # Receiver side: where channel c of source s starts inside s's block, i.e. how many of s's rows here come
        # from tokens before that channel's first token. Tensor ops only (no host sync: the sizes stay on the
        # device, as under num_worst_tokens). Padding rows (-1) count nowhere.
        src_idx = recv_src_idx.to(torch.int64)
        rows = torch.arange(src_idx.shape[0], device=dev)
        src_rank = torch.searchsorted(rank_prefix[:, rank].contiguous(), rows, right=True)
        valid = src_idx >= 0
        src_rank = torch.where(valid, src_rank, 0)
        per = torch.clamp((num_tokens.to(torch.int64) + num_channels - 1) // num_channels, min=1)
        channel = torch.where(valid, src_idx // per[src_rank], 0)
        counts = torch.zeros(sent.shape[0] * num_channels, dtype=torch.int64, device=dev)
        counts.index_add_(0, src_rank * num_channels + channel, valid.to(torch.int64))
        counts = counts.view(sent.shape[0], num_channels)
        recv_channel = counts.cumsum(1) - counts
        return (
            rank_prefix.to(torch.int32),
            channel_prefix.to(torch.int32),
            recv_channel.to(torch.int32),
            recv_src_idx.to(torch.int32),
            is_token_in_rank,
            _DeepEPHandle._position_in_channel(is_token_in_rank, num_channels),
        )

    @staticmethod
    def internode(rank: int, num_channels: int, in_rank: list[torch.Tensor], num_recv_rows: int) -> tuple:
        """The 10 fields from every rank's ``is_token_in_rank`` (``in_rank[i]``: rank i's ``[T_i, R]``; the
        forwarding hop and the source metadata depend on the other ranks' routing) and the rows this rank's
        receive holds (``num_recv_rows`` >= the real rows; the rest are padding)."""
        nvl = 8
        mine = in_rank[rank]
        dev, num_ranks = mine.device, mine.shape[1]
        nodes, node, local = num_ranks // nvl, rank // nvl, rank % nvl

        def node_mask(m):  # [T, nodes]: the token goes to some rank of that node (counted once per node)
            return m.view(m.shape[0], nodes, nvl).any(-1)

        rdma_channel = _DeepEPHandle._channel_counts(node_mask(mine), num_channels).cumsum(1)
        gbl_channel = _DeepEPHandle._channel_counts(mine, num_channels).cumsum(1)
        # RDMA hop: rank (n, local) sends this rank, once per token, what any rank of this node needs.
        peers = [in_rank[n * nvl + local] for n in range(nodes)]
        to_node = [node_mask(p)[:, node] for p in peers]
        recv_rdma_channel = torch.stack(
            [_DeepEPHandle._channel_counts(m[:, None], num_channels)[0].cumsum(0) for m in to_node]
        )
        recv_rdma_prefix = torch.stack([m.sum() for m in to_node]).cumsum(0)
        # The forwarder's NVL queues: per (source node, channel, local destination), in source token order.
        send_nvl = torch.cat(
            [
                _DeepEPHandle._position_in_channel(p[:, node * nvl : (node + 1) * nvl], num_channels)[m]
                for p, m in zip(peers, to_node)
            ]
        )
        to_me = [m[:, rank] for m in in_rank]
        recv_gbl_prefix = torch.stack([m.sum() for m in to_me]).cumsum(0)
        block_start = recv_gbl_prefix - torch.stack([m.sum() for m in to_me])
        counts = torch.stack([_DeepEPHandle._channel_counts(m[:, None], num_channels)[0] for m in to_me])
        recv_gbl_channel = block_start[:, None] + counts.cumsum(1) - counts
        bits = 1 << torch.arange(nvl, device=dev)
        meta = torch.zeros(num_recv_rows, 2, dtype=torch.int32, device=dev)
        rows = 0
        for i, (m, t) in enumerate(zip(in_rank, to_me)):
            got = m[t][:, node * nvl : (node + 1) * nvl].to(torch.int64)
            meta[rows : rows + got.shape[0], 0] = i // nvl
            meta[rows : rows + got.shape[0], 1] = (got * bits).sum(1).to(torch.int32)
            rows += got.shape[0]
        return (
            mine,
            rdma_channel.to(torch.int32),
            gbl_channel.to(torch.int32),
            recv_rdma_channel.to(torch.int32),
            recv_rdma_prefix.to(torch.int32),
            recv_gbl_channel.to(torch.int32),
            recv_gbl_prefix.to(torch.int32),
            meta.view(torch.uint8),
            _DeepEPHandle._position_in_channel(node_mask(mine), num_channels),
            send_nvl,
        )

    # ---- the model of upstream's channels and queues ----

    @staticmethod
    def _channel_starts(num_tokens: int, num_channels: int) -> list[int]:
        """First token of each channel, then ``num_tokens``: upstream's ``get_channel_task_range`` splits a
        rank's tokens into ``num_channels`` contiguous ranges of ``ceil(T / C)`` tokens (the last may be short or
        empty)."""
        per = -(-num_tokens // num_channels)
        return [min(per * c, num_tokens) for c in range(num_channels)] + [num_tokens]

    @staticmethod
    def _channel_counts(mask: torch.Tensor, num_channels: int) -> torch.Tensor:
        """``[K, C]`` int64: per column of ``mask [T, K]``, the set rows in each channel's token range."""
        starts = _DeepEPHandle._channel_starts(mask.shape[0], num_channels)
        prefix = torch.zeros(mask.shape[0] + 1, mask.shape[1], dtype=torch.int64, device=mask.device)
        prefix[1:] = mask.to(torch.int64).cumsum(0)
        bounds = torch.tensor(starts, device=mask.device)
        return (prefix[bounds[1:]] - prefix[bounds[:-1]]).T.contiguous()

    @staticmethod
    def _position_in_channel(mask: torch.Tensor, num_channels: int) -> torch.Tensor:
        """``[T, K]`` int32: for each set entry of ``mask [T, K]``, how many set rows of its column precede it in its
        channel (upstream's per-(channel, destination) queue tail when the token is sent), else -1."""
        t = mask.shape[0]
        per = max(-(-t // num_channels), 1)
        counts = mask.to(torch.int64)
        before = counts.cumsum(0) - counts  # set rows before each row, over the whole column
        first = (torch.arange(t, device=mask.device) // per) * per  # the first token of each row's channel
        return torch.where(mask, before - before[first], -1).to(torch.int32)


class Buffer:
    """DeepEP V1's ``Buffer`` on a ``torch.distributed`` group (normal and low-latency modes)."""

    num_sms = 20

    def __init__(
        self,
        group,
        num_nvl_bytes: int = 0,
        num_rdma_bytes: int = 0,
        low_latency_mode: bool = False,
        num_qps_per_rank: int = 24,
        allow_nvlink_for_low_latency_mode: bool = True,
        allow_mnnvl: bool = False,
        explicitly_destroy: bool = False,
        enable_shrink: bool = False,
        comm=None,
        num_cpu_timeout_secs: float = 100.0,
    ):
        api = "deep_ep.Buffer"
        ck.check_arg(
            group is not None,
            api,
            "group",
            "value",
            "a torch.distributed ProcessGroup (mpi4py communicators are not supported)",
            "None",
        )
        ck.check_arg(
            isinstance(num_cpu_timeout_secs, (int, float)) and num_cpu_timeout_secs > 0,
            api,
            "num_cpu_timeout_secs",
            "value",
            "a positive number of seconds",
            lambda: repr(num_cpu_timeout_secs),
        )
        for name, value in (("num_nvl_bytes", num_nvl_bytes), ("num_rdma_bytes", num_rdma_bytes)):
            if value < 0 or value % 128:
                raise ValueError(ck.message(api, name, "value", "a non-negative multiple of 128", value))
        self.group = group
        self.group_name = group.group_name
        self.rank, self.group_size = group.rank(), group.size()
        self.num_nvl_bytes, self.num_rdma_bytes = num_nvl_bytes, num_rdma_bytes
        self.low_latency_mode = low_latency_mode
        self.explicitly_destroy = explicitly_destroy
        # How long every collective of this buffer waits for the other ranks (the ops' timeout_s). Upstream V1
        # compiles in 100 s (LEGACY_NUM_CPU_TIMEOUT_SECS); V2's ElasticBuffer takes it as num_cpu_timeout_secs.
        self.num_cpu_timeout_secs = float(num_cpu_timeout_secs)
        self._combine_buffers: dict = {}  # (T_max, hidden, num_experts, device) -> the zero-copy combine buffer
        # Shrink mode: the rank mask and the alive groups of the low-latency calls (deep_ep/buffers/shrink.py).
        self._shrink = shrink.ShrinkState(group, "deep_ep.Buffer") if enable_shrink else None
        self._destroyed = False

    # ---- static helpers ----

    @staticmethod
    def set_num_sms(new_num_sms: int) -> None:
        if new_num_sms % 2:
            raise ValueError(
                ck.message("deep_ep.Buffer.set_num_sms", "new_num_sms", "value", "an even number", new_num_sms)
            )
        Buffer.num_sms = new_num_sms

    @staticmethod
    def is_sm90_compiled() -> bool:
        """True: upstream answers whether its SM90 kernels (FP8 dispatch, UE8M0 scales) were built, and DeepEP
        code gates those paths on it. Ours are the device-generic ep ops, which implement them everywhere."""
        return True

    @staticmethod
    def capture() -> EventOverlap:
        return EventOverlap(EventHandle())

    @staticmethod
    def get_dispatch_config(num_ranks: int) -> Config:
        Buffer._check_config_ranks(num_ranks)
        return Config(Buffer.num_sms, *_DISPATCH_CONFIGS[num_ranks])

    @staticmethod
    def get_combine_config(num_ranks: int) -> Config:
        Buffer._check_config_ranks(num_ranks)
        return Config(Buffer.num_sms, *_COMBINE_CONFIGS[num_ranks])

    @staticmethod
    def _check_config_ranks(num_ranks: int) -> None:
        if num_ranks not in _DISPATCH_CONFIGS:
            expected = f"one of {list(_DISPATCH_CONFIGS)} (DeepEP's tuned configurations)"
            raise ValueError(ck.message("deep_ep.Buffer", "num_ranks", "value", expected, num_ranks))

    @staticmethod
    def get_low_latency_rdma_size_hint(
        num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int, num_experts: int
    ) -> int:
        """DeepEP's formula (specs §6.3)."""
        t, h, e = num_max_dispatch_tokens_per_rank, hidden, num_experts
        msg_d = 16 + max(2 * h, h + 4 * h // 128)
        msg_c = 4 * h // 128 + 2 * h
        send = max(t * msg_d, e * t * msg_c)
        recv = max(e * t * msg_d, e * t * msg_c)
        sig = -(-4 * e // 128) * 128
        return ((2 * (send + recv + sig)) // 128 + 1) * 128

    # ---- lifecycle ----

    def destroy(self) -> None:
        if not self.explicitly_destroy:
            raise RuntimeError("deep_ep.Buffer.destroy: the buffer was built with explicitly_destroy=False")
        self._destroyed = True

    def get_comm_stream(self):
        return torch.cuda.current_stream() if torch.cuda.is_available() else None

    def _check_async(self, api: str, previous_event, async_finish: bool, allocate_on_comm_stream: bool) -> None:
        if self._destroyed:
            raise RuntimeError(f"deep_ep.Buffer.{api}: the buffer was destroyed")
        if allocate_on_comm_stream and not (previous_event is not None and async_finish):
            expected = "False unless previous_event is given and async_finish is True"
            raise ValueError(ck.message(f"deep_ep.Buffer.{api}", "allocate_on_comm_stream", "value", expected, "True"))

    # ---- normal mode ----

    def get_dispatch_layout(
        self,
        topk_idx: torch.Tensor,
        num_experts: int,
        previous_event=None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ):
        self._check_async("get_dispatch_layout", previous_event, async_finish, allocate_on_comm_stream)
        per_rank, per_node, per_expert, in_rank = ep_dispatch_layout(topk_idx, num_experts, self.group_size)
        return per_rank, (per_node if self.group_size > 8 else None), per_expert, in_rank, _event(async_finish)

    def dispatch(
        self,
        x,
        handle: tuple | None = None,
        num_tokens_per_rank=None,
        num_tokens_per_rdma_rank=None,
        is_token_in_rank=None,
        num_tokens_per_expert=None,
        topk_idx=None,
        topk_weights=None,
        expert_alignment: int = 1,
        num_worst_tokens: int = 0,
        config: Config | None = None,
        previous_event=None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ):
        """``(recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list, handle, event)``."""
        self._check_async("dispatch", previous_event, async_finish, allocate_on_comm_stream)
        data, scales = x if isinstance(x, tuple) else (x, None)
        if handle is not None:
            if topk_idx is not None or topk_weights is not None:
                raise ValueError(
                    "deep_ep.Buffer.dispatch: arguments 'topk_idx'/'topk_weights' value: expected None "
                    "with a cached handle, got tensors"
                )
            handle = self._op_handle("dispatch", handle)
            recv_x, recv_scales = ep_dispatch_cached(data, handle, scales, timeout_s=self.num_cpu_timeout_secs)
            return (recv_x, recv_scales) if scales is not None else recv_x, None, None, None, None, _event(async_finish)
        if (topk_idx is None) != (topk_weights is None):
            raise ValueError(
                "deep_ep.Buffer.dispatch: arguments 'topk_idx' and 'topk_weights' value: expected both or neither"
            )
        ck.check_arg(
            num_tokens_per_expert is not None,
            "deep_ep.Buffer.dispatch",
            "num_tokens_per_expert",
            "value",
            "the layout's num_tokens_per_expert (required without a cached handle, as DeepEP)",
            "None",
        )
        with_topk = topk_idx is not None
        if not with_topk:
            ck.check_arg(
                is_token_in_rank is not None,
                "deep_ep.Buffer.dispatch",
                "is_token_in_rank",
                "value",
                "the layout's is_token_in_rank (or topk_idx)",
                "None",
            )
            # Route by rank alone: one pseudo-expert per destination rank.
            ranks = torch.arange(self.group_size, device=is_token_in_rank.device)
            out = ep_dispatch(
                data,
                torch.where(is_token_in_rank, ranks, -1),
                num_experts=self.group_size,
                group=self.group_name,
                x_scales=scales,
                num_worst_tokens=num_worst_tokens,
                timeout_s=self.num_cpu_timeout_secs,
            )
            recv_x = (out.recv_x, out.recv_x_scales) if scales is not None else out.recv_x
            counts = [] if num_worst_tokens > 0 else self._recv_counts(num_tokens_per_expert, expert_alignment)
            handle = self._deep_ep_handle(is_token_in_rank, out, config)
            return recv_x, None, None, counts, handle, _event(async_finish)
        out = ep_dispatch(
            data,
            topk_idx,
            topk_weights,
            num_experts=num_tokens_per_expert.shape[0],
            group=self.group_name,
            x_scales=scales,
            expert_alignment=expert_alignment,
            num_worst_tokens=num_worst_tokens,
            timeout_s=self.num_cpu_timeout_secs,
        )
        recv_x = (out.recv_x, out.recv_x_scales) if scales is not None else out.recv_x
        counts = [] if num_worst_tokens > 0 else out.num_recv_tokens_per_expert.tolist()
        if is_token_in_rank is None:  # DeepEP requires it; the ops do not, and the handle carries it
            is_token_in_rank = ep_dispatch_layout(topk_idx, num_tokens_per_expert.shape[0], self.group_size)[3]
        handle = self._deep_ep_handle(is_token_in_rank, out, config)
        return recv_x, out.recv_topk_idx, out.recv_topk_weights, counts, handle, _event(async_finish)

    def _deep_ep_handle(self, is_token_in_rank: torch.Tensor, out, config: Config | None) -> _DeepEPHandle:
        """DeepEP's handle tuple for a dispatch (see ``_DeepEPHandle``). The prefix matrices need every rank's
        layout counts and token count: one small all-gather; across nodes (R > 8) the forwarding hop and the
        source metadata need every rank's ``is_token_in_rank``: a second one."""
        api, num_channels = "deep_ep.Buffer.dispatch", (config.num_sms if config is not None else Buffer.num_sms) // 2
        in_rank = is_token_in_rank.to(torch.bool)
        mine = torch.cat([in_rank.sum(0), torch.tensor([in_rank.shape[0]], device=in_rank.device)]).to(torch.int64)
        everyone = [torch.empty_like(mine) for _ in range(self.group_size)]
        work = dist.all_gather(everyone, mine, group=self.group, async_op=True)
        waits.wait(api, self.group, work, self.num_cpu_timeout_secs, "the handle's layout-count all-gather")
        everyone = torch.stack(everyone)
        sent, num_tokens = everyone[:, :-1], everyone[:, -1]
        if self.group_size <= 8:
            fields = _DeepEPHandle.intranode(self.rank, num_channels, in_rank, sent, num_tokens, out.recv_src_idx)
            return _DeepEPHandle(fields, out.handle)
        sizes = num_tokens.tolist()
        padded = torch.zeros(max(sizes), self.group_size, dtype=torch.uint8, device=in_rank.device)
        padded[: in_rank.shape[0]] = in_rank.to(torch.uint8)
        masks = [torch.empty_like(padded) for _ in range(self.group_size)]
        work = dist.all_gather(masks, padded, group=self.group, async_op=True)
        waits.wait(api, self.group, work, self.num_cpu_timeout_secs, "the handle's is_token_in_rank all-gather")
        masks = [m[:t].to(torch.bool) for m, t in zip(masks, sizes)]
        masks[self.rank] = in_rank
        fields = _DeepEPHandle.internode(self.rank, num_channels, masks, out.recv_src_idx.shape[0])
        return _DeepEPHandle(fields, out.handle)

    @staticmethod
    def _op_handle(api: str, handle) -> _OpHandle:
        """The ops' ``EPHandle`` inside DeepEP's handle tuple (a bare ``EPHandle`` passes through). A tuple
        without it (re-packed, or DeepEP's own) cannot be replayed: its fields model channels that do not exist."""
        if isinstance(handle, _DeepEPHandle):
            return handle.ep
        if isinstance(handle, _OpHandle):
            return handle
        got = type(handle).__name__
        if isinstance(handle, (tuple, list)):
            got += f" of length {len(handle)} without the .ep the dispatch's handle carries"
        expected = "the handle deep_ep.Buffer.dispatch returned (DeepEP's 6- or 10-tuple carrying .ep, or an EPHandle)"
        raise ValueError(ck.message(f"deep_ep.Buffer.{api}", "handle", "value", expected, got))

    def _recv_counts(self, num_tokens_per_expert: torch.Tensor, expert_alignment: int) -> list[int]:
        """DeepEP's ``num_recv_tokens_per_expert_list`` from the layouts alone (a dispatch without top-k has no
        per-slot routing): each local expert's count summed over the source ranks, rounded up to the alignment."""
        api = "deep_ep.Buffer.dispatch"
        ck.check_arg(
            not num_tokens_per_expert.shape[0] % self.group_size,
            api,
            "num_tokens_per_expert",
            "shape",
            lambda: f"[num_experts] with num_experts a multiple of {self.group_size} ranks",
            lambda: list(num_tokens_per_expert.shape),
        )
        ck.check_arg(not expert_alignment < 1, api, "expert_alignment", "value", ">= 1", expert_alignment)
        total = num_tokens_per_expert.to(torch.int64).clone()
        work = dist.all_reduce(total, group=self.group, async_op=True)
        waits.wait(
            "deep_ep.Buffer.dispatch", self.group, work, self.num_cpu_timeout_secs, "the per-expert count all-reduce"
        )
        mine = total.view(self.group_size, -1)[self.rank].tolist()
        return [-(-c // expert_alignment) * expert_alignment for c in mine]

    def combine(
        self,
        x: torch.Tensor,
        handle: tuple,
        topk_weights=None,
        bias=None,
        config: Config | None = None,
        previous_event=None,
        async_finish: bool = False,
        allocate_on_comm_stream: bool = False,
    ):
        """``(combined_x, combined_topk_weights, event)``: the unweighted sum of each token's returning copies."""
        self._check_async("combine", previous_event, async_finish, allocate_on_comm_stream)
        handle = self._op_handle("combine", handle)
        combined, weights = ep_combine(x, handle, topk_weights, bias, timeout_s=self.num_cpu_timeout_secs)
        return combined, weights, _event(async_finish)

    # ---- low-latency mode ----

    def _require_low_latency(self, api: str) -> None:
        if not self.low_latency_mode:
            raise ValueError(f"deep_ep.Buffer.{api}: the buffer was built with low_latency_mode=False")

    def _require_shrink(self, api: str) -> shrink.ShrinkState:
        if self._shrink is None:
            raise ValueError(f"deep_ep.Buffer.{api}: shrink mode is not enabled (Buffer(..., enable_shrink=True))")
        return self._shrink

    def low_latency_update_mask_buffer(self, rank_to_mask: int, mask: bool = False) -> None:
        """Mask (``mask=True``) or unmask a rank: masked ranks are skipped by the low-latency calls."""
        self._require_shrink("low_latency_update_mask_buffer").update(rank_to_mask, mask)

    def low_latency_query_mask_buffer(self, mask_status: torch.Tensor) -> None:
        """Writes each rank's mask (1 = masked) into ``mask_status`` (int32 ``[num_ranks]``)."""
        self._require_shrink("low_latency_query_mask_buffer").query(mask_status)

    def low_latency_clean_mask_buffer(self) -> None:
        self._require_shrink("low_latency_clean_mask_buffer").clean()

    def _alive(self):
        """Shrink mode: (alive ranks, their process group) after this call's liveness round; else None."""
        if self._shrink is None:
            return None
        alive = self._shrink.alive(self.num_cpu_timeout_secs)
        return alive, self._shrink.process_group(alive)

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank: int, hidden: int, num_experts: int) -> None:
        """Nothing to clean (no signal areas); a barrier, as upstream's (in shrink mode, of the ranks alive)."""
        shrunk = self._alive()
        group = shrunk[1] if shrunk else self.group
        work = dist.barrier(group=group, async_op=True)
        waits.wait("deep_ep.Buffer.clean_low_latency_buffer", group, work, self.num_cpu_timeout_secs, "the barrier")

    def low_latency_dispatch(
        self,
        x: torch.Tensor,
        topk_idx: torch.Tensor,
        num_max_dispatch_tokens_per_rank: int,
        num_experts: int,
        cumulative_local_expert_recv_stats=None,
        dispatch_wait_recv_cost_stats=None,
        use_fp8: bool = True,
        round_scale: bool = False,
        use_ue8m0: bool = False,
        async_finish: bool = False,
        return_recv_hook: bool = False,
    ):
        """``(recv_x, recv_count, handle, event, hook)``. Scales come row-major ``[L, R * T_max, H / 128]`` (DeepEP
        returns a token-stride-1 view of the same values). ``hook`` does nothing: the receive already happened."""
        self._require_low_latency("low_latency_dispatch")
        if async_finish and return_recv_hook:
            raise ValueError(
                "deep_ep.Buffer.low_latency_dispatch: arguments 'async_finish' and 'return_recv_hook' "
                "value: expected at most one of them True, got both"
            )
        shrunk = self._alive()
        if shrunk and len(shrunk[0]) < self.group_size:
            recv_x, count, handle = self._shrunk_dispatch(
                x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts, use_fp8, round_scale, use_ue8m0, *shrunk
            )
        else:
            recv_x, count, handle = ep_low_latency_dispatch(
                x,
                topk_idx,
                num_max_dispatch_tokens_per_rank,
                num_experts,
                group=self.group_name,
                use_fp8=use_fp8,
                round_scale=round_scale,
                use_ue8m0=use_ue8m0,
                timeout_s=self.num_cpu_timeout_secs,
            )
        # DeepEP's 5-tuple; low_latency_combine rebuilds the op's handle with this buffer's group.
        handle = _LowLatencyHandle(handle[:5], handle.backend_state)
        if cumulative_local_expert_recv_stats is not None:
            cumulative_local_expert_recv_stats += count.to(cumulative_local_expert_recv_stats.dtype)
        hook = (lambda: None) if return_recv_hook else None
        return recv_x, count, handle, _event(async_finish), hook

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
        out=None,
        combine_wait_recv_cost_stats=None,
    ):
        """``(combined_x, event, hook)``: ``sum_k w[t, k] * y_k(t)``. ``use_logfmt`` (DeepEP's lossy 10-bit
        transport) is accepted and the rows travel exactly; ``zero_copy=True`` combines the rows written into
        ``get_next_low_latency_combine_buffer(handle)`` (``x`` only gives the shape), as DeepEP."""
        self._require_low_latency("low_latency_combine")
        if use_logfmt and zero_copy:
            raise ValueError(
                "deep_ep.Buffer.low_latency_combine: arguments 'use_logfmt' and 'zero_copy' value: "
                "expected at most one of them True, got both"
            )
        handle = self._ll_handle(handle)
        if zero_copy:
            # DeepEP's kernel skips copying x: the expert outputs are already in the combine buffer.
            source = self._combine_buffers.get(self._combine_buffer_key(handle))
            api = "deep_ep.Buffer.low_latency_combine"
            ck.check_arg(
                source is not None,
                api,
                "zero_copy",
                "value",
                "True only after writing the outputs into get_next_low_latency_combine_buffer(handle)",
                "True with no such buffer for this handle's shape",
            )
            ck.check_arg(
                tuple(x.shape) == tuple(source.shape),
                api,
                "x",
                "shape",
                lambda: f"{list(source.shape)} (the combine buffer's)",
                lambda: list(x.shape),
            )
            x = source
        shrunk = self._alive()
        if shrunk and len(shrunk[0]) < self.group_size:
            alive, group = shrunk
            t_max, local = handle.num_max_dispatch_tokens_per_rank, handle.num_experts // self.group_size
            x, src_info, layout = shrink.narrow_rows(x, handle.src_info, handle.layout_range, alive, t_max)
            handle = EPLowLatencyHandle(
                src_info, layout, t_max, handle.hidden, len(alive) * local, group.group_name, None
            )
            topk_idx = shrink.renumber(topk_idx, alive, self.group_size, local)
        combined = ep_low_latency_combine(x, topk_idx, topk_weights, handle, timeout_s=self.num_cpu_timeout_secs)
        if out is not None:
            out.copy_(combined)
            combined = out
        hook = (lambda: None) if return_recv_hook else None
        return combined, _event(async_finish), hook

    def _shrunk_dispatch(self, x, topk_idx, t_max, num_experts, use_fp8, round_scale, use_ue8m0, alive, group):
        """The dispatch over the alive ranks' group, laid out for all ranks (masked sources empty)."""
        local = num_experts // self.group_size
        recv_x, count, handle = ep_low_latency_dispatch(
            x,
            shrink.renumber(topk_idx, alive, self.group_size, local),
            t_max,
            len(alive) * local,
            group=group.group_name,
            use_fp8=use_fp8,
            round_scale=round_scale,
            use_ue8m0=use_ue8m0,
            timeout_s=self.num_cpu_timeout_secs,
        )
        size = self.group_size
        if isinstance(recv_x, tuple):
            recv_x = tuple(shrink.widen(size, t_max, t, 0) for t in recv_x)
        else:
            recv_x = shrink.widen(size, t_max, recv_x, 0)
        full = EPLowLatencyHandle(
            shrink.widen(size, t_max, handle.src_info, -1),
            shrink.widen_layout(alive, size, handle.layout_range),
            t_max,
            handle.hidden,
            num_experts,
            self.group_name,
            None,
        )
        return recv_x, count, full

    def _ll_handle(self, handle) -> EPLowLatencyHandle:
        """The op's handle from DeepEP's ``(packed_recv_src_info, packed_recv_layout_range,
        num_max_dispatch_tokens_per_rank, hidden, num_experts)`` (an ``EPLowLatencyHandle`` passes through)."""
        if isinstance(handle, EPLowLatencyHandle):
            return handle
        if not isinstance(handle, (tuple, list)) or len(handle) != 5:
            length = len(handle) if isinstance(handle, (tuple, list)) else "-"
            got = f"{type(handle).__name__} of length {length}"
            raise ValueError(
                ck.message("deep_ep.Buffer", "handle", "value", "the 5-tuple low_latency_dispatch returned", got)
            )
        return EPLowLatencyHandle(*handle, self.group_name, getattr(handle, "backend_state", None))

    def get_next_low_latency_combine_buffer(self, handle) -> torch.Tensor:
        """The ``[L, R * T_max, H]`` BF16 buffer to write expert outputs into for ``low_latency_combine(...,
        zero_copy=True)``, which combines it instead of its ``x``. One persistent tensor per buffer and shape
        (DeepEP's is a view of its registered RDMA buffer, alternating between two halves; ours has no halves)."""
        handle = self._ll_handle(handle)
        key = self._combine_buffer_key(handle)
        if key not in self._combine_buffers:
            local = handle.num_experts // self.group_size
            rows = self.group_size * handle.num_max_dispatch_tokens_per_rank
            self._combine_buffers[key] = torch.zeros(local, rows, handle.hidden, dtype=torch.bfloat16, device=key[3])
        return self._combine_buffers[key]

    @staticmethod
    def _combine_buffer_key(handle: EPLowLatencyHandle):
        return handle.num_max_dispatch_tokens_per_rank, handle.hidden, handle.num_experts, handle.src_info.device
