"""Rewrite: torch's own scaled GEMMs to ours where the device has no kernel for them. ``torch._scaled_mm(a [M, K],
b [K, N], scale_a, scale_b, bias, out_dtype=BF16/FP32)`` becomes ``fp8_gemm(a, sfa, b^T, sfb, bias, recipe_a,
recipe_b)`` and ``torch._scaled_grouped_mm(a [M, K], b [G, K, N], scale_a [M], scale_b [G, N], offs)`` (rowwise, the
MoE forward) becomes ``m_grouped_fp8_gemm(a, scale_a[:, None], b^T, scale_b[..., None], offs)``. The recipes, read
off the scale shapes as ATen does: tensorwise (two one-element scales), rowwise (``[M, 1]`` x ``[1, N]``), and
DeepSeek's blockwise ones (1x128 x 128x128: ``[M, K/128]`` x ``[K/128, N/128]``; 1x128 x 1x128; 128x128 x 1x128), each
the same block scaling in our ops' terms (one scale per ``[gran_mn, gran_k]`` block of ``a`` and of ``b^T``; a whole
row or the whole matrix is one block). Same values: both dequantize per block, accumulate in FP32 and round once (a
bias is added before that rounding in ours).

Where: the cases the device's ATen kernel refuses. On CPU, ``_scaled_mm`` runs tensorwise and rowwise scales but
raises on the blockwise recipes, and ``_scaled_grouped_mm`` has no CPU kernel at all: a compiled graph holding them
fails when it runs, and runs ours after ``inductor_lowerings.enable()``. On Ascend (torch_npu 2.13 registers neither
op) every recipe is rewritten (``fp8_gemm`` maps the DeepSeek recipe to ``npu_quant_matmul`` there). CUDA has cuBLAS's
and CUTLASS's kernels: left alone.

``torch.nn.functional.scaled_mm`` (``aten._scaled_mm_v2``: recipes as ``ScalingType`` codes, one scale tensor per
operand, the blockwise scales K-block-major as torch's meta function lays them out) is rewritten the same way, and
``torch.nn.functional.scaled_grouped_mm`` (``aten._scaled_grouped_mm_v2``) with RowWise scales as the first grouped
form. torch 2.13 has no meta function for ``_scaled_grouped_mm_v2`` (and no CPU kernel), so Dynamo could not put it in
a graph: ``inductor_lowerings.enable()`` registers one where torch has none (``register_fakes``: the output shape,
from torch's own helper for the grouped GEMMs).

Left alone: FP8 outputs (``out_dtype`` None or an FP8 type) and ``scale_result``, scales of any other shape (MX / NV
block formats), swizzled scales, a non-default ``contraction_dim``, a bias whose dtype differs from the output's,
grouped forms other than 2-D x 3-D with ``offs``, and any call our ops' own checks refuse.
"""

from __future__ import annotations

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from torch_ascend_moe.checks.fp8_gemm import fp8_gemm_signature
from torch_ascend_moe.checks.grouped import m_grouped_fp8_signature
from torch_ascend_moe.inductor_lowerings._pass import Plan, accepts, call_args, rewrite, val

# device type -> the recipes its ATen _scaled_mm runs itself (None: all of them); devices not listed get every recipe
# rewritten. _scaled_grouped_mm is rewritten wherever _scaled_mm's recipes are not all native.
NATIVE = {"cpu": {"tensorwise", "rowwise"}, "cuda": None}
_ops = torch.ops.ascend_moe
_OUT = (torch.bfloat16, torch.float32)


def _shape_is(t, *sizes) -> bool:
    return t.dim() == len(sizes) and all(statically_known_true(s == e) for s, e in zip(t.shape, sizes))


def _ceil(x, b):
    return (x + b - 1) // b


def _recipe(sa, sb, m, n, k):
    """(name, recipe_a, recipe_b, sfa from scale_a, sfb from scale_b) for _scaled_mm's scale shapes, else None. Our
    ``b`` operand is ``mat2^T`` ``[N, K]``, so ``b``'s scales are ``scale_b`` transposed."""
    if sa.numel() == 1 and sb.numel() == 1 and not statically_known_true(m * n == 1):
        return "tensorwise", [1, k], [n, k], lambda s: s.reshape(1, 1).expand(m, 1), lambda s: s.reshape(1, 1)
    if _shape_is(sa, m, 1) and _shape_is(sb, 1, n):
        return "rowwise", [1, k], [1, k], lambda s: s, lambda s: s.t()
    kb = _ceil(k, 128)
    if _shape_is(sa, m, kb) and _shape_is(sb, kb, _ceil(n, 128)):
        return "1x128 x 128x128", [1, 128], [128, 128], lambda s: s, lambda s: s.t()
    if _shape_is(sa, m, kb) and _shape_is(sb, kb, n):
        return "1x128 x 1x128", [1, 128], [1, 128], lambda s: s, lambda s: s.t()
    if _shape_is(sa, _ceil(m, 128), kb) and _shape_is(sb, kb, n):
        return "128x128 x 1x128", [128, 128], [1, 128], lambda s: s, lambda s: s.t()
    return None


