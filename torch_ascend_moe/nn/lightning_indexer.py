"""``LightningIndexer``: DeepSeek's sparse-attention indexer (DeepSeek-V3.2 DSA) on the mqa_logits ops.

Per token, ``H`` small query heads and one shared key (MQA) score every visible KV token:
``I[i, j] = sum_h w[i, h] * relu(q[i, h] . k[j])``, and each query keeps its top-k KV positions for the
sparse attention that follows. As in DeepSeek's model, ``k`` is LayerNorm-ed, the per-head weights come from
a projection of the hidden state scaled by ``H^-1/2 * D^-1/2``, and q/k are quantized (FP8 with one FP32
scale per (token, head) / per token, or FP4 with 1x32 UE8M0 scales) before the scores.

Inference (no gradient needed) quantizes for real and runs the FP8/FP4 kernel. Training runs the same
numerics through a straight-through fake quantizer and the BF16/FP32 kernel, so the projections get
gradients; DeepSeek trains the indexer against the main attention with a KL loss (``indexer_kl_loss``).
"""

from __future__ import annotations

import torch
from torch import nn

from torch_ascend_moe import checks as ck
from torch_ascend_moe.ops.mqa_logits import mqa_logits, mqa_logits_topk, mqa_topk
from torch_ascend_moe.quant.straight_through import fake_quantize, quantize_rows

_BLOCK = {"fp8": None, "fp4": 32}  # FP8: one scale per row (None = D); FP4: 1 x 32 UE8M0


class LightningIndexer(nn.Module):
    """Scores KV tokens for each query and selects the top-k.

    ``forward(x, ks, ke, q_input=None)`` with hidden states ``x [T, hidden]`` (queries and keys are the same
    tokens), per-query visible ranges ``[ks[i], ke[i])`` and optionally a separate query input (DeepSeek
    feeds the compressed query latent) returns ``(indices [T, topk] int32, logits [T, T])``; indices are KV
    positions, -1 where fewer than ``topk`` are visible. ``select`` returns the top-k alone, without the
    ``[T, T]`` logits. ``quant``: ``"fp8"``, ``"fp4"`` or None.
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int = 64,
        head_dim: int = 128,
        topk: int = 2048,
        quant: str | None = "fp8",
        q_input_size: int | None = None,
    ):
        super().__init__()
        if quant not in (None, "fp8", "fp4"):
            raise ValueError(ck.message("LightningIndexer", "quant", "value", "'fp8', 'fp4' or None", repr(quant)))
        if quant == "fp4" and head_dim % 32:
            raise ValueError(ck.message("LightningIndexer", "head_dim", "value", "a multiple of 32", head_dim))
        self.num_heads, self.head_dim, self.topk, self.quant = num_heads, head_dim, topk, quant
        self.wq = nn.Linear(q_input_size or hidden_size, num_heads * head_dim, bias=False)
        self.wk = nn.Linear(hidden_size, head_dim, bias=False)
        self.k_norm = nn.LayerNorm(head_dim)
        self.weights_proj = nn.Linear(hidden_size, num_heads, bias=False)

    def _operands(self, q: torch.Tensor, k: torch.Tensor) -> dict:
        """The op's q/k arguments: float, fake-quantized (training) or really quantized (inference)."""
        if self.quant is None:
            return {"q": q, "k": k}
        gran = _BLOCK[self.quant] or self.head_dim
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
            return {"q": fake_quantize(q, self.quant, gran), "k": fake_quantize(k, self.quant, gran)}
        (q_data, q_sf), (k_data, k_sf) = quantize_rows(q, self.quant, gran), quantize_rows(k, self.quant, gran)
        return {"q": q_data, "q_sf": q_sf, "k": k_data, "k_sf": k_sf}

    def _inputs(self, x: torch.Tensor, q_input: torch.Tensor | None):
        """(q, k, weights, q_sf, k_sf) for the mqa ops."""
        hidden = self.wk.in_features
        ck.check_arg(x.dim() == 2 and x.shape[1] == hidden, "LightningIndexer", "x", "shape",
                     f"[T, hidden_size={hidden}]", list(x.shape))  # fmt: skip
        t = x.shape[0]
        q = self.wq(x if q_input is None else q_input).float().view(t, self.num_heads, self.head_dim)
        k = self.k_norm(self.wk(x)).float()
        weights = self.weights_proj(x).float() * (self.num_heads**-0.5 * self.head_dim**-0.5)
        ops = self._operands(q, k)
        return ops["q"], ops["k"], weights, ops.get("q_sf"), ops.get("k_sf")

    def logits(self, x: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, q_input: torch.Tensor | None = None):
        """Index scores ``[T, T]`` (FP32), exactly -inf outside ``[ks, ke)``."""
        q, k, weights, q_sf, k_sf = self._inputs(x, q_input)
        return mqa_logits(q, k, weights, ks, ke, q_sf=q_sf, k_sf=k_sf, logits_dtype=torch.float32)

    def select(self, x: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, q_input: torch.Tensor | None = None):
        """``(scores [T, topk] FP32, indices [T, topk] int32)`` without the ``[T, T]`` logits (``mqa_logits_topk``):
        what sparse attention consumes at inference; the same indices as ``forward``."""
        q, k, weights, q_sf, k_sf = self._inputs(x, q_input)
        return mqa_logits_topk(q, k, weights, ks, ke, self.topk, q_sf=q_sf, k_sf=k_sf, logits_dtype=torch.float32)

    def forward(self, x: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, q_input: torch.Tensor | None = None):
        logits = self.logits(x, ks, ke, q_input)
        _, indices = mqa_topk(logits, ks, ke, self.topk)
        return indices, logits


def indexer_kl_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V3.2's indexer loss: mean over queries of ``KL(p || softmax(I))``, where ``p`` is the main
    attention distribution (summed over heads, L1-normalised per query; zero on masked positions) and ``I``
    the index logits (-inf on masked positions). Queries with nothing visible contribute 0."""
    visible = torch.isfinite(logits)
    log_q = torch.log_softmax(logits.masked_fill(~visible, -1e30), dim=-1)
    p = torch.where(visible, target, 0)
    p = p / p.sum(-1, keepdim=True).clamp_min(torch.finfo(p.dtype).tiny)
    terms = torch.where(p > 0, p * (p.clamp_min(torch.finfo(p.dtype).tiny).log() - log_q), 0)
    return terms.sum(-1).mean()
