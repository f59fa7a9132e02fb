"""CPU references of torch_npu ops (our reading of their documented semantics, not Ascend's kernels), registered
on ``npu::<op>``'s CPU key with ``npu_wheel.cpu_reference``, for the ep / mqa_logits / hc_prenorm adapter checks.

* ``npu_moe_distribute_dispatch_v2`` / ``combine_v2`` on ONE rank (``ep_world_size == 1``; no TP, no shared
  experts, ``quant_mode == 0``): dispatch expands to expert-major rows (expert ascending, then token ascending,
  then slot), ``expert_token_nums`` counts (type 1) or inclusive sums (type 0), ``ep_recv_counts`` the inclusive
  sums per (expert, source rank) (A3's prefix-sum form), rows past the valid ones zero. Shapes come from the
  wheel's own Meta kernel. ``assist_info_for_combine`` is opaque on Ascend: here it holds (source rank, token,
  slot) per expanded row, a convention only our combine reference reads. Combine: ``out[t] = sum_k
  expert_scales[t, k] * y[row(t, k)]`` over active slots in slot order, FP32 from zero, one rounding.
* ``npu_lightning_indexer`` (TND / BSND, ``N2 == 1``): ``I[t, s] = sum_j w[t, j] * relu(q[t, j] . k[s])`` (the
  CANN LightningIndexer formula; the wheel's docstring gives none) in FP32 over the batch's keys, masked by
  ``sparse_mode`` (0: all of the batch's keys; 3: right-down causal, query i of S1 sees keys s <= S2 - S1 + i),
  top ``sparse_count`` by value (ties to the lower key), indices relative to the batch's first key, -1 / -inf
  padding; values in the query's dtype. (Tie order, padding values, and index base are our assumptions.)
* ``npu_mhc_pre``'s ``h_mix`` / ``inv_rms`` only: ``h_mix = x.reshape(T, n*D) @ phi^T`` (FP32),
  ``inv_rms = rsqrt(mean(x^2) + norm_eps)``; the other outputs are not modelled (zeros).
"""

from __future__ import annotations

import torch

from torch_ascend_moe.testing import npu_wheel
from torch_ascend_moe.testing.npu_wheel import cpu_reference, load

_REGISTERED = False


def _meta_like(t):
    return None if t is None else torch.empty(t.shape, dtype=t.dtype, device="meta")


