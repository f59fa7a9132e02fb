"""The C++ half of ``deep_ep.ElasticBuffer`` (``csrc/elastic/buffer.hpp`` ``class ElasticBuffer``, bound as
``deep_ep._C.ElasticBuffer``): its members and the host checks of ``dispatch`` / ``combine``; what the direct-mode
kernels then do is ``_elastic_kernels`` (``deep_ep/include/deep_ep/impls/{dispatch,dispatch_copy_epilogue,combine,
combine_reduce_epilogue,combine_utils}.cuh``), sizes and helpers ``_elastic_layout``.

Conventions are the V1 runtime's (``_runtime``): host checks in upstream's order and words
(``RuntimeError("DeepEP stand-in: Assertion exception (<file>:<line>): <condition>")``), then one all-to-all exchange
of Python objects on the group standing for the NVLink stores into the peers' receive buffers, then the results;
``Panic`` (after the exchange, on the rank that would observe it) for what a kernel would trap on, hang on or turn
into garbage; ``_standin.garbage`` (NaN / 0x7f...) for memory ``torch::empty`` leaves unwritten. ``is_cuda()`` parts
of the checks are skipped (CPU tensors stand for device tensors); the contiguity parts are kept.

The model of the direct (non-hybrid) kernels:

* dispatch, sender (``dispatch.cuh``): a token goes once to every rank one of its experts lives on; the slot it takes
  in rank ``r``'s receive region for this sender is the sender's running count toward ``r`` (an ``atomicAdd``, so the
  order among the sender's tokens is the arrival order: a seeded shuffle here, ``configure(elastic_shuffle_seed=)``).
  ``dst_buffer_slot_idx[t, k] = rank * num_max_tokens_per_rank + slot`` at the *highest* lane ``k`` of each
  destination rank (``ptx::deduplicate`` keeps the highest lane), ``-1`` elsewhere. A cached dispatch reuses those
  slots (``kReuseSlotIndices``): every lane with a slot ``>= 0`` stores the token there, toward the rank its
  ``handle.topk_idx`` names;
* dispatch, receiver (``dispatch_copy_epilogue.cuh``): row ``i`` is slot ``i - psum[s - 1]`` of source ``s``'s region,
  sources in order of ``psum_num_recv_tokens_per_scaleup_rank`` (the handle's in cached mode), so rows are grouped by
  source rank and in slot order inside a group. ``recv_src_metadata[i] = (src_rank * num_max_tokens_per_rank + t,
  src_rank * K + highest local lane, <expand: the expanded row of each lane or -1; otherwise never written>)``;
* combine (``combine.cuh``): received row ``i`` goes back to rank ``recv_src_metadata[i, 1] // K``, token
  ``recv_src_metadata[i, 0] % num_max_tokens_per_rank``, into layout row ``own rank`` (``allow_multiple_reduction``
  and ``R <= K``) or ``recv_src_metadata[i, 1] % K``; its weights row travels with it;
* combine with ``do_expand``: a received token's expanded rows are summed first (fp32 in lane order, one bf16
  rounding; a single row is sent as is) with ``allow_multiple_reduction``; without it each row travels alone to layout
  row ``k`` (an "expanded send", which traps if ``topk_weights`` is given: combine.cuh:69);
* combine reduce (``combine_reduce_epilogue.cuh`` + ``combine_utils.cuh``): for token ``t`` the slots are the highest
  lane of each destination rank (every valid lane for an expanded send), ascending; ``fp32(0) + bias_0 + bias_1 +``
  the slots' rows in that order, one bf16 rounding (the bf16 ``hadd`` shortcut for two rows without bias rounds the
  same); ``combined_topk_weights[t, k]`` = lane ``k`` of the row the owner of slot ``k`` sent, ``0`` at ``-1`` slots.

A receive slot no sender wrote in this call is a ``Panic`` (upstream reads stale buffer contents), as are two
different rows written to one slot (upstream: whichever lands last).
"""

from __future__ import annotations

import torch

from . import _standin as S
from ._elastic_kernels import combine_kernels, dispatch_kernels
from ._elastic_layout import (
    BF16,
    MAX_TOPK,
    NUM_ALIGNMENT_BYTES,
    SF_PACK_BYTES,
    WORKSPACE_MAX_EXPERTS,
    WORKSPACE_MAX_EXPERTS_PER_RANK,
    event_arg,
    get_combine_buffer_size,
    get_dispatch_buffer_size,
    get_shape,
    graph_capturing,
    ints,
    logical_domain_size,
    physical_domain_size,
)
from ._standin import ELASTIC_DISPATCH_HPP, ELASTIC_HPP, ELASTIC_UTILS_HPP, LAYOUT_CUH, check, panic


