"""Benchmark cases of the fp8_linear family against FP32 ``F.linear`` on the same shapes.

The ops include their casts (activations every call, and ``fp8_linear`` the weight as well), so the
ratio is what a user of ``FP8Linear`` / the fused inference path sees against an FP32 layer on this CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torch_ascend_moe.bench import Case
from torch_ascend_moe.ops.fp8_linear import fp8_linear, fp8_quant_gemm
from torch_ascend_moe.quant import per_block_cast_to_fp8


def _quant_gemm_case(m, n, k) -> Case:
    def setup():
        x, w = torch.randn(m, k), torch.randn(n, k)
        b, sfb = per_block_cast_to_fp8(w, use_ue8m0=False)
        return (lambda: fp8_quant_gemm(x, b, sfb)), (lambda: F.linear(x, w))

    return Case(f"fp8_quant_gemm {m}x{n}x{k}", 2 * m * n * k, setup, "F.linear fp32")


def _linear_case(m, n, k, train: bool) -> Case:
    def setup():
        x, w = torch.randn(m, k, requires_grad=train), torch.randn(n, k, requires_grad=train)
        grad = torch.randn(m, n)

        def step(fn):
            if not train:
                return lambda: fn(x, w)

            def run():
                with torch.enable_grad():
                    torch.autograd.grad(fn(x, w), (x, w), grad)

            return run

        return step(fp8_linear), step(F.linear)

    kind = "fwd+bwd" if train else "fwd"
    return Case(f"fp8_linear {kind} {m}x{n}x{k}", (6 if train else 2) * m * n * k, setup, f"F.linear fp32 {kind}")


def _linear_backward_case(m, n, k) -> Case:
    """The backward alone: dgrad and wgrad FP8 GEMMs on gradients requantized by the quant ops."""

    def setup():
        x, w = torch.randn(m, k, requires_grad=True), (torch.randn(n, k) / k**0.5).requires_grad_()
        grad = torch.randn(m, n)

        def backward(fn):
            with torch.enable_grad():
                y = fn(x, w)
            return lambda: torch.autograd.grad(y, (x, w), grad, retain_graph=True)

        return backward(fp8_linear), backward(F.linear)

    return Case(f"fp8_linear bwd {m}x{n}x{k}", 4 * m * n * k, setup, "F.linear fp32 bwd", grad=True)


def cases(quick: bool = False) -> list[Case]:
    if quick:
        return [_quant_gemm_case(4, 256, 512), _linear_case(64, 256, 512, True), _linear_backward_case(64, 256, 512)]
    return [
        _quant_gemm_case(1, 2112, 7168),
        _quant_gemm_case(128, 2112, 1792),
        _linear_case(512, 2048, 2048, False),
        _linear_case(512, 2048, 2048, True),
        _linear_backward_case(512, 2048, 2048),
    ]
