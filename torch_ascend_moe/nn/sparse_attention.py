"""DeepSeek Sparse Attention (DeepSeek-V3.2's attention) in MLA's absorbed form, prefill path: a
``LightningIndexer`` picks each token's ``topk`` keys (``mqa_logits_topk``: never the ``[T, T]`` scores), and
``sparse_mla_prefill`` attends over those latent rows only (memory O(T * topk)).

Per token: one latent KV row ``[kv_lora_rank | rope_dim]`` (the RMS-normalised compressed KV, then the RoPE'd key
part), shared by every head; queries in the same latent space per head (``w_uk`` absorbed into the query
projection); the attention's output is latent ``[T, H, kv_lora_rank]``, taken to each head's values by ``w_uv``
and to the hidden size by ``wo``. RoPE: rotate-half on the last ``rope_dim`` columns of q and k.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from torch_ascend_moe import checks as ck
from torch_ascend_moe.backends.portable.sparse_mla import encode_v32
from torch_ascend_moe.checks.sparse_mla import V32_BYTES, V32_NOPE, V32_ROPE
from torch_ascend_moe.nn.lightning_indexer import LightningIndexer
from torch_ascend_moe.ops.mqa_logits import mqa_topk, paged_mqa_logits
from torch_ascend_moe.ops.sparse_mla import sparse_mla_decode, sparse_mla_prefill


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Rotate-half RoPE of ``x [T, ..., d]`` (d even) at integer ``positions [T]``, computed in FP32."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    angles = positions.float()[:, None] * inv[None, :]  # [T, d / 2]
    shape = [x.shape[0]] + [1] * (x.dim() - 2) + [d // 2]
    cos, sin = angles.cos().view(shape), angles.sin().view(shape)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def _per_head(t: torch.Tensor, b: int, n: int, heads: int) -> torch.Tensor:
    """``t [b * n, heads, ...]`` (or ``[b * n, heads * m]``) as ``[b, n, heads, m]``, with every size known."""
    return t.view(b, n, heads, math.prod(t.shape[1:]) // heads)


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
            raise ValueError(ck.message("DSAttention", "rope_dim", "value", "an even number", rope_dim))
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
        hidden = self.wkv.in_features
        ck.check_arg(x.dim() == 2 and x.shape[1] == hidden, "DSAttention", "x", "shape", f"[T, hidden_size={hidden}]",
                     list(x.shape))  # fmt: skip
        t = x.shape[0]
        positions = torch.arange(t, device=x.device) if positions is None else positions
        ck.check_arg(positions.shape == (t,), "DSAttention", "positions", "shape", f"[T={t}]", list(positions.shape))
        q = self.wq(x).unflatten(-1, (self.num_heads, -1))  # unflatten: sizes known at 0 tokens too
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
        return self._output(latent)

    def _output(self, latent: torch.Tensor) -> torch.Tensor:
        values = torch.einsum("thr,hrv->thv", latent, self.w_uv.to(latent.dtype))
        return self.wo(values.flatten(1))

    def new_cache(self, batch: int, max_tokens: int, page: int = 64, kv_format: str = "bf16") -> PagedDSACache:
        """An empty paged cache for ``decode`` (see ``PagedDSACache``)."""
        return PagedDSACache(self, batch, max_tokens, page, kv_format)

    def decode(self, x: torch.Tensor, cache: PagedDSACache) -> torch.Tensor:
        """``x [batch, n, hidden]``: each request's next ``n`` tokens (a prompt, one generated token, or a few with
        multi-token prediction) -> ``[batch, n, hidden]``. Their latent rows and indexer keys are appended to
        ``cache``; token ``t`` of request ``b`` then attends over the ``topk`` of its request's tokens up to itself
        that the indexer ranks highest, read from the pages: the indexer through ``paged_mqa_logits`` + ``mqa_topk``,
        the attention through ``sparse_mla_prefill`` over the cache's rows (``"bf16"``) or ``sparse_mla_decode``
        over its FP8 records (``"fp8"``). The same function of the tokens as ``forward`` over the whole sequence
        (up to the FP8 rounding of the latent rows with ``"fp8"``). Inference: the selection is not
        differentiable, and the cache holds values, not a graph."""
        api = "DSAttention.decode"
        ck.check_arg(x.dim() == 3, api, "x", "rank", "3 ([batch, n, hidden])", x.dim())
        b, n, _ = x.shape
        ck.check_arg(b == cache.lengths.shape[0], api, "x", "size(0)", f"the cache's batch {cache.lengths.shape[0]}", b)
        if not torch.compiler.is_compiling():  # a host read: skipped in a graph
            room = cache.block_table.shape[1] * cache.page - int(cache.lengths.max()) if b else n
            ck.check_arg(n <= room, api, "x", "size(1)", f"at most {room} tokens (the cache's room left)", n)
        if b * n == 0:  # no token: nothing appended, nothing attended (the indexer's ops need a token)
            return x.new_empty(b, n, x.shape[2])
        positions = cache.lengths.long()[:, None] + torch.arange(n, device=x.device)  # [b, n]
        flat = x.flatten(0, 1)  # no -1 sizes in this method: none can be inferred at 0 tokens
        q, kv = self.latents(flat, positions.reshape(-1))
        with torch.no_grad():  # the indexer's inference path: really quantized operands
            iq, k_data, weights, q_sf, k_sf = self.indexer._inputs(flat.detach(), None)
        cache.write(kv.detach().view(b, n, kv.shape[-1]), k_data, k_sf)
        context = (positions + 1).to(torch.int32)  # token t sees its request's tokens up to itself
        # Columns of the logits: the longest context, or (no host read while compiling) the cache's capacity.
        capacity = cache.block_table.shape[1] * cache.page
        columns = capacity if torch.compiler.is_compiling() else int(cache.lengths.max())
        heads = self.indexer.num_heads
        with torch.no_grad():
            logits = paged_mqa_logits(
                _per_head(iq, b, n, heads), cache.index_k, weights, context, cache.block_table, columns,
                q_sf=None if q_sf is None else _per_head(q_sf, b, n, heads), logits_dtype=torch.float32,
            )  # fmt: skip
            zeros = torch.zeros(b * n, dtype=torch.int32, device=x.device)
            _, picked = mqa_topk(logits, zeros, context.view(-1), self.indexer.topk)  # positions, -1 padded
        topk = picked.shape[-1]
        records = cache.records(picked.reshape(b, n * topk)).to(torch.int32)  # [b, n * topk]
        if cache.kv_format == "fp8":
            latent, _ = sparse_mla_decode(
                q.unflatten(0, (b, n)), cache.kv, records.view(b, n, topk), self.scale, self.kv_lora_rank
            )
            latent = latent.flatten(0, 1)
        else:
            rows = cache.kv.view(-1, 1, cache.kv.shape[-1])
            latent, _, _ = sparse_mla_prefill(q, rows, records.view(b * n, 1, topk), self.scale, self.kv_lora_rank)
        return self._output(latent).unflatten(0, (b, n))


class PagedDSACache:
    """One ``DSAttention`` layer's decode state for ``batch`` requests of up to ``max_tokens`` tokens each, in pages
    of ``page`` tokens: the latent KV rows (``kv_format`` ``"bf16"``: rows in the module's dtype, ``[blocks, page, 1,
    d_qk]``; ``"fp8"``: DeepSeek-V3.2's 656-byte FlashMLA records, d_qk 576 only) and the indexer's keys (DeepGEMM's
    paged FP8 / FP4 layout, what ``paged_mqa_logits`` reads), one ``block_table [batch, max_blocks]`` for both and
    ``lengths [batch]`` (tokens written). Blocks are assigned in a random order (a serving engine's allocator
    would; the kernels never assume order). The tensors are public: an engine may bring its own block table."""

    def __init__(self, layer: DSAttention, batch: int, max_tokens: int, page: int = 64, kv_format: str = "bf16"):
        d_qk = layer.kv_lora_rank + layer.rope_dim
        if kv_format not in ("bf16", "fp8"):
            raise ValueError(ck.message("PagedDSACache", "kv_format", "value", "'bf16' or 'fp8'", repr(kv_format)))
        if kv_format == "fp8" and (layer.kv_lora_rank, layer.rope_dim) != (V32_NOPE, V32_ROPE):
            raise ValueError(
                "PagedDSACache: argument 'kv_format' value: 'fp8' (DeepSeek-V3.2's 656-byte records) needs "
                f"kv_lora_rank 512 and rope_dim 64, got {layer.kv_lora_rank} and {layer.rope_dim}"
            )
        for arg, value, low in (("batch", batch, 0), ("max_tokens", max_tokens, 0), ("page", page, 1)):
            ck.check_int_arg("PagedDSACache", arg, value, low)
        quant, dim = layer.indexer.quant, layer.indexer.head_dim
        if quant is None:
            raise ValueError("PagedDSACache: the layer's indexer must quantize its keys ('fp8' or 'fp4') to be paged")
        weight = layer.wkv.weight
        per = -(-max_tokens // page)
        self.page, self.kv_format, self.quant = page, kv_format, quant
        blocks = batch * per
        self.block_table = torch.randperm(blocks, device=weight.device).to(torch.int32).view(batch, per)
        self.lengths = torch.zeros(batch, dtype=torch.int32, device=weight.device)
        if kv_format == "fp8":
            self.kv = torch.zeros(blocks, page, 1, V32_BYTES, dtype=torch.uint8, device=weight.device)
        else:
            self.kv = torch.zeros(blocks, page, 1, d_qk, dtype=weight.dtype, device=weight.device)
        self.index_data = dim if quant == "fp8" else dim // 2  # bytes of a key, then 4 bytes of scales
        self.index_k = torch.zeros(blocks, page, 1, self.index_data + 4, dtype=torch.uint8, device=weight.device)

    def records(self, positions: torch.Tensor) -> torch.Tensor:
        """Record numbers ``block * page + offset`` of token ``positions [batch, n]`` (-1 stays -1)."""
        valid = positions >= 0
        pos = positions.clamp(min=0).long()
        block = self.block_table.long().gather(1, pos // self.page)
        return torch.where(valid, block * self.page + pos % self.page, -1)

    def write(self, kv_rows: torch.Tensor, data: torch.Tensor, sf: torch.Tensor) -> None:
        """Append ``kv_rows [batch, n, d_qk]`` and the indexer's quantized keys (``data [batch * n, ...]``, FP32
        scales ``sf [batch * n, blocks]``: the bytes its prefill path computes) after each request's tokens."""
        batch, n = kv_rows.shape[:2]
        if batch * n == 0:  # nothing to append (and no rows to index the pages with)
            return
        positions = self.lengths.long()[:, None] + torch.arange(n, device=kv_rows.device)
        records = self.records(positions).reshape(-1)
        rows = kv_rows.flatten(0, 1)
        if self.kv_format == "fp8":
            self.kv.view(-1, V32_BYTES)[records] = encode_v32(rows)
        else:
            self.kv.view(-1, rows.shape[1])[records] = rows.to(self.kv.dtype)
        if self.quant == "fp8":  # one FP32 scale per key
            scale_bytes = sf.float().contiguous().view(torch.uint8)
        else:  # UE8M0 codes of the power-of-two scales per 32 values, padded to 4 bytes
            codes = (torch.log2(sf.float()) + 127).to(torch.uint8)
            scale_bytes = torch.nn.functional.pad(codes, (0, 4 - codes.shape[1]), value=127)
        # DeepGEMM's paged layout: a block's ``page`` key rows, then its ``page`` scale rows
        block_bytes = self.index_k.view(self.index_k.shape[0], -1)
        block, offset = records // self.page, records % self.page
        cols = torch.arange(self.index_data, device=records.device)
        block_bytes[block[:, None], (offset * self.index_data)[:, None] + cols] = data.view(torch.uint8)
        sf_cols = self.page * self.index_data + offset[:, None] * 4 + torch.arange(4, device=records.device)
        block_bytes[block[:, None], sf_cols] = scale_bytes
        self.lengths += n
