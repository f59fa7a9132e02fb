"""The Triton kernels behind the moe_routing family on CUDA: bit for bit the C++ kernels (the gating weights: up to
the order of their k-term sum).

``moe_permute`` is a device counting sort in three launches and no sort: ``_count`` adds each routed pair to its
expert's count (integer atomics: the order of the adds cannot change a count), ``_place`` gives each expert one
program that turns the counts into its aligned segment start (an in-register prefix sum) and walks the pairs in
(token, choice) order, numbering its own with a running prefix sum (the C++ kernel's row order), and ``_copy_rows``
copies each routed token row to its slot. ``moe_unpermute`` is one launch: a program per (token, column block) adds
its k slots' weighted rows from zero in slot order, in FP32 (FP64 for FP64), one rounding at the end.
``moe_gating_topk`` takes the scores from ATen (the same softmax / sigmoid as the C++ kernel: exp is not bit-
portable between Triton and ATen) and does the rest in one launch, a program per token: the bias, group scores, kept
groups, the top-k by repeated arg-max (torch's stable descending order: NaN first, -0.0 equal to 0.0, ties to the
lower index), the weights, their renormalisation and scaling. No host read anywhere: each op is capturable.
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.cuda._triton import device_refusal, div_rn, launch, round_to_bf16, tl, triton

MAX_EXPERTS = 4096  # one program holds every expert of a token (gating) or every expert's count (permute)
_MIN_CAPABILITY = (8, 0)  # integer atomics and scans; nothing FP8


def refusal(t: torch.Tensor, experts: int) -> str | None:
    """Why the routing kernels do not take a call, or None: one program holds a token's experts."""
    if experts > MAX_EXPERTS:
        return f"{experts} experts (one program holds at most {MAX_EXPERTS})"
    return device_refusal(t.device, _MIN_CAPABILITY)


# --- moe_permute -------------------------------------------------------------------------------------------------


