"""CPU stand-in for ``deep_ep`` (deepseek-ai/DeepEP): behaves like the real library's V1 API (``deep_ep.Buffer``) at
its Python boundary, on CPU tensors across the ranks of a gloo process group (one process per rank), so code that
*calls* DeepEP can be tested without a GPU. Tests put ``tests/standins`` on ``sys.path`` and ``import deep_ep``
(``tests.upstream.standin.installed("deep_ep", **config)``); ``deep_ep._standin.configure(...)`` is a fresh library
load (see ``_standin``).

Written from
------------
deepseek-ai/DeepEP @ ``dd758caf451848bd150e1046af3d0a73e5fff38d`` (2026-07-14, ``__version__ = '2.1.0'``):
``deep_ep/__init__.py``, ``deep_ep/buffers/legacy.py`` (the Python ``Buffer``: signatures, defaults, asserts, config
tables), ``deep_ep/utils/{event,envs}.py``, ``csrc/legacy/{buffer,config}.hpp`` (host checks, allocation, buffer-size
checks, the low-latency buffer layout), ``csrc/kernels/legacy/{layout,intranode,internode_ll}.cu``,
``csrc/kernels/legacy/{launch,utils,compiled}.cuh``, ``csrc/utils/event.hpp``,
``deep_ep/include/deep_ep/common/exception.cuh`` and ``tests/legacy/test_{intranode,low_latency}.py``; the facts
are summarized in ``shared/specs/deepep_api.md`` §2-§6. File:line references in messages point into that snapshot.

What it imitates
----------------
* ``Buffer(group, num_nvl_bytes=0, num_rdma_bytes=0, low_latency_mode=False, num_qps_per_rank=24,
  allow_nvlink_for_low_latency_mode=True, allow_mnnvl=False, explicitly_destroy=False, enable_shrink=False,
  comm=None)``: collective construction (two or three ``all_gather_object`` calls as upstream, the NVSHMEM environment
  variables), the constructor's host checks, ``num_sms`` / ``set_num_sms``, ``destroy`` (collective), ``capture``,
  ``is_sm90_compiled`` (True), ``get_dispatch_config`` / ``get_combine_config`` (upstream's tables), ``Config`` with
  ``get_nvl_buffer_size_hint`` / ``get_rdma_buffer_size_hint``, ``get_low_latency_rdma_size_hint``; ``EventHandle``
  / ``EventOverlap`` (no-op events, upstream's Python class).
* ``get_dispatch_layout`` (``layout.cu``: int32 truncation of expert ids, ids ``>= num_experts`` ignored,
  ``num_tokens_per_rdma_rank`` None intranode).
* Intranode (2, 4, 8 ranks) ``dispatch`` / cached ``dispatch`` / ``combine`` with every entry of the 6-tuple handle
  computed as the kernels do: ``C = config.num_sms // 2`` channels of ``ceil(T / C)`` tokens; ``channel_prefix_matrix
  [R, C]`` = inclusive prefix over channels of tokens sent to each rank; ``recv_channel_prefix_matrix[s, c]`` = the
  start offset (exclusive prefix) of channel ``c`` inside source ``s``'s rows; ``rank_prefix_matrix[:, rank]`` =
  inclusive prefix over sources of tokens received; ``send_head[t, r]`` = the token's running index in its channel's
  queue toward ``r``, ``-1`` if not sent; ``recv_src_idx`` = source token index. Receive order: source-rank-major,
  ascending source token. ``num_worst_tokens``, FP8 ``(x, scales)`` with float32/int32 scales read through their
  strides, ``expert_alignment``, ``recv_topk_weights`` zeroed at non-local slots, the buffer-size host checks.
  Combine routes every returning row with the handle (the sender side reads ``rank_prefix_matrix[:, rank]`` and
  ``recv_channel_prefix_matrix``; the receiver side reads ``send_head``) and sums biases first, then ranks in ascending
  order, in FP32 with one bf16 rounding; weights are summed the same way. Like upstream's ``cached_notify_combine``, a
  combine rewrites the ``-1`` entries of the handle's ``send_head`` **in place** to ``-(next sent head) - 1`` (or
  ``-(1 << 25) - 1``).
* Low-latency ``low_latency_dispatch`` / ``low_latency_combine`` / ``clean_low_latency_buffer`` /
  ``get_next_low_latency_combine_buffer`` (``zero_copy``), the receive hook (outputs are filled only when the hook
  runs; ``recv_count`` reads 0 before), FP8 cast exactly as ``internode_ll.cu`` (``amax`` floor 1e-4,
  ``scale_inv = amax * fp32(1/448)``, power-of-two ``round_scale``, UE8M0 packing 4 exponents per int32, scales a
  transposed view), the non-deterministic receive order as a seeded shuffle (``configure(ll_shuffle_seed=...)``; the
  sender shuffles the rows of each expert, the receiver the order of source segments) with ``packed_recv_src_info``
  and ``packed_recv_layout_range = (begin << 32) | count`` consistent with it, combine weighted in slot order with an
  FP32 fused multiply-add (nvcc contracts ``accum += x * w``) and one bf16 rounding; shrink-mode mask buffer
  (``enable_shrink``) honoured by the low-latency kernels.
* Host checks: ``RuntimeError("DeepEP stand-in: Assertion exception (<file>:<line>): <condition>")`` in upstream's
  order (upstream raises ``RuntimeError("Assertion exception (<file>:<line>): <condition>")``); the Python asserts
  of ``legacy.py`` raise ``AssertionError`` with upstream's message. What the device would trap on, hang on, or turn
  into garbage raises ``_standin.Panic`` (inconsistent handles, counts that disagree with ``is_token_in_rank``, rows
  out of bounds, ranks that disagree on shapes/configs, ``num_qps_per_rank < num_local_experts`` in low-latency mode,
  a low-latency combine slot nobody wrote). Uninitialized outputs (rows past the real count with
  ``num_worst_tokens``, unused low-latency rows, ``recv_src_idx`` padding) hold NaN / 0x7f... patterns, never zeros.

Divergences / simplifications (also in the report of the session that wrote it)
------------------------------------------------------------------------------
* ``rank_prefix_matrix`` columns other than the own rank hold ``0x7F7F7F7F``: upstream only fills column ``rank``
  (``notify_dispatch`` writes ``[src][dst]`` into the destination's buffer) and the rest is whatever the NVLink
  buffer's first ``R*R`` ints held (zeros at first, queue counters after a combine), prefix-summed. Read column
  ``rank`` only, as upstream's kernels and tests do.
* ``strict_handle`` (default on): a combine whose ``recv_src_idx`` does not match the rows ``send_head`` selects
  raises ``StrictHandleError`` (a ``Panic``); upstream never reads those values and would return the
  ``send_head``-routed result.
* Error text: upstream's ``EPException`` reads ``"Assertion exception (<path>:<line>): <cond>"`` with the build's
  absolute ``__FILE__``; the stand-in prefixes ``"DeepEP stand-in: "`` and uses repository-relative paths (match on
  ``"(csrc/legacy/buffer.hpp:457): x.dim() == 2 and x.is_contiguous()"``). Python asserts that carry no message
  upstream carry ``"DeepEP stand-in: deep_ep/buffers/legacy.py:<line>: assert <cond>"`` here.
* Collectives: each op is one all-to-all of Python objects on the group after all of the op's host checks (upstream
  runs a few checks, e.g. the buffer-size one at buffer.hpp:627, after its notify kernel); a check failing on one
  rank only leaves the others waiting until the group's timeout, as the real kernels would.
* Low-latency combine: a token slot no expert wrote this time is a ``Panic`` (upstream reads a stale receive slot);
  two different rows written to one slot are a ``Panic`` (upstream: whichever lands last). The FMA of the weighted
  sum is [inferred] from nvcc's default ``--fmad=true`` (no ``-use_fast_math`` / ``-fmad=false`` in setup.py).
* Ring-queue timing is not simulated: a ``send_head`` entry ``>=`` the rows its queue carries is a hang (Panic); out of
  order heads are a Panic only when the queue holds more rows than ``num_max_nvl_chunked_recv_tokens``; otherwise
  the slot ``h`` reads row ``h`` of its queue (a wrong but well-defined result).
* Not modelled (``NotImplementedError``): internode (more than 8 ranks) dispatch/combine, ``use_logfmt=True``,
  ``get_comm_stream``, ``get_local_buffer_tensor``, the V2 names (``ElasticBuffer``, ``EPHandle``,
  ``get_physical_domain_size``, ``get_logical_domain_size``: they exist so detection by name sees upstream 2.1.0).
  Streams and events are no-ops; ``async_finish`` returns an event whose wait does nothing; wait-cost statistics
  add 0. ``allow_nvlink_for_low_latency_mode`` changes nothing; low-latency timeouts auto-mask only in shrink mode.
* Call log: ``deep_ep._standin.CALLS`` (``reset()`` clears it).
"""

