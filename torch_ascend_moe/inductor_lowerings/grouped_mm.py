"""Rewrite: stock models' grouped GEMMs to ours. transformers' MoE experts (``experts_implementation="grouped_mm"``)
call ``torch._grouped_mm(x [M, K], w [G, K, N], offs)`` (``aten._grouped_mm``), or, for non-BF16 weights under
``torch.compile``, its own ``transformers::grouped_mm_fallback`` op (a host loop of ``torch.mm``); both become
``m_grouped_bf16_gemm(x, w^T, offs)`` (the psum layout is ``offs``; the transpose is a view), so an unmodified model
compiled after ``inductor_lowerings.enable()`` runs our kernel for its experts. Its training graphs' weight gradients,
``_grouped_mm(A [K, S], B [S, N], offs) -> [G, K, N]``, become ``k_grouped_bf16_gemm(A^T, B, offs, G)``.

Only where that is the better kernel (``applies``): on Ascend always (torch_npu 2.13 has no ``_grouped_mm`` kernel, so
the aten op would not run there at all, while ours is ``npu_grouped_matmul`` and has a GE converter); on CPU for FP32
(ours 1.02-1.18x ATen's, a host loop of ``torch.mm`` in transformers' fallback) and for BF16 / FP16 where PyTorch's
CPU GEMM of that type has no dot-product instructions (``backends.cpu_gemm``: ATen's ``_grouped_mm`` emulates the
type there, 90-300x slower than ours in ``bench grouped``'s shapes; an unmodified Mixtral block compiled with the
passes 4-7x faster, ``bench compile``). Left alone on CPUs with BF16 dot products (oneDNN's native grouped GEMM, on
par with ours, which calls ATen's BF16 GEMM there) and on CUDA (ours calls ``torch._grouped_mm`` anyway). Same values
up to the FP32 summation order (both accumulate in FP32 and round once); rows past ``offs[-1]`` are zeros in ours,
unspecified in ATen's.

Left alone: a bias or an ``out_dtype`` other than the input's, other operand ranks (3-D x 3-D batched, 3-D x 2-D),
calls our ops refuse (their own checks decide).
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends import cpu_gemm
from torch_ascend_moe.checks.grouped import k_grouped_signature, m_grouped_signature
from torch_ascend_moe.inductor_lowerings._pass import Plan, accepts, call_args, late_rewrite, rewrite, val

DEVICES = {"npu", "privateuseone"}  # where ATen's _grouped_mm has no kernel of its own and ours is torch_npu's
_ops = torch.ops.ascend_moe


def applies(x: torch.Tensor) -> bool:
    """Whether ours is the better grouped GEMM for operands like ``x`` (see the module's docstring)."""
    if x.device.type == "cpu":
        return x.dtype == torch.float32 or cpu_gemm.emulated(x.dtype)
    return x.device.type in DEVICES


def _plan(node: torch.fx.Node, a, b, offs, bias=None, out_dtype=None) -> Plan | None:
    fa, fb, fo = val(a), val(b), val(offs)
    if fa is None or fb is None or fo is None or bias is not None or not applies(fa):
        return None
    out = val(node).dtype
    if (out_dtype is not None and out_dtype != fa.dtype) or out != fa.dtype:
        return None
    if fa.dim() == 2 and fb.dim() == 3:  # x [S, K] @ w[g] [K, N] per row group: the experts' forward
        if not accepts(m_grouped_signature, fa, fb.transpose(1, 2), fo, True, 1, out):
            return None

        def m_grouped(a, b, offs):
            return _ops.m_grouped_bf16_gemm.default(a, b.transpose(1, 2), offs, True, 1, out)

        return Plan(m_grouped, [a, b, offs], _ops.m_grouped_bf16_gemm.default)
    if fa.dim() == 2 and fb.dim() == 2:  # A [K, S] @ B [S, N] per column group of A -> [G, K, N]: weight gradients
        groups = fo.shape[0]
        if not accepts(k_grouped_signature, fa.t(), fb, fo, groups, True, 1, None, out):
            return None

        def k_grouped(a, b, offs):
            return _ops.k_grouped_bf16_gemm.default(a.t(), b, offs, groups, True, 1, None, out)

        return Plan(k_grouped, [a, b, offs], _ops.k_grouped_bf16_gemm.default)
    return None


# The stock grouped GEMMs this rewrite takes -> the names of their (x, w, offs) arguments; transformers' fallback op is
# added when it appears.
STOCK: dict = {torch.ops.aten._grouped_mm.default: ("input", "mat2", "offs")}


def _plan_stock(node: torch.fx.Node) -> Plan | None:
    args = call_args(node)
    x, w, offs = (args[k] for k in STOCK[node.target])
    return _plan(node, x, w, offs, args.get("bias"), args.get("out_dtype"))


def experts_gemm(node: torch.fx.Node) -> dict | None:
    """For a stock grouped GEMM (``STOCK``) this rewrite turns into ``m_grouped_bf16_gemm`` (the experts' forward):
    that op's arguments by name (``b`` the weight's node, untransposed; ``fakes``: the operands' fake values as the op
    takes them), else None. ``swiglu_epilogue`` reads a joint graph's stock experts through it."""
    decision = _plan_stock(node) if node.target in STOCK else None
    if decision is None or decision.op is not _ops.m_grouped_bf16_gemm.default:
        return None
    a, b, offs = decision.inputs
    fakes = {"a": val(a), "b": val(b).transpose(1, 2), "layout": val(offs)}
    return {"a": a, "b": b, "layout": offs, "psum": True, "alignment": 1, "out_dtype": None, "fakes": fakes}


rewrite(torch.ops.aten._grouped_mm.default, "grouped_mm")(_plan_stock)


@late_rewrite
def register_transformers_fallback() -> bool:
    """transformers' ``grouped_mm_fallback`` op exists once transformers' MoE integration is imported (lazily, maybe
    after our first compile): registered at the first compile that finds it."""
    namespace = getattr(torch.ops, "transformers", None)
    op = getattr(getattr(namespace, "grouped_mm_fallback", None), "default", None)
    if op is None:
        return False
    STOCK[op] = ("input", "weight", "offs")
    rewrite(op, "grouped_mm")(_plan_stock)
    return True
