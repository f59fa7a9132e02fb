"""The mega_moe family's argument checks (``mega_moe``: DeepGEMM's fused MegaMoE, functional, specs/deepgemm_api.md
§10). Python only: the family has no C++ kernel (its portable kernel serves every device), so there is no C++ twin
(``PYTHON_ONLY``; tests/test_validation_twins.py verifies that no C++ kernel implements its op)."""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck

OP = "ascend_moe::mega_moe"
# The family has no C++ kernel (its portable kernel serves every device): every check function is Python's alone.
PYTHON_ONLY = {name: (OP,) for name in ("_check_weights", "_check_shared", "mega_moe_signature", "check_topk_values")}
GRAN = 32
BLOCK = 128  # DeepGEMM's SM90 FP8 Mega MoE: x per 1x128, weights per 128x128 block, FP32 scales
BLOCK_ACT_GRAN = 64  # ... and its L2 input requantized per 1x64 (FP32 scales, not powers of two)


_FORMATS = {
    # kind: (accepted weight dtypes, their description, packed columns per element)
    "bf16": ((torch.bfloat16,), "torch.bfloat16 with a BF16 x", 1),
    "fp4": ((torch.uint8, torch.int8), "torch.uint8 or torch.int8 (packed FP4) with an FP8 x", 2),
    "fp8": ((torch.float8_e4m3fn,), "torch.float8_e4m3fn with an FP8 x", 1),
    "fp8_block": ((torch.float8_e4m3fn,), "torch.float8_e4m3fn with a 1x128-scaled FP8 x", 1),
}


def kind_of(x, x_sf, l1_weights) -> str:
    """The op's mode: ``bf16``; ``fp4`` (FP8 x FP4, 1x32); ``fp8`` (FP8 x FP8, 1x32: DeepGEMM 2.8's fp8xfp8);
    ``fp8_block`` (FP8 x FP8 with a 1x128-scaled x, ``x_sf [T, H/128]``, and 128x128-block weight scales: the SM90
    FP8 Mega MoE of DeepGEMM's nv_dev branch). Read from the dtypes and ``x_sf``'s width."""
    if x.dtype != torch.float8_e4m3fn:
        return "bf16"
    if l1_weights.dtype != torch.float8_e4m3fn:
        return "fp4"
    h = x.shape[-1]
    block = x_sf is not None and x_sf.dim() == 2 and h % BLOCK == 0 and h > 0 and x_sf.shape[1] * BLOCK == h
    return "fp8_block" if block else "fp8"