def dispatch_v2(
    x,
    expert_ids,
    group_ep,
    ep_world_size,
    ep_rank_id,
    moe_expert_num,
    *,
    scales=None,
    x_active_mask=None,
    expert_scales=None,
    elastic_info=None,
    performance_info=None,
    group_tp="",
    tp_world_size=0,
    tp_rank_id=0,
    expert_shard_type=0,
    shared_expert_num=1,
    shared_expert_rank_num=0,
    quant_mode=0,
    global_bs=0,
    expert_token_nums_type=1,
    comm_alg="",
    zero_expert_num=0,
    copy_expert_num=0,
    const_expert_num=0,
    y_dtype=None,
    x_dtype=None,
    scales_dtype=None,
):
    assert ep_world_size == 1 and ep_rank_id == 0, "the CPU reference models one rank"
    assert quant_mode == 0 and scales is None and tp_world_size <= 1 and shared_expert_rank_num == 0
    assert elastic_info is None
    # The products' documented rules (aclnnMoeDistributeDispatchV2): A2 and A3 only; expert_scales on A2 only;
    # a 2-D x_active_mask on A3 only.
    soc = npu_wheel.SOC["version"]
    a2, a3 = 220 <= soc < 226, 250 <= soc < 256
    if not (a2 or a3):
        raise RuntimeError(f"npu_moe_distribute_dispatch_v2: not supported on SoC {soc}")
    if expert_scales is not None and not a2:
        raise RuntimeError("npu_moe_distribute_dispatch_v2: expert_scales is not supported on Atlas A3")
    if x_active_mask is not None and x_active_mask.dim() == 2 and not a3:
        raise RuntimeError("npu_moe_distribute_dispatch_v2: a 2-D x_active_mask needs Atlas A3")
    shapes = torch.ops.npu.npu_moe_distribute_dispatch_v2.default(
        _meta_like(x),
        _meta_like(expert_ids),
        group_ep,
        ep_world_size,
        ep_rank_id,
        moe_expert_num,
        x_active_mask=_meta_like(x_active_mask),
        expert_scales=_meta_like(expert_scales),
        quant_mode=quant_mode,
        global_bs=global_bs,
        expert_token_nums_type=expert_token_nums_type,
        shared_expert_num=shared_expert_num,
    )
    out = [torch.zeros(s.shape, dtype=s.dtype) for s in shapes]
    bs, k = expert_ids.shape
    ids = expert_ids.long()
    # MC2 wants each row's expert ids distinct and valid, masked slots included (what _fill_empty_slots ensures).
    sorted_ids = torch.sort(ids, dim=1).values
    if k > 1 and (sorted_ids[:, 1:] == sorted_ids[:, :-1]).any() or ((ids < 0) | (ids >= moe_expert_num)).any():
        raise RuntimeError("npu_moe_distribute_dispatch_v2: expert_ids must be distinct valid experts per row")
    active = torch.ones(bs, k, dtype=torch.bool)
    if x_active_mask is not None:
        active = x_active_mask.bool() if x_active_mask.dim() == 2 else x_active_mask.bool().unsqueeze(1).expand(bs, k)
    local = moe_expert_num  # one rank owns every expert
    counts = torch.zeros(local, dtype=torch.int64)
    row = 0
    assist = out[2]
    for e in range(local):
        for t in range(bs):
            for s in range(k):
                if active[t, s] and ids[t, s] == e:
                    out[0][row] = x[t]
                    assist[3 * row : 3 * row + 3] = torch.tensor([0, t, s], dtype=torch.int32)
                    if expert_scales is not None:  # each received row's expert_scales entry, as FP32
                        out[6][row] = expert_scales[t, s].float()
                    counts[e] += 1
                    row += 1
    out[3][:] = counts if expert_token_nums_type == 1 else torch.cumsum(counts, 0)
    out[4][:] = torch.cumsum(counts, 0).to(torch.int32)
    return tuple(out)


def combine_v2(
    expand_x,
    expert_ids,
    assist_info_for_combine,
    ep_send_counts,
    expert_scales,
    group_ep,
    ep_world_size,
    ep_rank_id,
    moe_expert_num,
    *,
    tp_send_counts=None,
    x_active_mask=None,
    expand_scales=None,
    shared_expert_x=None,
    elastic_info=None,
    ori_x=None,
    const_expert_alpha_1=None,
    const_expert_alpha_2=None,
    const_expert_v=None,
    performance_info=None,
    group_tp="",
    tp_world_size=0,
    tp_rank_id=0,
    expert_shard_type=0,
    shared_expert_num=1,
    shared_expert_rank_num=0,
    global_bs=0,
    comm_quant_mode=0,
    comm_alg="",
    zero_expert_num=0,
    copy_expert_num=0,
    const_expert_num=0,
):
    assert ep_world_size == 1 and shared_expert_x is None and comm_quant_mode == 0
    assert tp_send_counts is None and expand_scales is None, "no TP, no A2 expand_scales in our calls"
    bs, k = expert_ids.shape
    rows = int(ep_send_counts[moe_expert_num - 1]) if moe_expert_num else 0  # inclusive sums: the last is the total
    row_of = torch.full((bs, k), -1, dtype=torch.int64)
    for j in range(rows):
        _, t, s = assist_info_for_combine[3 * j : 3 * j + 3].tolist()
        row_of[t, s] = j
    out = torch.zeros(bs, expand_x.shape[1], dtype=torch.float32)
    for s in range(k):
        ok = (row_of[:, s] >= 0).unsqueeze(1)
        term = expert_scales[:, s : s + 1].float() * expand_x[row_of[:, s].clamp(min=0)].float()
        out += torch.where(ok, term, 0)
    return out.to(expand_x.dtype)


