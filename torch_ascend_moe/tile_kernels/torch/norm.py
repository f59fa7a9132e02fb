"""``tile_kernels.torch.norm`` (the Ascend era's): the RMSNorm references over the ``rms_norm`` ops."""

from __future__ import annotations

from torch_ascend_moe.ops.norm import rms_norm, rms_norm_backward

__all__ = ["norm_backward_ref", "norm_forward_ref"]


def norm_forward_ref(x, weight, eps: float, residual=None, out_scale: float = 1.0):
    """``(out, rstd, residual_out)``: RMSNorm of ``x (+ residual)``; ``residual_out`` is x itself without one."""
    out, rstd, s = rms_norm(x, weight, eps, residual=residual, out_scale=out_scale)
    return out, rstd, x if residual is None else s


def norm_backward_ref(out_grad, x, weight, rstd, residual_out_grad=None, out_scale: float = 1.0):
    """``(x_grad, weight_grad)``: ``weight_grad`` in FP32 (None without a weight)."""
    x_grad, w_grad = rms_norm_backward(out_grad, x, weight, rstd, residual_out_grad=residual_out_grad,
                                       out_scale=out_scale)  # fmt: skip
    return x_grad, (w_grad if weight is not None else None)
