"""CPU stand-in for ``deep_ep`` (deepseek-ai/DeepEP): behaves like the real library's V1 API (``deep_ep.Buffer``) and
V2 API (``deep_ep.ElasticBuffer`` / ``EPHandle``) at its Python boundary, on CPU tensors across the ranks of a gloo
process group (one process per rank), so code that *calls* DeepEP can be tested without a GPU. Tests put
``tests/standins`` on ``sys.path`` and ``import deep_ep`` (``tests.upstream.standin.installed("deep_ep", **config)``);
``deep_ep._standin.configure(...)`` is a fresh library load (see ``_standin``).

Written from
------------
deepseek-ai/DeepEP @ ``dd758caf451848bd150e1046af3d0a73e5fff38d`` (2026-07-14, ``__version__ = '2.1.0'``):
``deep_ep/__init__.py``, ``deep_ep/buffers/legacy.py`` (the Python ``Buffer``: signatures, defaults, asserts, config
tables), ``deep_ep/utils/{event,envs}.py``, ``csrc/legacy/{buffer,config}.hpp`` (host checks, allocation, buffer-size
checks, the low-latency buffer layout), ``csrc/kernels/legacy/{layout,intranode,internode_ll}.cu``,
``csrc/kernels/legacy/{launch,utils,compiled}.cuh``, ``csrc/utils/event.hpp``,
``deep_ep/include/deep_ep/common/exception.cuh`` and ``tests/legacy/test_{intranode,low_latency}.py``; for V2
``deep_ep/buffers/elastic.py``, ``deep_ep/utils/{envs,semantic,refs}.py``, ``csrc/elastic/{buffer,utils}.hpp``,
``csrc/kernels/elastic/{dispatch,combine}.hpp``, ``csrc/kernels/backend/nccl.cu``,
``deep_ep/include/deep_ep/common/{layout,compiled,ptx}.cuh``,
``deep_ep/include/deep_ep/impls/{dispatch,dispatch_copy_epilogue,combine,combine_reduce_epilogue,combine_utils}.cuh``
and ``tests/elastic/test_ep.py``; the facts are summarized in ``shared/specs/deepep_api.md`` §2-§6, §2.4, §4.5,
§4.6, §5.4, §8.4, §9.4. File:line references in messages point into that snapshot.

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
* V2 (``_elastic*.py``): ``ElasticBuffer(group, num_bytes=None, num_cpu_bytes=0, num_max_tokens_per_rank=0,
  hidden=0, num_topk=0, use_fp8_dispatch=False, deterministic=False, allow_hybrid_mode=True,
  allow_multiple_reduction=True, prefer_overlap_with_compute=True, sl_idx=3, num_allocated_qps=0,
  num_cpu_timeout_secs=300, num_gpu_timeout_secs=100, explicitly_destroy=False)``: collective construction (an
  ``all_gather_object`` standing for NCCL's symmetric-window registration, ranks asking for different windows are a
  ``Panic``, then a barrier as upstream's ``group.barrier()``), upstream's attributes (``group``, ``rank_idx``,
  ``num_ranks``, ``num_bytes``, ``num_max_tokens_per_rank``, ``deterministic``, ``allow_hybrid_mode``,
  ``allow_multiple_reduction``, ``prefer_overlap_with_compute``, ``num_allocated_qps`` (0 -> 17 direct, 129 hybrid:
  no fast RDMA atomics without ``ibstat``), ``explicitly_destroy``, ``runtime``, ``num_scaleout_ranks`` /
  ``num_scaleup_ranks`` / ``scaleout_rank_idx`` / ``scaleup_rank_idx``, ``num_rdma_ranks`` / ``num_nvlink_ranks``),
  ``get_buffer_size_hint`` and the constructor's sizing (``calculate_buffer_size`` and the dispatch / combine size
  functions of buffer.hpp, hybrid branch included), the engram / PP / AGRS size hints, ``destroy``, ``barrier``,
  ``capture``, ``get_theoretical_num_sms`` (upstream's bandwidth model over ``configure(nvlink_gbs=, rdma_gbs=)``) /
  ``get_theoretical_num_qps``; ``get_physical_domain_size(group)`` / ``get_logical_domain_size(group,
  allow_hybrid_mode=True)``: one node of ``R`` NVLink peers unless ``configure(num_nvlink_ranks=)``.
* V2 ``dispatch`` / cached ``dispatch`` / ``combine`` in direct mode, expanded layout included: receive order grouped
  by source rank, arrival order inside a group (a seeded shuffle of the senders' slot assignment,
  ``configure(elastic_shuffle_seed=)``; ``deterministic=True`` runs upstream's ``EPHandle.deterministic_sort``); every
  ``EPHandle`` field as the kernels write it (``dst_buffer_slot_idx`` at the highest lane per destination rank,
  ``recv_src_metadata = (src_rank * num_max + t, src_rank * K + highest local lane, expanded rows | unwritten)``,
  inclusive ``psum_num_recv_tokens_per_scaleup_rank``, aligned ``psum_num_recv_tokens_per_expert`` / list, unaligned
  counts); FP8 ``(x, sf)`` with any number of 4-byte SF packs read through their strides, TMA-aligned column-major
  ``recv_sf``; weights copied unmasked; ``do_cpu_sync=False`` (worst-case rows, the count only in
  ``psum_num_recv_tokens_per_scaleup_rank[-1]``, the rest uninitialized); ``cumulative_local_expert_recv_stats``;
  ``do_handle_copy``; cached dispatch places rows with the handle's ``dst_buffer_slot_idx`` / psum (a mutated handle
  shows); combine routes rows with ``recv_src_metadata`` only, sums ``fp32(0) + bias_0 + bias_1`` then each
  destination rank's row at its highest lane in lane order, one bf16 rounding (bitwise ``refs.combine``), weights from
  the slot's owner. ``configure(platform="ascend")``: the DeepEP-Ascend V2 port's refusals (``_elastic``).
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
  ``get_comm_stream``, ``get_local_buffer_tensor``; V2 hybrid kernels (more than one scale-out rank, only with
  ``configure(num_nvlink_ranks=)``) and the experimental Engram / PP / AGRS methods.
  Streams and events are no-ops; ``async_finish`` returns an event whose wait does nothing; wait-cost statistics
  add 0. ``allow_nvlink_for_low_latency_mode`` changes nothing; low-latency timeouts auto-mask only in shrink mode.
* V2 divergences: ``ElasticBuffer(None)`` raises an exception that is both upstream's ``AttributeError`` (from
  ``group.rank()``) and a ``NotImplementedError``; ``get_comm_stream()`` returns ``None``; ``nccl_comm_handle`` is a
  placeholder; ``check_nvlink_connections`` is skipped. ``recv_src_metadata[:, 2:]`` of a non-expanded dispatch is
  never written upstream (``torch::empty``) and reads ``0x7F7F7F7F`` here. A receive slot (dispatch) or combine slot
  nobody wrote in this call is a ``Panic`` (upstream reads stale buffer contents), so is a slot two different rows
  were written to (upstream: timing); a cached expanded dispatch skips negative slots as upstream does. The
  expanded rows of one expert are assigned in a seeded shuffled order of the received rows (upstream: the
  ``atomicAdd`` order of its warps). A non-cached ``do_cpu_sync=True`` dispatch while a graph is captured (CUDA / NPU
  capture or the tests' ``capture_emulation.capturing_everywhere()``) raises upstream's "Dispatch CPU wait" timeout at
  once instead of after ``num_cpu_timeout_secs``. Device-side traps named in messages: dispatch_copy_epilogue.cuh:74
  / :107, combine.cuh:69; an expert id ``>= num_experts``, a slot outside the sender's region, rows past a tensor's
  end are ``Panic`` too. The Ascend flavour's refusal words are the stand-in's (the port's source is not readable).
* Call log: ``deep_ep._standin.CALLS`` (``reset()`` clears it).
"""

from __future__ import annotations

import torch

from . import _standin as _standin
from ._buffer import Buffer
from ._config import Config
from ._elastic import ElasticBuffer, EPHandle, get_logical_domain_size, get_physical_domain_size
from ._event import EventHandle, EventOverlap

__version__ = "2.1.0"

#: ``deep_ep.topk_idx_t``: the build's top-k index type (``EP_NUM_TOPK_IDX_BITS = 64`` by default).
topk_idx_t = torch.int64


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
