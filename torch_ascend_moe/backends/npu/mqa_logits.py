"""The mqa_logits family on Ascend: ``npu_lightning_indexer`` computes the indexer's top-k (indices, optionally
values) without materializing the logits, so it maps onto ``mqa_logits_topk`` (the fused
``mqa_topk(mqa_logits(...))``), registered here as its adapter; not onto ``mqa_logits`` (which must return the full
``[S, S_kv]`` logits, which the indexer never forms) nor ``mqa_topk`` (which cannot see its producer). A compiler
pass rewrites ``mqa_topk(mqa_logits(...))`` into ``mqa_logits_topk`` (issue 19), which then reaches the indexer.

Where the semantics agree: the formula ``I[i, j] = sum_h weights[i, h] * relu(q[i, h] . k[j])`` (ReLU before
the weights, as ours), one key head, top-k by value, -1 / -inf padding. The adapter's preconditions:

* Ranges: ours are arbitrary per-query ``[ks[i], ke[i])`` over one KV sequence; the indexer's come from batches
  (cumulative ``actual_seq_lengths`` in TND) with ``sparse_mode`` 3 (right-down causal: query ``i`` of a batch
  with ``S1`` queries and ``S2`` keys sees keys ``s <= S2 - S1 + i``) or 0 (the batch's keys). ``batches_of``
  reads the batches off ``ks``/``ke`` (a host read: eager, not while capturing) and the adapter runs the indexer
  only when ``implied_ranges`` of those batches gives ``ks``/``ke`` back exactly (varlen prefill batches,
  causal or not), else the portable kernel.
* Dtypes: the indexer takes BF16/FP16 ``q``, ``k`` AND ``weights`` and returns values in the query's dtype. Ours
  takes BF16 operands with BF16 weights (BF16 logits), or FP32 weights when every weight is a BF16 value (a host
  check) and the logits are BF16; quantized operands need ``npu_quant_lightning_indexer`` (int8 on A3, FP8/HiF8
  on A5: another mapping, not done).
* Shapes (docs / peers.md): heads ``N1 <= 64``, ``D = 128``, ``sparse_count`` (our ``topk``) in 1..2048 or
  3072..8192 in steps of 1024; contiguous operands (the docs refuse strided ones: copied here).
* What is not bitwise ours: the indexer's FP32 summation order, and (in our CPU reading of it) its ranking of the
  FP32 scores before the values are rounded, where ``mqa_logits_topk`` ranks the BF16 values with ties to the
  lower position: keys whose values tie after rounding may come in another order, or another of them may take
  the last slot. Either is a top-k of the BF16 logits. Indices are taken relative to the batch's first key
  (shifted back to absolute positions here), as vllm-ascend feeds them to ``npu_sparse_flash_attention``. The
  formula is CANN's (the op's ops-transformer / sgl-kernel-npu docs; the wheel's docstring has none); tie order
  and padding values are not documented: unverified on hardware.
* No GE converter: the range precondition is a value check a graph cannot branch on (GE has no fallback).
* ``paged_mqa_logits`` (decode) maps to ``layout_key="PA_BSND"`` + ``block_table`` in principle, but our
  cache layout (FP8 data + scales per block, DeepGEMM's) is not the indexer's BF16 ``[blocks, block, 1, D]``.
  ``mqa_logits`` and ``mqa_topk`` alone have no CANN counterpart (reasons above): portable (ACLNN matmuls, sort).
* ``mqa_logits_backward`` (the logits' gradient w.r.t. q, k, weights) has no CANN counterpart (the indexer's
  ``npu_lightning_indexer_grad`` is for its own training recipe, not this formula's full gradient); it runs its
  portable kernel. ``paged_mqa_logits_metadata`` is DeepGEMM's scheduling table (per-SM block ranges for the paged
  kernel): integer bookkeeping, no CANN op, and the indexer schedules itself.
* ``sparse_mqa_logits`` / ``paged_sparse_mqa_logits`` (DeepSeek V4.1's candidate-block indexer, DeepGEMM 2.8) have
  no CANN op in the torch_npu 2.13 wheel, and DeepGEMM-Ascend has no sparse indexer API (specs/upstream_2609.md
  §1): portable (a gather of the candidate tokens, then ACLNN matmuls).
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.chain import kernel, planned, stays_portable
from torch_ascend_moe.backends.npu import has_op
from torch_ascend_moe.checks import mqa_logits as mqa_checks
from torch_ascend_moe.distributed import capture

MAX_HEADS, HEAD_DIM = 64, 128
# sparse_count: 1..2048, or 3072..8192 in steps of 1024 (the docs).
SPARSE_COUNTS = frozenset([*range(1, 2049), *range(3072, 8193, 1024)])


def implied_ranges(
    num_queries: int, cu_seqlens_q: torch.Tensor | None, cu_seqlens_k: torch.Tensor | None, num_keys: int, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(ks, ke)`` int32 ``[S]`` the indexer's batches mean: query ``i`` of batch ``b`` sees keys
    ``[k0_b, k0_b + S2_b - S1_b + i + 1)`` causal, ``[k0_b, k1_b)`` not."""
    cq, ck = _cumulative(num_queries, cu_seqlens_q, cu_seqlens_k, num_keys)
    cq, ck = cq.cpu().long(), ck.cpu().long()
    ks = torch.empty(num_queries, dtype=torch.int64)
    ke = torch.empty(num_queries, dtype=torch.int64)
    for b in range(len(cq) - 1):
        q0, q1, k0, k1 = int(cq[b]), int(cq[b + 1]), int(ck[b]), int(ck[b + 1])
        i = torch.arange(q1 - q0)
        ks[q0:q1] = k0
        ke[q0:q1] = (k1 - (q1 - q0) + i + 1).clamp(min=k0) if causal else k1
    return ks.int(), ke.int()


