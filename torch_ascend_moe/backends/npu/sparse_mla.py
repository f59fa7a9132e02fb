"""The sparse_mla family on Ascend: adapters onto FlashMLA's own Ascend 950 release (deepseek-ai/FlashMLA's G3 state,
2026-09-30, specs/flashmla_api.md §8), which registers ``torch.ops.flash_mla.sparse_prefill_fwd`` and
``sparse_decode_fwd`` for ``PrivateUse1`` when its ``flash_mla`` package is installed; the portable kernels
otherwise (gathers, einsums and a logsumexp: ACLNN ops on an NPU).

What the release's kernels take (its ``csrc/api/sparse_prefill.cpp`` / ``sparse_decode.cpp`` @ 136b361), so what
the adapters hand them, every other call staying portable:

* DeepSeek-V4.1 only: BF16 ``q`` with d_qk = d_v = 512, ``h_q`` = 64 (the Ascend kernels declare only HEAD_64), one
  KV head; decode over V4.1's 528-byte FP8 records, an extra cache of 528- or 288-byte records (FP4 only as the
  extra cache), token-interleaved, whole blocks contiguous (``stride(1)`` = the record size): the layouts this
  family reads, byte for byte. Not V3.2's 656 nor V4's 584 records.
* Index validity: ours leaves out anything ``< 0`` or past the rows / records; the release's decode treats only -1
  as invalid and reads out of bounds otherwise, and its prefill's rule on Ascend is not documented beyond the CUDA
  one. The adapters therefore rewrite every index ours leaves out to -1 on the device (one elementwise op, no host
  read) before the call.
* Top-k in multiples of 64 (the kernels' KV block, ``B_TOPK = 64``; upstream's tests use no other; [INFERRED]).
* Upstream's ``lse`` of the decode is ``[b, s_q, h_q]`` (the Python interface transposes it): returned here as ours,
  ``[b, h_q, s_q]``. Its numerics are FlashMLA's (P rounded to BF16 before P·V; a rescale skipped below 6 natural
  units), within the op's documented tolerance of ours, not bitwise.
* A build whose op has another signature (argument count) is not used.

Not mapped: torch_npu 2.13's own ``npu_sparse_flash_attention`` (CANN's DSA attention):

* Its inputs split the latent row into ``query`` / ``key`` and ``query_rope`` / ``key_rope``, take a block table,
  ``actual_seq_lengths_*`` and a ``sparse_block_size`` (DeepSeek-V3.2's 1-token blocks are ``sparse_block_size=1``)
  in BSND/TND layouts, and return three tensors whose meaning (``return_softmax_lse``, its log base, what an empty
  selection gives) is documented only in prose we have not been able to pin against FlashMLA's definitions
  (natural-log lse, +inf / -inf for a token with no row, ``attn_sink`` scaling ``out`` only).
* Invalid indices: the CANN op's handling of out-of-range entries (beyond ``-1`` padding) is not stated.

Verified how: ``tests/npu/test_flash_mla_ascend_adapter.py`` registers a stand-in ``flash_mla`` library on the CPU
with the release's signatures and checks (written from its C++ sources, computing upstream's reference math): which
calls reach it, what they pass, the outputs against our ops. Not run on an Ascend 950.
"""

from __future__ import annotations

import importlib

import torch

from torch_ascend_moe.backends.chain import TAKEN, first_refusal, kernel, on_refresh, refuse
from torch_ascend_moe.meta import sparse_mla as meta

HEADS, DIM, TOPK_BLOCK = 64, 512, 64
DECODE_RECORDS = {meta.V41_BYTES}  # the main cache; the extra one may also hold FP4 records
EXTRA_RECORDS = {meta.V41_BYTES, meta.V41_FP4_BYTES}
_ARITY = {"sparse_prefill_fwd": 7, "sparse_decode_fwd": 13}  # the release's signatures


_IMPORTED = []


@on_refresh
def _forget() -> None:
    _IMPORTED.clear()


def _import_release() -> None:
    """Import the ``flash_mla`` package once (its import loads the extension that registers the ops); absent or
    unloadable, the ops are simply not there."""
    if not _IMPORTED:
        _IMPORTED.append(True)
        try:
            importlib.import_module("flash_mla")
        except (ImportError, OSError):
            pass


def _release_has(name: str):
    def available():
        there = flash_mla_op(name) is not None
        return (
            TAKEN
            if there
            else refuse(
                f"FlashMLA's Ascend release is not loaded (no torch.ops.flash_mla.{name} with the release's signature)"
            )
        )

    return available


def flash_mla_op(name: str):
    """FlashMLA's ``torch.ops.flash_mla.<name>`` where its Ascend extension is loaded with the release's signature,
    else None."""
    _import_release()
    namespace = torch.ops.flash_mla
    if not hasattr(namespace, name):
        return None
    op = getattr(namespace, name).default
    return op if len(op._schema.arguments) == _ARITY[name] else None


