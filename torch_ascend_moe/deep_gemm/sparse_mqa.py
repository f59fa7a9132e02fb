"""DeepGEMM 2.8's sparse indexer API (DeepSeek V4.1's hierarchical indexer; specs/upstream_2609.md §1) over the
``ascend_moe`` ops ``sparse_mqa_logits`` / ``paged_sparse_mqa_logits``.

Upstream builds an SM schedule once per step (``get_*sparse_mqa_logits_metadata``) and the logits functions read
everything from it: the ranges, the candidate blocks, the block table. Its bytes are upstream's internal layout;
ours are documented instead (little-endian int32 words, returned as a 1-D uint8 tensor as upstream's):

* ragged: ``[MAGIC, S, NB, SBK, use_unaligned_ks, num_kv_tokens, qk format, 0]`` then ``ks[S]``, ``ke[S]`` (clamped
  to ``num_kv_tokens`` as upstream's scheduler clamps them) and the block ids ``[S, NB]``;
* paged: ``[MAGIC + 1, S, NB, SBK, page_kv, P, qk format, 0]`` then ``context_lens[S]``, ``indices[S]``, the block
  table ``[S, P]`` and the block ids ``[S, NB]``.

The logits functions recover S from ``q``, NB from their argument (P from the length), and check the header
against them where the tensor may be read on the host (not while a CUDA graph is captured). Upstream's limits are
enforced so code that runs here runs there: H 32, D 128, BF16 weights, SBK 8 or 16, ``0 < NB <= 4096`` with
``NB % 4 == 0``, scales mandatory (int32, four packed UE8M0 codes per 128 values), a paged cache stride
a multiple of 512 bytes. Output: BF16 ``[S, NB * SBK]``; the columns upstream leaves unwritten (slots past a
query's blocks, tokens outside its range) are exactly ``-inf`` here. An MXFP8 paged cache (4 UE8M0 bytes per
token of 128 values) is the Ascend page layout byte for byte and is read as such.
"""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck
from torch_ascend_moe.deep_gemm.mqa import _FP4_DTYPES, _data, _scales, _split_kv, _split_q
from torch_ascend_moe.distributed import capture
from torch_ascend_moe.ops.mqa_logits import paged_sparse_mqa_logits, sparse_mqa_logits

MAGIC = 0x53504D51  # "QMPS": a ragged sparse schedule of ours; MAGIC + 1: a paged one
HEADER = 8  # int32 words
_HEADS, _DIM = 32, 128
_MAX_TOKENS = 1 << 20  # upstream's per-stream workspace bound on S
_QK = {torch.int8: 0, torch.float8_e4m3fn: 1}  # qk_dtype: packed MXFP4 (int8) or MXFP8 (E4M3)


def _qk_format(api: str, qk_dtype) -> int:
    """``qk_dtype`` as a torch dtype or the string TVM-FFI passes ("int8", "float8_e4m3fn", "torch.int8", ...)."""
    if isinstance(qk_dtype, str):
        qk_dtype = getattr(torch, qk_dtype.removeprefix("torch."), None)
    expected = "torch.int8 (MXFP4) or torch.float8_e4m3fn (MXFP8)"
    ck.check_arg(qk_dtype in _QK, api, "qk_dtype", "value", expected, qk_dtype)
    return _QK[qk_dtype]


def _check_blocks(api: str, sparse_kv_block_indices: torch.Tensor, sbk: int) -> int:
    bi = sparse_kv_block_indices
    ck.check_arg(sbk in (8, 16), api, "sparse_block_kv", "value", "8 or 16", sbk)
    ck.check_rank(api, "sparse_kv_block_indices", bi, 2, "[S, num_max_sparse_blocks]")
    ck.check_arg(bi.dtype == torch.int32, api, "sparse_kv_block_indices", "dtype", "torch.int32", bi.dtype)
    ck.check_arg(bi.is_contiguous(), api, "sparse_kv_block_indices", "layout", "contiguous", "strided")
    nb = bi.shape[1]
    ck.check_arg(
        0 < nb <= 4096 and nb % 4 == 0,
        api,
        "sparse_kv_block_indices",
        "size(1) (num_max_sparse_blocks)",
        "a multiple of 4 in (0, 4096]",
        nb,
    )
    ck.check_arg(bi.shape[0] <= _MAX_TOKENS, api, "sparse_kv_block_indices", "size(0) (S)", "at most 2^20", bi.shape[0])
    return nb