def lightning_indexer(
    query,
    key,
    weights,
    *,
    actual_seq_lengths_query=None,
    actual_seq_lengths_key=None,
    block_table=None,
    layout_query="BSND",
    layout_key="BSND",
    sparse_count=2048,
    sparse_mode=3,
    pre_tokens=9223372036854775807,
    next_tokens=9223372036854775807,
    return_value=False,
):
    assert block_table is None and layout_query == layout_key and sparse_mode in (0, 3)
    if layout_query == "BSND":  # [B, S1, N1, D], key [B, S2, 1, D], weights [B, S1, N1]
        b, s1, s2 = query.shape[0], query.shape[1], key.shape[1]
        q, kk, w = query.flatten(0, 1), key.flatten(0, 1), weights.flatten(0, 1)
        assert actual_seq_lengths_query is None and actual_seq_lengths_key is None, "full BSND rows only"
        cq, ck_ = torch.arange(b + 1) * s1, torch.arange(b + 1) * s2
    else:  # TND: cumulative lengths
        q, kk, w = query, key, weights
        cq = torch.cat([torch.zeros(1, dtype=torch.int64), actual_seq_lengths_query.long()])
        ck_ = torch.cat([torch.zeros(1, dtype=torch.int64), actual_seq_lengths_key.long()])
    assert kk.shape[1] == 1, "one key head"
    t = q.shape[0]
    idx = torch.full((t, sparse_count), -1, dtype=torch.int32)
    val = torch.full((t, sparse_count), float("-inf"), dtype=query.dtype)
    for bi in range(len(cq) - 1):
        q0, q1, k0, k1 = int(cq[bi]), int(cq[bi + 1]), int(ck_[bi]), int(ck_[bi + 1])
        if q1 == q0 or k1 == k0:
            continue
        scores = torch.einsum("ihd,jd->ihj", q[q0:q1].float(), kk[k0:k1, 0].float()).relu_()
        logits = torch.einsum("ihj,ih->ij", scores, w[q0:q1].float())
        i = torch.arange(q1 - q0).unsqueeze(1)
        j = torch.arange(k1 - k0).unsqueeze(0)
        visible = j <= (k1 - k0) - (q1 - q0) + i if sparse_mode == 3 else torch.ones_like(j, dtype=torch.bool)
        logits = torch.where(visible, logits, float("-inf"))
        order = torch.sort(-logits.double(), dim=1, stable=True).indices[:, :sparse_count]
        n = visible.sum(1, keepdim=True)
        keep = torch.arange(order.shape[1]).unsqueeze(0) < n
        width = order.shape[1]
        idx[q0:q1, :width] = torch.where(keep, order, -1).to(torch.int32)
        val[q0:q1, :width] = torch.where(keep, logits.gather(1, order), float("-inf")).to(query.dtype)
    shape = [*query.shape[:-2], 1, sparse_count]
    values = val.view(shape) if return_value else query.new_empty(0)
    return idx.view(shape), values


def mhc_pre(x, phi, alpha, bias, *, gamma=None, norm_eps=1e-6, hc_eps=1e-6, out_flag=0, inner_precise=0):
    assert x.dim() == 3 and gamma is None
    t, n, d = x.shape
    flat = x.reshape(t, n * d).float()
    h_mix = flat @ phi.float().t()
    inv_rms = torch.rsqrt(flat.square().mean(1) + norm_eps)
    res = (t, n, n) if alpha.numel() == 3 else (1,)
    return (
        x.new_zeros(t, d),
        torch.zeros(t, n),
        torch.zeros(res),
        inv_rms,
        h_mix,
        torch.zeros(t, n),
    )


def register() -> None:
    """Register the references (once per process)."""
    global _REGISTERED
    if _REGISTERED:
        return
    load()
    cpu_reference("npu_moe_distribute_dispatch_v2")(dispatch_v2)
    cpu_reference("npu_moe_distribute_combine_v2")(combine_v2)
    cpu_reference("npu_lightning_indexer")(lightning_indexer)
    cpu_reference("npu_mhc_pre")(mhc_pre)
    _REGISTERED = True