class ElasticRuntime:
    """``deep_ep._C.ElasticBuffer`` (buffer.hpp:19-1344), direct mode."""

    def __init__(
        self,
        rank_idx,
        num_ranks,
        comm,
        num_buffer_bytes,
        num_cpu_buffer_bytes,
        allow_hybrid_mode,
        allow_multiple_reduction,
        prefer_overlap_with_compute,
        sl_idx,
        num_allocated_qps,
        num_cpu_timeout_secs,
        num_gpu_timeout_secs,
        explicitly_destroy,
    ):
        ints(
            "ElasticBuffer.__init__",
            rank_idx=rank_idx,
            num_ranks=num_ranks,
            num_buffer_bytes=num_buffer_bytes,
            num_cpu_buffer_bytes=num_cpu_buffer_bytes,
            sl_idx=sl_idx,
            num_allocated_qps=num_allocated_qps,
            num_cpu_timeout_secs=num_cpu_timeout_secs,
            num_gpu_timeout_secs=num_gpu_timeout_secs,
        )
        a = NUM_ALIGNMENT_BYTES
        check(
            num_buffer_bytes > 0 and num_buffer_bytes % a == 0,
            f"{ELASTIC_HPP}:98",
            "num_buffer_bytes > 0 and num_buffer_bytes % symmetric::kNumAlignmentBytes == 0",
        )
        check(
            num_cpu_buffer_bytes >= 0 and num_cpu_buffer_bytes % a == 0,
            f"{ELASTIC_HPP}:99",
            "num_cpu_buffer_bytes >= 0 and num_cpu_buffer_bytes % symmetric::kNumAlignmentBytes == 0",
        )
        check(
            num_cpu_buffer_bytes <= num_buffer_bytes, f"{ELASTIC_HPP}:100", "num_cpu_buffer_bytes <= num_buffer_bytes"
        )
        self.rank_idx, self.num_ranks, self.comm = int(rank_idx), int(num_ranks), comm
        self.num_buffer_bytes = int(num_buffer_bytes)
        self.num_cpu_buffer_bytes = int(num_cpu_buffer_bytes)
        self.allow_hybrid_mode = bool(allow_hybrid_mode)
        self.allow_multiple_reduction = bool(allow_multiple_reduction)
        self.prefer_overlap_with_compute = bool(prefer_overlap_with_compute)
        self.num_allocated_qps = int(num_allocated_qps)
        self.explicitly_destroy = bool(explicitly_destroy)
        self.num_rdma_ranks, self.num_nvl_ranks = physical_domain_size(self.num_ranks)
        self.num_scaleout_ranks, self.num_scaleup_ranks = logical_domain_size(self.num_ranks, self.allow_hybrid_mode)
        self.is_scaleup_nvlink = self.num_scaleup_ranks == self.num_nvl_ranks
        self.destroyed = False
        self.dispatch_calls = 0

    # -- simple members ----------------------------------------------------------------------------------------------

    def destroy(self) -> None:
        check(not self.destroyed, f"{ELASTIC_HPP}:153", "not destroyed")
        self.barrier(True, True)
        self.destroyed = True

    def get_comm_stream(self):
        return None  # no CUDA communication stream on CPU

    def get_physical_domain_size(self) -> tuple[int, int]:
        return self.num_rdma_ranks, self.num_nvl_ranks

    def get_logical_domain_size(self) -> tuple[int, int]:
        return self.num_scaleout_ranks, self.num_scaleup_ranks

    def barrier(self, use_comm_stream=True, with_cpu_sync=False, sequential=True) -> None:
        self.comm.barrier()  # launch_barrier: every rank of the group takes part

    def _not_hybrid(self, op: str) -> None:
        if self.num_scaleout_ranks > 1:
            S.not_implemented(
                f"ElasticBuffer.{op} in hybrid mode ({self.num_scaleout_ranks} scale-out x {self.num_scaleup_ranks} "
                "scale-up ranks)",
                "the hybrid RDMA + NVLink kernels (hybrid_dispatch.cuh / hybrid_combine.cuh) are not emulated",
            )

    def _exchange(self, op: str, meta: dict, per_dst: list, problems: list) -> list:
        """The kernels' stores into the peers' buffers: one all-to-all; then every rank checks it agrees with the
        others on the template parameters, and panics on what it found before."""
        gathered = self.comm.exchange([(meta, item) for item in per_dst])
        if problems:
            panic("; ".join(problems))
        for s, (m, _) in enumerate(gathered):
            if m != meta:
                panic(
                    f"{op}: rank {s} and rank {self.rank_idx} disagree ({m!r} vs {meta!r}): the JIT kernels are "
                    "instantiated differently and would misread each other's buffers"
                )
        return [item for _, item in gathered]

    # -- dispatch ----------------------------------------------------------------------------------------------------

    def dispatch(
        self,
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
    ):
        """buffer.hpp:693-1177 + dispatch.hpp + dispatch.cuh + dispatch_copy_epilogue.cuh."""
        api = "ElasticBuffer.dispatch"
        ints(
            api,
            num_max_tokens_per_rank=num_max_tokens_per_rank,
            num_experts=num_experts,
            expert_alignment=expert_alignment,
            num_sms=num_sms,
            num_qps=num_qps,
        )
        event_arg(api, "previous_event", previous_event)
        event_arg(api, "previous_event_before_epilogue", previous_event_before_epilogue)
        num_max, E, a = int(num_max_tokens_per_rank), int(num_experts), int(expert_alignment)
        R = self.num_ranks
        check(num_sms > 0, f"{ELASTIC_HPP}:728", "num_sms > 0")
        check(not do_zero_padding or do_expand, f"{ELASTIC_HPP}:731", "not do_zero_padding or do_expand")
        cached = cached_num_recv_tokens is not None
        if cached:
            for line, value, name in (
                (737, cached_num_recv_tokens_per_expert_list, "cached_num_recv_tokens_per_expert_list"),
                (738, cached_num_expanded_tokens, "cached_num_expanded_tokens"),
                (739, cached_psum_num_recv_tokens_per_scaleup_rank, "cached_psum_num_recv_tokens_per_scaleup_rank"),
                (740, cached_psum_num_recv_tokens_per_expert, "cached_psum_num_recv_tokens_per_expert"),
                (741, cached_dst_buffer_slot_idx, "cached_dst_buffer_slot_idx"),
            ):
                check(value is not None, f"{ELASTIC_HPP}:{line}", f"{name}.has_value()")
        num_tokens, hidden = get_shape(x, 2)
        L = E // R
        check(x.is_contiguous(), f"{ELASTIC_HPP}:754", "x.is_cuda() and x.is_contiguous()")
        check(
            (hidden * x.element_size()) % 16 == 0,
            f"{ELASTIC_HPP}:755",
            "(x.size(1) * x.element_size()) % sizeof(int4) == 0",
        )
        check(num_tokens <= num_max, f"{ELASTIC_HPP}:756", "num_tokens <= num_max_tokens_per_rank")
        num_sf_packs = 0
        if sf is not None:
            n_, num_sf_packs = get_shape(sf, 2)
            check(num_tokens == n_, f"{ELASTIC_HPP}:765", "num_tokens == num_tokens_")
            check(sf.element_size() == SF_PACK_BYTES, f"{ELASTIC_HPP}:767", "sf->element_size() == sizeof(sf_pack_t)")
        n_, K = get_shape(topk_idx, 2)
        check(num_tokens == n_, f"{ELASTIC_HPP}:776", "num_tokens == num_tokens_")
        check(
            topk_idx.dtype == torch.int64,
            f"{ELASTIC_HPP}:777",
            "topk_idx.scalar_type() == c10::CppTypeToScalarType<topk_idx_t>::value",
        )
        check(topk_idx.is_contiguous(), f"{ELASTIC_HPP}:778", "topk_idx.is_cuda() and topk_idx.is_contiguous()")
        if topk_weights is not None:
            n_, _ = get_shape(topk_weights, 2)
            check(num_tokens == n_, f"{ELASTIC_HPP}:784", "num_tokens == num_tokens__")
            check(
                topk_weights.is_contiguous(),
                f"{ELASTIC_HPP}:785",
                "topk_weights->is_cuda() and topk_weights->is_contiguous()",
            )
            S.data_ptr_check(topk_weights, torch.float32)
        stats = cumulative_local_expert_recv_stats
        if stats is not None:
            (n_,) = get_shape(stats, 1)
            check(
                stats.is_contiguous(),
                f"{ELASTIC_HPP}:793",
                "cumulative_local_expert_recv_stats->is_cuda() and cumulative_local_expert_recv_stats->is_contiguous()",
            )
            check(L == n_, f"{ELASTIC_HPP}:795", "num_local_experts == num_local_experts_")
            S.data_ptr_check(stats, torch.int32)
        if previous_event is not None:
            check(allocate_on_comm_stream, f"{ELASTIC_HPP}:540", "allocate_on_comm_stream")
        check(E % R == 0, f"{ELASTIC_HPP}:805", "num_experts % nccl_context->num_ranks == 0")
        if cached:
            psum_e = cached_psum_num_recv_tokens_per_expert
            (n_,) = get_shape(psum_e, 1)
            check(L == n_, f"{ELASTIC_HPP}:809", "num_local_experts == num_local_experts_")
            check(
                psum_e.is_contiguous(),
                f"{ELASTIC_HPP}:810",
                "psum_num_recv_tokens_per_expert.is_cuda() and psum_num_recv_tokens_per_expert.is_contiguous()",
            )
            check(
                psum_e.dtype == torch.int32,
                f"{ELASTIC_HPP}:811",
                "psum_num_recv_tokens_per_expert.scalar_type() == torch::kInt",
            )
            unaligned = cached_num_unaligned_recv_tokens_per_expert
            if unaligned is None:  # `.value_or(torch::Tensor())`: an undefined tensor has no dim
                check(False, f"{ELASTIC_UTILS_HPP}:17", "t.dim() == kNumDims")
            (n_,) = get_shape(unaligned, 1)
            check(L == n_, f"{ELASTIC_HPP}:824", "num_local_experts == num_local_experts_")
            check(
                unaligned.is_contiguous(),
                f"{ELASTIC_HPP}:825",
                "num_unaligned_recv_tokens_per_expert.is_cuda() and "
                "num_unaligned_recv_tokens_per_expert.is_contiguous()",
            )
            check(
                unaligned.dtype == torch.int32,
                f"{ELASTIC_HPP}:826",
                "num_unaligned_recv_tokens_per_expert.scalar_type() == torch::kInt",
            )
            psum_su = cached_psum_num_recv_tokens_per_scaleup_rank
            (n_,) = get_shape(psum_su, 1)
            check(
                n_ == self.num_scaleup_ranks,
                f"{ELASTIC_HPP}:838",
                "num_scaleup_ranks == nccl_context->num_scaleup_ranks",
            )
            check(
                psum_su.is_contiguous(),
                f"{ELASTIC_HPP}:839",
                "psum_num_recv_tokens_per_scaleup_rank.is_cuda() and "
                "psum_num_recv_tokens_per_scaleup_rank.is_contiguous()",
            )
            check(
                psum_su.dtype == torch.int32,
                f"{ELASTIC_HPP}:840",
                "psum_num_recv_tokens_per_scaleup_rank.scalar_type() == torch::kInt",
            )
        self._not_hybrid("dispatch")
        if cached:
            slots_in = cached_dst_buffer_slot_idx
            n_, k_ = get_shape(slots_in, 2)
            check(
                num_tokens == n_ and K == k_,
                f"{ELASTIC_HPP}:874",
                "num_tokens == num_tokens__ and num_topk == num_topk_",
            )
            check(
                slots_in.is_contiguous(),
                f"{ELASTIC_HPP}:875",
                "dst_buffer_slot_idx.is_cuda() and dst_buffer_slot_idx.is_contiguous()",
            )
            check(
                slots_in.dtype == torch.int32, f"{ELASTIC_HPP}:876", "dst_buffer_slot_idx.scalar_type() == torch::kInt"
            )
        check(
            get_dispatch_buffer_size(
                num_max, hidden, num_sf_packs, K, x.element_size(), 1, self.num_scaleup_ranks, self.is_scaleup_nvlink
            )
            <= self.num_buffer_bytes,
            f"{ELASTIC_HPP}:963",
            "get_dispatch_buffer_size( num_max_tokens_per_rank, hidden, num_sf_packs, num_topk, x.element_size(), "
            "nccl_context->num_scaleout_ranks, nccl_context->num_scaleup_ranks, nccl_context->is_scaleup_nvlink) "
            "<= num_buffer_bytes",
        )
        check(E <= WORKSPACE_MAX_EXPERTS, f"{LAYOUT_CUH}:39", "num_experts <= kNumMaxExperts")
        check(L <= WORKSPACE_MAX_EXPERTS_PER_RANK, f"{LAYOUT_CUH}:40", "num_experts_per_rank <= kNumMaxExpertsPerRank")
        check(num_sms <= S.STATE.num_device_sms, f"{ELASTIC_HPP}:979", "num_sms <= jit::device_runtime->get_num_sms()")
        if cached:
            check(stats is None, f"{ELASTIC_DISPATCH_HPP}:168", "cumulative_local_expert_recv_stats == nullptr")
        if K > MAX_TOPK:
            raise RuntimeError(
                f"{S.PREFIX}JIT compilation of dispatch_impl fails: static_assert(kNumTopk <= 32) "
                "(deep_ep/include/deep_ep/impls/dispatch.cuh:93)"
            )
        if cached:
            check(not do_cpu_sync, f"{ELASTIC_HPP}:1013", 'not do_cpu_sync and "Cannot do CPU sync with cached mode"')
        if cached and cached_recv_src_metadata is not None:
            S.data_ptr_check(cached_recv_src_metadata, torch.int32)
        if not cached and do_cpu_sync and graph_capturing():
            # buffer.hpp:1017-1064: a captured kernel does not run, so the host never sees the counts it spins on
            raise RuntimeError(
                f"{S.PREFIX}Dispatch CPU wait exception ({ELASTIC_HPP}:1063): the dispatch kernel does not run while "
                "a graph is captured, so the CPU never sees the received counts (upstream times out after "
                "num_cpu_timeout_secs); pass do_cpu_sync=False or a cached handle"
            )
        return dispatch_kernels(
            self,
            x,
            sf,
            topk_idx,
            topk_weights,
            stats,
            cached,
            num_max,
            E,
            a,
            K,
            L,
            num_tokens,
            hidden,
            num_sf_packs,
            slots_in if cached else None,
            psum_su if cached else None,
            psum_e if cached else None,
            unaligned if cached else None,
            cached_num_recv_tokens,
            cached_num_expanded_tokens,
            cached_num_recv_tokens_per_expert_list,
            cached_recv_src_metadata,
            async_with_compute_stream,
            do_handle_copy,
            do_cpu_sync,
            do_expand,
            do_zero_padding,
            use_tma_aligned_col_major_sf,
        )

    def combine(
        self,
        x,
        topk_weights,
        bias_0,
        bias_1,
        src_metadata,
        combined_topk_idx,
        psum_num_recv_tokens_per_scaleup_rank,
        token_metadata_at_forward,
        channel_linked_list,
        num_experts,
        num_max_tokens_per_rank,
        num_sms,
        num_qps,
        previous_event,
        previous_event_before_epilogue,
        async_with_compute_stream,
        allocate_on_comm_stream,
        use_expanded_layout,
    ):
        """buffer.hpp:1179-1343 + combine.hpp + combine.cuh + combine_reduce_epilogue.cuh."""
        api = "ElasticBuffer.combine"
        ints(
            api,
            num_experts=num_experts,
            num_max_tokens_per_rank=num_max_tokens_per_rank,
            num_sms=num_sms,
            num_qps=num_qps,
        )
        event_arg(api, "previous_event", previous_event)
        event_arg(api, "previous_event_before_epilogue", previous_event_before_epilogue)
        E, num_max = int(num_experts), int(num_max_tokens_per_rank)
        expand, mr = bool(use_expanded_layout), self.allow_multiple_reduction
        check(num_sms > 0, f"{ELASTIC_HPP}:1198", "num_sms > 0")
        num_tokens, hidden = get_shape(x, 2)
        check(x.is_contiguous(), f"{ELASTIC_HPP}:1202", "x.is_cuda() and x.is_contiguous()")
        check(x.dtype == BF16, f"{ELASTIC_HPP}:1203", "x.scalar_type() == torch::kBFloat16")
        check(
            (hidden * x.element_size()) % 16 == 0,
            f"{ELASTIC_HPP}:1204",
            "(x.size(1) * x.element_size()) % sizeof(int4) == 0",
        )
        T, K = get_shape(combined_topk_idx, 2)
        psum = psum_num_recv_tokens_per_scaleup_rank
        (num_scaleup,) = get_shape(psum, 1)
        check(
            combined_topk_idx.is_contiguous(),
            f"{ELASTIC_HPP}:1209",
            "combined_topk_idx.is_cuda() and combined_topk_idx.is_contiguous()",
        )
        check(
            combined_topk_idx.dtype == torch.int64,
            f"{ELASTIC_HPP}:1210",
            "combined_topk_idx.scalar_type() == c10::CppTypeToScalarType<topk_idx_t>::value",
        )
        check(
            num_scaleup == self.num_scaleup_ranks,
            f"{ELASTIC_HPP}:1211",
            "num_scaleup_ranks == nccl_context->num_scaleup_ranks",
        )
        check(
            psum.is_contiguous(),
            f"{ELASTIC_HPP}:1212",
            "psum_num_recv_tokens_per_scaleup_rank.is_cuda() and psum_num_recv_tokens_per_scaleup_rank.is_contiguous()",
        )
        check(
            psum.dtype == torch.int32,
            f"{ELASTIC_HPP}:1213",
            "psum_num_recv_tokens_per_scaleup_rank.scalar_type() == torch::kInt",
        )
        check(T <= num_max, f"{ELASTIC_HPP}:1214", "num_combined_tokens <= num_max_tokens_per_rank")
        num_reduced, k2 = get_shape(src_metadata, 2)
        check(
            num_reduced == (num_reduced if expand else num_tokens),
            f"{ELASTIC_HPP}:1219",
            "num_reduced_tokens == (use_expanded_layout ? num_reduced_tokens : num_tokens)",
        )
        check(k2 == K + 2, f"{ELASTIC_HPP}:1220", "num_topk_p2 == num_topk + 2")
        check(
            src_metadata.is_contiguous(),
            f"{ELASTIC_HPP}:1221",
            "src_metadata.is_cuda() and src_metadata.is_contiguous()",
        )
        check(src_metadata.dtype == torch.int32, f"{ELASTIC_HPP}:1222", "src_metadata.scalar_type() == torch::kInt")
        if topk_weights is not None:
            if expand:
                (n_,) = get_shape(topk_weights, 1)
                check(num_tokens == n_, f"{ELASTIC_HPP}:1228", "num_tokens == num_tokens__")
            else:
                n_, k_ = get_shape(topk_weights, 2)
                check(
                    num_tokens == n_ and K == k_,
                    f"{ELASTIC_HPP}:1231",
                    "num_tokens == num_tokens__ and num_topk == num_topk__",
                )
            check(
                topk_weights.is_contiguous(),
                f"{ELASTIC_HPP}:1233",
                "topk_weights->is_cuda() and topk_weights->is_contiguous()",
            )
            check(
                topk_weights.dtype == torch.float32,
                f"{ELASTIC_HPP}:1234",
                "topk_weights->scalar_type() == torch::kFloat",
            )
        for b in (bias_0, bias_1):
            if b is not None:
                check(
                    b.dim() == 2 and b.is_contiguous(),
                    f"{ELASTIC_HPP}:1242",
                    "bias.dim() == 2 and bias.is_contiguous()",
                )
                check(b.dtype == x.dtype, f"{ELASTIC_HPP}:1243", "bias.scalar_type() == x.scalar_type()")
                check(
                    b.size(0) == T and b.size(1) == hidden,
                    f"{ELASTIC_HPP}:1244",
                    "bias.size(0) == num_combined_tokens and bias.size(1) == hidden",
                )
        if previous_event is not None:
            check(allocate_on_comm_stream, f"{ELASTIC_HPP}:540", "allocate_on_comm_stream")
        check(
            get_combine_buffer_size(num_max, hidden, K, 1, self.num_scaleup_ranks, self.is_scaleup_nvlink, mr)
            <= self.num_buffer_bytes,
            f"{ELASTIC_HPP}:1254",
            "get_combine_buffer_size(num_max_tokens_per_rank, hidden, num_topk, nccl_context->num_scaleout_ranks, "
            "nccl_context->num_scaleup_ranks, nccl_context->is_scaleup_nvlink, allow_multiple_reduction) "
            "<= num_buffer_bytes",
        )
        self._not_hybrid("combine")
        if K > MAX_TOPK:
            raise RuntimeError(
                f"{S.PREFIX}JIT compilation of combine_reduce_epilogue_impl fails: static_assert(kNumTopk <= 32) "
                "(deep_ep/include/deep_ep/impls/combine_reduce_epilogue.cuh:65)"
            )
        return combine_kernels(
            self,
            x,
            topk_weights,
            bias_0,
            bias_1,
            src_metadata,
            combined_topk_idx,
            psum,
            E,
            num_max,
            K,
            T,
            hidden,
            num_tokens,
            num_reduced,
            num_scaleup,
            expand,
            async_with_compute_stream,
        )
