"""DeepSeek's manifold-constrained hyper-connections (mHC) pipeline as TileKernels computes it
(specs/tilekernels_deepselect.md §8), on the ``hc_prenorm_gemm`` op: the pre-norm projection of the flattened
residual streams, the split into pre / post / combination mixes, Sinkhorn normalization, the pre mix applied to the
streams, and the post step that mixes the streams and adds the layer's output.

These are compositions (the GEMM is the op; the rest are a few elementwise and ``[m, m]`` operations per token), not
ops: each is differentiable, traceable and exportable as plain torch code, and the fused steps
(``mhc_pre_big_fuse``) are bit for bit the composition by construction. Shapes: residual ``[..., m, H]`` (BF16 in
DeepSeek's models; FP32/FP64 kept), ``m3 = m·(m + 2)`` mixes per token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torch_ascend_moe.ops.hc_prenorm import hc_prenorm_gemm

__all__ = [
    "expand_to_mhc",
    "mhc_head",
    "mhc_head_compute_mix",
    "mhc_post",
    "mhc_pre",
    "mhc_pre_apply_mix",
    "mhc_pre_norm_fn",
    "mhc_pre_split_mixes",
    "sinkhorn_normalize",
]

_K_BLOCK = 64  # hc_prenorm_gemm's K granularity


def _out_dtype(x: torch.Tensor) -> torch.dtype:
    """DeepSeek's results are BF16 (its streams' dtype); FP32/FP64 streams keep theirs."""
    return x.dtype


def expand_to_mhc(hidden: torch.Tensor, mhc_mult: int) -> torch.Tensor:
    """``[..., H] -> [..., m, H]``: ``m`` copies of the embedding (the gradient sums them)."""
    return hidden.unsqueeze(-2).expand(*hidden.shape[:-1], mhc_mult, hidden.shape[-1]).contiguous()


def mhc_pre_norm_fn(residual: torch.Tensor, fn: torch.Tensor, norm_weight: torch.Tensor | None, eps: float):
    """``[..., m3]`` mixes: ``(r · tf32(fn ⊙ norm_weight)ᵀ) · rsqrt(Σr² / (m·H) + eps)`` with ``r`` the flattened
    streams in FP32 (``hc_prenorm_gemm``: the projection and the square sum in one pass)."""
    if norm_weight is not None:
        fn = fn * norm_weight
    flat = residual.flatten(-2)
    k = flat.shape[-1]
    rows = flat.reshape(-1, k)
    pad = -k % _K_BLOCK
    if pad:  # zero columns change neither the projection nor the square sum
        rows, fn = F.pad(rows, (0, pad)), F.pad(fn, (0, pad))
    raw, sqr_sum = hc_prenorm_gemm(rows, fn)
    mixes = raw * (sqr_sum.unsqueeze(-1) / k + eps).rsqrt()
    return mixes.view(*flat.shape[:-1], fn.shape[0])


def mhc_pre_split_mixes(mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, mhc_mult: int,
                        post_mult_value: float, pre_eps: float):  # fmt: skip
    """``(pre [..., m, 1], post [..., m, 1], comb [..., m, m])`` of ``mixes [..., m3]``: ``y = mixes · [s0]*m ‖
    [s1]*m ‖ [s2]*m² + base``; ``pre = sigmoid(y[:m]) + pre_eps``, ``post = sigmoid(y[m:2m]) · post_mult_value``,
    ``comb = y[2m:]`` row-major."""
    m = mhc_mult
    scales = torch.cat([scale[0].expand(m), scale[1].expand(m), scale[2].expand(m * m)])
    y = mixes * scales + base
    pre = y[..., :m].sigmoid().unsqueeze(-1) + pre_eps
    post = (y[..., m : 2 * m].sigmoid() * post_mult_value).unsqueeze(-1)
    comb = y[..., 2 * m :].reshape(*y.shape[:-1], m, m)
    return pre, post, comb


def sinkhorn_normalize(x: torch.Tensor, repeat: int = 10, eps: float = 1e-6) -> torch.Tensor:
    """``softmax(x, -1) + eps``, divided by its column sums (+ eps), then ``repeat - 1`` times by its row sums and
    its column sums (each + eps): a nearly doubly stochastic ``[..., m, m]``."""
    x = x.softmax(-1) + eps
    x = x / (x.sum(-2, keepdim=True) + eps)
    for _ in range(repeat - 1):
        x = x / (x.sum(-1, keepdim=True) + eps)
        x = x / (x.sum(-2, keepdim=True) + eps)
    return x


def mhc_pre_apply_mix(x: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    """``Σ_m x[..., m, :] · mix[..., m, 0]`` in FP32, rounded once: the layer's input ``[..., H]``."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    return (x.to(acc) * mix.to(acc)).sum(-2).to(_out_dtype(x))


def mhc_post(x: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """New streams ``[..., m, H]``: stream ``n = x · post[n] + Σ_m comb[m, n] · residual[m]`` in FP32, rounded
    once (note the transpose: ``comb``'s rows are the source streams)."""
    acc = torch.float64 if residual.dtype == torch.float64 else torch.float32
    mixed = torch.einsum("...mn,...mc->...nc", comb.to(acc), residual.to(acc))
    return (x.to(acc).unsqueeze(-2) * post.to(acc) + mixed).to(_out_dtype(residual))


def mhc_head_compute_mix(mix: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, pre_eps: float) -> torch.Tensor:
    """``sigmoid(mix · scale + base) + pre_eps``: the final head's pre mix."""
    return torch.sigmoid(mix * scale + base) + pre_eps


def mhc_pre(residual: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, *,
            norm_weight: torch.Tensor | None = None, norm_eps: float = 1e-6, post_mult_value: float = 1.0,
            pre_eps: float = 1e-6, sinkhorn_eps: float = 1e-6, sinkhorn_repeat: int = 10):  # fmt: skip
    """``(layer_input [..., H], post [..., m, 1], comb [..., m, m])``: the whole pre step (the same computation with
    and without gradients; ``norm_weight`` applied in both)."""
    m = residual.shape[-2]
    mixes = mhc_pre_norm_fn(residual, fn, norm_weight, norm_eps)
    pre, post, comb = mhc_pre_split_mixes(mixes, scale, base, m, post_mult_value, pre_eps)
    comb = sinkhorn_normalize(comb, sinkhorn_repeat, sinkhorn_eps)
    return mhc_pre_apply_mix(residual, pre), post, comb


def mhc_head(residual: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, *,
             norm_weight: torch.Tensor | None = None, norm_eps: float = 1e-6,
             pre_eps: float = 1e-6) -> torch.Tensor:  # fmt: skip
    """The final head's input ``[..., H]``: ``fn [m, m·H]``'s mixes through ``mhc_head_compute_mix``, applied."""
    mixes = mhc_pre_norm_fn(residual, fn, norm_weight, norm_eps)
    mix = mhc_head_compute_mix(mixes, scale.reshape(-1) if scale.numel() == 1 else scale, base, pre_eps)
    return mhc_pre_apply_mix(residual, mix.unsqueeze(-1))
