"""DeepEP 2.5.0's ``EPBuffer`` (specs/upstream_2609.md §9.2; ``deep_ep/buffers/ep.py`` of the split): V2's
``ElasticBuffer`` under its new name and constructor, over the same ep ops.

``EPBuffer(group, num_bytes=None, num_max_tokens_per_rank=0, hidden=0, num_topk=0, use_fp8_dispatch=False,
lb_allocation_plan_or_num_bytes=0, deterministic=False, allow_hybrid_mode=True, allow_multiple_reduction=True,
prefer_overlap_with_compute=True, sl_idx=None, num_allocated_qps=0, num_cpu_timeout_secs=300,
num_gpu_timeout_secs=100, explicitly_destroy=False)``: ``ElasticBuffer``'s arguments without ``num_cpu_bytes``,
plus the load-balance region, kept as ``runtime.lb_storage`` (uint8 of that many bytes; nothing here reads it).
A ``BufferAllocator`` plan in its place is refused: its layout (offset alignment, how ``materialize`` swaps the
views in) is not pinned by the spec. ``dispatch`` takes 2.5.0's ``defer_epilogue``: our dispatch is synchronous, so
the epilogue has run when the call returns and the returned event's wait has nothing left to do (the spec infers
"the epilogue runs later"). Everything else is ``ElasticBuffer``'s (``deepep_api.md`` §4.5-4.6); ``EPHandle`` is
unchanged.
"""

from __future__ import annotations

import types

import torch

from torch_ascend_moe import checks as ck
from torch_ascend_moe.deep_ep.buffers.elastic import ElasticBuffer


class EPBuffer(ElasticBuffer):
    def __init__(
        self,
        group,
        num_bytes: int | None = None,
        num_max_tokens_per_rank: int = 0,
        hidden: int = 0,
        num_topk: int = 0,
        use_fp8_dispatch: bool = False,
        lb_allocation_plan_or_num_bytes=0,
        deterministic: bool = False,
        allow_hybrid_mode: bool = True,
        allow_multiple_reduction: bool = True,
        prefer_overlap_with_compute: bool = True,
        sl_idx: int | None = None,
        num_allocated_qps: int = 0,
        num_cpu_timeout_secs: int = 300,
        num_gpu_timeout_secs: int = 100,
        explicitly_destroy: bool = False,
    ) -> None:
        lb = lb_allocation_plan_or_num_bytes
        if isinstance(lb, bool) or not isinstance(lb, int) or lb < 0:
            expected = "a non-negative number of bytes (a BufferAllocator plan's layout is not implemented here)"
            raise ValueError(
                ck.message("deep_ep.EPBuffer", "lb_allocation_plan_or_num_bytes", "value", expected, repr(lb))
            )
        super().__init__(
            group, num_bytes, 0, num_max_tokens_per_rank, hidden, num_topk, use_fp8_dispatch, deterministic,
            allow_hybrid_mode, allow_multiple_reduction, prefer_overlap_with_compute, 3 if sl_idx is None else sl_idx,
            num_allocated_qps, num_cpu_timeout_secs, num_gpu_timeout_secs, explicitly_destroy,
        )  # fmt: skip
        self.runtime = types.SimpleNamespace(lb_storage=torch.zeros(lb, dtype=torch.uint8))

    def dispatch(self, *args, defer_epilogue: bool = False, **kwargs):
        """``ElasticBuffer.dispatch`` (``do_zero_padding``, ``use_tma_aligned_col_major_sf`` included);
        ``defer_epilogue`` accepted (module docstring)."""
        if not isinstance(defer_epilogue, bool):
            got = str(type(defer_epilogue))
            raise ValueError(ck.message("deep_ep.EPBuffer.dispatch", "defer_epilogue", "type", "bool", got))
        return super().dispatch(*args, **kwargs)
