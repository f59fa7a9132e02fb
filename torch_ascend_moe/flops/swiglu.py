"""FLOP formulas of the swiglu family, per output element: forward about 5 (exp, add, divide, two multiplies; the
weight one more), backward about 14 (the recomputed forward, the sigmoid's derivative term, two gradients and the
weight-gradient dot product); the clamp's comparisons and the casts' amax are not counted."""

from __future__ import annotations

from torch_ascend_moe._registry import flop_formula


@flop_formula
def swiglu_forward(x_shape, *args, out_shape=None, **kwargs) -> int:
    return 5 * x_shape[0] * (x_shape[1] // 2)


@flop_formula
def swiglu_backward(x_shape, *args, out_shape=None, **kwargs) -> int:
    return 14 * x_shape[0] * (x_shape[1] // 2)
