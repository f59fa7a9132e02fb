"""Sample inputs, the FP64 reference, bad inputs and the harness spec of ``mega_moe`` (single process; the
expert-parallel form is checked on spawned ranks, ``tests.distributed.mega_moe_bodies``), and the unfused
pipeline of our separate ops that tests/mega_moe compares the op with bitwise.

The reference follows the op's definition step by step in FP64 with its rounding points (BF16 after L1, after
the activation in BF16 mode, after L2 and after the combine; FP8 mode: per-32 UE8M0 requantization of the
activation; SM90's block-scaled mode: L1 unrounded, per-64 FP32 requantization, written from
specs/upstream_2609.md §5.2), dequantizing FP8 / FP4 operands exactly; it differs from the kernel only by
FP32-vs-FP64 accumulation inside the GEMMs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torch_ascend_moe.backends.portable import mega_moe as portable
from torch_ascend_moe.ops.quant import quantize_fp8
from torch_ascend_moe.quant import cast_back_from_fp4, per_token_cast_to_fp4, per_token_cast_to_fp8
from torch_ascend_moe.testing.harness import FP8_TENSOR_CORES, BadInput, OpSpec, SampleInput

# (T, H, I, E, K, clamp, mode, I_s: the fused shared experts' intermediate size, 0 = none); mode "bf16", "fp4"
# (FP8 x FP4, 1x32) or "block" (SM90's FP8 x FP8: 1x128 x, 128x128-block weights)
_CASES = [
    (9, 64, 32, 4, 2, None, "bf16", 0),
    (7, 64, 64, 3, 3, 0.5, "bf16", 32),
    (8, 64, 32, 4, 2, 1.0, "fp4", 64),
    (0, 64, 32, 2, 2, None, "bf16", 32),
    (6, 256, 128, 3, 2, 2.0, "block", 0),
]
GRAD_POSITIONS = (0, 3, 4, 6, 8, 10)  # x, topk_weights, l1, l2, shared l1, shared l2


def fp4_experts(w: torch.Tensor):
    """Per-expert FP4 (1x32 UE8M0) of ``w [E, N, K]``: (uint8 [E, N, K/2], FP32 [E, N, K/32])."""
    packed, scales = zip(*(per_token_cast_to_fp4(w[e].float(), use_ue8m0=True, gran_k=32) for e in range(w.shape[0])))
    return torch.stack(packed).view(torch.uint8), torch.stack(scales)


def samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(60)
    out = []
    for t, h, inter, e, k, clamp, mode, shared in _CASES:
        fp8 = mode != "bf16"
        x = torch.randn(t, h, generator=g)
        idx = (
            torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
            if t
            else torch.zeros(0, k, dtype=torch.long)
        )
        if t:
            idx[torch.rand(t, k, generator=g) < 0.2] = -1
        w = torch.rand(t, k, generator=g)
        l1 = torch.randn(e, 2 * inter, h, generator=g) * h**-0.5
        l2 = torch.randn(e, h, inter, generator=g) * inter**-0.5
        shared_args = (None,) * 4
        if shared:
            sl1 = torch.randn(2 * shared, h, generator=g) * h**-0.5
            sl2 = torch.randn(h, shared, generator=g) * shared**-0.5
            if fp8:
                (q1, f1), (q2, f2) = (per_token_cast_to_fp8(m, use_ue8m0=True, gran_k=32) for m in (sl1, sl2))
                shared_args = (q1, f1, q2, f2)
            else:
                shared_args = (sl1.bfloat16(), None, sl2.bfloat16(), None)
        if mode == "block":
            xq, xsf = quantize_fp8(x, (1, 128), use_ue8m0=False)
            (w1, s1), (w2, s2) = block_experts(l1), block_experts(l2)
            args = (xq, xsf, idx, w, w1, s1, w2, s2, *shared_args)
        elif fp8:
            xq, xsf = per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32)
            (w1, s1), (w2, s2) = fp4_experts(l1), fp4_experts(l2)
            args = (xq, xsf, idx, w, w1, s1, w2, s2, *shared_args)
        else:
            args = (x.bfloat16(), None, idx, w, l1.bfloat16(), None, l2.bfloat16(), None, *shared_args)
        args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)
        if requires_grad and not fp8:
            for i in GRAD_POSITIONS:
                if args[i] is not None:
                    args[i].requires_grad_()
        label = {"bf16": "BF16", "fp4": "FP8xFP4", "block": "FP8xFP8 128-blocks"}[mode]
        name = f"T{t} H{h} I{inter} E{e} top-{k} {label} clamp={clamp} shared I_s={shared}"
        out.append(SampleInput((*args, None, clamp), name))
    return out


def block_experts(w: torch.Tensor):
    """Per-expert FP8 of ``w [E, N, K]`` with an FP32 scale per 128x128 block: (E4M3, FP32 [E, N/128, K/128])."""
    q, sf = zip(*(quantize_fp8(w[e].float(), (128, 128), use_ue8m0=False) for e in range(w.shape[0])))
    return torch.stack(q), torch.stack(sf)


def _dequant(w, sf):
    if sf is None:
        return w.detach().double()
    if w.dtype == torch.float8_e4m3fn:  # 128x128 blocks
        return w.double() * sf.double().repeat_interleave(128, dim=1).repeat_interleave(128, dim=2)
    return torch.stack(
        [cast_back_from_fp4(w[e].view(torch.int8), sf[e], gran_k=32) for e in range(w.shape[0])]
    ).double()


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).double()


def _deq_rows(w, sf):
    """FP8 ``[N, K]`` with 1x32 (or 1x128) scales, or BF16, in FP64."""
    w = w.detach().double()
    return w if sf is None else w * sf.double().repeat_interleave(w.shape[1] // sf.shape[1], dim=1)


def _expert(xd, w1, w2, weight, activation_clamp, fp8, block=False):
    """One token through one expert in FP64 with the op's rounding points: ``bf16(L2(q(act)))``."""
    inter = w1.shape[0] // 2
    hidden = xd @ w1.T if block else _bf16(xd @ w1.T)
    gate, up = hidden[:inter], hidden[inter:]
    if activation_clamp is not None:
        gate, up = gate.clamp(max=activation_clamp), up.clamp(-activation_clamp, activation_clamp)
    act = F.silu(gate) * up * weight
    if block:  # per 64: FP32 scale max(amax, 1e-4) / 448, not a power of two
        groups = act.float().view(-1, 64)
        sf = groups.abs().amax(dim=1, keepdim=True).clamp(min=1e-4) / 448
        act = ((groups / sf).to(torch.float8_e4m3fn).double() * sf.double()).view(-1)
    elif fp8:
        q, sf = per_token_cast_to_fp8(act.float().view(1, -1), use_ue8m0=True, gran_k=32)
        act = q.double() * sf.double().repeat_interleave(32, dim=1)
    else:
        act = _bf16(act)
    return _bf16(act.view(-1) @ w2.T)