def _int32_vector(api: str, name: str, t: torch.Tensor, s: int) -> torch.Tensor:
    ck.check_arg(t.dtype == torch.int32, api, name, "dtype", "torch.int32", t.dtype)
    ck.check_arg(t.numel() == s, api, name, "numel", lambda: f"{s} (one per query token)", t.numel())
    return t.reshape(-1)


def _header(words: list[int], device) -> torch.Tensor:
    return torch.tensor(words + [0] * (HEADER - len(words)), dtype=torch.int32, device=device)


def get_sparse_mqa_logits_metadata(
    cu_seq_len_k_start: torch.Tensor,
    cu_seq_len_k_end: torch.Tensor,
    num_kv_tokens: int,
    sparse_kv_block_indices: torch.Tensor,
    qk_dtype,
    sparse_block_kv: int,
    use_unaligned_ks: bool = False,
) -> torch.Tensor:
    """The ragged schedule ``fp8_fp4_sparse_mqa_logits`` reads (our layout: the module's docstring); build it once
    per step and pass it to every layer, as upstream's callers do."""
    api = "deep_gemm.get_sparse_mqa_logits_metadata"
    fmt = _qk_format(api, qk_dtype)
    nb = _check_blocks(api, sparse_kv_block_indices, sparse_block_kv)
    s = sparse_kv_block_indices.shape[0]
    ks = _int32_vector(api, "cu_seq_len_k_start", cu_seq_len_k_start, s)
    ke = _int32_vector(api, "cu_seq_len_k_end", cu_seq_len_k_end, s)
    ck.check_int_arg(api, "num_kv_tokens", num_kv_tokens, 0)
    # Upstream's scheduler: kb = min(ks, N), ke' = max(kb, min(ke, N)).
    ks = ks.clamp(max=num_kv_tokens)
    ke = torch.maximum(ks, ke.clamp(max=num_kv_tokens))
    head = _header([MAGIC, s, nb, sparse_block_kv, int(bool(use_unaligned_ks)), num_kv_tokens, fmt], ks.device)
    words = torch.cat([head, ks, ke, sparse_kv_block_indices.reshape(-1)])
    return words.view(torch.uint8)


def get_paged_sparse_mqa_logits_metadata(
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    indices: torch.Tensor,
    page_kv: int,
    sparse_kv_block_indices: torch.Tensor,
    qk_dtype,
    sparse_block_kv: int,
) -> torch.Tensor:
    """The paged schedule ``fp8_fp4_paged_sparse_mqa_logits`` reads. ``block_table [S, P]`` has one row per query
    token (``indices [S]``: its request); each token reads its own row (upstream reads the first row of a token
    pair and requires paired rows to be equal: equal results)."""
    api = "deep_gemm.get_paged_sparse_mqa_logits_metadata"
    fmt = _qk_format(api, qk_dtype)
    nb = _check_blocks(api, sparse_kv_block_indices, sparse_block_kv)
    s = sparse_kv_block_indices.shape[0]
    lens = _int32_vector(api, "context_lens", context_lens, s)
    ids = _int32_vector(api, "indices", indices, s)
    ck.check_rank(api, "block_table", block_table, 2, "[S, max_pages] (one row per query token)")
    ck.check_arg(block_table.dtype == torch.int32, api, "block_table", "dtype", "torch.int32", block_table.dtype)
    ck.check_dim_size(api, "block_table", block_table, 0, "S", s, "the query tokens")
    ck.check_int_arg(api, "page_kv", page_kv, 1)
    ck.check_arg(
        page_kv % sparse_block_kv == 0,
        api,
        "page_kv",
        "value",
        f"a multiple of sparse_block_kv={sparse_block_kv}",
        page_kv,
    )
    p = block_table.shape[1]
    head = _header([MAGIC + 1, s, nb, sparse_block_kv, page_kv, p, fmt], lens.device)
    words = torch.cat([head, lens, ids, block_table.reshape(-1), sparse_kv_block_indices.reshape(-1)])
    return words.view(torch.uint8)


