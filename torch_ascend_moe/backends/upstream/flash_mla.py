"""FlashMLA's own kernels behind the sparse_mla family: its G3 release (deepseek-ai/FlashMLA, 2026-09-30,
specs/flashmla_api.md §1, §3-§5, §8) registers ``torch.ops.flash_mla.sparse_prefill_fwd`` and ``sparse_decode_fwd``
for ``CUDA`` (SM100f only) and ``PrivateUse1`` (Ascend 950) when its ``flash_mla`` package is installed; the chain's
next kernels otherwise (CUDA: our Triton prefill; both: the portable kernels).

What the release's kernels take (its ``csrc/api/sparse_prefill.cpp`` / ``sparse_decode.cpp`` @ 136b361), so what
these kernels hand them, every other call refused:

* DeepSeek-V4.1 only: BF16 ``q`` with d_qk = d_v = 512, one KV head; ``h_q`` = 64 on Ascend (its kernels declare
  only HEAD_64), 64 or 128 on CUDA; decode over V4.1's 528-byte FP8 records, an extra cache of 528- or 288-byte
  records (FP4 only as the extra cache), token-interleaved, whole blocks contiguous (``stride(1)`` = the record
  size): the layouts this family reads, byte for byte. Not V3.2's 656 nor V4's 584 records.
* CUDA: SM100 only (the release's check: "only supported on SM100f").
* Index validity: ours leaves out anything ``< 0`` or past the rows / records; the release's decode treats only -1
  as invalid and reads out of bounds otherwise, and its prefill's rule is documented for CUDA only. Every index ours
  leaves out is rewritten to -1 on the device (one elementwise op, no host read) before the call.
* Top-k in multiples of 64 (the kernels' KV block, ``B_TOPK = 64``; CUDA's 128-head prefill: 128, or 64 up to 1280,
  its "small top-k" kernel).
* Upstream's ``lse`` of the decode is ``[b, s_q, h_q]`` (the Python interface transposes it): returned here as ours,
  ``[b, h_q, s_q]``. Its numerics are FlashMLA's (P rounded to BF16 before P·V; on Ascend a rescale skipped below 6
  natural units), within the op's documented tolerance of ours, not bitwise.
* A build whose op has another signature (argument count) is not used (FlashMLA before G3 exposes pybind
  functions, ``flash_mla.cuda``, with other call forms: not mapped).

Not mapped on Ascend: torch_npu 2.13's own ``npu_sparse_flash_attention`` (CANN's DSA attention): its inputs split
the latent row into ``query`` / ``key`` and ``query_rope`` / ``key_rope``, take a block table,
``actual_seq_lengths_*`` and a ``sparse_block_size`` in BSND/TND layouts, and return three tensors whose meaning
(``return_softmax_lse``, its log base, what an empty selection gives) is documented only in prose we have not been
able to pin against FlashMLA's definitions; its handling of out-of-range indices (beyond ``-1`` padding) is not
stated.

Verified how: ``tests/npu/test_flash_mla_ascend_adapter.py`` registers a stand-in ``flash_mla`` library on the CPU
with the release's signatures and checks (written from its C++ sources, computing upstream's reference math): which
calls reach it on each device's chain, what they pass, the outputs against our ops. Not run on an Ascend 950 or an
SM100 GPU.
"""

from __future__ import annotations

import importlib
import inspect

import torch

from torch_ascend_moe.backends.chain import TAKEN, first_refusal, kernel, on_refresh, refuse
from torch_ascend_moe.backends.upstream import Library
from torch_ascend_moe.checks import sparse_mla as sparse_checks
from torch_ascend_moe.distributed import capture

HEADS = {"npu": (64,), "cuda": (64, 128)}
DIM, TOPK_BLOCK, SM100 = 512, 64, 10
DECODE_RECORDS = {sparse_checks.V41_BYTES}  # the main cache; the extra one may also hold FP4 records
EXTRA_RECORDS = {sparse_checks.V41_BYTES, sparse_checks.V41_FP4_BYTES}
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
        if flash_mla_op(name) is not None:
            return TAKEN
        signature = f"no torch.ops.flash_mla.{name} with the release's signature"
        return refuse(f"FlashMLA's G3 release is not loaded ({signature})")

    return available


def flash_mla_op(name: str):
    """FlashMLA's ``torch.ops.flash_mla.<name>`` where its extension is loaded with the release's signature, else
    None."""
    _import_release()
    namespace = torch.ops.flash_mla
    if not hasattr(namespace, name):
        return None
    op = getattr(namespace, name).default
    return op if len(op._schema.arguments) == _ARITY[name] else None


