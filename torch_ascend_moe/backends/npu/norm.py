"""The norm family on Ascend: ``rms_norm``, ``rms_norm_quant`` and ``rms_norm_backward`` run their portable kernels
(a row reduction and elementwise ACLNN ops; quantize_blocks' cast).

Not mapped yet, and why: torch_npu 2.13's ``npu_rms_norm(x, gamma, epsilon) -> (y, rstd)`` and
``npu_add_rms_norm(x1, x2, gamma, epsilon) -> (y, rstd, x)`` compute the same normalization, but their docs give no
operation order (is ``x * rstd * gamma`` rounded once? is the residual sum rounded to x's dtype before the square
sum, as TileKernels does?) and have no ``out_scale`` or unit weight; ``npu_add_rms_norm_quant`` / the dynamic-quant
variants quantize to int8 or with their own scale rules. A mapping would need those checked on hardware.
"""

from torch_ascend_moe.backends.chain import stays_portable

stays_portable(
    "rms_norm",
    "rms_norm_quant",
    "rms_norm_backward",
    device="npu",
    why="npu_rms_norm's operation order and rounding are undocumented; no out_scale or unit weight",
)