def reference(args):
    """fp64 per token: each routed expert's clamped SwiGLU x weight, plus the shared experts' (weight 1)."""
    x, x_sf, topk_idx, topk_weights = args.x, args.x_sf, args.topk_idx, args.topk_weights
    l1, l1_sf, l2, l2_sf = args.l1_weights, args.l1_sf, args.l2_weights, args.l2_sf
    shared_l1, shared_l1_sf = args.shared_l1_weights, args.shared_l1_sf
    shared_l2, shared_l2_sf = args.shared_l2_weights, args.shared_l2_sf
    activation_clamp = args.activation_clamp
    fp8 = x.dtype == torch.float8_e4m3fn
    block = fp8 and l1.dtype == torch.float8_e4m3fn and x_sf.shape[1] * 128 == x.shape[1]
    xd = _deq_rows(x, x_sf)
    w1, w2 = _dequant(l1, l1_sf), _dequant(l2, l2_sf)
    t, h = x.shape
    y = torch.zeros(t, h, dtype=torch.float64)
    counts = torch.zeros(w1.shape[0], dtype=torch.int32)
    for i in range(t):
        if shared_l1 is not None:
            sw1, sw2 = _deq_rows(shared_l1, shared_l1_sf), _deq_rows(shared_l2, shared_l2_sf)
            y[i] += _expert(xd[i], sw1, sw2, 1.0, activation_clamp, fp8)
        for j in range(topk_idx.shape[1]):
            e = int(topk_idx[i, j])
            if e < 0:
                continue
            counts[e] += 1
            y[i] += _expert(xd[i], w1[e], w2[e], float(topk_weights[i, j]), activation_clamp, fp8, block)
    return _bf16(y), counts


_ARG_NAMES = (
    "x",
    "x_sf",
    "topk_idx",
    "topk_weights",
    "l1_weights",
    "l1_sf",
    "l2_weights",
    "l2_sf",
    "shared_l1_weights",
    "shared_l1_sf",
    "shared_l2_weights",
    "shared_l2_sf",
    "group_name",
    "activation_clamp",
)