def _cumulative(num_queries, cu_seqlens_q, cu_seqlens_k, num_keys):
    """Cumulative starts ``[B + 1]`` of the query and key batches (one batch when none are given)."""
    if cu_seqlens_q is None:
        return torch.tensor([0, num_queries]), torch.tensor([0, num_keys])
    return cu_seqlens_q, cu_seqlens_k


def batches_of(ks: list[int], ke: list[int]) -> tuple[list[int], list[int], bool] | None:
    """``(cu_seqlens_q, cu_seqlens_k, causal)`` of the indexer's batches whose ``implied_ranges`` are exactly
    ``ks``/``ke``, or None. A batch is a run of queries with one ``ks`` (its first key); its last key is the last
    query's ``ke`` (causal) or every query's (not); key batches must tile ``[0, k1)`` back to back."""
    s = len(ks)
    if s == 0:
        return None
    cq, ck = [0], [0]
    for i in range(1, s + 1):
        if i == s or ks[i] != ks[i - 1]:
            if ks[cq[-1]] != ck[-1]:
                return None  # keys of consecutive batches must be contiguous from 0
            cq.append(i)
            ck.append(ke[i - 1])
            if ck[-1] <= ck[-2]:
                return None  # an empty key batch cannot be told apart from its neighbour
    for causal in (True, False):
        want_ks, want_ke = implied_ranges(s, torch.tensor(cq), torch.tensor(ck), ck[-1], causal)
        if want_ks.tolist() == ks and want_ke.tolist() == ke:
            return cq, ck, causal
    return None


