"""DeepEP 2.5.0's ``PPBuffer`` (specs/upstream_2609.md §9.2; ``deep_ep/buffers/pp.py`` of the split): pipeline
send/recv between ring neighbours, V2's ``ElasticBuffer.pp_*`` as its own class.

``PPBuffer(group, num_max_tensor_bytes, num_max_inflight_tensors, sl_idx=None, num_gpu_timeout_secs=100,
explicitly_destroy=False)`` with ``send(x, dst_rank_idx, num_sms=None)`` (returns at once; at most
``num_max_inflight_tensors`` in flight per peer, the oldest waited for first) and ``recv(x, src_rank_idx,
num_sms=None)`` (the next tensor that peer sent, into ``x``); peers are the previous and next rank of the group.
"""

from __future__ import annotations

import torch

from torch_ascend_moe.deep_ep.buffers.elastic import ElasticBuffer


class PPBuffer:
    def __init__(
        self,
        group,
        num_max_tensor_bytes: int,
        num_max_inflight_tensors: int,
        sl_idx: int | None = None,
        num_gpu_timeout_secs: int = 100,
        explicitly_destroy: bool = False,
    ) -> None:
        self._buffer = ElasticBuffer(
            group,
            num_bytes=ElasticBuffer.get_pp_buffer_size_hint(num_max_tensor_bytes, num_max_inflight_tensors),
            sl_idx=3 if sl_idx is None else sl_idx,
            num_gpu_timeout_secs=num_gpu_timeout_secs,
            explicitly_destroy=explicitly_destroy,
        )
        self._buffer.pp_set_config(num_max_tensor_bytes, num_max_inflight_tensors)
        self.group = group
        self.num_max_tensor_bytes, self.num_max_inflight_tensors = num_max_tensor_bytes, num_max_inflight_tensors

    def send(self, x: torch.Tensor, dst_rank_idx: int, num_sms: int | None = None) -> None:
        self._buffer.pp_send(x, dst_rank_idx, num_sms or 0)

    def recv(self, x: torch.Tensor, src_rank_idx: int, num_sms: int | None = None) -> None:
        self._buffer.pp_recv(x, src_rank_idx, num_sms or 0)

    def destroy(self) -> None:
        self._buffer.destroy()
