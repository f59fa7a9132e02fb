"""The swiglu family on Ascend: ``swiglu_forward`` / ``swiglu_backward`` run their portable kernels (elementwise
ACLNN ops, the psum layout masked on the device, quantize_blocks' cast), no host read while capturing.

Not mapped, and why (torch_npu 2.13's meta registrations and docs):

* ``npu_swiglu`` / ``npu_swiglu_backward`` compute ``silu(a) * b`` (and its gradient) with no clamp, routing weight
  or layout; they would cover only the plain call, and their rounding of ``a / (1 + exp(-a))`` (TileKernels'
  exact operation order, which the compat tests compare bitwise) is not documented.
* ``npu_swiglu_group_quant`` (``weight``, ``group_index``, ``clamp_limit``, ``block_size``, ``round_scale``) and its
  backward are the closest fused kernels, but their docs give no formula for the clamp (both halves the same
  way?), the scale rule (``448 / amax`` or ``1 / sf``? the amax floor?), nor how ``group_index`` padding rows are
  treated; ``npu_swiglu_quant`` / ``npu_dequant_swiglu_quant`` quantize to int8 with smooth scales.
* TileKernels' own Ascend kernels (TileLang-Ascend) are not torch ops we could call.
"""

from torch_ascend_moe.backends.chain import stays_portable

stays_portable(
    "swiglu_forward",
    "swiglu_backward",
    device="npu",
    why=(
        "npu_swiglu has no clamp, weights or layout, and npu_swiglu_group_quant's clamp and scale rules are "
        "undocumented"
    ),
)