def bad_inputs(device) -> list[BadInput]:
    x, idx, w = torch.randn(4, 64).bfloat16(), torch.tensor([[0, 1], [1, -1], [0, 1], [1, 0]]), torch.rand(4, 2)
    l1, l2 = torch.randn(2, 64, 64).bfloat16(), torch.randn(2, 64, 32).bfloat16()
    s1, s2 = torch.randn(64, 64).bfloat16(), torch.randn(64, 32).bfloat16()
    good = dict(x=x, topk_idx=idx, topk_weights=w, l1_weights=l1, l2_weights=l2)

    def bad(match, name, data_dependent=False, **changed):
        values = {**good, **changed}
        return BadInput(tuple(values.get(n) for n in _ARG_NAMES), match, name, data_dependent=data_dependent)

    xq, xsf = per_token_cast_to_fp8(x.float(), use_ue8m0=True, gran_k=32)
    (w1, f1), (w2, f2) = fp4_experts(l1.float()), fp4_experts(l2.float())
    fp8 = dict(x=xq, x_sf=xsf, l1_weights=w1, l1_sf=f1, l2_weights=w2, l2_sf=f2)
    xb, xbsf = quantize_fp8(torch.randn(4, 128), (1, 128), use_ue8m0=False)
    (b1, g1), (b2, g2) = block_experts(torch.randn(2, 256, 128)), block_experts(torch.randn(2, 128, 128))
    block = dict(x=xb, x_sf=xbsf, l1_weights=b1, l1_sf=g1, l2_weights=b2, l2_sf=g2)
    return [
        bad(
            r"argument 'l2_sf' shape: expected \[2, 1, 1\], got \[2, 128, 4\]",
            "1x32 L2 scales with 128x128-block L1 scales",
            **{**block, "l2_sf": torch.ones(2, 128, 4)},
        ),
        bad(
            r"argument 'shared_l1_weights' value: expected None with 128x128-block FP8 weights",
            "shared experts in the block-scaled mode",
            shared_l1_weights=torch.zeros(256, 128, dtype=torch.float8_e4m3fn),
            shared_l2_weights=torch.zeros(128, 128, dtype=torch.float8_e4m3fn),
            **block,
        ),
        bad(
            r"argument 'x_sf' shape: expected \[4, 4\] \(or \[4, 1\] with 128x128-block FP8 weights\), got \[4, 2\]",
            "x_sf of neither width",
            **{**block, "x_sf": torch.ones(4, 2)},
        ),
        bad(
            r"argument 'l1_weights' size\(1\) / 2 \(I\): expected a multiple of 128 with 128x128 blocks, got 64",
            "I not a multiple of 128",
            **{**block, "l1_weights": b1[:, :128], "l2_weights": b2[:, :, :64]},
        ),
        bad(r"argument 'x' dtype: expected torch.bfloat16 or", "x dtype", x=x.float()),
        bad(r"argument 'l1_weights' size\(1\) \(2I\)", "odd 2I", l1_weights=l1[:, :63]),
        bad(r"argument 'l2_weights' shape: expected \[2, 64, 32\]", "l2", l2_weights=l2[:, :, :16]),
        bad(r"argument 'topk_weights' shape: expected \[4, 2\]", "w", topk_weights=w[:, :1]),
        bad(r"argument 'topk_idx' size\(0\) \(T\): expected 4", "T", topk_idx=idx[:3]),
        bad(r"argument 'activation_clamp' value: expected None or >= 0", "clamp", activation_clamp=-1.0),
        bad(r"argument 'x_sf' value: expected None with a BF16 x", "x_sf", x_sf=torch.ones(4, 2)),
        bad(
            r"argument 'topk_idx' values: expected expert ids in \[-1, 2\), got 2",
            "id >= E",
            data_dependent=True,
            topk_idx=idx + 1,
        ),
        bad(
            r"argument 'shared_l2_weights' value: expected a tensor when shared_l1_weights is given",
            "shared l1 without l2",
            shared_l1_weights=s1,
        ),
        bad(
            r"argument 'shared_l2_weights' shape: expected \[64, 32\], got \[64, 16\]",
            "shared l2 shape",
            shared_l1_weights=s1,
            shared_l2_weights=s2[:, :16],
        ),
        bad(
            r"argument 'shared_l1_weights' dtype: expected torch.float8_e4m3fn with an FP8 x",
            "BF16 shared weights with FP8 x",
            shared_l1_weights=s1,
            shared_l2_weights=s2,
            **fp8,
        ),
        bad(
            r"argument 'shared_l1_sf' value: expected None with BF16 weights",
            "shared scales in BF16 mode",
            shared_l1_weights=s1,
            shared_l2_weights=s2,
            shared_l1_sf=torch.ones(64, 2),
        ),
    ]


