"""``HyperConnection``: DeepSeek's manifold-constrained hyper-connections (mHC) around a layer, on the
``hc_prenorm_gemm`` op.

``n_hc`` residual streams ``[T, n, C]`` replace the single residual. Per token the flattened streams are
RMS-normalised and projected to ``n + n + n*n`` mixing logits; the pre-norm GEMM returns the raw projection
and ``sum x^2`` so the normalisation is applied afterwards (``RMSNorm(x) @ W^T = (x @ W^T) * rsqrt(mean(x^2)
+ eps)``; RMSNorm's weight is folded into W). Coefficients: ``pre = sigmoid`` (how much of each stream the
layer reads), ``post = 2 * sigmoid`` (how much of the layer output each stream receives) and a residual
mixing matrix made doubly stochastic by Sinkhorn iterations on ``exp(logits)`` (the "manifold constraint":
mixing preserves the mean of the streams). Spec context: specs/deepgemm_api.md §9 (the formula of the
coefficients there is marked inferred; the structure follows the mHC paper).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from torch_ascend_moe.ops.hc_prenorm import hc_prenorm_gemm


def sinkhorn(logits: torch.Tensor, iterations: int) -> torch.Tensor:
    """A doubly stochastic matrix from ``exp(logits)`` ([..., n, n]) by alternating row and column normalisation
    (in log space, so large logits cannot overflow)."""
    log_p = logits
    for _ in range(iterations):
        log_p = log_p - log_p.logsumexp(dim=-1, keepdim=True)
        log_p = log_p - log_p.logsumexp(dim=-2, keepdim=True)
    return log_p.exp()


class HyperConnection(nn.Module):
    """mHC with ``n_hc`` streams of width ``hidden_size``; ``forward(streams, layer)`` returns new streams.

    >>> hc = HyperConnection(64, n_hc=4)
    >>> streams = hc.expand(torch.randn(3, 64))  # [T, C] -> [T, 4, C]
    >>> hc(streams, torch.nn.Linear(64, 64)).shape
    torch.Size([3, 4, 64])
    """

    def __init__(self, hidden_size: int, n_hc: int = 4, *, sinkhorn_iterations: int = 20, eps: float = 1e-6) -> None:
        super().__init__()
        if (n_hc * hidden_size) % 64:
            raise ValueError(
                f"HyperConnection: arguments 'hidden_size', 'n_hc': expected n_hc * hidden_size to be a multiple of 64 "
                f"(the pre-norm GEMM's K blocks), got {n_hc} * {hidden_size}"
            )
        self.hidden_size, self.n_hc, self.sinkhorn_iterations, self.eps = hidden_size, n_hc, sinkhorn_iterations, eps
        n_coeffs = 2 * n_hc + n_hc * n_hc
        # FP32 projection (the pre-norm GEMM reads it in TF32), small init: mixing starts near the identity.
        self.proj = nn.Parameter(torch.randn(n_coeffs, n_hc * hidden_size) * (n_hc * hidden_size) ** -0.5 * 0.01)
        bias = torch.zeros(n_coeffs)
        bias[2 * n_hc :] = (torch.eye(n_hc) * 4.0).flatten()  # residual mixing starts close to identity
        self.bias = nn.Parameter(bias)

    def expand(self, x: torch.Tensor) -> torch.Tensor:
        """The streams of the first layer: ``n_hc`` copies of the embedding ``x [T, C]``."""
        return x.unsqueeze(1).expand(-1, self.n_hc, -1).contiguous()

    def coefficients(self, streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(pre [T, n], post [T, n], res [T, n, n])`` of streams ``[T, n, C]``."""
        t, n = streams.shape[0], self.n_hc
        flat = streams.reshape(t, n * self.hidden_size)
        raw, sqr_sum = hc_prenorm_gemm(flat, self.proj)
        logits = raw * torch.rsqrt(sqr_sum / flat.shape[1] + self.eps).unsqueeze(-1) + self.bias
        pre = torch.sigmoid(logits[:, :n])
        post = 2 * torch.sigmoid(logits[:, n : 2 * n])
        res = sinkhorn(logits[:, 2 * n :].view(t, n, n), self.sinkhorn_iterations)
        return pre, post, res

    def forward(self, streams: torch.Tensor, layer: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        pre, post, res = self.coefficients(streams)
        dtype = streams.dtype
        layer_in = (pre.unsqueeze(-1) * streams.float()).sum(1).to(dtype)
        layer_out = layer(layer_in).float()
        mixed = torch.bmm(res, streams.float()) + post.unsqueeze(-1) * layer_out.unsqueeze(1)
        return mixed.to(dtype)

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, n_hc={self.n_hc}, sinkhorn_iterations={self.sinkhorn_iterations}"
