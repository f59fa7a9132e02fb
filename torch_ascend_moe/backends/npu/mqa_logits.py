"""The mqa_logits family on Ascend: ``npu_lightning_indexer`` computes the indexer's top-k (indices, optionally
values) without materializing the logits, so it maps onto the COMPOSITION ``mqa_topk(mqa_logits(...))``, not
onto either op: ``mqa_logits`` must return the full ``[S, S_kv]`` logits (the indexer never does) and an
adapter of ``mqa_topk`` cannot see its producer. ``mqa_logits_topk`` is the fused mapping, for a compiler
pass that matches ``mqa_topk(mqa_logits(q, k, weights, ks, ke), ks, ke, topk)`` (registered on no op).

Where the semantics agree: the formula ``I[i, j] = sum_h weights[i, h] * relu(q[i, h] . k[j])`` (ReLU before
the weights, as ours), one key head, top-k by value. Where they differ (the mapping's preconditions):

* Ranges: ours are arbitrary per-query ``[ks[i], ke[i])`` over one KV sequence; the indexer's are per batch
  (cumulative ``actual_seq_lengths`` in TND) with ``sparse_mode`` 3 (right-down causal: query ``i`` of a batch
  with ``S1`` queries and ``S2`` keys sees keys ``s <= S2 - S1 + i``) or 0 (the batch's keys). So the mapping
  holds only when ``ks``/``ke`` are what ``implied_ranges`` gives for the batches; they are not read (no host
  sync): the caller (the pass) must establish it, or pass ``validate=True`` in eager.
* Dtypes: the indexer takes BF16/FP16 ``q``, ``k`` AND ``weights`` (ours: FP32 or BF16 weights, FP8/FP4
  operands with scales): FP32 weights are rounded to the query's dtype here (not exact); quantized operands
  need ``npu_quant_lightning_indexer`` (int8 on A3, FP8/HiF8 on A5: another mapping, not done). Values come
  back in the query's dtype (ours: the logits dtype). Assumed: scores ranked in FP32, values rounded after,
  i.e. ``mqa_topk`` of FP32 logits with the values rounded (with BF16 logits ``mqa_topk`` ranks rounded values,
  so keys tied after rounding may order differently).
* Shapes: heads ``N1 <= 64`` and ``D = 128`` on hardware (docs/peers.md), ``sparse_count`` in 1..2048 or
  3072..8192 by 1024; ``topk`` beyond that cannot map.
* Indices: assumed relative to the batch's first key (shifted back to absolute KV positions here), as
  vllm-ascend feeds them to ``npu_sparse_flash_attention`` with per-request lengths / block tables; with one
  batch it does not matter. The formula is CANN's (the op's ops-transformer / sgl-kernel-npu docs; the
  wheel's docstring has none). Tie order and the padding of rows with fewer than ``topk`` visible keys
  (-1 / -inf here, as ``mqa_topk``) are not documented: unverified on hardware.
* ``paged_mqa_logits`` (decode) maps to ``layout_key="PA_BSND"`` + ``block_table`` in principle, but our
  cache layout (FP8 data + scales per block, DeepGEMM's) is not the indexer's BF16 ``[blocks, block, 1, D]``.
* ``mqa_logits_backward`` (the logits' gradient w.r.t. q, k, weights) has no CANN counterpart (the indexer has
  no backward in torch_npu 2.13); it runs its portable kernel (ACLNN matmuls). ``paged_mqa_logits_metadata`` is
  DeepGEMM's scheduling table (per-SM block ranges for the paged kernel): integer bookkeeping, no CANN op, and
  the indexer schedules itself.
"""

from __future__ import annotations

import torch


def implied_ranges(
    num_queries: int, cu_seqlens_q: torch.Tensor | None, cu_seqlens_k: torch.Tensor | None, num_keys: int, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(ks, ke)`` int32 ``[S]`` for which ``mqa_logits_topk`` equals ``mqa_topk(mqa_logits(...))``:
    query ``i`` of batch ``b`` sees keys ``[k0_b, k0_b + S2_b - S1_b + i + 1)`` causal, ``[k0_b, k1_b)`` not."""
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


def mqa_logits_topk(
    q: torch.Tensor,
    k: torch.Tensor,
    weights: torch.Tensor,
    ks: torch.Tensor,
    ke: torch.Tensor,
    topk: int,
    *,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    causal: bool = True,
    validate: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``mqa_topk(mqa_logits(q, k, weights, ks, ke), ks, ke, topk)`` through ``npu_lightning_indexer`` (TND):
    ``(values [S, topk] in q's dtype, indices int32 [S, topk])`` absolute KV positions, -1 / -inf padding.

    ``q [S, H, D]``, ``k [S_kv, D]`` BF16/FP16, ``weights [S, H]`` (cast to q's dtype). The batches are
    ``cu_seqlens_q`` / ``cu_seqlens_k`` (``[B + 1]`` int, starting at 0; None: one batch of everything);
    ``causal`` picks ``sparse_mode`` 3 (right-down causal) over 0. ``ks``/``ke`` must be ``implied_ranges``'s
    (checked only with ``validate``, a host sync)."""
    s, s_kv = q.shape[0], k.shape[0]
    if validate:
        want_ks, want_ke = implied_ranges(s, cu_seqlens_q, cu_seqlens_k, s_kv, causal)
        if not (torch.equal(ks.cpu().int(), want_ks) and torch.equal(ke.cpu().int(), want_ke)):
            raise ValueError(
                "mqa_logits_topk: ks/ke are not the ranges npu_lightning_indexer's batches and sparse_mode imply "
                "(see implied_ranges); keep mqa_topk(mqa_logits(...))"
            )
    device = q.device
    if cu_seqlens_q is None:
        cq = torch.tensor([0, s], dtype=torch.int32, device=device)
        ck = torch.tensor([0, s_kv], dtype=torch.int32, device=device)
    else:
        cq, ck = cu_seqlens_q.to(device=device, dtype=torch.int32), cu_seqlens_k.to(device=device, dtype=torch.int32)
    indices, values = torch.ops.npu.npu_lightning_indexer.default(
        q,
        k.unsqueeze(1),  # [S_kv, N2 = 1, D]
        weights.to(q.dtype),
        actual_seq_lengths_query=cq[1:],
        actual_seq_lengths_key=ck[1:],
        layout_query="TND",
        layout_key="TND",
        sparse_count=topk,
        sparse_mode=3 if causal else 0,
        return_value=True,
    )
    indices, values = indices.squeeze(1), values.squeeze(1)
    # Indices are relative to each query's batch's first key: shift back to absolute positions.
    batch = torch.searchsorted(cq[1:].long(), torch.arange(s, device=device), right=True)
    start = ck.long()[batch].unsqueeze(1)
    indices = torch.where(indices >= 0, indices.long() + start, -1).to(torch.int32)
    return values, indices


__all__ = ["implied_ranges", "mqa_logits_topk"]