def _last_dim_contiguous(*tensors) -> bool:
    return all(t is None or t.stride(-1) == 1 for t in tensors)


def sm_major(t: torch.Tensor) -> int | None:
    """The SM major of a CUDA tensor's GPU (None for any other tensor)."""
    return torch.cuda.get_device_capability(t.device)[0] if t.is_cuda else None


def _fits(device: str, q, d_v: int, topks: tuple[int, ...], prefill: bool) -> bool:
    heads = q.shape[-2]
    if device == "cuda" and sm_major(q) != SM100:
        return False
    blocks = all(k > 0 and k % TOPK_BLOCK == 0 for k in topks)
    if device == "cuda" and prefill and heads == 128:  # 128 wide, or the "small top-k" kernel
        blocks = blocks and all(k % 128 == 0 or k <= 1280 for k in topks)
    return q.dtype == torch.bfloat16 and q.shape[-1] == DIM and d_v == DIM and heads in HEADS[device] and blocks


def _only_minus_one(indices: torch.Tensor, limit: int, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Every index ours leaves out (``< 0``, ``>= limit``, or (``lengths``: ``[s_q]`` / ``[b]`` per row) at a top-k
    position at or past its row's length) as -1, the only invalid value the kernels know. Upstream documents that a
    valid index past ``topk_length`` pointing at a NaN row may poison its output: ours never reads one."""
    out = (indices < 0) | (indices >= limit)
    if lengths is not None:
        position = torch.arange(indices.shape[-1], device=indices.device)
        out = out | (position >= lengths.reshape(-1, *[1] * (indices.dim() - 1)))
    return torch.where(out, -1, indices)


def prefill_fits(device: str, q, kv, indices, d_v, attn_sink, topk_length) -> bool:
    """Whether the release's prefill kernel computes this call on ``device`` (see the module docstring)."""
    return (
        _fits(device, q, d_v, (indices.shape[2],), prefill=True)
        and q.shape[0] > 0
        and kv.shape[0] > 0
        and _last_dim_contiguous(q, kv, indices, attn_sink, topk_length)
    )


_NOT_V41 = (
    "not a DeepSeek-V4.1 call the release takes (BF16, d 512, 64 heads (CUDA: 64 or 128, on SM100), top-k in 64s, "
    "contiguous rows)"
)


def _takes_prefill(device: str):
    def takes(q, kv, indices, sm_scale, d_v, attn_sink, topk_length):
        sparse_checks.sparse_mla_prefill_signature(q, kv, indices, sm_scale, d_v, attn_sink, topk_length)
        fits = prefill_fits(device, q, kv, indices, d_v, attn_sink, topk_length)
        return first_refusal(None if fits else _NOT_V41)

    return takes


def _prefill(q, kv, indices, sm_scale, d_v, attn_sink, topk_length):
    op = flash_mla_op("sparse_prefill_fwd")
    indices = _only_minus_one(indices, kv.shape[0], topk_length)
    return op(q, kv, indices, sm_scale, d_v, attn_sink, topk_length)  # out, max, lse


for _device in ("cuda", "npu"):
    kernel(
        "sparse_mla_prefill",
        device=_device,
        library="flash_mla",
        calls="flash_mla.sparse_prefill_fwd",
        takes=_takes_prefill(_device),
        available=_release_has("sparse_prefill_fwd"),
    )(_prefill)


# ---- FlashMLA before G3 (G2 @ 9241ae3: pybind ``flash_mla.cuda`` behind ``flash_mla.flash_mla_sparse_fwd``) ----
#
# The release most Hopper installs have: its sparse prefill runs on SM90a and SM100f (G3 dropped SM90), with the
# semantics G3 kept (natural-log lse, lonely rows out 0 / lse +inf / max -inf, invalid = < 0 or >= s_kv), d_qk 576
# (V3.2) or 512 (V4), 64 or 128 heads. G1 (base-2 lse, lonely -inf) is told by its missing ``attn_sink`` and not
# used. Its kernels' top-k blocks: SM90 128 (``sm90/prefill/sparse/phase1.cuh``); SM100 64 with 64 heads, 128 with 128
# heads unless its "small top-k" kernel serves (top-k <= 1280, d_qk 512: 64). Its decode reads V3.2's and V4's
# records, which our decode op does not take: not mapped.

_G2_DIMS, _G2_HEADS, _INT32_MAX = (512, 576), (64, 128), 2**31 - 1


def _g2_build(module) -> str | None:
    fn = getattr(module, "flash_mla_sparse_fwd", None)
    if fn is None:
        return "flash_mla has no flash_mla_sparse_fwd (a FlashMLA before its sparse release)"
    if flash_mla_op("sparse_prefill_fwd") is not None:
        return "FlashMLA's G3 release is loaded (its ops serve SM100; it has no SM90 kernels)"
    if "attn_sink" not in inspect.signature(fn).parameters:
        return "FlashMLA G1 (base-2 lse, lonely rows -inf): not mapped"
    return None


G2 = Library("flash_mla", accept=_g2_build)


def _g2_topk_block(arch: int, heads: int, d_qk: int, topk: int) -> int:
    if arch == 9 or (heads == 128 and not (topk <= 1280 and d_qk == 512)):
        return 128
    return TOPK_BLOCK


def g2_prefill_refusal(q, kv, indices, d_v) -> str | None:
    """Why FlashMLA G2's sparse prefill does not take this (checked) call, or None."""
    if not all(capture.has_data(t) for t in (q, kv, indices)):
        return "fake or meta tensors (the library runs on data; our fake serves tracing)"
    arch = sm_major(q)
    if arch not in (9, SM100):
        return f"SM{arch}x: FlashMLA G2's sparse prefill is SM90a's and SM100f's"
    (s_q, heads, d_qk), topk = q.shape, indices.shape[2]
    if q.dtype != torch.bfloat16 or d_qk not in _G2_DIMS or d_v != DIM or heads not in _G2_HEADS:
        return f"{q.dtype} q, d_qk {d_qk}, d_v {d_v}, {heads} heads (G2: BF16, d_qk 512 or 576, d_v 512, 64/128 heads)"
    block = _g2_topk_block(arch, heads, d_qk, topk)
    if not (s_q and kv.shape[0] and topk) or topk % block:
        return f"top-{topk} over {kv.shape[0]} rows (G2's kernel on SM{arch}x takes non-empty top-k in {block}s)"
    if not _last_dim_contiguous(q, kv, indices) or any(
        abs(x) > _INT32_MAX for t in (q, kv, indices) for x in t.stride()
    ):
        return "a last dim not contiguous, or strides past int32 (G2 passes them as int)"
    return None


def _takes_g2_prefill(q, kv, indices, sm_scale, d_v, attn_sink, topk_length):
    sparse_checks.sparse_mla_prefill_signature(q, kv, indices, sm_scale, d_v, attn_sink, topk_length)
    return first_refusal(g2_prefill_refusal(q, kv, indices, d_v))


@kernel(
    "sparse_mla_prefill",
    device="cuda",
    library="flash_mla",
    calls="flash_mla.flash_mla_sparse_fwd (G2: flash_mla.cuda)",
    takes=_takes_g2_prefill,
    available=G2.available,
)
def _g2_prefill(q, kv, indices, sm_scale, d_v, attn_sink, topk_length):
    indices = _only_minus_one(indices, kv.shape[0], topk_length)
    attn_sink, topk_length = (None if t is None else t.contiguous() for t in (attn_sink, topk_length))
    return tuple(G2.module().flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v, attn_sink, topk_length))


def decode_fits(device: str, q, k_cache, indices, d_v, extra_k_cache, extra_indices) -> bool:
    """Whether the release's decode kernel computes this call on ``device`` (see the module docstring)."""
    caches = [(k_cache, DECODE_RECORDS)] + ([(extra_k_cache, EXTRA_RECORDS)] if extra_k_cache is not None else [])
    topks = (indices.shape[2],) + ((extra_indices.shape[2],) if extra_indices is not None else ())
    return (
        _fits(device, q, d_v, topks, prefill=False)
        and q.shape[0] > 0
        and q.shape[1] > 0
        and all(c.shape[3] in formats and c.stride(1) == c.shape[3] for c, formats in caches)
        and _last_dim_contiguous(q, indices, extra_indices)
    )


def _takes_decode(device: str):
    def takes(
        q, k_cache, indices, sm_scale, d_v, attn_sink, topk_length, extra_k_cache, extra_indices, extra_topk_length
    ):
        sparse_checks.sparse_mla_decode_signature(
            q, k_cache, indices, sm_scale, d_v, attn_sink, topk_length, extra_k_cache, extra_indices, extra_topk_length
        )
        fits = decode_fits(device, q, k_cache, indices, d_v, extra_k_cache, extra_indices)
        return first_refusal(None if fits else _NOT_V41 + " or not V4.1's 528-byte records")

    return takes


def _decode(
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


for _device in ("cuda", "npu"):
    kernel(
        "sparse_mla_decode",
        device=_device,
        library="flash_mla",
        calls="flash_mla.sparse_decode_fwd",
        takes=_takes_decode(_device),
        available=_release_has("sparse_decode_fwd"),
    )(_decode)
