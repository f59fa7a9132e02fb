"""The Triton kernel behind ``sparse_mla_prefill`` on CUDA: one program per (query token, block of ``BH`` heads),
an online softmax over the token's top-k in blocks of ``BK`` positions. Each block loads its indices, leaves out
the invalid ones (``< 0``, ``>= s_kv``, position ``>= topk_length[i]``), gathers the selected KV rows (0 for rows
left out: NaN in a row nobody selects never enters), forms the ``[BH, BK]`` logits in one dot per ``BD`` columns
of ``d_qk``, and adds ``exp(logit - running max) @ V`` (V: the rows' first ``d_v`` columns) to an FP32
accumulator rescaled as the max grows. Nothing of size ``[s_q, s_kv]`` or ``[s_q, topk, d]`` exists.

Numerics (the op's definition): logits ``sm_scale * q.k`` in FP32 (a BF16/FP16 dot on the GPU: the products are
exact in FP32; an IEEE FP32 dot for FP32 and in the interpreter), the weights in FP32, ``P @ V`` in FP32: 16-bit V
is exact in TF32, so on the GPU P is split into a TF32 head and its tail and each meets V in a TF32 tensor-core dot
(about FP32's precision, not FlashMLA's BF16-rounded P); FP32 V takes an IEEE FP32 dot. One rounding to q's dtype.
``out = acc / (total + exp(sink - m))`` (``total``: the sum of ``exp(logit - m)``), so a -inf sink is exactly no
sink and a +inf sink gives 0. A token with no row: out 0, lse +inf, max_logits -inf.
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.cuda._triton import INTERPRETED, device_refusal, div_rn, launch, store_result, tl, triton

BLOCK_K = 32  # top-k positions per step
BLOCK_D = 64  # d_qk columns per logits dot


def refusal(q: torch.Tensor) -> str | None:
    """Why the kernel does not run here, or None (BF16 dots need sm80+; the interpreter on CPU tensors)."""
    return device_refusal(q.device, (8, 0))


def heads_block(h: int, bdv: int) -> int:
    """Heads per program: a power of two, at least 16 rows per dot, at most 64 and at most 8192 accumulator
    elements (the FP32 ``[BH, d_v]`` accumulator lives in registers: 16 heads for d_v 512)."""
    return max(16, min(64, triton.next_power_of_2(h), 8192 // bdv))


def sparse_mla_prefill(q, kv, indices, sm_scale, d_v, attn_sink, topk_length):
    """``(out [s_q, h_q, d_v], max_logits, lse [s_q, h_q] FP32)`` of a call the op's meta accepted, s_q, h_q, s_kv
    and topk nonzero, q not FP64."""
    s_q, h, d = q.shape
    out = q.new_empty(s_q, h, d_v)
    max_logits = q.new_empty(s_q, h, dtype=torch.float32)
    lse = q.new_empty(s_q, h, dtype=torch.float32)
    bdv = max(16, triton.next_power_of_2(d_v))
    bh = heads_block(h, bdv)
    sixteen_bit = q.dtype in (torch.bfloat16, torch.float16)
    launch(
        _prefill_kernel,
        (s_q, triton.cdiv(h, bh)),
        q,
        kv,
        indices,
        attn_sink if attn_sink is not None else lse,
        topk_length if topk_length is not None else indices,
        out,
        max_logits,
        lse,
        float(sm_scale),
        h,
        d,
        d_v,
        kv.shape[0],
        indices.shape[2],
        q.stride(0),
        q.stride(1),
        q.stride(2),
        kv.stride(0),
        kv.stride(2),
        indices.stride(0),
        indices.stride(2),
        attn_sink.stride(0) if attn_sink is not None else 0,
        topk_length.stride(0) if topk_length is not None else 0,
        out.stride(0),
        out.stride(1),
        max_logits.stride(0),
        HAS_SINK=attn_sink is not None,
        HAS_LENGTH=topk_length is not None,
        # Triton's interpreter (3.9) gets BF16 dots wrong (see _mqa): interpreted, both dots take FP32 copies (the
        # same exact products; the GPU forms are tested interpreted on FP16, which it gets right).
        DOT_16BIT=sixteen_bit and not INTERPRETED,
        PV_SPLIT=sixteen_bit and not INTERPRETED,
        OUT_BF16=q.dtype == torch.bfloat16,
        BH=bh,
        BK=BLOCK_K,
        BD=max(16, min(BLOCK_D, triton.next_power_of_2(d))),
        BDV=bdv,
        num_warps=8 if bh * bdv >= 8192 else 4,
    )
    return out, max_logits, lse


@triton.jit
def _no_inf(m):
    """The softmax's shift for a running max ``m``: ``m``, or 0 where it is infinite (torch.logsumexp's guard)."""
    return tl.where(tl.abs(m) == float("inf"), 0.0, m)


@triton.jit
def _prefill_kernel(
    q,
    kv,
    indices,
    sink,
    lengths,
    out,
    max_logits,
    lse,
    sm_scale,
    H,
    D,
    DV,
    S_KV,
    TOPK,
    s_qi,
    s_qh,
    s_qd,
    s_kvj,
    s_kvd,
    s_ii,
    s_ik,
    s_sh,
    s_li,
    s_oi,
    s_oh,
    s_mi,
    HAS_SINK: tl.constexpr,
    HAS_LENGTH: tl.constexpr,
    DOT_16BIT: tl.constexpr,
    PV_SPLIT: tl.constexpr,
    OUT_BF16: tl.constexpr,
    BH: tl.constexpr,
    BK: tl.constexpr,
    BD: tl.constexpr,
    BDV: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1) * BH + tl.arange(0, BH)
    head_ok = head < H
    q_rows = q + i * s_qi + head.to(tl.int64) * s_qh  # [BH]
    cols_v = tl.arange(0, BDV)
    n = TOPK
    if HAS_LENGTH:  # positions past topk_length[i] are left out: the loop stops there
        n = tl.minimum(tl.load(lengths + i * s_li), TOPK)
    m = tl.full([BH], float("-inf"), tl.float32)  # running max of the logits (NaN once one is NaN)
    total = tl.zeros([BH], tl.float32)  # running sum of exp(logit - shift)
    acc = tl.zeros([BH, BDV], tl.float32)  # running sum of exp(logit - shift) * V
    seen = tl.zeros([BK], tl.int32)  # valid rows, to tell a token with none
    for start in range(0, n, BK):
        pos = start + tl.arange(0, BK)
        idx = tl.load(indices + i * s_ii + pos * s_ik, mask=pos < n, other=-1)
        valid = (pos < n) & (idx >= 0) & (idx < S_KV)
        seen += valid.to(tl.int32)
        rows = kv + tl.where(valid, idx, 0).to(tl.int64) * s_kvj  # [BK]
        s = tl.zeros([BH, BK], tl.float32)
        for d0 in range(0, D, BD):
            cols = d0 + tl.arange(0, BD)
            qc = tl.load(q_rows[:, None] + cols[None, :] * s_qd, mask=head_ok[:, None] & (cols[None, :] < D), other=0)
            kc = tl.load(rows[:, None] + cols[None, :] * s_kvd, mask=valid[:, None] & (cols[None, :] < D), other=0)
            if DOT_16BIT:
                s = tl.dot(qc, tl.trans(kc), s)
            else:
                s = tl.dot(qc.to(tl.float32), tl.trans(kc.to(tl.float32)), s, input_precision="ieee")
        s = tl.where(valid[None, :], s * sm_scale, float("-inf"))
        # tl.max may drop NaN on the GPU (maxnum): a NaN logit makes the max NaN, as torch's amax does.
        has_nan = tl.max((s != s).to(tl.int32), axis=1) > 0
        m_new = tl.maximum(m, tl.where(has_nan, float("nan"), tl.max(s, axis=1)), propagate_nan=tl.PropagateNan.ALL)
        shift = _no_inf(m_new)
        # Nothing summed yet while m is -inf (total and acc are 0): no rescale, whose exp could overflow.
        alpha = tl.where(m == float("-inf"), 0.0, tl.exp(_no_inf(m) - shift))
        p = tl.exp(s - shift[:, None])  # 0 for the rows left out
        v = tl.load(rows[:, None] + cols_v[None, :] * s_kvd, mask=valid[:, None] & (cols_v[None, :] < DV), other=0)
        if PV_SPLIT:  # P = head (its top 11 significant bits: a TF32 value) + tail (exact), V exact in TF32
            head_p = (p.to(tl.uint32, bitcast=True) & 0xFFFFE000).to(tl.float32, bitcast=True)
            pv = tl.dot(head_p, v.to(tl.float32), input_precision="tf32")
            pv = tl.dot(p - head_p, v.to(tl.float32), pv, input_precision="tf32")
        else:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        acc = acc * alpha[:, None] + pv
        total = total * alpha + tl.sum(p, axis=1)
        m = m_new
    shift = _no_inf(m)
    denom = total
    if HAS_SINK:  # exp(L - shift) with L = logaddexp(lse, sink)
        denom = total + tl.exp(tl.load(sink + head * s_sh, mask=head_ok, other=0.0) - shift)
    # total == 0: no valid row, or all of its logits are -inf: every weight is 0 (also with a NaN sink)
    o = tl.where(total[:, None] == 0, 0.0, div_rn(acc, denom[:, None]))
    lonely = tl.sum(seen) == 0
    o_ptr = out + i * s_oi + head.to(tl.int64)[:, None] * s_oh + cols_v[None, :]
    store_result(o_ptr, o, head_ok[:, None] & (cols_v[None, :] < DV), OUT_BF16)
    row = i * s_mi + head
    tl.store(max_logits + row, m, mask=head_ok)
    tl.store(lse + row, tl.where(lonely, float("inf"), shift + tl.log(total)), mask=head_ok)


__all__ = ["BLOCK_D", "BLOCK_K", "heads_block", "refusal", "sparse_mla_prefill"]
