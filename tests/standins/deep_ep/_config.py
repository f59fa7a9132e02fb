"""``deep_ep.Config`` and the V1 buffer-size arithmetic (``csrc/legacy/config.hpp``).

``Config`` is a pybind11 class upstream with a constructor and the two hint methods only: its fields are not exposed
to Python (no ``def_readwrite``), so ``config.num_sms`` raises ``AttributeError`` there and here.
"""

from __future__ import annotations

from . import _standin as S
from ._standin import CONFIG_HPP, check

NUM_MAX_NVL_PEERS = 8  # LEGACY_NUM_MAX_NVL_PEERS (csrc/kernels/legacy/compiled.cuh:5)
NUM_MAX_RDMA_PEERS = 20  # LEGACY_NUM_MAX_RDMA_PEERS
NUM_MAX_LOCAL_EXPERTS = 1024  # LEGACY_NUM_MAX_LOCAL_EXPERTS
NUM_WORKSPACE_BYTES = 32 * 1024 * 1024  # LEGACY_NUM_WORKSPACE_BYTES
NUM_BUFFER_ALIGNMENT_BYTES = 128  # LEGACY_NUM_BUFFER_ALIGNMENT_BYTES
SOURCE_META_BYTES = 8  # sizeof(internode::SourceMeta) (csrc/kernels/legacy/internode.cu:22-45)
TOPK_IDX_BYTES = 8  # sizeof(topk_idx_t), EP_NUM_TOPK_IDX_BITS = 64 (the default build)
INT_MAX = 2**31 - 1


def ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


def align_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


def _int_arg(api: str, name: str, value, unsigned: bool = False) -> int:
    # pybind11's int caster: Python ints (and bools) only; size_t rejects negative values.
    if not isinstance(value, int) or (unsigned and value < 0):
        S.incompatible(api, f"{name}={value!r} is not convertible to {'size_t' if unsigned else 'int'}")
    return int(value)


