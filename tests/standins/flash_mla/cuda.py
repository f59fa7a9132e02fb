"""The stand-in's ``flash_mla.cuda`` extension: ``sparse_prefill_fwd`` as ``csrc/api/sparse_fwd.h`` @ 9241ae3 checks
and computes it (``TORCH_CHECK`` failures as ``RuntimeError`` with upstream's words; the kernels' own asserts as
``Panic``), the math of ``tests/ref.py::ref_sparse_attn_fwd`` in float64. The other entry points are not modelled."""

from __future__ import annotations

import torch

from . import _standin as S

F64 = torch.float64


def _check(ok: bool, *words) -> None:
    if not ok:
        raise RuntimeError("".join(str(w) for w in words))


def _ndim(t, n, name):
    _check(t is None or t.dim() == n, f"{name} must be a {n}D tensor")


def _dtype(t, dtype, name):
    _check(t is None or t.dtype == dtype, f"{name} must have dtype {dtype}")


def _last_dim_contiguous(t, name):
    _check(t is None or t.stride(-1) == 1, f"{name} must have contiguous last dimension")


def sparse_prefill_fwd(q, kv, indices, sm_scale, d_v, attn_sink, topk_length):
    S.CALLS.append(("sparse_prefill_fwd", {"q": tuple(q.shape), "indices": tuple(indices.shape), "d_v": d_v}))
    arch = S.STATE.arch
    _check(
        arch in (9, 10),
        "Sparse Attention Forward Kernel is only supported on SM90a and SM100f architectures.",
    )
    for t, n, name in ((q, 3, "q"), (kv, 3, "kv"), (indices, 3, "indices"), (attn_sink, 1, "attn_sink")):
        _ndim(t, n, name)
    _ndim(topk_length, 1, "topk_length")
    s_q, h_q, d_qk = q.shape
    s_kv, h_kv = kv.shape[0], kv.shape[1]
    topk = indices.shape[2]
    _check(d_qk in (576, 512), "Invalid d_qk: ", d_qk)
    _check(d_v == 512, "Invalid d_v", d_v)
    for t, dtype, name in (
        (q, torch.bfloat16, "q"),
        (kv, torch.bfloat16, "kv"),
        (indices, torch.int32, "indices"),
        (attn_sink, torch.float32, "attn_sink"),
        (topk_length, torch.int32, "topk_length"),
    ):
        _dtype(t, dtype, name)
    _check(tuple(kv.shape) == (s_kv, h_kv, d_qk), "kv shape mismatch")
    _check(tuple(indices.shape) == (s_q, h_kv, topk), "indices shape mismatch")
    _check(attn_sink is None or tuple(attn_sink.shape) == (h_q,), "attn_sink shape mismatch")
    _check(topk_length is None or tuple(topk_length.shape) == (s_q,), "topk_length shape mismatch")
    for t, name in ((q, "q"), (kv, "kv"), (indices, "indices"), (attn_sink, "attn_sink"), (topk_length, "tl")):
        _last_dim_contiguous(t, name)
    for t in (q, kv, indices):
        for stride in t.stride()[:2]:
            _check(abs(stride) <= 2**31 - 1, "stride does not fit int32")
    _check(h_q in (64, 128), "Unsupported h_q: ", h_q)
    # The kernels' own asserts (device traps): h_kv 1; top-k blocks per arch / head count / kernel.
    if h_kv != 1:
        raise S.Panic(f"h_kv = {h_kv}: the kernels assume one KV head")
    block = 128 if arch == 9 or (h_q == 128 and not (topk <= 1280 and d_qk == 512)) else 64
    if topk % block or s_q == 0:
        raise S.Panic(f"top-{topk} on SM{arch}x with {h_q} heads: the kernel's top-k block is {block}")
    return _reference(q, kv, indices[:, 0], sm_scale, d_v, attn_sink, topk_length)


def _reference(q, kv, idx, sm_scale, d_v, attn_sink, topk_length):
    """``ref_sparse_attn_fwd`` in float64, plus the documented NaN caveat: a valid index at or past ``topk_length``
    pointing at a row with a NaN poisons the output (the kernel loads whole blocks before masking)."""
    s_q, h_q, _ = q.shape
    s_kv, topk = kv.shape[0], idx.shape[1]
    idx = idx.long().clone()
    in_range = (idx >= 0) & (idx < s_kv)
    past = torch.zeros_like(in_range)
    if topk_length is not None:
        past = torch.arange(topk).unsqueeze(0) >= topk_length.long().unsqueeze(1)
    invalid = ~in_range | past
    gathered = kv[:, 0].to(F64)[torch.where(in_range, idx, 0)]  # [s_q, topk, d_qk]
    p = torch.einsum("shd,std->sht", q.to(F64), gathered) * sm_scale
    p = p.masked_fill(invalid.unsqueeze(1), float("-inf"))
    lse = torch.logsumexp(p, -1)
    max_logits = p.max(-1).values
    norm = lse if attn_sink is None else torch.logaddexp(lse, attn_sink.to(F64).unsqueeze(0))
    norm = torch.where(norm == float("-inf"), float("inf"), norm)
    out = torch.einsum("sht,std->shd", torch.exp(p - norm.unsqueeze(-1)), gathered[..., :d_v])
    poisoned = (past & in_range & torch.isnan(gathered).any(-1)).any(-1)  # [s_q]
    out[poisoned] = float("nan")
    lse = torch.where(lse == float("-inf"), float("inf"), lse)
    return out.to(torch.bfloat16), max_logits.float(), lse.float()


def __getattr__(name):
    if name in ("sparse_decode_fwd", "dense_decode_fwd", "dense_prefill_fwd", "dense_prefill_bwd", "get_mla_metadata"):

        def not_modelled(*args, **kwargs):
            raise NotImplementedError(f"FlashMLA stand-in: flash_mla.cuda.{name} is not modelled")

        return not_modelled
    raise AttributeError(name)