def _words(api: str, metadata: torch.Tensor, fixed: int, s: int, nb: int, paged: bool) -> torch.Tensor:
    """The metadata as int32 words: ``fixed`` of them for a ragged schedule; a paged one adds its table's ``S * P``."""
    ok = metadata.dim() == 1 and metadata.dtype == torch.uint8 and metadata.numel() % 4 == 0
    ck.check_arg(ok, api, "metadata", "value", "a 1-D uint8 tensor from the matching get_*_metadata", metadata.dtype)
    words = metadata.view(torch.int32)
    extra = words.numel() - fixed
    ck.check_arg(
        extra == 0 or (paged and extra > 0 and s > 0 and extra % s == 0),
        api,
        "metadata",
        "length",
        lambda: f"the schedule of S={s} query tokens and num_max_sparse_blocks={nb}",
        lambda: f"{metadata.numel()} bytes",
    )
    return words


def _check_header(api: str, words: torch.Tensor, expected: list[int]) -> None:
    if not capture.host_readable(words):
        return
    head = words[: len(expected)].tolist()
    names = ("kind", "S", "num_max_sparse_blocks", "sparse_block_kv")
    for i, (got, want) in enumerate(zip(head, expected)):
        what = names[i] if i < len(names) else f"header word {i}"
        ck.check_arg(got == want, api, "metadata", what, want, got)


