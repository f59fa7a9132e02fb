"""DeepSeek Sparse Attention (DeepSeek-V3.2's attention) in MLA's absorbed form, prefill path: a
``LightningIndexer`` picks each token's ``topk`` keys (``mqa_logits_topk``: never the ``[T, T]`` scores), and
``sparse_mla_prefill`` attends over those latent rows only (memory O(T * topk)).

Per token: one latent KV row ``[kv_lora_rank | rope_dim]`` (the RMS-normalised compressed KV, then the RoPE'd key
part), shared by every head; queries in the same latent space per head (``w_uk`` absorbed into the query
projection); the attention's output is latent ``[T, H, kv_lora_rank]``, taken to each head's values by ``w_uv``
and to the hidden size by ``wo``. RoPE: rotate-half on the last ``rope_dim`` columns of q and k.
"""

from __future__ import annotations

import torch
from torch import nn

from torch_ascend_moe.nn.lightning_indexer import LightningIndexer
from torch_ascend_moe.ops.sparse_mla import sparse_mla_prefill


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Rotate-half RoPE of ``x [T, ..., d]`` (d even) at integer ``positions [T]``, computed in FP32."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    angles = positions.float()[:, None] * inv[None, :]  # [T, d / 2]
    shape = [x.shape[0]] + [1] * (x.dim() - 2) + [d // 2]
    cos, sin = angles.cos().view(shape), angles.sin().view(shape)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class DSAttention(nn.Module):
    """``forward(x [T, hidden], ks=None, ke=None, positions=None) -> [T, hidden]``: every token attends over the
    ``topk`` tokens the indexer ranks highest inside ``[ks[i], ke[i])`` (default causal: ``[0, i + 1)``); a varlen
    batch is one ``T`` with per-sequence ranges. ``indices(x, ks, ke)`` gives the selection alone (``[T, topk]``,
    -1 where fewer are visible). The selection is not differentiable (the indexer trains by ``indexer_kl_loss``);
    everything else is."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        kv_lora_rank: int = 512,
        rope_dim: int = 64,
        v_head_dim: int = 128,
        topk: int = 2048,
        indexer_heads: int = 64,
        indexer_head_dim: int = 128,
        indexer_quant: str | None = "fp8",
    ) -> None:
        super().__init__()
        if rope_dim % 2:
            raise ValueError(f"DSAttention: argument 'rope_dim' value: expected an even number, got {rope_dim}")
        self.num_heads, self.kv_lora_rank, self.rope_dim, self.v_head_dim = (
            num_heads,
            kv_lora_rank,
            rope_dim,
            v_head_dim,
        )
        d_qk = kv_lora_rank + rope_dim
        self.wq = nn.Linear(hidden_size, num_heads * d_qk, bias=False)  # w_uk absorbed: queries in latent space
        self.wkv = nn.Linear(hidden_size, d_qk, bias=False)
        self.kv_norm = nn.RMSNorm(kv_lora_rank)
        self.w_uv = nn.Parameter(torch.randn(num_heads, kv_lora_rank, v_head_dim) * kv_lora_rank**-0.5)
        self.wo = nn.Linear(num_heads * v_head_dim, hidden_size, bias=False)
        self.indexer = LightningIndexer(hidden_size, indexer_heads, indexer_head_dim, topk, indexer_quant)
        self.scale = d_qk**-0.5

    @staticmethod
    def _ranges(t: int, device, ks, ke):
        if ks is None:
            ks = torch.zeros(t, dtype=torch.int32, device=device)
        if ke is None:
            ke = torch.arange(1, t + 1, dtype=torch.int32, device=device)
        return ks, ke

    def latents(self, x: torch.Tensor, positions: torch.Tensor | None = None):
        """``(q [T, H, d_qk], kv [T, 1, d_qk])``: the operands of ``sparse_mla_prefill``."""
        t = x.shape[0]
        positions = torch.arange(t, device=x.device) if positions is None else positions
        q = self.wq(x).view(t, self.num_heads, -1)
        kv = self.wkv(x)
        r = self.kv_lora_rank
        q = torch.cat([q[..., :r], rotary(q[..., r:], positions)], dim=-1)
        kv = torch.cat([self.kv_norm(kv[:, :r]), rotary(kv[:, r:], positions)], dim=-1)
        return q, kv[:, None, :]

    def indices(self, x: torch.Tensor, ks=None, ke=None) -> torch.Tensor:
        ks, ke = self._ranges(x.shape[0], x.device, ks, ke)
        with torch.no_grad():
            _, idx = self.indexer.select(x.detach(), ks, ke)
        return idx

    def forward(self, x: torch.Tensor, ks=None, ke=None, positions=None) -> torch.Tensor:
        q, kv = self.latents(x, positions)
        idx = self.indices(x, ks, ke)
        latent, _, _ = sparse_mla_prefill(q, kv, idx[:, None, :], self.scale, self.kv_lora_rank)
        values = torch.einsum("thr,hrv->thv", latent, self.w_uv.to(latent.dtype))
        return self.wo(values.reshape(x.shape[0], -1))
