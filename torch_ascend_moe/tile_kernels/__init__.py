"""TileKernels-compatible API over ``torch.ops.ascend_moe`` (specs/tilekernels_deepselect.md): code written for
``import tile_kernels`` runs with ``import torch_ascend_moe.tile_kernels as tile_kernels`` for what is here so far:

- ``tile_kernels.moe``: ``top2_sum_gate`` (DeepSeek-V3's fused gate: the ``moe_topk_gate`` op), ``topk_gate``,
  ``topk_sum_and_topk_group_idx``, ``normalize_weight``, ``aux_fi``, ``group_count``, ``mask_indices_by_tp``,
  ``inplace_unique_group_indices``; the Ascend era's ``moe_topk_gate_forward`` / ``moe_topk_gate`` /
  ``moe_topk_gate_backward`` (``moe.ascend``); the fused routing layout ``get_fused_mapping``,
  ``expand_to_fused(_with_sf)``, ``reduce_fused`` (``moe.fused``: ``moe_permute``'s layout);
  ``moe.scoring.ScoringFunc``.
- ``tile_kernels.torch``: the same functions under the reference names upstream's tests compare against
  (``stable_topk``, ``top2_sum_gate``, ...): one implementation, so a kernel-vs-reference test passes trivially and
  proves nothing; our own tests compare against references written from the spec.
- ``tile_kernels.quant``: the per-token / per-block / per-channel casts to E4M3 and E2M1 (the ``quantize_blocks``
  op: TileKernels' scale rule, RNE E2M1), their ``_with_sf_only`` / ``_with_precomputed_sf`` forms, QuantTensor
  inputs, ``per_block_cast_lossless``, ``cast_back`` / ``per_token_cast_back``, ``unpack_from_e2m1fn_x2``, and the
  three scale-factor layouts (row-major FP32, TMA-aligned column-major, packed UE8M0 int32); the fused SwiGLU
  kernels (the ``swiglu_forward`` / ``swiglu_backward`` ops) in v1's and the Ascend era's forms (``quant.swiglu``);
  the Ascend era's RMSNorm kernels ``norm_forward(_and_per_token_cast)`` / ``norm_backward`` (``quant.norm``).
- ``tile_kernels.engram`` / ``modeling.engram``: the Engram hash and gate (``torch_ascend_moe.ops.engram``).
- ``tile_kernels.transpose``: ``transpose``, ``batched_transpose``.
- ``tile_kernels.transform``: ``apply_rotary`` (in-place RoPE; the ``rotary_embedding`` op).
- ``tile_kernels.modeling.mhc``: ``mhc_pre``, ``mhc_head``, ``expand_from_embedding`` and ``ops`` (the mHC layers over
  ``torch_ascend_moe.ops.mhc``, with upstream's residual-gradient accumulation protocol); ``tile_kernels.torch.mhc``.
- ``tile_kernels.testing``: ``numeric`` (``assert_equal``, ``calc_diff``, ``check_bias``, ``count_bytes``),
  ``generator`` (upstream's input generators), ``bench.make_param_id``, ``clear_unused_sf``; ``tile_kernels.utils``.
- ``set_num_sms`` / ``get_num_sms`` / ``get_device_num_sms``: validated and kept; results never depend on them;
  ``config.set_token_alignment`` / ``get_token_alignment`` (the Ascend era's psum layout alignment, default 128).

Every module path of upstream @ 36d9e45 exists (``moe.top2_sum_gate_kernel``, ``quant.per_token_cast_kernel``,
``torch.cast``, ``modeling.mhc.ops.post``, ...) with the functions it defines, and the Ascend-era fork's kernel
modules and test helpers (``moe.moe_topk_gate_forward_kernel``, ``quant.norm_forward_kernel``, ``rand``,
``testing.moe``); their TileLang kernel builders (``get_*_kernel``, the mHC kernels' private ones) are not here:
they build device kernels. The settings live in one module (``_state``), so importing the package under upstream's
name (a second copy of ``config``) still shares them. Upstream's argument asserts are kept (``AssertionError``, its
conditions). Outputs are allocated on the inputs' device (upstream: always CUDA).
"""

from __future__ import annotations

from torch_ascend_moe.tile_kernels import (
    config,
    engram,
    mhc,
    modeling,
    moe,
    quant,
    rand,
    testing,
    torch,  # noqa: A001  (upstream's module name)
    transform,
    transpose,
    utils,
)
from torch_ascend_moe.tile_kernels.config import (
    get_deterministic_algorithms,
    get_device_num_sms,
    get_max_smem_per_sm,
    get_num_ai_cores,
    get_num_cube_cores,
    get_num_sms,
    get_num_vec_cores,
    get_pdl,
    get_token_alignment,
    set_num_sms,
    set_pdl,
    set_token_alignment,
    use_deterministic_algorithms,
)

__all__ = [
    "config",
    "engram",
    "mhc",
    "modeling",
    "moe",
    "quant",
    "rand",
    "testing",
    "torch",
    "transform",
    "transpose",
    "utils",
    "get_deterministic_algorithms",
    "get_device_num_sms",
    "get_max_smem_per_sm",
    "get_num_ai_cores",
    "get_num_cube_cores",
    "get_num_sms",
    "get_num_vec_cores",
    "get_pdl",
    "get_token_alignment",
    "set_num_sms",
    "set_pdl",
    "set_token_alignment",
    "use_deterministic_algorithms",
]