def _mx_operand(api: str, q, heads_dims: tuple[int, ...]):
    """(data, int32 scales) of an MXFP4 (int8, D/2) or MXFP8 (E4M3, D) operand pair; returns (data, sf, fp4)."""
    data, sf = _split_q(api, q)
    ck.check_arg(sf is not None, api, "q", "value", "(q, q_sf): the scales are mandatory", "no scales")
    fp4 = data.dtype in _FP4_DTYPES
    ck.check_arg(
        fp4 or data.dtype == torch.float8_e4m3fn,
        api,
        "q",
        "dtype",
        "torch.int8 (packed MXFP4) or torch.float8_e4m3fn (MXFP8)",
        data.dtype,
    )
    ck.check_arg(sf.dtype == torch.int32, api, "q_sf", "dtype", "torch.int32 (four packed UE8M0)", sf.dtype)
    want = [*heads_dims, _DIM // 2 if fp4 else _DIM]
    ck.check_arg(
        list(data.shape[1:]) == want,
        api,
        "q",
        "shape",
        lambda: f"[S, {', '.join(map(str, want))}] (H 32, D 128)",
        lambda: ck.shape_str(data.shape),
    )
    return data, sf, fp4


def _check_weights(api: str, weights: torch.Tensor, s: int) -> None:
    ck.check_arg(weights.dtype == torch.bfloat16, api, "weights", "dtype", "torch.bfloat16", weights.dtype)
    ck.check_arg(
        list(weights.shape) == [s, _HEADS],
        api,
        "weights",
        "shape",
        f"[{s}, {_HEADS}]",
        lambda: ck.shape_str(weights.shape),
    )


def fp8_fp4_sparse_mqa_logits(
    q,
    kv: tuple[torch.Tensor, torch.Tensor],
    weights: torch.Tensor,
    metadata: torch.Tensor,
    num_max_sparse_blocks: int,
    sparse_block_kv: int,
    use_unaligned_ks: bool = False,
) -> torch.Tensor:
    """BF16 ``[S, num_max_sparse_blocks * sparse_block_kv]``: column ``s * SBK + o`` scores token ``o`` of query
    ``i``'s ``s``-th candidate block (``ascend_moe.sparse_mqa_logits``)."""
    api = "deep_gemm.fp8_fp4_sparse_mqa_logits"
    q_data, q_sf, fp4 = _mx_operand(api, q, (_HEADS,))
    s = q_data.shape[0]
    k_data, kv_sf = _split_kv(api, kv)
    ck.check_arg(
        (k_data.dtype in _FP4_DTYPES) == fp4 and k_data.dim() == 2 and k_data.shape[-1] == q_data.shape[-1],
        api,
        "kv",
        "value",
        lambda: f"(data [N, {q_data.shape[-1]}] as q's format, int32 scales [N])",
        lambda: f"{k_data.dtype} {ck.shape_str(k_data.shape)}",
    )
    ck.check_arg(kv_sf.dtype == torch.int32, api, "kv_sf", "dtype", "torch.int32 (four packed UE8M0)", kv_sf.dtype)
    _check_weights(api, weights, s)
    ck.check_arg(sparse_block_kv in (8, 16), api, "sparse_block_kv", "value", "8 or 16", sparse_block_kv)
    nb = num_max_sparse_blocks
    words = _words(api, metadata, HEADER + 2 * s + s * nb, s, nb, paged=False)
    _check_header(api, words, [MAGIC, s, nb, sparse_block_kv, int(bool(use_unaligned_ks))])
    ks, ke = words[HEADER : HEADER + s], words[HEADER + s : HEADER + 2 * s]
    blocks = words[HEADER + 2 * s :].view(s, nb)
    return sparse_mqa_logits(
        _data(q_data),
        _data(k_data),
        weights,
        ks,
        ke,
        blocks,
        sparse_block_kv,
        q_sf=_scales(q_sf, [s, _HEADS], _DIM),
        k_sf=_scales(kv_sf, [k_data.shape[0]], _DIM),
        unaligned_ks=bool(use_unaligned_ks),
        logits_dtype=torch.bfloat16,
    )


def fp8_fp4_paged_sparse_mqa_logits(
    q,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    metadata: torch.Tensor,
    num_max_sparse_blocks: int,
    sparse_block_kv: int,
) -> torch.Tensor:
    """BF16 ``[S, num_max_sparse_blocks * sparse_block_kv]`` over a paged cache ``uint8 [pages, page_kv, 1, D' + 4]``
    (``ascend_moe.paged_sparse_mqa_logits``); ``q = (q [S, 1, 32, D'], q_sf int32 [S, 1, 32])``."""
    api = "deep_gemm.fp8_fp4_paged_sparse_mqa_logits"
    q_data, q_sf, fp4 = _mx_operand(api, q, (1, _HEADS))
    s = q_data.shape[0]
    _check_weights(api, weights, s)
    ck.check_arg(sparse_block_kv in (8, 16), api, "sparse_block_kv", "value", "8 or 16", sparse_block_kv)
    ck.check_arg(
        kv_cache.dim() == 4 and kv_cache.stride(0) % 512 == 0,
        api,
        "kv_cache",
        "stride(0)",
        "a multiple of 512 bytes (pages padded as upstream's test pads them)",
        lambda: kv_cache.stride(0) if kv_cache.dim() == 4 else f"a {kv_cache.dim()}-D tensor",
    )
    nb = num_max_sparse_blocks
    fixed = HEADER + 2 * s + s * nb
    words = _words(api, metadata, fixed, s, nb, paged=True)
    p = (words.numel() - fixed) // s if s else 0
    _check_header(api, words, [MAGIC + 1, s, nb, sparse_block_kv, kv_cache.shape[1], p])
    lens = words[HEADER : HEADER + s].view(s, 1)
    table = words[HEADER + 2 * s : HEADER + 2 * s + s * p].view(s, p)
    blocks = words[HEADER + 2 * s + s * p :].view(s, nb)
    return paged_sparse_mqa_logits(
        _data(q_data),
        kv_cache,
        weights,
        lens,
        table,
        blocks,
        sparse_block_kv,
        q_sf=_scales(q_sf, [s, 1, _HEADS], _DIM),
        ascend_kv_layout=not fp4,  # MXFP8: 4 UE8M0 bytes per token of 128 values = the Ascend page layout
        logits_dtype=torch.bfloat16,
    )
