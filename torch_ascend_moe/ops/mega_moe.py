"""The mega_moe family: DeepGEMM's fused MegaMoE as one functional op."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import FROM_SCHEMA, schema_defaults

_mega_moe = torch.ops.ascend_moe.mega_moe.default


@schema_defaults
def mega_moe(
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor,
    l1_weights: torch.Tensor,
    l2_weights: torch.Tensor,
    *,
    x_sf: torch.Tensor | None = None,
    l1_sf: torch.Tensor | None = None,
    l2_sf: torch.Tensor | None = None,
    shared_l1_weights: torch.Tensor | None = None,
    shared_l2_weights: torch.Tensor | None = None,
    shared_l1_sf: torch.Tensor | None = None,
    shared_l2_sf: torch.Tensor | None = None,
    group=None,
    activation_clamp: float | None = None,
    timeout_s: float = FROM_SCHEMA,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MoE experts in one op: ``(y [T, H] BF16, pairs received per local expert int32 [E_local])``.

    BF16 mode: ``x [T, H]`` BF16, ``l1_weights [E_local, 2I, H]`` (gate rows, then up), ``l2_weights
    [E_local, H, I]`` BF16. FP8 x FP4 mode: ``x`` FP8 E4M3 with ``x_sf [T, H/32]`` (FP32 powers of two),
    weights packed FP4 (uint8/int8 ``[E_local, 2I, H/2]``, ``[E_local, H, I/2]``) with FP32 1x32 scales
    ``l1_sf [E_local, 2I, H/32]``, ``l2_sf [E_local, H, I/32]``. ``topk_idx`` global expert ids (-1 skipped),
    FP8 x FP8 (DeepGEMM 2.8's fp8xfp8): E4M3 weights with the same 1x32 scales. SM90's block-scaled FP8 (DeepGEMM
    nv_dev's ``fp8_mega_moe``): ``x_sf [T, H/128]`` FP32, E4M3 weights with FP32 128x128-block scales ``l1_sf
    [E_local, 2I/128, H/128]``, ``l2_sf [E_local, H/128, I/128]`` (I a multiple of 128; no shared experts), L1 kept
    in FP32 and the activation requantized per 1x64 with FP32 scales. ``topk_idx`` global expert ids (-1 skipped),
    ``topk_weights`` FP32, applied before L2. ``activation_clamp``: ``gate <= c``, ``|up| <= c``. ``group``
    (a process group or its name) makes it expert-parallel: rank r holds experts ``[r·E_l, (r+1)·E_l)``.

    Fused shared experts (DeepGEMM-Ascend): ``shared_l1_weights [2I_s, H]`` (gate rows, then up) and
    ``shared_l2_weights [H, I_s]`` (no expert dim; S shared experts of intermediate I are one of I_s = S·I), BF16,
    or FP8 E4M3 with FP32 1x32 scales ``shared_l1_sf [2I_s, H/32]``, ``shared_l2_sf [H, I_s/32]`` in FP8 mode;
    computed for every token at its home rank (same clamp, weight 1) and added first in the combine's FP32 sum.
    Steps and rounding points: ``torch_ascend_moe/backends/portable/mega_moe.py``. BF16 mode is differentiable.

    >>> x = torch.randn(4, 64).bfloat16()
    >>> y, counts = mega_moe(x, torch.tensor([[0, 1], [1, -1], [0, 0], [1, 0]]), torch.rand(4, 2),
    ...                      torch.randn(2, 64, 64).bfloat16(), torch.randn(2, 64, 32).bfloat16())
    >>> y.shape, counts.tolist()
    (torch.Size([4, 64]), [4, 3])
    """
    if group is not None:
        from torch_ascend_moe.distributed.groups import group_name_of

        group = group_name_of(group)
    # By name, as the schema lists them (Dynamo before torch 2.13 cannot trace ``locals()``).
    return _mega_moe(
        x=x,
        topk_idx=topk_idx,
        topk_weights=topk_weights,
        l1_weights=l1_weights,
        l2_weights=l2_weights,
        x_sf=x_sf,
        l1_sf=l1_sf,
        l2_sf=l2_sf,
        shared_l1_weights=shared_l1_weights,
        shared_l2_weights=shared_l2_weights,
        shared_l1_sf=shared_l1_sf,
        shared_l2_sf=shared_l2_sf,
        activation_clamp=activation_clamp,
        timeout_s=timeout_s,
        group_name=group,
    )
