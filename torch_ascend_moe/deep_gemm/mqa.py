"""DeepGEMM's MQA-logits API (specs/deepgemm_api.md §8, Ascend §16.2) over the ``ascend_moe`` mqa_logits ops.

Upstream forms: ``q`` FP8 ``[S, H, D]`` (no scale) or FP4 ``(int8 [S, H, D/2], int32 [S, H])``; KV FP8
``(K [S_kv, D], FP32 [S_kv])`` or FP4 ``(int8 [S_kv, D/2], int32 [S_kv])`` (UE8M0, 1x32, packed 4 per int32).
DeepGEMM-Ascend's forms are recognised by their arguments: ``max_seqlen_k`` given positionally where upstream
has ``clean_logits``, Q scales required, int16 UE8M0 pairs ``[.., D/64]``, BF16 weights and logits, compressed
output only; paged calls take ``indices`` as the 8th positional argument and ``use_ascend_kv_layout``.

Upstream's kernel limits are enforced so code that runs here runs there: ``D`` in {32, 64, 128} (FP4: 64,
128), ``H`` a multiple of 4 up to 128 (DeepGEMM 2.8's SM100 rule; Ascend: ``4 <= H <= 64``, ``D`` in {64, 128}),
``block_kv`` in {32, 64} (Ascend pages: 64, 128). Outputs are contiguous (upstream returns a view of a buffer whose rows
are padded to 1024 bytes; the values are the same). Positions outside the ranges are always exactly
``-inf``: ``clean_logits=False`` leaves them "unspecified" upstream, and -inf is one valid choice.
"""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck
from torch_ascend_moe.deep_gemm.runtime import get_num_sms
from torch_ascend_moe.ops.mqa_logits import mqa_logits, paged_mqa_logits, paged_mqa_logits_metadata
from torch_ascend_moe.quant import scales_to_float

_FP4_DTYPES = (torch.int8, torch.uint8, torch.float4_e2m1fn_x2)


def _data(x: torch.Tensor) -> torch.Tensor:
    """FP8 data as is; packed FP4 (int8 upstream, uint8 or float4_e2m1fn_x2) as the ops' uint8."""
    return x.view(torch.uint8) if x.dtype in _FP4_DTYPES else x