@triton.jit
def _count(ids, counts, N, E, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    e = tl.load(ids + i, mask=i < N, other=-1)
    routed = (e >= 0) & (e < E)  # ids outside [0, E) only get here unchecked (capture): they route nowhere
    tl.atomic_add(counts + e, 1, mask=routed)


@triton.jit
def _place(ids, counts, row_map, offs, N, E, ALIGN, BLOCK: tl.constexpr, BLOCK_E: tl.constexpr):
    expert = tl.program_id(0)
    all_e = tl.arange(0, BLOCK_E)
    c = tl.load(counts + all_e, mask=all_e < E, other=0)
    aligned = (c + ALIGN - 1) // ALIGN * ALIGN
    # Segment e starts at the previous end rounded up to the alignment: the sum of the aligned counts before it.
    start = tl.sum(tl.where(all_e < expert, aligned, 0), 0)
    count = tl.sum(tl.where(all_e == expert, c, 0), 0)
    tl.store(offs + expert, (start + count).to(tl.int32))
    next_row = start
    for c0 in range(0, N, BLOCK):
        i = c0 + tl.arange(0, BLOCK)
        mine = tl.load(ids + i, mask=i < N, other=-1) == expert
        rank = tl.cumsum(mine.to(tl.int32), 0)
        tl.store(row_map + i, (next_row + rank - 1).to(tl.int32), mask=mine)
        next_row += tl.sum(mine.to(tl.int32), 0)


@triton.jit
def _copy_rows(x, row_map, out, K, H, x_s0, x_s1, BLOCK_H: tl.constexpr):
    pair = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    row = tl.load(row_map + pair) + tl.zeros_like(h)  # a vector: the interpreter masks with vectors only
    keep = (h < H) & (row >= 0)
    token = (pair // K).to(tl.int64)
    v = tl.load(x + token * x_s0 + h * x_s1, mask=keep)
    tl.store(out + row.to(tl.int64) * H + h, v, mask=keep)


def _block_h(h: int) -> int:
    return min(1024, triton.next_power_of_2(max(h, 1)))


def permute(x, topk_idx, num_experts: int, alignment: int, capacity: int):
    """``moe_permute``'s outputs (range checks are the caller's)."""
    t, k = topk_idx.shape
    n = t * k
    ids = topk_idx.contiguous().view(-1)
    counts = torch.zeros(num_experts, dtype=torch.int32, device=x.device)
    row_map = torch.full((t, k), -1, dtype=torch.int32, device=x.device)
    offs = torch.empty(num_experts, dtype=torch.int32, device=x.device)
    out = x.new_zeros(capacity, x.shape[1])
    if n:
        launch(_count, (triton.cdiv(n, 1024),), ids, counts, n, num_experts, BLOCK=1024)
    block_e = triton.next_power_of_2(num_experts)
    launch(_place, (num_experts,), ids, counts, row_map, offs, n, num_experts, alignment, BLOCK=1024, BLOCK_E=block_e)
    h = x.shape[1]
    if n and h:
        bh = _block_h(h)
        launch(_copy_rows, (n, triton.cdiv(h, bh)), x, row_map, out, k, h, x.stride(0), x.stride(1), BLOCK_H=bh)
    return out, row_map, offs


# --- moe_unpermute -----------------------------------------------------------------------------------------------


@triton.jit
def _unpermute(
    y, row_map, w, bias, out, H, K, y_s0, y_s1, rm_s0, rm_s1, w_s0, w_s1, b_s0, b_s1, HAS_W: tl.constexpr,
    HAS_BIAS: tl.constexpr, F64: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    acc = tl.zeros([BLOCK_H], dtype=tl.float64 if F64 else tl.float32)
    if HAS_BIAS:  # the sum starts from the bias (one rounding for bias and slots together; a -0.0 bias kept)
        acc = tl.load(bias + t * b_s0 + h * b_s1, mask=h < H, other=0.0).to(acc.dtype)
    for j in range(K):
        row = tl.load(row_map + t * rm_s0 + j * rm_s1) + tl.zeros_like(h)  # a vector, as the interpreter masks
        routed = row >= 0
        v = tl.load(y + row.to(tl.int64) * y_s0 + h * y_s1, mask=(h < H) & routed, other=0.0).to(acc.dtype)
        if HAS_W:
            v = tl.load(w + t * w_s0 + j * w_s1).to(acc.dtype) * v
        # The select between the product and the sum keeps them two roundings (no FMA), as the C++ kernel; a -1
        # slot adds nothing (its NaN weight dropped, a -0.0 bias left -0.0).
        acc = tl.where(routed, acc + tl.where(routed, v, 0.0), acc)
    if out.dtype.element_ty == tl.bfloat16:
        res = round_to_bf16(acc.to(tl.float32))
    else:
        res = acc.to(out.dtype.element_ty)
    tl.store(out + t * H + h, res, mask=h < H)


def unpermute(y, row_map, topk_weights, bias=None):
    """``moe_unpermute``'s output (range checks are the caller's)."""
    t, k = row_map.shape
    h = y.shape[1]
    out = y.new_empty(t, h)
    if t and h:
        w = topk_weights if topk_weights is not None else row_map  # an unread placeholder
        b = bias if bias is not None else row_map
        bh = _block_h(h)
        launch(
            _unpermute,
            (t, triton.cdiv(h, bh)),
            y,
            row_map,
            w,
            b,
            out,
            h,
            k,
            y.stride(0),
            y.stride(1),
            row_map.stride(0),
            row_map.stride(1),
            w.stride(0),
            w.stride(1),
            b.stride(0),
            b.stride(1),
            HAS_W=topk_weights is not None,
            HAS_BIAS=bias is not None,
            F64=y.dtype == torch.float64,
            BLOCK_H=bh,
        )
    return out


# --- moe_gating_topk ---------------------------------------------------------------------------------------------


@triton.jit
def _descending_key(v):
    """int64 keys in torch's descending-sort order of FP32 ``v``: NaN above +inf (every NaN equal), -0.0 equal to
    0.0; a larger key sorts first. Non-negative, so -1 can mark a lane no longer eligible."""
    v = tl.where(v == 0, 0.0, v)
    bits = v.to(tl.int32, bitcast=True)
    key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)  # negative floats: larger magnitude, smaller key
    key = tl.where(v != v, 0x7FFFFFFF, key)
    return key.to(tl.int64) + 0x80000000


@triton.jit
def _first_max(key, lanes, NONE: tl.constexpr):
    """The lane of ``key``'s largest value, the lowest such lane (a stable sort's first)."""
    best = tl.max(key, 0)
    return tl.min(tl.where(key == best, lanes, NONE), 0)


@triton.jit
def _gating(
    scores, bias, weights, idx, E, GROUP, NUM_GROUPS, TOPK_GROUPS, TOPK, scale,
    HAS_BIAS: tl.constexpr, GROUPED: tl.constexpr, RENORMALIZE: tl.constexpr, SCALED: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, BLOCK_E)
    valid = lanes < E
    score_row = scores + t * E
    choice = tl.load(score_row + lanes, mask=valid, other=0.0)
    if HAS_BIAS:
        choice = choice + tl.load(bias + lanes, mask=valid, other=0.0)
    key = tl.where(valid, _descending_key(choice), -1)
    kept = valid
    if GROUPED:
        group_of = lanes // GROUP
        g_lanes = tl.arange(0, BLOCK_G)
        g_key = tl.full([BLOCK_G], -1, dtype=tl.int64)
        for g in range(NUM_GROUPS):
            member = valid & (group_of == g)
            first = _first_max(tl.where(member, key, -1), lanes, BLOCK_E)
            best = tl.load(score_row + first)
            if HAS_BIAS:  # DeepSeek-V3: a group scores the sum of its best two choices
                best += tl.load(bias + first)
                if GROUP > 1:
                    second = _first_max(tl.where(member & (lanes != first), key, -1), lanes, BLOCK_E)
                    best = best + (tl.load(score_row + second) + tl.load(bias + second))
            g_key = tl.where(g_lanes == g, _descending_key(best), g_key)
        kept = lanes < 0
        for _ in range(TOPK_GROUPS):
            g = _first_max(g_key, g_lanes, BLOCK_G)
            kept = kept | (valid & (group_of == g))
            g_key = tl.where(g_lanes == g, -1, g_key)
    # Kept groups' experts first (a 1 above every key), then the others, each in choice order.
    key = tl.where(valid, key + tl.where(kept, 1 << 33, 0), -1)
    k_lanes = tl.arange(0, BLOCK_K)
    picked = tl.zeros([BLOCK_K], dtype=tl.int64)
    w = tl.zeros([BLOCK_K], dtype=tl.float32)
    total = 0.0
    for j in range(TOPK):
        e = _first_max(key, lanes, BLOCK_E)
        s = tl.load(score_row + e)
        picked = tl.where(k_lanes == j, e.to(tl.int64), picked)
        w = tl.where(k_lanes == j, s, w)
        total += s
        key = tl.where(lanes == e, -1, key)
    if RENORMALIZE:
        w = div_rn(w, total + 1e-20)
    if SCALED:
        w = w * scale
    tl.store(weights + t * TOPK + k_lanes, w, mask=k_lanes < TOPK)
    tl.store(idx + t * TOPK + k_lanes, picked, mask=k_lanes < TOPK)


def gating(scores, bias, topk, num_groups, topk_groups, renormalize, routed_scaling_factor):
    """``(weights, idx)`` from FP32 ``scores [T, E]`` (softmax or sigmoid of the logits)."""
    t, e = scores.shape
    weights = torch.empty(t, topk, dtype=torch.float32, device=scores.device)
    idx = torch.empty(t, topk, dtype=torch.int64, device=scores.device)
    if t:
        grouped = 1 < num_groups and topk_groups < num_groups
        launch(
            _gating,
            (t,),
            scores.contiguous(),
            scores if bias is None else bias.to(torch.float32).contiguous(),  # an unread placeholder without bias
            weights,
            idx,
            e,
            e // num_groups,
            num_groups,
            topk_groups,
            topk,
            float(routed_scaling_factor),
            HAS_BIAS=bias is not None,
            GROUPED=grouped,
            RENORMALIZE=bool(renormalize),
            SCALED=routed_scaling_factor != 1.0,
            BLOCK_E=triton.next_power_of_2(e),
            BLOCK_G=triton.next_power_of_2(num_groups),
            BLOCK_K=triton.next_power_of_2(topk),
        )
    return weights, idx