def _rewritten(device: torch.device, recipe: str) -> bool:
    native = NATIVE.get(device.type, set())
    return native is not None and recipe not in native


@rewrite(torch.ops.aten._scaled_mm.default, "scaled_mm")
def plan_scaled_mm(node: torch.fx.Node) -> Plan | None:
    args = call_args(node)
    a, b, scale_a, scale_b, bias = (args[k] for k in ("input", "mat2", "scale_a", "scale_b", "bias"))
    if args["scale_result"] is not None:
        return None
    return _fp8_gemm_plan(a, b, scale_a, scale_b, bias, args["out_dtype"], _recipe)


def _fp8_gemm_plan(a, b, scale_a, scale_b, bias, out, recipe_of) -> Plan | None:
    """The ``fp8_gemm`` call of a 2-D scaled GEMM whose recipe ``recipe_of(fsa, fsb, m, n, k)`` reads off its scales
    (see ``_recipe``), where the device lacks that recipe."""
    fa, fb, fsa, fsb = (val(x) for x in (a, b, scale_a, scale_b))
    if None in (fa, fb, fsa, fsb) or out not in _OUT:
        return None
    if fa.dim() != 2 or fb.dim() != 2 or fsa.dtype != torch.float32 or fsb.dtype != torch.float32:
        return None
    m, k, n = fa.shape[0], fa.shape[1], fb.shape[1]
    recipe = recipe_of(fsa, fsb, m, n, k)
    if recipe is None or not _rewritten(fa.device, recipe[0]):
        return None
    _, recipe_a, recipe_b, to_sfa, to_sfb = recipe
    fbias = val(bias)
    if bias is not None and (fbias is None or fbias.dtype != out or not _shape_is(fbias, n)):
        return None
    fc = None if bias is None else fbias.expand(m, n)
    if not accepts(fp8_gemm_signature, fa, to_sfa(fsa), fb.t(), to_sfb(fsb), fc, recipe_a, recipe_b, out):
        return None

    def fp8_gemm(a, b, scale_a, scale_b, *bias):
        c = bias[0].expand(m, n) if bias else None
        return _ops.fp8_gemm.default(a, to_sfa(scale_a), b.t(), to_sfb(scale_b), c, recipe_a, recipe_b, 1.0, out)

    return Plan(fp8_gemm, [a, b, scale_a, scale_b, *([bias] if bias is not None else [])], _ops.fp8_gemm.default)


# torch.nn.functional.ScalingType's values: the v2 ops take recipes as ints.
_TENSORWISE, _ROWWISE, _BLOCK_1X128, _BLOCK_128X128 = 0, 1, 4, 5


