"""Rewrite: a ``dequantize`` call becomes its own math in ATen ops (each block's codes widened to FP32 times its
scale, rounded once to the output dtype: the op's reference, ``quant.reference.dequantize``), so Inductor fuses the
dequantization into the kernels that read its output: a dequantize followed by pointwise work or a reduction (a
residual add, an activation, a requant to another block size, a norm) is one pass over the FP8 codes, instead of
our opaque kernel writing the wide tensor out and the next kernel reading it back.

Same values as the op, bit for bit: one FP32 multiply per element and one rounding, as the op computes them (NaN
codes and scales, UE8M0 power-of-two scales included). Where a consumer is fused in, Inductor keeps the FP32
product for it when the output dtype is narrower (as for its own pointwise chains): one rounding fewer, within the
dtype's error.

Only on CUDA (``DEVICES``), where the op's kernel (one Triton launch) still writes the wide tensor the next kernel
reads back, and Inductor's Triton code widens FP8 in registers inside that next kernel. Not on CPU, where it was
measured and does not pay: our C++ kernel against Inductor's code for dequantize -> + residual / -> RMSNorm /
-> requant at 4096x7168, 0.88x / 1.01x / 1.00x (2 threads, 2026-12-03; Inductor's CPU code widens FP8 element by
element). Not on Ascend (CANN adapters).

Left alone: packed FP4 codes (a table decode), ``float8_e8m0fnu`` scales (Inductor has no code for the dtype: it
would fall back anyway) and packed UE8M0 scales (int32 / int16 bit fields), shapes that are not whole blocks (the
ragged last block needs the pad -> slice pattern torch 2.13's Inductor miscompiles on CPU: see quantize_inline), a
dynamic size the blocks cannot be proven to divide, and calls the op refuses (its own checks decide, so a rewritten
graph never runs where the original raised).
"""

from __future__ import annotations

import torch

from torch_ascend_moe.checks.quant import dequantize_signature
from torch_ascend_moe.inductor_lowerings._pass import Plan, accepts, call_args, rewrite, val
from torch_ascend_moe.quant import reference

DEVICES = {"cuda"}  # where the inlined math beats the op's kernel (see above; tests add "cpu" to check values)
_SCALES = (torch.float32,)  # Inductor cannot generate code reading float8_e8m0fnu, nor packed UE8M0 words
_ops = torch.ops.ascend_moe


def _whole(size, block: int) -> bool:
    return isinstance(size, int) and size % min(block, max(size, 1)) == 0


@rewrite(_ops.dequantize.default, "dequantize_inline")
def plan(node: torch.fx.Node) -> Plan | None:
    args = call_args(node)
    data, scale, block, out_dtype = args["data"], args["scale"], list(args["block"]), args["out_dtype"]
    fd, fs = val(data), val(scale)
    if fd is None or fs is None or fd.device.type not in DEVICES:
        return None
    if fd.dtype != torch.float8_e4m3fn or fs.dtype not in _SCALES:
        return None
    if not accepts(dequantize_signature, fd, fs, block, out_dtype):
        return None
    m, n = fd.shape
    if block[0] == 1 and not isinstance(m, int):  # a dynamic token count, per-token blocks of a static width
        whole = _whole(n, block[1])
    else:
        whole = _whole(m, block[0]) and _whole(n, block[1])
    if not whole:
        return None

    def inline(data, scale):
        rows, cols = data.shape
        gr, gc = (1, block[1]) if block[0] == 1 else reference._cut(block, rows, cols)
        gc = min(gc, max(cols, 1))
        values = data.float().view(rows // gr, gr, cols // gc, gc)
        product = values * scale.float()[:, None, :, None]
        return product.view(rows, cols).to(out_dtype or torch.float32)

    return Plan(inline, [data, scale], _ops.dequantize.default)