def _scales(sf: torch.Tensor | None, lead: list, d: int) -> torch.Tensor | None:
    """Scales ``[*lead, D/g]`` for the ops: packed UE8M0 (int32, int16) unpacked to FP32 per 1x32 block, a
    per-row FP32 scale ``[*lead]`` given a trailing block dim."""
    if sf is None:
        return None
    if sf.dtype in (torch.int32, torch.int16):
        values = scales_to_float(sf.reshape(*lead, -1))
        return values[..., : d // 32].contiguous()
    if sf.dim() == len(lead):
        return sf.unsqueeze(-1)
    return sf.reshape(*lead, -1)


def _check_heads_dim(api: str, heads: int, d: int, fp4: bool, ascend: bool) -> None:
    if ascend:
        ck.check_arg(heads % 4 == 0 and 4 <= heads <= 64, api, "q", "heads (H)", "a multiple of 4 in [4, 64]", heads)
        ck.check_arg(d in (64, 128), api, "q", "head dim (D)", "64 or 128", d)
        return
    # DeepGEMM 2.8 on SM100: any multiple of 4 up to 128 (its test runs 12 and 20); 2.6.1's 8, 16, 32, 64 among them.
    ck.check_arg(heads % 4 == 0 and 0 < heads <= 128, api, "q", "heads (H)", "a multiple of 4 in (0, 128]", heads)
    allowed = (64, 128) if fp4 else (32, 64, 128)
    ck.check_arg(d in allowed, api, "q", "head dim (D)", " or ".join(map(str, allowed)), d)


def _split_q(api: str, q) -> tuple[torch.Tensor, torch.Tensor | None]:
    if isinstance(q, (tuple, list)):
        ck.check_arg(len(q) == 2, api, "q", "value", "a tensor or a (q, q_sf) pair", f"a {len(q)}-tuple")
        return q[0], q[1]
    return q, None


def _split_kv(api: str, kv) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(kv, kv_sf)`` pair every MQA-logits entry takes (a bare tensor names no argument when unpacked)."""
    ok = isinstance(kv, (tuple, list)) and len(kv) == 2
    got = lambda: f"a tensor of shape {list(kv.shape)}" if isinstance(kv, torch.Tensor) else type(kv).__name__  # noqa: E731
    ck.check_arg(ok, api, "kv", "value", "a (kv, kv_sf) pair", got)
    return kv[0], kv[1]


def _int32_scales(sf) -> bool:
    return sf is not None and sf.dtype == torch.int32


def _ascend_call(q_sf, kv_sf) -> bool:
    return (q_sf is not None and q_sf.dtype == torch.int16) or (kv_sf is not None and kv_sf.dtype == torch.int16)


def fp8_fp4_mqa_logits(
    q,
    kv: tuple[torch.Tensor, torch.Tensor],
    weights: torch.Tensor,
    cu_seq_len_k_start: torch.Tensor,
    cu_seq_len_k_end: torch.Tensor,
    clean_logits: bool | int = True,
    max_seqlen_k: int = 0,
    logits_dtype: torch.dtype = torch.float32,
    schedule_meta: torch.Tensor | None = None,
) -> torch.Tensor:
    """Ragged MQA logits: ``[S, S_kv]``, or ``[S, max_seqlen_k]`` compressed (column t = KV ``ks[i] + t``).

    Call forms: DeepGEMM 2.6's sixth positional argument is ``clean_logits`` (a bool); DeepGEMM 2.8's and
    DeepGEMM-Ascend's is ``max_seqlen_k`` (an int, as vLLM 0.33 passes it): told apart by its type. Which of the
    two int forms is told by the scales: DeepGEMM-Ascend's are int16 UE8M0 pairs (its logits BF16, compressed only);
    otherwise the CUDA semantics (FP32 logits unless ``logits_dtype`` says BF16, full logits cleaned).
    ``schedule_meta`` (2.8, from ``get_mqa_logits_metadata``) only schedules upstream's kernel: the result is the
    same with or without it (upstream's test requires it bitwise), so it is checked and not needed."""
    api = "deep_gemm.fp8_fp4_mqa_logits"
    if schedule_meta is not None:
        _check_schedule(api, schedule_meta)
    if not isinstance(clean_logits, bool):  # (q, kv, weights, ks, ke, max_seqlen_k): 2.8 / DeepGEMM-Ascend
        max_seqlen_k = int(clean_logits)
        clean_logits = max_seqlen_k == 0
    q_data, q_sf = _split_q(api, q)
    k_data, kv_sf = _split_kv(api, kv)
    ascend = _ascend_call(q_sf, kv_sf)
    if ascend:
        clean_logits = False
        ck.check_arg(q_sf is not None, api, "q", "value", "(q, sf_q): DeepGEMM-Ascend needs Q scales", "no scales")
        ck.check_arg(max_seqlen_k > 0, api, "max_seqlen_k", "value", "> 0 (Ascend: compressed logits only)", 0)
        ck.check_arg(weights.dtype == torch.bfloat16, api, "weights", "dtype", "torch.bfloat16 (Ascend)", weights.dtype)
        logits_dtype = torch.bfloat16
    fp4 = q_data.dtype in _FP4_DTYPES
    s, heads = q_data.shape[0], q_data.shape[1] if q_data.dim() == 3 else 0
    d = q_data.shape[-1] * (2 if fp4 else 1)
    _check_heads_dim(api, heads, d, fp4, ascend)
    ck.check_arg(
        not (clean_logits and max_seqlen_k > 0),
        api,
        "clean_logits",
        "value",
        "False with compressed logits (max_seqlen_k > 0)",
        True,
    )
    ck.check_arg(
        logits_dtype in (torch.float32, torch.bfloat16),
        api,
        "logits_dtype",
        "value",
        "torch.float32 or torch.bfloat16",
        logits_dtype,
    )
    return mqa_logits(
        _data(q_data),
        _data(k_data),
        weights,
        cu_seq_len_k_start,
        cu_seq_len_k_end,
        q_sf=_scales(q_sf, [s, heads], d),
        k_sf=_scales(kv_sf, [k_data.shape[0]], d),
        max_seqlen_k=max_seqlen_k,
        logits_dtype=logits_dtype,
    )


def fp8_mqa_logits(
    q: torch.Tensor,
    kv: tuple[torch.Tensor, torch.Tensor],
    weights: torch.Tensor,
    cu_seq_len_k_start: torch.Tensor,
    cu_seq_len_k_end: torch.Tensor,
    clean_logits: bool = True,
    max_seqlen_k: int = 0,
) -> torch.Tensor:
    """FP8-only form: ``q`` E4M3 ``[S, H, D]`` without scales, KV ``(E4M3 [S_kv, D], FP32 [S_kv])``, FP32 logits."""
    api = "deep_gemm.fp8_mqa_logits"
    ck.check_arg(q.dtype == torch.float8_e4m3fn, api, "q", "dtype", "torch.float8_e4m3fn", q.dtype)
    return fp8_fp4_mqa_logits((q, None), kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits, max_seqlen_k)


def get_paged_mqa_logits_metadata(context_lens: torch.Tensor, block_kv, num_sms=None, indices=None) -> torch.Tensor:
    """The paged kernel's schedule ``[num_sms + 1, 2]`` int32 (our kernels do not need it).

    DeepGEMM-Ascend's form ``(context_lens, num_heads, indices)`` is recognised by the tensor in third place
    and uses ``get_num_sms()`` cores.
    """
    if isinstance(num_sms, torch.Tensor):
        indices, num_sms, block_kv = num_sms, get_num_sms(), 64
    if num_sms is None:
        num_sms = get_num_sms()
    return paged_mqa_logits_metadata(context_lens, block_kv, num_sms, indices)


def get_mqa_logits_metadata(
    cu_seq_len_k_start: torch.Tensor, cu_seq_len_k_end: torch.Tensor, num_kv_tokens: int, num_heads: int
) -> torch.Tensor:
    """DeepGEMM 2.8's ragged schedule for ``fp8_fp4_mqa_logits(..., schedule_meta=)``: int32 ``[num_sms + 1, 2]``,
    each SM's (query, 256-token KV split) start with the work (the queries' clamped range lengths) split evenly,
    as ``get_paged_mqa_logits_metadata`` splits a decode batch. Our kernels do not need it."""
    api = "deep_gemm.get_mqa_logits_metadata"
    ck.check_int_arg(api, "num_kv_tokens", num_kv_tokens, 0)
    ck.check_int_arg(api, "num_heads", num_heads, 1)
    ks = cu_seq_len_k_start.clamp(max=num_kv_tokens)
    lengths = (cu_seq_len_k_end.clamp(max=num_kv_tokens) - ks).clamp(min=0)
    return paged_mqa_logits_metadata(lengths.to(torch.int32).reshape(-1, 1), 64, get_num_sms())


def _check_schedule(api: str, schedule_meta: torch.Tensor) -> None:
    ck.check_arg(
        schedule_meta.dim() == 2 and schedule_meta.shape[1] == 2 and schedule_meta.dtype == torch.int32,
        api,
        "schedule_meta",
        "value",
        "int32 [num_sms + 1, 2] from get_paged_mqa_logits_metadata",
        lambda: f"{schedule_meta.dtype} {ck.shape_str(schedule_meta.shape)}",
    )


def fp8_fp4_paged_mqa_logits(
    q,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    schedule_meta: torch.Tensor,
    max_context_len: int,
    clean_logits=False,
    logits_dtype: torch.dtype = torch.float32,
    indices: torch.Tensor | None = None,
    use_ascend_kv_layout: bool = False,
) -> torch.Tensor:
    """Paged MQA logits ``[B * next_n, max_context_len]``; positions past each context length are -inf."""
    api = "deep_gemm.fp8_fp4_paged_mqa_logits"
    if isinstance(clean_logits, torch.Tensor):  # DeepGEMM-Ascend: indices in 8th place
        clean_logits, indices = False, clean_logits
    q_data, q_sf = _split_q(api, q)
    ascend = use_ascend_kv_layout or (q_sf is not None and q_sf.dtype == torch.int16)
    ck.check_arg(
        context_lens.dim() == 2,
        api,
        "context_lens",
        "rank",
        "2-D [B, next_n] (1-D context lengths are not supported)",
        lambda: f"{context_lens.dim()}-D",
    )
    ck.check_arg(
        not clean_logits, api, "clean_logits", "value", "False (unsupported with 2-D context_lens, as upstream)", True
    )
    _check_schedule(api, schedule_meta)
    fp4 = q_data.dtype in _FP4_DTYPES
    heads = q_data.shape[2] if q_data.dim() == 4 else 0
    d = q_data.shape[-1] * (2 if fp4 else 1)
    _check_heads_dim(api, heads, d, fp4, ascend)
    block_kv = kv_cache.shape[1] if kv_cache.dim() == 4 else 0
    allowed = (64, 128) if ascend else (32, 64)
    ck.check_arg(block_kv in allowed, api, "kv_cache", "size(1) (block_kv)", " or ".join(map(str, allowed)), block_kv)
    if ascend:
        ck.check_arg(indices is not None, api, "indices", "value", "a tensor (Ascend: varlen only)", None)
        ck.check_arg(weights.dtype == torch.bfloat16, api, "weights", "dtype", "torch.bfloat16 (Ascend)", weights.dtype)
        logits_dtype = torch.bfloat16
    lead = list(q_data.shape[:3])
    # MXFP8 (E4M3 q with int32 UE8M0 scales, DeepGEMM 2.8): 4 UE8M0 bytes per token of 128 values, which is the
    # Ascend page layout byte for byte; shorter heads are re-laid out (_mx_fp8_pages).
    layout_ascend = use_ascend_kv_layout or (q_data.dtype == torch.float8_e4m3fn and _int32_scales(q_sf))
    if layout_ascend and not use_ascend_kv_layout and d < 128:
        kv_cache, layout_ascend = _mx_fp8_pages(kv_cache, d)
    return paged_mqa_logits(
        _data(q_data),
        kv_cache,
        weights,
        context_lens,
        block_table,
        max_context_len,
        q_sf=_scales(q_sf, lead, d),
        indices=indices,
        ascend_kv_layout=layout_ascend,
        logits_dtype=logits_dtype,
    )


def _mx_fp8_pages(kv_cache: torch.Tensor, d: int) -> tuple[torch.Tensor, bool]:
    """DeepGEMM 2.8's MXFP8 pages for a head dim below 128 (``D`` bytes, then one 4-byte word of ``D/32`` UE8M0
    codes per token) in a layout our op reads, copied once per call: ``D = 64`` as the Ascend layout (``D/32`` code
    bytes per token), ``D = 32`` (one code: a per-token power of two) as DeepGEMM's FP8 layout with FP32 scales."""
    blocks, block_kv = kv_cache.shape[0], kv_cache.shape[1]
    flat = kv_cache.as_strided((blocks, block_kv * (d + 4)), (kv_cache.stride(0), 1))
    data = flat[:, : block_kv * d]
    codes = flat[:, block_kv * d :].reshape(blocks, block_kv, 4)[..., : d // 32]
    if d % 64 == 0:
        pages = torch.cat([data, codes.reshape(blocks, block_kv * (d // 32))], dim=1)  # sizes given: blocks may be 0
        return pages.view(blocks, block_kv, 1, d + d // 32), True
    scale = torch.where(codes == 255, torch.nan, torch.pow(2.0, codes.float() - 127)).reshape(blocks, block_kv)
    pages = torch.cat([data, scale.contiguous().view(torch.uint8).reshape(blocks, block_kv * 4)], dim=1)
    return pages.view(blocks, block_kv, 1, d + 4), False


def fp8_paged_mqa_logits(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    schedule_meta: torch.Tensor,
    max_context_len: int,
    clean_logits: bool = False,
    indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """FP8-only form: ``q`` E4M3 ``[B, next_n, H, D]``, cache ``uint8 [blocks, block_kv, 1, D + 4]``, FP32 logits."""
    api = "deep_gemm.fp8_paged_mqa_logits"
    ck.check_arg(q.dtype == torch.float8_e4m3fn, api, "q", "dtype", "torch.float8_e4m3fn", q.dtype)
    return fp8_fp4_paged_mqa_logits(
        (q, None),
        kv_cache,
        weights,
        context_lens,
        block_table,
        schedule_meta,
        max_context_len,
        clean_logits,
        torch.float32,
        indices,
    )