def _last_dim_contiguous(*tensors) -> bool:
    return all(t is None or t.stride(-1) == 1 for t in tensors)


def _fits(q, d_v: int, topks: tuple[int, ...]) -> bool:
    return (
        q.dtype == torch.bfloat16
        and q.shape[-1] == DIM
        and d_v == DIM
        and q.shape[-2] == HEADS
        and all(k > 0 and k % TOPK_BLOCK == 0 for k in topks)
    )


def _only_minus_one(indices: torch.Tensor, limit: int) -> torch.Tensor:
    """Every index ours leaves out (``< 0`` or ``>= limit``) as -1, the only invalid value the kernels know."""
    return torch.where((indices < 0) | (indices >= limit), -1, indices)


def prefill_fits(q, kv, indices, d_v, attn_sink, topk_length) -> bool:
    """Whether the release's prefill kernel computes this call (see the module docstring)."""
    return (
        _fits(q, d_v, (indices.shape[2],))
        and q.shape[0] > 0
        and kv.shape[0] > 0
        and _last_dim_contiguous(q, kv, indices, attn_sink, topk_length)
    )


_NOT_V41 = "not a DeepSeek-V4.1 call the release takes (BF16, d 512, 64 heads, top-k in 64s, contiguous rows)"


def _takes_prefill(q, kv, indices, sm_scale, d_v, attn_sink, topk_length):
    meta.sparse_mla_prefill_signature(q, kv, indices, sm_scale, d_v, attn_sink, topk_length)
    return first_refusal(None if prefill_fits(q, kv, indices, d_v, attn_sink, topk_length) else _NOT_V41)


@kernel(
    device="npu",
    library="flash_mla",
    calls="flash_mla.sparse_prefill_fwd",
    takes=_takes_prefill,
    available=_release_has("sparse_prefill_fwd"),
)
def sparse_mla_prefill(q, kv, indices, sm_scale, d_v, attn_sink, topk_length):
    op = flash_mla_op("sparse_prefill_fwd")
    out, max_logits, lse = op(q, kv, _only_minus_one(indices, kv.shape[0]), sm_scale, d_v, attn_sink, topk_length)
    return out, max_logits, lse


def decode_fits(q, k_cache, indices, d_v, extra_k_cache, extra_indices) -> bool:
    """Whether the release's decode kernel computes this call (see the module docstring)."""
    caches = [(k_cache, DECODE_RECORDS)] + ([(extra_k_cache, EXTRA_RECORDS)] if extra_k_cache is not None else [])
    topks = (indices.shape[2],) + ((extra_indices.shape[2],) if extra_indices is not None else ())
    return (
        _fits(q, d_v, topks)
        and q.shape[0] > 0
        and q.shape[1] > 0
        and all(c.shape[3] in formats and c.stride(1) == c.shape[3] for c, formats in caches)
        and _last_dim_contiguous(q, indices, extra_indices)
    )


def _takes_decode(
    q, k_cache, indices, sm_scale, d_v, attn_sink, topk_length, extra_k_cache, extra_indices, extra_topk_length
):
    args = (q, k_cache, indices, sm_scale, d_v, attn_sink, topk_length, extra_k_cache, extra_indices, extra_topk_length)
    meta.sparse_mla_decode_signature(*args)
    fits = decode_fits(q, k_cache, indices, d_v, extra_k_cache, extra_indices)
    return first_refusal(None if fits else _NOT_V41 + " or not V4.1's 528-byte records")


@kernel(
    device="npu",
    library="flash_mla",
    calls="flash_mla.sparse_decode_fwd",
    takes=_takes_decode,
    available=_release_has("sparse_decode_fwd"),
)
def sparse_mla_decode(
    q, k_cache, indices, sm_scale, d_v, attn_sink, topk_length, extra_k_cache, extra_indices, extra_topk_length
):
    op = flash_mla_op("sparse_decode_fwd")
    contiguous = [None if t is None else t.contiguous() for t in (topk_length, attn_sink, extra_topk_length)]
    topk_length, attn_sink, extra_topk_length = contiguous
    if extra_k_cache is not None:
        extra_indices = _only_minus_one(extra_indices, extra_k_cache.shape[0] * extra_k_cache.shape[1])
    out, lse, _, _ = op(
        q, k_cache, _only_minus_one(indices, k_cache.shape[0] * k_cache.shape[1]), topk_length, attn_sink, None, None,
        extra_k_cache, extra_indices, extra_topk_length, d_v, sm_scale, False,
    )  # fmt: skip
    b, s_q, h_q = lse.shape
    return out, lse.new_empty(b, h_q, s_q).copy_(lse.transpose(1, 2))
