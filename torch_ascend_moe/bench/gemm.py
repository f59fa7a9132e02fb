"""Benchmark cases of the gemm family against ``torch.mm``/``bmm``/``einsum`` in the same dtype.

Shapes are DeepSeek-V3 GEMMs (hidden 7168, MLA/MoE projections) scaled to what a 2-core CPU runs in
about a minute; M covers decode (1), small batches (16) and prefill (128-512).
"""

from __future__ import annotations

import torch

from torch_ascend_moe.bench import Case
from torch_ascend_moe.ops.gemm import bf16_bmm, bf16_einsum, bf16_gemm

BF16 = torch.bfloat16


def _randn(*shape, dtype=BF16):
    return torch.randn(*shape, dtype=torch.float32).to(dtype)


def _gemm_case(m, n, k, *, out_dtype=None, nn=False, accumulate=False) -> Case:
    def setup():
        a = _randn(m, k)
        b = _randn(k, n).t() if nn else _randn(n, k)  # nn: B stored [K, N] (MN-major)
        c = _randn(m, n, dtype=out_dtype or BF16) if accumulate else None
        if out_dtype == torch.float32:
            # torch.mm has no BF16-in/FP32-out kernel on CPU: the baseline is the FP32 upcast users write.
            return (lambda: bf16_gemm(a, b, c, out_dtype=out_dtype)), (
                lambda: torch.mm(a.float(), b.float().t()) if c is None else torch.addmm(c, a.float(), b.float().t())
            )
        if c is None:
            return (lambda: bf16_gemm(a, b)), (lambda: torch.mm(a, b.t()))
        return (lambda: bf16_gemm(a, b, c)), (lambda: torch.addmm(c, a, b.t()))

    tags = ["NN" if nn else "NT", "fp32" if out_dtype else "bf16"] + (["+C"] if accumulate else [])
    baseline = "torch.addmm" if accumulate else "torch.mm"
    if out_dtype == torch.float32:
        baseline += " (fp32 upcast)"
    return Case(f"gemm {m}x{n}x{k} {' '.join(tags)}", 2 * m * n * k, setup, baseline)


def _bmm_case(batch, m, n, k) -> Case:
    def setup():
        a, b = _randn(batch, m, k), _randn(batch, n, k)
        return (lambda: bf16_bmm(a, b)), (lambda: torch.bmm(a, b.transpose(1, 2)))

    return Case(f"bmm {batch}x{m}x{n}x{k}", 2 * batch * m * n * k, setup, "torch.bmm")


def _einsum_case(equation, sizes) -> Case:
    def setup():
        a = _randn(*[sizes[x] for x in equation[0:3]])
        b = _randn(*[sizes[x] for x in equation[4:7]])
        return (lambda: bf16_einsum(equation, a, b)), (lambda: torch.einsum(equation, a, b))

    flops = 2
    for v in sizes.values():
        flops *= v
    label = ",".join(f"{k}={v}" for k, v in sizes.items())
    return Case(f"einsum {equation} {label}", flops, setup, "torch.einsum")


def cases(quick: bool = False) -> list[Case]:
    # 1x8x8 measures the per-call overhead (dispatch, autograd key, wrapper) against torch.mm's.
    if quick:
        return [
            _gemm_case(1, 8, 8),
            _gemm_case(1, 256, 512),
            _gemm_case(64, 256, 512, out_dtype=torch.float32),
            _bmm_case(2, 32, 64, 64),
        ]
    return [
        _gemm_case(1, 8, 8),
        _gemm_case(1, 2112, 7168),
        _gemm_case(1, 4096, 2048, nn=True),
        _gemm_case(16, 2112, 7168),
        _gemm_case(128, 2112, 1792),
        _gemm_case(128, 2112, 1792, out_dtype=torch.float32),
        _gemm_case(256, 1536, 1024, accumulate=True),
        _gemm_case(512, 2048, 2048),
        _gemm_case(256, 1024, 1024, nn=True),
        _bmm_case(8, 128, 512, 256),
        _einsum_case("bhr,hdr->bhd", dict(b=64, h=16, r=512, d=128)),
        _einsum_case("bmk,bnk->mn", dict(b=8, m=256, n=256, k=256)),
    ]