from __future__ import annotations

import torch

from . import _standin
from ._buffer import Buffer
from ._config import Config
from ._event import EventHandle, EventOverlap

__version__ = "2.1.0"

#: ``deep_ep.topk_idx_t``: the build's top-k index type (``EP_NUM_TOPK_IDX_BITS = 64`` by default).
topk_idx_t = torch.int64


class ElasticBuffer:
    """``deep_ep.ElasticBuffer`` (V2) exists upstream; the stand-in does not model it."""

    def __init__(self, *args, **kwargs):
        _standin.not_implemented("ElasticBuffer", "DeepEP V2 (elastic); use the V1 deep_ep.Buffer")


class EPHandle:
    """``deep_ep.EPHandle`` (V2) exists upstream; the stand-in does not model it."""

    def __init__(self, *args, **kwargs):
        _standin.not_implemented("EPHandle", "DeepEP V2 (elastic)")


def get_physical_domain_size(group):
    _standin.not_implemented("get_physical_domain_size", "DeepEP V2 (elastic)")


def get_logical_domain_size(group, allow_hybrid_mode: bool = True):
    _standin.not_implemented("get_logical_domain_size", "DeepEP V2 (elastic)")


__all__ = [
    "Buffer",
    "Config",
    "ElasticBuffer",
    "EPHandle",
    "EventHandle",
    "EventOverlap",
    "get_logical_domain_size",
    "get_physical_domain_size",
    "topk_idx_t",
]
