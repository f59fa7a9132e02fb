"""``HyperConnection``: DeepSeek's manifold-constrained hyper-connections (mHC) around a layer, computed as
TileKernels computes them (``torch_ascend_moe.ops.mhc``, on the ``hc_prenorm_gemm`` op; specs/tilekernels_deepselect.md
§8).

``m = n_hc`` residual streams ``[..., m, H]`` replace the single residual. Per token the flattened streams are
projected by ``fn [m(m+2), m·H]`` (its rows scaled by an optional RMSNorm weight, read in TF32) and normalised
afterwards (``· rsqrt(Σx²/(m·H) + eps)``, the pre-norm GEMM returns both), giving ``m + m + m²`` mixes; with the
three gains ``scale`` and the biases ``base``: ``pre = sigmoid + pre_eps`` (how much of each stream the layer
reads), ``post = sigmoid · post_mult_value`` (how much of the layer output each stream receives) and a residual
combination made (nearly) doubly stochastic by DeepSeek's Sinkhorn normalisation (softmax, then alternating column
and row normalisations with ``eps``). The new streams: ``post[n] · layer(Σ pre[m] · streams[m]) + Σ_m comb[m, n] ·
streams[m]``, rounded once to the streams' dtype.

Unlike TileKernels' ``mhc_pre``, whose inference path (no gradients: ``mhc_pre_big_fuse``) drops the norm weight,
this module applies it in training and inference alike.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from torch_ascend_moe import checks as ck
from torch_ascend_moe.ops import mhc


class HyperConnection(nn.Module):
    """mHC with ``n_hc`` streams of width ``hidden_size``; ``forward(streams, layer)`` returns new streams.

    Parameters (DeepSeek's names): ``fn`` FP32 ``[n(n+2), n·hidden]``, ``scale`` ``[3]``, ``base`` ``[n(n+2)]``,
    ``norm_weight`` ``[n·hidden]`` when ``norm_weight=True``. ``post_mult_value`` 2 (the mHC paper's ``2·sigmoid``;
    TileKernels' default is 1).

    >>> hc = HyperConnection(64, n_hc=4)
    >>> streams = hc.expand(torch.randn(3, 64))  # [T, C] -> [T, 4, C]
    >>> hc(streams, torch.nn.Linear(64, 64)).shape
    torch.Size([3, 4, 64])
    """

    def __init__(
        self,
        hidden_size: int,
        n_hc: int = 4,
        *,
        sinkhorn_iterations: int = 10,
        eps: float = 1e-6,
        pre_eps: float = 1e-6,
        sinkhorn_eps: float = 1e-6,
        post_mult_value: float = 2.0,
        norm_weight: bool = False,
    ) -> None:
        super().__init__()
        for arg, value in (("hidden_size", hidden_size), ("n_hc", n_hc)):
            ck.check_int_arg("HyperConnection", arg, value, 1)
        ck.check_int_arg("HyperConnection", "sinkhorn_iterations", sinkhorn_iterations, 0)
        self.hidden_size, self.n_hc = hidden_size, n_hc
        self.sinkhorn_iterations, self.eps, self.pre_eps = sinkhorn_iterations, eps, pre_eps
        self.sinkhorn_eps, self.post_mult_value = sinkhorn_eps, post_mult_value
        rows, width = n_hc * (n_hc + 2), n_hc * hidden_size
        # Small projection: the mixes start at their biases; the combination starts close to the identity.
        self.fn = nn.Parameter(torch.randn(rows, width) * width**-0.5 * 0.01)
        self.scale = nn.Parameter(torch.ones(3))
        base = torch.zeros(rows)
        base[2 * n_hc :] = (torch.eye(n_hc) * 4.0).flatten()
        self.base = nn.Parameter(base)
        self.norm_weight = nn.Parameter(torch.ones(width)) if norm_weight else None

    def expand(self, x: torch.Tensor) -> torch.Tensor:
        """The streams of the first layer: ``n_hc`` copies of the embedding ``x [..., C]``."""
        return mhc.expand_to_mhc(x, self.n_hc)

    def pre(self, streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(layer_input [..., C], post [..., n, 1], comb [..., n, n])`` of streams ``[..., n, C]``."""
        # The mixes are computed in FP32 (FP64 for FP64 streams) whatever dtype a model.to(...) left the
        # parameters in: the ops take them in that dtype.
        want = [self.n_hc, self.hidden_size]
        ok = streams.dim() >= 2 and list(streams.shape[-2:]) == want
        expected = f"[..., {want[0]}, {want[1]}] (n_hc streams of hidden_size)"
        ck.check_arg(ok, "HyperConnection", "streams", "shape", expected, list(streams.shape))
        acc = torch.float64 if streams.dtype == torch.float64 else torch.float32
        fn, scale, base = (p.to(acc) for p in (self.fn, self.scale, self.base))
        norm_weight = None if self.norm_weight is None else self.norm_weight.to(acc)
        return mhc.mhc_pre(
            streams, fn, scale, base, norm_weight=norm_weight, norm_eps=self.eps,
            post_mult_value=self.post_mult_value, pre_eps=self.pre_eps, sinkhorn_eps=self.sinkhorn_eps,
            sinkhorn_repeat=self.sinkhorn_iterations,
        )  # fmt: skip

    def forward(self, streams: torch.Tensor, layer: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        layer_input, post, comb = self.pre(streams)
        out = layer(layer_input)
        ck.check_arg(out.shape == layer_input.shape, "HyperConnection", "layer", "output shape",
                     lambda: f"its input's {list(layer_input.shape)}", list(out.shape))  # fmt: skip
        return mhc.mhc_post(out.to(streams.dtype), streams, post, comb)

    def extra_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, n_hc={self.n_hc}, sinkhorn_iterations={self.sinkhorn_iterations}, "
            f"post_mult_value={self.post_mult_value}, norm_weight={self.norm_weight is not None}"
        )
