"""Benchmark cases of the fp8_gemm family against ``torch.mm``/``bmm``/``einsum`` in FP32 on the same logical shapes.

FP32 is the baseline because it is what the CPU multiplies in: the op dequantizes panels of the
low-precision operands and runs SGEMM on them (issue target: within 1.5x of the FP32 ``torch.mm``).
"""

from __future__ import annotations

import torch

from torch_ascend_moe import quant
from torch_ascend_moe.bench import Case
from torch_ascend_moe.ops.fp8_gemm import fp8_bmm, fp8_einsum, fp8_gemm


def _fp8_token(x):  # FP8 1x128 blocks (per token), FP32 scales
    return (*quant.per_token_cast_to_fp8(x, False, 128), [1, 128])


def _fp8_token_ue8m0(x):  # FP8 1x128, power-of-two (UE8M0) scales
    return (*quant.per_token_cast_to_fp8(x, True, 128), [1, 128])


def _fp8_block(x):  # FP8 128x128 blocks (weights)
    return (*quant.per_block_cast_to_fp8(x, False, 128), [128, 128])


def _fp4(x):  # FP4 (E2M1, packed as uint8) 1x32 blocks, UE8M0 scales
    data, sf = quant.per_token_cast_to_fp4(x, True, gran_k=32)
    return data.view(torch.uint8), sf, [1, 32]


# (name, cast of a, cast of b): each cast returns (data, FP32 scales, recipe)
_FORMATS = [
    ("fp8-1x128 x fp8-128x128", _fp8_token, _fp8_block),
    ("fp8-1x128 x fp8-1x128 ue8m0", _fp8_token_ue8m0, _fp8_token_ue8m0),
    ("fp8-1x128 x fp4-1x32", _fp8_token_ue8m0, _fp4),
    ("fp4-1x32 x fp4-1x32", _fp4, _fp4),
]


def _case(m, n, k, fmt_index=0) -> Case:
    name, cast_a, cast_b = _FORMATS[fmt_index]

    def setup():
        x, w = torch.randn(m, k), torch.randn(n, k)
        a, sfa, ra = cast_a(x)
        b, sfb, rb = cast_b(w)
        xf, wf = x.clone(), w.clone()
        return (lambda: fp8_gemm(a, sfa, b, sfb, recipe_a=ra, recipe_b=rb)), (lambda: torch.mm(xf, wf.t()))

    return Case(f"fp8_gemm {m}x{n}x{k} {name}", 2 * m * n * k, setup, "torch.mm fp32")


def _bmm_case(groups, m, n, k) -> Case:
    def setup():
        x, w = torch.randn(groups, m, k), torch.randn(groups, n, k)
        a = [_fp8_token(x[i]) for i in range(groups)]
        b = [_fp8_block(w[i]) for i in range(groups)]
        a, sfa, b, sfb = (torch.stack([p[j] for p in src]) for src, j in ((a, 0), (a, 1), (b, 0), (b, 1)))
        return (lambda: fp8_bmm(a, sfa, b, sfb)), (lambda: torch.bmm(x, w.mT))

    return Case(f"fp8_bmm {groups}x{m}x{n}x{k}", 2 * groups * m * n * k, setup, "torch.bmm fp32")


def _einsum_case(b_, h, r, d) -> Case:
    eq = "bhr,hdr->bhd"

    def setup():
        x, w = torch.randn(b_, h, r), torch.randn(h, d, r)
        # Blocks of gran_mn along the output letter and gran_k along the contracted r, per head h.
        xs = [quant.block_cast_to_fp8(x[:, i], (1, 128), False) for i in range(h)]
        ws = [quant.block_cast_to_fp8(w[i], (128, 128), False) for i in range(h)]
        a, sfa = torch.stack([p[0] for p in xs], dim=1), torch.stack([p[1] for p in xs], dim=1)
        b, sfb = torch.stack([p[0] for p in ws]), torch.stack([p[1] for p in ws])
        return (lambda: fp8_einsum(eq, a, sfa, b, sfb)), (lambda: torch.einsum(eq, x, w))

    return Case(f"fp8_einsum {eq} b{b_} h{h} r{r} d{d}", 2 * b_ * h * r * d, setup, "torch.einsum fp32")


def cases(quick: bool = False) -> list[Case]:
    if quick:
        return [_case(1, 256, 512), _case(64, 256, 512, 2), _bmm_case(2, 16, 128, 256), _einsum_case(8, 2, 256, 128)]
    return [
        _case(1, 2112, 7168),
        _case(16, 2112, 7168),
        _case(128, 2112, 1792),
        _case(512, 2048, 2048),
        _case(128, 2112, 1792, 1),
        _case(128, 2112, 1792, 2),
        _case(128, 2112, 1792, 3),
        _bmm_case(8, 64, 512, 1024),
        _einsum_case(64, 8, 1024, 512),
    ]
