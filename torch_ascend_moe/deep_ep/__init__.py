"""DeepEP(-Ascend)-compatible API over the ``ascend_moe`` ep ops: code written for ``import deep_ep`` runs unchanged
with ``import torch_ascend_moe.deep_ep as deep_ep``. Laid out as upstream: ``buffers.legacy`` (V1's ``Buffer``,
normal and low-latency modes, and ``Config``), ``buffers.elastic`` (V2's ``ElasticBuffer`` / ``EPHandle``,
DeepEP-Ascend's API), ``buffers.ep`` / ``buffers.pp`` (DeepEP 2.5.0's ``EPBuffer`` / ``PPBuffer``), ``utils``
(events, environment, references, test helpers). What differs from upstream, and why: each module's docstring.
"""

from __future__ import annotations

import torch

from torch_ascend_moe.deep_ep import utils  # noqa: F401  (deep_ep.utils, as upstream)
from torch_ascend_moe.deep_ep.buffers.elastic import ElasticBuffer, EPHandle
from torch_ascend_moe.deep_ep.buffers.ep import EPBuffer
from torch_ascend_moe.deep_ep.buffers.legacy import Buffer, Config
from torch_ascend_moe.deep_ep.buffers.pp import PPBuffer
from torch_ascend_moe.deep_ep.utils.envs import get_logical_domain_size, get_physical_domain_size
from torch_ascend_moe.deep_ep.utils.event import EventHandle, EventOverlap
from torch_ascend_moe.ops.ep import EPLowLatencyHandle

__version__ = "2.1.0+ascend_moe"
topk_idx_t = torch.int64


__all__ = [
    "Buffer",
    "Config",
    "EPBuffer",
    "EPHandle",
    "EPLowLatencyHandle",
    "ElasticBuffer",
    "EventHandle",
    "EventOverlap",
    "PPBuffer",
    "get_logical_domain_size",
    "get_physical_domain_size",
    "topk_idx_t",
]
