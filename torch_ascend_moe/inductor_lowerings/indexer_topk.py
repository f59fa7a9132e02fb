"""Rewrite: ``mqa_topk(mqa_logits(q, ..., ks, ke), ks, ke, topk)`` (the sparse-attention indexer's logits, then its
top-k) becomes one ``mqa_logits_topk``, which never holds the ``[S, S_kv]`` logits (CPU: a query tile's buffer;
CUDA: the Triton logits a block of queries at a time; Ascend: ``npu_lightning_indexer``). Same values: the fused
op is bitwise the composition on each backend.

Left alone: compressed logits (``max_seqlen_k > 0`` / ``compressed=True``: the fused op has the full form only),
top-k over other ranges than the logits', and logits used elsewhere too (they would be computed twice).
"""

from __future__ import annotations

import torch

from torch_ascend_moe.inductor_lowerings._pass import Plan, call_args, only_used_by, rewrite

_ops = torch.ops.ascend_moe


@rewrite(_ops.mqa_topk.default, "indexer_topk")
def plan(topk: torch.fx.Node) -> Plan | None:
    args = call_args(topk)
    logits = args["logits"]
    if not isinstance(logits, torch.fx.Node) or logits.target is not _ops.mqa_logits.default or args["compressed"]:
        return None
    la = call_args(logits)
    if la["max_seqlen_k"] != 0 or la["ks"] is not args["ks"] or la["ke"] is not args["ke"]:
        return None
    if not only_used_by([logits], topk):
        return None
    k, dtype = args["topk"], la["logits_dtype"]
    names = ("q", "q_sf", "k", "k_sf", "weights", "ks", "ke")
    present = [n for n in names if la[n] is not None]

    def fused(*tensors):
        given = dict(zip(present, tensors))
        q, q_sf, kk, k_sf, w, ks, ke = (given.get(n) for n in names)
        return _ops.mqa_logits_topk.default(q, q_sf, kk, k_sf, w, ks, ke, k, dtype)

    return Plan(fused, [la[n] for n in present], _ops.mqa_logits_topk.default)