def _recipe_v2(recipe_a, recipe_b, sa, sb, m, n, k):
    """_recipe for ``_scaled_mm_v2``'s recipe codes and scale layouts (torch's meta function): tensorwise and
    rowwise as ``_scaled_mm``'s; the blockwise scales K-block-major, ``1x128`` as ``[M, K/128]`` (``b``'s
    ``[N, K/128]``: already our ``b^T`` layout) and ``128x128`` as ``[L4, M/128]`` with ``L4`` = ``K/128`` rounded up
    to 4 (rows past ``K/128`` are padding)."""
    kb = k // 128
    pair = (tuple(recipe_a), tuple(recipe_b))
    if pair == ((_TENSORWISE,), (_TENSORWISE,)):
        found = _recipe(sa, sb, m, n, k)
        return found if found is not None and found[0] == "tensorwise" else None
    if pair == ((_ROWWISE,), (_ROWWISE,)):
        if not (_shape_is(sa, m, 1) and statically_known_true(sb.numel() == n)):
            return None
        return "rowwise", [1, k], [1, k], lambda s: s, lambda s: s.reshape(n, 1)
    l4 = _ceil(kb, 4) * 4
    if pair == ((_BLOCK_1X128,), (_BLOCK_128X128,)) and _shape_is(sa, m, kb) and _shape_is(sb, l4, n // 128):
        return "1x128 x 128x128", [1, 128], [128, 128], lambda s: s, lambda s: s[:kb].t()
    if pair == ((_BLOCK_1X128,), (_BLOCK_1X128,)) and _shape_is(sa, m, kb) and _shape_is(sb, n, kb):
        return "1x128 x 1x128", [1, 128], [1, 128], lambda s: s, lambda s: s
    if pair == ((_BLOCK_128X128,), (_BLOCK_1X128,)) and _shape_is(sa, l4, m // 128) and _shape_is(sb, n, kb):
        return "128x128 x 1x128", [128, 128], [1, 128], lambda s: s[:kb].t(), lambda s: s
    return None


@rewrite(torch.ops.aten._scaled_mm_v2.default, "scaled_mm")
def plan_scaled_mm_v2(node: torch.fx.Node) -> Plan | None:
    """``torch.nn.functional.scaled_mm`` (``aten._scaled_mm_v2``): one scale per operand, no swizzle, the default
    contraction; otherwise as ``_scaled_mm``."""
    args = call_args(node)
    a, b, scales_a, scales_b, bias = (args[k] for k in ("input", "mat2", "scale_a", "scale_b", "bias"))
    out = args["out_dtype"]
    if len(scales_a) != 1 or len(scales_b) != 1 or args["contraction_dim"]:
        return None
    if any(s != 0 for s in (*args["swizzle_a"], *args["swizzle_b"])):  # SwizzleType.NO_SWIZZLE only
        return None
    recipes = args["recipe_a"], args["recipe_b"]
    return _fp8_gemm_plan(
        a, b, scales_a[0], scales_b[0], bias, out, lambda sa, sb, m, n, k: _recipe_v2(*recipes, sa, sb, m, n, k)
    )


@rewrite(torch.ops.aten._scaled_grouped_mm.default, "scaled_mm")
def plan_scaled_grouped_mm(node: torch.fx.Node) -> Plan | None:
    args = call_args(node)
    if args["scale_result"] is not None or args["bias"] is not None:
        return None
    return _grouped_plan(*(args[k] for k in ("input", "mat2", "scale_a", "scale_b", "offs", "out_dtype")))


@rewrite(torch.ops.aten._scaled_grouped_mm_v2.default, "scaled_mm")
def plan_scaled_grouped_mm_v2(node: torch.fx.Node) -> Plan | None:
    """``torch.nn.functional.scaled_grouped_mm`` with one RowWise scale per operand, no swizzle, the default
    contraction and no bias: ``_scaled_grouped_mm``'s rowwise form."""
    args = call_args(node)
    scales_a, scales_b = args["scale_a"], args["scale_b"]
    if len(scales_a) != 1 or len(scales_b) != 1 or args["contraction_dim"] or args["bias"] is not None:
        return None
    if tuple(args["recipe_a"]) != (_ROWWISE,) or tuple(args["recipe_b"]) != (_ROWWISE,):
        return None
    if any(s != 0 for s in (*args["swizzle_a"], *args["swizzle_b"])):
        return None
    return _grouped_plan(args["input"], args["mat2"], scales_a[0], scales_b[0], args["offs"], args["out_dtype"])


def _grouped_plan(a, b, scale_a, scale_b, offs, out) -> Plan | None:
    """The ``m_grouped_fp8_gemm`` call of a rowwise-scaled grouped GEMM ``a [M, K]`` x ``b [G, K, N]`` with ``offs``
    (``scale_a [M]``, ``scale_b [G, N]``), where the device has no kernel for it."""
    fa, fb, fsa, fsb, fo = (val(x) for x in (a, b, scale_a, scale_b, offs))
    if None in (fa, fb, fsa, fsb, fo) or out not in _OUT:
        return None
    if fa.dim() != 2 or fb.dim() != 3 or NATIVE.get(fa.device.type, set()) is None:
        return None
    m, k, groups, n = fa.shape[0], fa.shape[1], fb.shape[0], fb.shape[2]
    if (
        not (_shape_is(fsa, m) and _shape_is(fsb, groups, n))
        or fsa.dtype != torch.float32
        or fsb.dtype != torch.float32
    ):
        return None
    recipe = [1, k]
    if not accepts(
        m_grouped_fp8_signature, fa, fsa[:, None], fb.transpose(1, 2), fsb[..., None], fo, True, 1, recipe, recipe, out
    ):
        return None

    def m_grouped(a, b, scale_a, scale_b, offs):
        return _ops.m_grouped_fp8_gemm.default(
            a, scale_a[:, None], b.transpose(1, 2), scale_b[..., None], offs, True, 1, recipe, recipe, out
        )

    return Plan(m_grouped, [a, b, scale_a, scale_b, offs], _ops.m_grouped_fp8_gemm.default)


def _scaled_grouped_mm_v2_meta(
    mat_a, mat_b, scale_a, recipe_a, swizzle_a, scale_b, recipe_b, swizzle_b, offs=None, bias=None, out_dtype=None,
    contraction_dim=(), use_fast_accum=False,
):  # fmt: skip
    from torch._meta_registrations import _create_grouped_mm_output_tensor

    torch._check(mat_a.dim() in (2, 3) and mat_b.dim() in (2, 3), lambda: "Multiplicands must be 2D or 3D")
    torch._check(offs is not None or (mat_a.dim() == 3 and mat_b.dim() == 3), lambda: "Offsets tensor not provided")
    return _create_grouped_mm_output_tensor(mat_a, mat_b, offs, out_dtype or torch.bfloat16)


_FAKES = None


def register_fakes() -> None:
    """A Meta kernel for ``aten._scaled_grouped_mm_v2`` where torch has none (2.13): its output's shape and dtype, so
    Dynamo can trace ``torch.nn.functional.scaled_grouped_mm`` into a graph this rewrite sees. Idempotent."""
    global _FAKES
    name = "aten::_scaled_grouped_mm_v2"
    if _FAKES is not None or torch._C._dispatch_has_kernel_for_dispatch_key(name, "Meta"):
        return
    _FAKES = torch.library.Library("aten", "IMPL")  # kept alive: dropping it would unregister the kernel
    _FAKES.impl("_scaled_grouped_mm_v2", _scaled_grouped_mm_v2_meta, "Meta")
