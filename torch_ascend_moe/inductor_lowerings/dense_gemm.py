"""Rewrite: a model's BF16 / FP16 dense GEMMs (``aten.mm`` and ``aten.addmm``: ``nn.Linear``'s projections, a
router, the LM head, and in training graphs their input and weight gradients) to ``bf16_gemm``, on a CPU whose
PyTorch GEMM of that type has no dot-product instructions (``backends.cpu_gemm``): ATen emulates the type there and is
several times slower than ours (FP32 panels on MKL's SGEMM, or the streaming kernel for a few rows; ``bench compile``).
Both accumulate in FP32 and round once (``addmm``'s bias joins the FP32 sum in both): the same values up to the FP32
summation order. ``mm(a, m2)`` is ``bf16_gemm(a, m2ᵀ)`` (a view: our GEMM takes any majorness), ``addmm(bias, a, m2,
alpha=α)`` is ``bf16_gemm(a, m2ᵀ, bias expanded to [M, N], alpha=α)``.

Left alone: CPUs with BF16 (FP16) dot products (oneDNN's native GEMM, which ours calls there anyway), other devices,
FP32 / FP64 (the same MKL call on both sides), ``beta`` other than 1, a bias of another dtype, calls ``bf16_gemm``
refuses (its own checks decide).
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends import cpu_gemm
from torch_ascend_moe.checks.gemm import gemm_signature
from torch_ascend_moe.inductor_lowerings._pass import Plan, accepts, call_args, rewrite, val

_ops = torch.ops.ascend_moe


def _emulated(*fakes) -> bool:
    return all(f is not None and f.device.type == "cpu" for f in fakes) and cpu_gemm.emulated(fakes[0].dtype)


@rewrite(torch.ops.aten.mm.default, "dense_gemm")
def plan_mm(node: torch.fx.Node) -> Plan | None:
    args = call_args(node)
    a, m2 = args["input"], args["mat2"]
    fa, fm = val(a), val(m2)
    if not _emulated(fa, fm) or val(node).dtype != fa.dtype or not accepts(gemm_signature, fa, fm.t(), None, None):
        return None

    def gemm(a, m2):
        return _ops.bf16_gemm.default(a, m2.t(), None, 1.0, None)

    return Plan(gemm, [a, m2], _ops.bf16_gemm.default)


@rewrite(torch.ops.aten.addmm.default, "dense_gemm")
def plan_addmm(node: torch.fx.Node) -> Plan | None:
    args = call_args(node)
    bias, a, m2, beta, alpha = args["input"], args["mat1"], args["mat2"], args["beta"], args["alpha"]
    fb, fa, fm = val(bias), val(a), val(m2)
    if not _emulated(fa, fm, fb) or beta != 1 or not isinstance(alpha, (int, float)):
        return None
    shape = (fa.shape[0], fm.shape[1])
    if fb.dtype != fa.dtype or val(node).dtype != fa.dtype or torch.broadcast_shapes(fb.shape, shape) != shape:
        return None
    if not accepts(gemm_signature, fa, fm.t(), fb.expand(shape), None):
        return None

    def gemm(bias, a, m2):
        return _ops.bf16_gemm.default(a, m2.t(), bias.expand(a.shape[0], m2.shape[1]), float(alpha), None)

    return Plan(gemm, [bias, a, m2], _ops.bf16_gemm.default)