class Config:
    """``deep_ep.Config(num_sms=20, num_max_nvl_chunked_send_tokens=6, num_max_nvl_chunked_recv_tokens=256,
    num_max_rdma_chunked_send_tokens=6, num_max_rdma_chunked_recv_tokens=256)`` (config.hpp:31-51, bound at
    buffer.hpp:1752-1760)."""

    __slots__ = ("_num_sms", "_nvl_send", "_nvl_recv", "_rdma_send", "_rdma_recv")

    @S.logged("Config")
    def __init__(
        self,
        num_sms: int = 20,
        num_max_nvl_chunked_send_tokens: int = 6,
        num_max_nvl_chunked_recv_tokens: int = 256,
        num_max_rdma_chunked_send_tokens: int = 6,
        num_max_rdma_chunked_recv_tokens: int = 256,
    ) -> None:
        api = "Config.__init__"
        num_sms = _int_arg(api, "num_sms", num_sms)
        nvl_send = _int_arg(api, "num_max_nvl_chunked_send_tokens", num_max_nvl_chunked_send_tokens)
        nvl_recv = _int_arg(api, "num_max_nvl_chunked_recv_tokens", num_max_nvl_chunked_recv_tokens)
        rdma_send = _int_arg(api, "num_max_rdma_chunked_send_tokens", num_max_rdma_chunked_send_tokens)
        rdma_recv = _int_arg(api, "num_max_rdma_chunked_recv_tokens", num_max_rdma_chunked_recv_tokens)
        check(num_sms >= 0, f"{CONFIG_HPP}:41", "num_sms >= 0")
        check(
            nvl_send > 0 and nvl_recv > 0,
            f"{CONFIG_HPP}:42",
            "num_max_nvl_chunked_send_tokens > 0 and num_max_nvl_chunked_recv_tokens > 0",
        )
        check(
            nvl_send < nvl_recv,
            f"{CONFIG_HPP}:43",
            "num_max_nvl_chunked_send_tokens < num_max_nvl_chunked_recv_tokens",
        )
        check(
            rdma_send > 0 and rdma_recv > 0,
            f"{CONFIG_HPP}:44",
            "num_max_rdma_chunked_send_tokens > 0 and num_max_rdma_chunked_recv_tokens > 0",
        )
        # Ceil up RDMA buffer size (config.hpp:47)
        rdma_recv = align_up(rdma_recv, rdma_send)
        check(
            rdma_send < rdma_recv,
            f"{CONFIG_HPP}:48",
            "num_max_rdma_chunked_send_tokens < num_max_rdma_chunked_recv_tokens",
        )
        # C++ integer division (both operands positive here)
        check(
            rdma_send <= rdma_recv // 2,
            f"{CONFIG_HPP}:50",
            "num_max_rdma_chunked_send_tokens <= num_max_rdma_chunked_recv_tokens / 2",
        )
        self._num_sms, self._nvl_send, self._nvl_recv = num_sms, nvl_send, nvl_recv
        self._rdma_send, self._rdma_recv = rdma_send, rdma_recv

    def __repr__(self) -> str:
        return f"<deep_ep._C.Config object (stand-in) at {hex(id(self))}>"

    @S.logged("Config.get_nvl_buffer_size_hint")
    def get_nvl_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        """config.hpp:53-73."""
        hidden_bytes = _int_arg("get_nvl_buffer_size_hint", "hidden_bytes", hidden_bytes, unsigned=True)
        num_ranks = _int_arg("get_nvl_buffer_size_hint", "num_ranks", num_ranks)
        k_max_topk, k_max_scales = 128, 128
        check(
            num_ranks < NUM_MAX_NVL_PEERS or num_ranks % NUM_MAX_NVL_PEERS == 0,
            f"{CONFIG_HPP}:58",
            "num_ranks < LEGACY_NUM_MAX_NVL_PEERS or num_ranks % LEGACY_NUM_MAX_NVL_PEERS == 0",
        )
        check(
            num_ranks <= NUM_MAX_NVL_PEERS or self._num_sms % 2 == 0,
            f"{CONFIG_HPP}:59",
            "num_ranks <= LEGACY_NUM_MAX_NVL_PEERS or num_sms % 2 == 0",
        )
        num_rdma_ranks = max(num_ranks // NUM_MAX_NVL_PEERS, 1)
        num_nvl_ranks = min(num_ranks, NUM_MAX_NVL_PEERS)
        num_channels = self._num_sms // 2
        slots = num_channels * num_nvl_ranks * self._nvl_recv
        num_bytes = num_channels * num_nvl_ranks * (2 * num_rdma_ranks + 3) * 4
        num_bytes += slots * hidden_bytes
        num_bytes += slots * SOURCE_META_BYTES
        num_bytes += slots * k_max_topk * TOPK_IDX_BYTES
        num_bytes += slots * k_max_topk * 4
        num_bytes += slots * k_max_scales * 4
        return ((num_bytes + 127) // 128) * 128

    @S.logged("Config.get_rdma_buffer_size_hint")
    def get_rdma_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        """config.hpp:75-99 (0 when ``num_ranks <= 8``)."""
        hidden_bytes = _int_arg("get_rdma_buffer_size_hint", "hidden_bytes", hidden_bytes)
        num_ranks = _int_arg("get_rdma_buffer_size_hint", "num_ranks", num_ranks)
        if num_ranks <= NUM_MAX_NVL_PEERS:
            return 0
        k_max_topk, k_max_scales = 128, 128
        check(num_ranks % NUM_MAX_NVL_PEERS == 0, f"{CONFIG_HPP}:84", "num_ranks % LEGACY_NUM_MAX_NVL_PEERS == 0")
        check(self._num_sms % 2 == 0, f"{CONFIG_HPP}:85", "num_sms % 2 == 0")
        num_rdma_ranks = num_ranks // NUM_MAX_NVL_PEERS
        num_channels = self._num_sms // 2
        slots = num_channels * num_rdma_ranks * self._rdma_recv
        num_bytes = num_channels * num_rdma_ranks * (NUM_MAX_NVL_PEERS * 2 + 2) * 2 * 4
        num_bytes += slots * hidden_bytes * 2
        num_bytes += slots * SOURCE_META_BYTES * 2
        num_bytes += slots * k_max_topk * TOPK_IDX_BYTES * 2
        num_bytes += slots * k_max_topk * 4 * 2
        num_bytes += slots * k_max_scales * 4 * 2
        num_bytes += slots * 16 * 2
        return ((num_bytes + 127) // 128) * 128


class LowLatencyLayout:
    """config.hpp:122-183: the two halves (send / receive / signal areas) of the low-latency RDMA buffer."""

    def __init__(self, num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int, num_experts: int):
        num_scales = int(hidden / 128) if hidden >= 0 else -((-hidden) // 128)  # C++ truncation
        check(num_scales * 4 <= hidden, f"{CONFIG_HPP}:142", "num_scales * sizeof(float) <= hidden")
        self.num_bytes_per_dispatch_msg = 16 + max(hidden * 2, hidden + num_scales * 4)
        self.num_bytes_per_combine_msg = num_scales * 4 + hidden * 2
        t = num_max_dispatch_tokens_per_rank
        send = max(t * self.num_bytes_per_dispatch_msg, num_experts * t * self.num_bytes_per_combine_msg)
        check(send % 16 == 0, f"{CONFIG_HPP}:150", "send_buffer_bytes % sizeof(int4) == 0")
        recv = max(num_experts * t * self.num_bytes_per_dispatch_msg, num_experts * t * self.num_bytes_per_combine_msg)
        check(recv % 16 == 0, f"{CONFIG_HPP}:158", "recv_buffer_bytes % sizeof(int4) == 0")
        signaling = num_experts * 4
        signaling_aligned = align_up(signaling, 128)
        self.send_buffer_bytes = send
        self.recv_buffer_bytes = recv
        self.signaling_buffer_bytes = signaling
        self.signaling_buffer_bytes_aligned = signaling_aligned
        self.total_bytes = 2 * send + 2 * recv + 2 * signaling_aligned
        # buffers[i].clean_meta(): (offset of the signal area of half i, number of ints to clean)
        self.clean_meta = [(signaling_aligned * i, signaling // 4) for i in range(2)]


def get_low_latency_rdma_size_hint(
    num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int, num_experts: int
) -> int:
    """config.hpp:185-188: the layout's total bytes, plus one alignment block, rounded down to 128."""
    api = "get_low_latency_rdma_size_hint"
    t = _int_arg(api, "num_max_dispatch_tokens_per_rank", num_max_dispatch_tokens_per_rank)
    h = _int_arg(api, "hidden", hidden)
    r = _int_arg(api, "num_ranks", num_ranks)
    e = _int_arg(api, "num_experts", num_experts)
    num_bytes = LowLatencyLayout(t, h, r, e).total_bytes
    return ((num_bytes + NUM_BUFFER_ALIGNMENT_BYTES) // NUM_BUFFER_ALIGNMENT_BYTES) * NUM_BUFFER_ALIGNMENT_BYTES