SPECS = [
    OpSpec(
        "mega_moe",
        samples,
        reference,
        bad_inputs,
        portable.mega_moe,
        dtypes=(torch.bfloat16,),
        gradcheck="BF16 by definition (it rounds to BF16 where upstream's kernel does); its gradients are checked "
        "against autograd through the unfused pipeline in tests/mega_moe",
        aoti="the kernel is Python (the unfused pipeline, optionally on torch.distributed)",
        device_thresholds=FP8_TENSOR_CORES,
    )
]


def unfused(
    x,
    x_sf,
    topk_idx,
    topk_weights,
    l1,
    l1_sf,
    l2,
    l2_sf,
    shared_l1,
    shared_l1_sf,
    shared_l2,
    shared_l2_sf,
    activation_clamp,
):
    """Upstream's test pipeline rebuilt from our separate ops (single process): permute, grouped GEMM,
    clamp + SwiGLU x weight (+ per-32 UE8M0 FP8 requantization), grouped GEMM; the shared experts as dense
    GEMMs with the same activation; unpermute with the shared row as each token's first term."""
    from torch_ascend_moe.ops.fp8_gemm import fp8_gemm
    from torch_ascend_moe.ops.gemm import bf16_gemm
    from torch_ascend_moe.ops.grouped import m_grouped_bf16_gemm, m_grouped_fp8_gemm
    from torch_ascend_moe.ops.moe_routing import moe_permute, moe_unpermute

    fp8 = x.dtype == torch.float8_e4m3fn
    e = l1.shape[0]

    def swiglu(h, weights):
        gate, up = h.float().chunk(2, dim=-1)
        if activation_clamp is not None:
            gate, up = gate.clamp(max=activation_clamp), up.clamp(-activation_clamp, activation_clamp)
        act = F.silu(gate) * up * weights
        return per_token_cast_to_fp8(act, use_ue8m0=True, gran_k=32) if fp8 else (act.bfloat16(), None)

    if fp8:
        rows, row_map, offs = moe_permute(x.view(torch.int8).view(torch.float16), topk_idx, e)
        rows = rows.view(torch.float8_e4m3fn)
        sf_rows, _, _ = moe_permute(x_sf, topk_idx, e)
        h = m_grouped_fp8_gemm(
            rows, sf_rows, l1, l1_sf, offs, recipe_a=(1, 32), recipe_b=(1, 32), out_dtype=torch.bfloat16
        )
    else:
        rows, row_map, offs = moe_permute(x, topk_idx, e)
        h = m_grouped_bf16_gemm(rows, l1, offs, out_dtype=torch.bfloat16)
    # each permuted row's weight: scatter the routing weights through row_map
    w_rows = torch.zeros(rows.shape[0], dtype=torch.float32)
    ok = row_map >= 0
    w_rows[row_map[ok].long()] = topk_weights[ok]
    q, sf = swiglu(h, w_rows.unsqueeze(1))
    if fp8:
        y = m_grouped_fp8_gemm(q, sf, l2, l2_sf, offs, recipe_a=(1, 32), recipe_b=(1, 32), out_dtype=torch.bfloat16)
    else:
        y = m_grouped_bf16_gemm(q, l2, offs, out_dtype=torch.bfloat16)
    if shared_l1 is None:
        return moe_unpermute(y, row_map)
    if fp8:
        q, sf = swiglu(fp8_gemm(x, x_sf, shared_l1, shared_l1_sf, recipe_a=(1, 32), recipe_b=(1, 32)), 1.0)
        ys = fp8_gemm(q, sf, shared_l2, shared_l2_sf, recipe_a=(1, 32), recipe_b=(1, 32))
    else:
        ys = bf16_gemm(swiglu(bf16_gemm(x, shared_l1), 1.0)[0], shared_l2)
    shared_rows = torch.arange(x.shape[0], dtype=row_map.dtype).unsqueeze(1) + y.shape[0]
    return moe_unpermute(torch.cat([y, ys]), torch.cat([shared_rows, row_map], dim=1))