def _indexer_call(q, k, weights, cq, ck, topk: int, causal: bool):
    """``npu_lightning_indexer`` in TND over the batches ``cq``/``ck`` (int lists): (values [S, topk] in q's dtype,
    absolute int32 indices [S, topk])."""
    device = q.device
    cq_t = torch.tensor(cq, dtype=torch.int32, device=device)
    ck_t = torch.tensor(ck, dtype=torch.int32, device=device)
    indices, values = torch.ops.npu.npu_lightning_indexer.default(
        q.contiguous(),
        k[: ck[-1]].unsqueeze(1).contiguous(),  # [keys, N2 = 1, D]
        weights.to(q.dtype).contiguous(),
        actual_seq_lengths_query=cq_t[1:],
        actual_seq_lengths_key=ck_t[1:],
        layout_query="TND",
        layout_key="TND",
        sparse_count=topk,
        sparse_mode=3 if causal else 0,
        return_value=True,
    )
    indices, values = indices.squeeze(1), values.squeeze(1)
    # Indices are relative to each query's batch's first key: shifted back to absolute positions.
    batch = torch.searchsorted(cq_t[1:].long(), torch.arange(q.shape[0], device=device), right=True)
    start = ck_t.long()[batch].unsqueeze(1)
    return values, torch.where(indices >= 0, indices.long() + start, -1).to(torch.int32)


def _shapes_refusal(q, k, weights, topk: int, out_dtype) -> str | None:
    """Why the indexer does not take a call by its dtypes and sizes (no values read), or None."""
    if q.dtype != torch.bfloat16 or k.dtype != torch.bfloat16 or out_dtype != torch.bfloat16:
        return "not BF16 q, k and logits"
    if q.shape[1] > MAX_HEADS or q.shape[2] != HEAD_DIM or q.shape[0] == 0:
        return f"heads above {MAX_HEADS}, a head dim other than {HEAD_DIM}, or no queries"
    if topk not in SPARSE_COUNTS:
        return f"top-{topk}: sparse_count takes 1..2048 or 3072..8192 in steps of 1024"
    return None


def _batches(q, q_sf, k, k_sf, weights, ks, ke, topk, logits_dtype):
    """The indexer's batches ``(cq, ck, causal)`` for a call it computes exactly, or the reason it does not (a str);
    our range errors first. Reads ``ks``/``ke`` (and non-BF16 weights) on the host."""
    sh = mqa_checks.fused_signature(q, q_sf, k, k_sf, weights, ks, ke, topk, logits_dtype)
    if capture.capturing(q.device) or not capture.host_readable(ks):
        return "the batches are read on the host: not while capturing, nor on fake tensors"
    why = _shapes_refusal(q, k, weights, topk, sh.out_dtype)
    if why:
        return why
    mqa_checks.check_range_values(mqa_checks.FUSED, ks, ke, sh.S_kv, 0)  # our errors before any kernel
    if weights.dtype != torch.bfloat16 and not bool((weights.bfloat16().float() == weights).all()):
        return "weights not exactly BF16 values (the indexer takes BF16 weights)"
    found = batches_of(ks.tolist(), ke.tolist())
    return found if found is not None else "ks/ke are not the ranges of causal or full batches"


_BATCHES = planned(_batches)


@kernel(
    device="npu",
    library="torch_npu",
    calls="npu_lightning_indexer",
    available=has_op("npu_lightning_indexer"),
    takes=_BATCHES,
)
def mqa_logits_topk(q, q_sf, k, k_sf, weights, ks, ke, topk, logits_dtype):
    cq, ck, causal = _BATCHES.result(q, q_sf, k, k_sf, weights, ks, ke, topk, logits_dtype)
    return _indexer_call(q, k, weights, cq, ck, topk, causal)


__all__ = ["batches_of", "implied_ranges", "mqa_logits_topk"]

stays_portable(
    "mqa_logits",
    "mqa_topk",
    device="npu",
    why="npu_lightning_indexer never forms the logits: it maps onto mqa_logits_topk, the fused pair",
)
stays_portable(
    "paged_mqa_logits",
    "paged_mqa_logits_metadata",
    device="npu",
    why="the indexer's paged form returns top-k, not the logits; the metadata is DeepGEMM's SM schedule",
)
stays_portable("mqa_logits_backward", device="npu", why="no CANN counterpart for the logits' gradient")
stays_portable(
    "sparse_mqa_logits",
    "paged_sparse_mqa_logits",
    device="npu",
    why="no CANN op in torch_npu 2.13 and no DeepGEMM-Ascend sparse indexer API",
)