def _check_weights(op, name, w, sf, kind, lead, rows, cols):
    """``w [*lead, rows, cols]`` BF16, packed FP4 ``[*lead, rows, cols/2]`` or FP8 ``[*lead, rows, cols]``;
    the quantized ones with FP32 1x32 scales ``sf [*lead, rows, cols/32]``."""
    sf_name = name.replace("_weights", "_sf")
    ck.check_rank(op, name, w, len(lead) + 2, "[E_local, N, K]" if lead else "[N, K]")
    dtypes, described, per_element = _FORMATS[kind]
    ck.check_arg(w.dtype in dtypes, op, name, "dtype", described, w.dtype)
    expected = [*lead, rows, cols // per_element]
    ck.check_arg(list(w.shape) == expected, op, name, "shape", expected, list(w.shape))
    if kind == "bf16":
        ck.check_arg(sf is None, op, sf_name, "value", "None with BF16 weights", "a tensor")
        return
    if kind == "fp8_block":
        ck.check_arg(sf is not None, op, sf_name, "value", "FP32 128x128-block scales with a 1x128-scaled x", None)
        expected_sf = [*lead, rows // BLOCK, cols // BLOCK]
    else:
        ck.check_arg(sf is not None, op, sf_name, "value", "FP32 1x32 scales with FP8 / FP4 weights", None)
        expected_sf = [*lead, rows, cols // GRAN]
    ck.check_arg(list(sf.shape) == expected_sf, op, sf_name, "shape", expected_sf, list(sf.shape))
    ck.check_arg(sf.dtype == torch.float32, op, sf_name, "dtype", "torch.float32", sf.dtype)


def _x_sf_shapes(t, h, fp8_weights: bool) -> str:
    """The accepted ``x_sf`` shapes, as text (sizes as eager prints them: this runs only on the failure path)."""
    t, h = int(t), int(h)
    block = f" (or {[t, h // BLOCK]} with 128x128-block FP8 weights)" if fp8_weights and h % BLOCK == 0 else ""
    return f"{[t, h // GRAN]}{block}"


def _check_shared(op, fp8, hidden, l1, l1_sf, l2, l2_sf):
    """The fused shared experts: one SwiGLU MLP (S shared experts of intermediate I as one of S·I, DeepSeek's
    convention) with ``shared_l1_weights [2I_s, H]`` (gate rows, then up) and ``shared_l2_weights [H, I_s]``,
    BF16, or FP8 E4M3 with 1x32 scales in FP8 x FP4 mode (DeepGEMM-Ascend: FP8 weights without expert dim)."""
    if l1 is None or l2 is None:
        given, missing = (
            ("shared_l1_weights", "shared_l2_weights") if l2 is None else ("shared_l2_weights", "shared_l1_weights")
        )
        ck.check_arg(l1 is None and l2 is None, op, missing, "value", f"a tensor when {given} is given", None)
        for name, sf in (("shared_l1_sf", l1_sf), ("shared_l2_sf", l2_sf)):
            ck.check_arg(sf is None, op, name, "value", "None without shared expert weights", "a tensor")
        return
    ck.check_rank(op, "shared_l1_weights", l1, 2, "[2I_s, H]")
    two_i = l1.shape[0]
    ck.check_arg(
        two_i % 2 == 0, op, "shared_l1_weights", "size(0) (2I_s)", "an even row count (gate rows, then up)", two_i
    )
    inter = two_i // 2
    if fp8:
        ck.check_arg(
            inter % GRAN == 0, op, "shared_l1_weights", "size(0) / 2 (I_s)", "a multiple of 32 with FP8 x", inter
        )
    kind = "fp8" if fp8 else "bf16"
    _check_weights(op, "shared_l1_weights", l1, l1_sf, kind, [], two_i, hidden)
    _check_weights(op, "shared_l2_weights", l2, l2_sf, kind, [], hidden, inter)


def mega_moe_signature(a, ranks: int) -> tuple[int, int]:
    """Checks the arguments; returns (total experts E = E_local * R, R). ``ranks``: the size of the call's group
    (``distributed.groups.group_size``, which checks the group's name), given so the checks stay below the
    distributed layer."""
    op = OP
    ck.check_rank(op, "x", a.x, 2, "[T, H]")
    fp8 = a.x.dtype == torch.float8_e4m3fn
    ck.check_arg(
        fp8 or a.x.dtype == torch.bfloat16, op, "x", "dtype", "torch.bfloat16 or torch.float8_e4m3fn", a.x.dtype
    )
    t, h = a.x.shape
    kind = kind_of(a.x, a.x_sf, a.l1_weights)
    if fp8:
        ck.check_arg(h % GRAN == 0, op, "x", "size(1) (H)", "a multiple of 32 with FP8 x", h)
        ck.check_arg(a.x_sf is not None, op, "x_sf", "value", "FP32 [T, H/32] scales with an FP8 x", None)
        ck.check_arg(
            kind == "fp8_block" or list(a.x_sf.shape) == [t, h // GRAN],
            op,
            "x_sf",
            "shape",
            lambda: _x_sf_shapes(t, h, a.l1_weights.dtype == torch.float8_e4m3fn),
            lambda: list(a.x_sf.shape),
        )
        ck.check_arg(a.x_sf.dtype == torch.float32, op, "x_sf", "dtype", "torch.float32", a.x_sf.dtype)
    else:
        ck.check_arg(a.x_sf is None, op, "x_sf", "value", "None with a BF16 x", "a tensor")
    ck.check_rank(op, "topk_idx", a.topk_idx, 2, "[T, K]")
    ck.check_arg(
        a.topk_idx.dtype in (torch.int32, torch.int64),
        op,
        "topk_idx",
        "dtype",
        "torch.int32 or torch.int64",
        a.topk_idx.dtype,
    )
    ck.check_dim_size(op, "topk_idx", a.topk_idx, 0, "T", t, "x.size(0)")
    ck.check_arg(
        list(a.topk_weights.shape) == list(a.topk_idx.shape),
        op,
        "topk_weights",
        "shape",
        lambda: ck.shape_str(a.topk_idx.shape),
        lambda: ck.shape_str(a.topk_weights.shape),
    )
    ck.check_arg(
        a.topk_weights.dtype == torch.float32, op, "topk_weights", "dtype", "torch.float32", a.topk_weights.dtype
    )
    ck.check_rank(op, "l1_weights", a.l1_weights, 3, "[E_local, 2I, H]")
    experts, two_i = a.l1_weights.shape[0], a.l1_weights.shape[1]
    ck.check_arg(two_i % 2 == 0, op, "l1_weights", "size(1) (2I)", "an even row count (gate rows, then up)", two_i)
    inter = two_i // 2
    if fp8:
        ck.check_arg(inter % GRAN == 0, op, "l1_weights", "size(1) / 2 (I)", "a multiple of 32 with FP8 x", inter)
    if kind == "fp8_block":
        ck.check_arg(
            inter % BLOCK == 0, op, "l1_weights", "size(1) / 2 (I)", "a multiple of 128 with 128x128 blocks", inter
        )
        ck.check_arg(
            a.shared_l1_weights is None,
            op,
            "shared_l1_weights",
            "value",
            "None with 128x128-block FP8 weights (the SM90 Mega MoE fuses no shared experts)",
            "a tensor",
        )
    # FP8 x: FP4 routed weights (fp8xfp4), or E4M3 ones (DeepGEMM 2.8's fp8xfp8, chosen by the weights' dtype; SM90's
    # block-scaled form, chosen by x_sf's width).
    _check_weights(op, "l1_weights", a.l1_weights, a.l1_sf, kind, [experts], two_i, h)
    _check_weights(op, "l2_weights", a.l2_weights, a.l2_sf, kind, [experts], h, inter)
    _check_shared(op, fp8, h, a.shared_l1_weights, a.shared_l1_sf, a.shared_l2_weights, a.shared_l2_sf)
    if a.activation_clamp is not None:
        ck.check_arg(a.activation_clamp >= 0, op, "activation_clamp", "value", "None or >= 0", a.activation_clamp)
    ck.check_arg(a.timeout_s > 0, op, "timeout_s", "value", "a positive number of seconds", a.timeout_s)
    return experts * ranks, ranks


def check_topk_values(topk_idx, num_experts: int) -> None:
    """The kernel's check of values (a fake cannot see them): expert ids in ``[-1, E)``, -1 marking an empty slot.
    ``topk_idx`` must be readable on the host (callers skip the check under graph capture)."""
    if not topk_idx.numel():
        return
    lo, hi = torch.stack(torch.aminmax(topk_idx)).tolist()  # one reduction and one read, not four ops and a read
    ck.check_arg(
        lo >= -1 and hi < num_experts,
        OP,
        "topk_idx",
        "values",
        f"expert ids in [-1, {num_experts})",
        lambda: int(topk_idx[(topk_idx < -1) | (topk_idx >= num_experts)][0]),
    )
