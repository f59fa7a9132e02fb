"""The mqa_logits family's argument checks (``mqa_logits`` and its backward, the paged decode and its schedule
metadata, ``mqa_topk``, ``mqa_logits_topk`` and the two sparse indexers). Twin: ``csrc/ops/mqa_logits_checks.h``
(the same checks in the same order, the same words; tests/test_validation_twins.py compares them).

The ``check_*_values`` functions look at tensor *values* (ranges, lengths, block ids): the kernels run them
eagerly; a fake cannot, so under ``torch.compile`` they fire when the compiled graph runs the kernel.
"""

from __future__ import annotations

import dataclasses

import torch

from torch_ascend_moe import checks as ck
from torch_ascend_moe.checks.fp8_gemm import is_fp4
from torch_ascend_moe.checks.fp8_gemm import logical_k as head_dim  # D: packed FP4 holds two values per byte

OP = "ascend_moe::mqa_logits"
BACKWARD = "ascend_moe::mqa_logits_backward"
PAGED = "ascend_moe::paged_mqa_logits"
METADATA = "ascend_moe::paged_mqa_logits_metadata"
TOPK = "ascend_moe::mqa_topk"
FUSED = "ascend_moe::mqa_logits_topk"
SPARSE = "ascend_moe::sparse_mqa_logits"
PAGED_SPARSE = "ascend_moe::paged_sparse_mqa_logits"
FLOAT_OPERANDS = (torch.bfloat16, torch.float32, torch.float64)
QUANTIZED = (torch.float8_e4m3fn, torch.uint8)
INDEX_DTYPES = (torch.int32, torch.int64)
SCHEDULE_SPLIT = 256  # KV tokens per unit of the paged schedule
# A paged cache's bytes per token, per layout.
ASCEND_ROW_BYTES = "D + D/32 (FP8) or D/2 + D/32 (FP4) with D % 64 == 0"
DEEPGEMM_ROW_BYTES = "D + 4 (FP8) or D/2 + 4 (FP4, D % 32 == 0 and D <= 128)"


def is_quantized(t: torch.Tensor) -> bool:
    return t.dtype in QUANTIZED


def acc_dtype(q: torch.Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def check_same_device_as(op: str, arg: str, t: torch.Tensor, ref: torch.Tensor, ref_name: str = "q") -> None:
    ck.check_arg(t.device == ref.device, op, arg, "device", lambda: f"{ref.device} (same as '{ref_name}')", t.device)


def check_operand(op: str, name: str, sf_name: str, x, sf, rank: int, layout: str, ref):
    """One q or k operand and its optional scales; returns the scale block size g (D for one scale per row)."""
    ck.check_rank(op, name, x, rank, layout)
    ck.check_arg(
        x.dtype in FLOAT_OPERANDS or is_quantized(x),
        op,
        name,
        "dtype",
        "torch.bfloat16, torch.float32, torch.float64, torch.float8_e4m3fn or torch.uint8 (packed FP4)",
        x.dtype,
    )
    check_same_device_as(op, name, x, ref)
    d = head_dim(x)
    if not is_quantized(x):
        ck.check_arg(sf is None, op, sf_name, "value", f"None for a {x.dtype} operand", "a tensor")
        return d
    if sf is None:
        ck.check_arg(not is_fp4(x), op, sf_name, "value", "scales for a packed FP4 operand", "None")
        return d
    ck.check_scale_dtype(op, sf_name, sf)
    check_same_device_as(op, sf_name, sf, ref)
    lead = list(x.shape[:-1])
    nb = sf.shape[-1] if sf.dim() == rank else 0
    ok = sf.dim() == rank and all(a == b for a, b in zip(sf.shape[:-1], lead)) and nb > 0 and d % nb == 0
    ck.check_arg(
        ok,
        op,
        sf_name,
        "shape",
        lambda: ck.shape_str(lead)[:-1] + f", D / g] with g dividing D={ck._text(d)}",
        lambda: ck.shape_str(sf.shape),
    )
    return d // nb


def check_pairing(op: str, q, k) -> None:
    """q and k are both high precision (one dtype) or both quantized (FP8 and FP4 may mix)."""
    if is_quantized(q):
        ck.check_arg(
            is_quantized(k), op, "k", "dtype", "torch.float8_e4m3fn or torch.uint8 (packed FP4), as 'q' is", k.dtype
        )
    else:
        ck.check_arg(k.dtype == q.dtype, op, "k", "dtype", lambda: f"{q.dtype} (same as 'q')", k.dtype)
    ck.check_arg(
        head_dim(k) == head_dim(q),
        op,
        "k",
        "head dim (D)",
        lambda: f"{ck._text(head_dim(q))} (q's D)",
        lambda: head_dim(k),
    )


def check_weights(op: str, w, q, rows, heads, rows_what: str, logits_dtype) -> torch.dtype:
    """weights ``[rows, H]``; returns the logits dtype (default: the weights' dtype)."""
    ck.check_rank(op, "weights", w, 2, "[rows, H]")
    fp64 = q.dtype == torch.float64
    if fp64:
        ck.check_arg(w.dtype == torch.float64, op, "weights", "dtype", "torch.float64 (with float64 q)", w.dtype)
    else:
        ck.check_arg(
            w.dtype in (torch.float32, torch.bfloat16),
            op,
            "weights",
            "dtype",
            "torch.float32 or torch.bfloat16",
            w.dtype,
        )
    check_same_device_as(op, "weights", w, q)
    ck.check_arg(
        w.shape[0] == rows and w.shape[1] == heads,
        op,
        "weights",
        "shape",
        lambda: f"{ck.shape_str([rows, heads])} ({rows_what}, H)",
        lambda: ck.shape_str(w.shape),
    )
    out = logits_dtype if logits_dtype is not None else w.dtype
    if fp64:
        ck.check_arg(out == torch.float64, op, "logits_dtype", "value", "torch.float64 (with float64 q)", out)
    elif w.dtype == torch.bfloat16:
        ck.check_arg(out == torch.bfloat16, op, "logits_dtype", "value", "torch.bfloat16 (with BF16 weights)", out)
    else:
        ck.check_arg(
            out in (torch.float32, torch.bfloat16), op, "logits_dtype", "value", "torch.float32 or torch.bfloat16", out
        )
    return out


def check_index_vector(op: str, name: str, t, length, ref, ref_name: str = "q") -> None:
    ck.check_rank(op, name, t, 1, "[S] (one per query)")
    ck.check_arg(t.dtype in INDEX_DTYPES, op, name, "dtype", "torch.int32 or torch.int64", t.dtype)
    check_same_device_as(op, name, t, ref, ref_name)
    ck.check_dim_size(op, name, t, 0, "S", length, f"{ref_name}.size(0)")


@dataclasses.dataclass
class MqaShapes:
    S: object
    H: object
    D: object
    S_kv: object
    gq: object
    gk: object
    out_dtype: torch.dtype


def mqa_signature(op, q, q_sf, k, k_sf, weights, ks, ke, max_seqlen_k, logits_dtype=None) -> MqaShapes:
    """Checks an ``mqa_logits`` call (or another op's part that is one, under ``op``)."""
    gq = check_operand(op, "q", "q_sf", q, q_sf, 3, "[S, H, D] (or [S, H, D/2] packed FP4)", q)
    gk = check_operand(op, "k", "k_sf", k, k_sf, 2, "[S_kv, D] (or [S_kv, D/2] packed FP4)", q)
    check_pairing(op, q, k)
    S, H, D = q.shape[0], q.shape[1], head_dim(q)
    ck.check_arg(H > 0 and D > 0, op, "q", "shape", "H > 0 heads of D > 0", lambda: ck.shape_str(q.shape))
    out = check_weights(op, weights, q, S, H, "S", logits_dtype)
    check_index_vector(op, "ks", ks, S, q)
    check_index_vector(op, "ke", ke, S, q)
    ck.check_arg(
        max_seqlen_k >= 0,
        op,
        "max_seqlen_k",
        "value",
        "0 (full [S, S_kv] logits) or positive (compressed)",
        max_seqlen_k,
    )
    ck.check_arg(max_seqlen_k <= ck.MAX_INT_ARG, op, "max_seqlen_k", "value", ck.MAX_INT_ARG_TEXT, max_seqlen_k)
    return MqaShapes(S, H, D, k.shape[0], gq, gk, out)


def check_range_values(op: str, ks, ke, s_kv: int, max_seqlen_k: int) -> None:
    """``0 <= ks[i] <= ke[i] <= S_kv`` (and ``ke - ks <= max_seqlen_k`` when compressed), on the data."""
    for i, (a, b) in enumerate(zip(ks.tolist(), ke.tolist())):
        ck.check_arg(0 <= a <= b, op, "ks", "values", "0 <= ks[i] <= ke[i]", f"ks[{i}]={a}, ke[{i}]={b}")
        ck.check_arg(b <= s_kv, op, "ke", "values", f"ke[i] <= S_kv={s_kv} (k.size(0))", f"ke[{i}]={b}")
        if max_seqlen_k > 0:
            ck.check_arg(
                b - a <= max_seqlen_k,
                op,
                "max_seqlen_k",
                "value",
                "at least ke[i] - ks[i] for every query (compressed logits)",
                f"{max_seqlen_k} < ke[{i}] - ks[{i}]={b - a}",
            )


def backward_signature(grad, q, q_sf, k, k_sf, weights, ks, ke, max_seqlen_k) -> MqaShapes:
    """Checks an ``mqa_logits_backward`` call."""
    sh = mqa_signature(BACKWARD, q, q_sf, k, k_sf, weights, ks, ke, max_seqlen_k)
    cols = max_seqlen_k if max_seqlen_k > 0 else sh.S_kv
    ck.check_rank(BACKWARD, "grad", grad, 2, "[S, columns] (the logits' gradient)")
    ck.check_arg(
        grad.shape[0] == sh.S and grad.shape[1] == cols,
        BACKWARD,
        "grad",
        "shape",
        lambda: f"{ck.shape_str([sh.S, cols])} (the logits' shape)",
        lambda: ck.shape_str(grad.shape),
    )
    ck.check_arg(
        grad.dtype in FLOAT_OPERANDS,
        BACKWARD,
        "grad",
        "dtype",
        "torch.bfloat16, torch.float32 or torch.float64",
        grad.dtype,
    )
    return sh


# ---- paged decode ----


@dataclasses.dataclass
class CacheFormat:
    """Per-token scale bytes of a cache block: DeepGEMM stores 4 (FP8: one FP32; FP4: four UE8M0 codes, one per 32
    values), the Ascend fused page layout D / 32 (one UE8M0 code per 32 values, int16-packed in pairs)."""

    block_kv: object
    data_bytes: object
    sf_bytes: object
    fp4: bool
    fp32_scale: bool


def check_cache(op: str, cache, d, ascend: bool, q) -> CacheFormat:
    """The cache's byte layout: per block, ``block_kv`` token rows of data, then ``block_kv`` scale rows."""
    ck.check_rank(op, "kv_cache", cache, 4, "[num_blocks, block_kv, 1, bytes per token] (uint8)")
    ck.check_arg(cache.dtype == torch.uint8, op, "kv_cache", "dtype", "torch.uint8", cache.dtype)
    check_same_device_as(op, "kv_cache", cache, q)
    row = cache.shape[3]
    sf_bytes = d // 32 if ascend else 4
    fp8, fp4 = row == d + sf_bytes, row == d // 2 + sf_bytes
    d_ok = (d % 64 == 0) if ascend else (d % 2 == 0 and (fp8 or (d % 32 == 0 and d <= 128)))
    ck.check_arg(
        d_ok and (fp8 or fp4),
        op,
        "kv_cache",
        "size(3) (bytes per token)",
        lambda: f"{ASCEND_ROW_BYTES if ascend else DEEPGEMM_ROW_BYTES} for D={ck._text(d)}",
        row,
    )
    ck.check_arg(cache.shape[2] == 1, op, "kv_cache", "size(2) (KV heads)", 1, cache.shape[2])
    ck.check_arg(
        cache.stride(3) == 1 and cache.stride(1) == row,
        op,
        "kv_cache",
        "strides (1, 3)",
        lambda: f"({row}, 1): token rows packed in each block",
        lambda: f"({cache.stride(1)}, {cache.stride(3)})",
    )
    block_kv = cache.shape[1]
    ck.check_arg(
        cache.shape[0] <= 1 or cache.stride(0) >= block_kv * row,
        op,
        "kv_cache",
        "stride(0)",
        lambda: f"at least block_kv * bytes per token = {block_kv * row}",
        lambda: cache.stride(0),
    )
    return CacheFormat(block_kv, d if fp8 else d // 2, sf_bytes, not fp8, (not ascend) and fp8)


def check_tables(op: str, context_lens, block_table, B, next_n) -> None:
    """``context_lens [B, next_n]`` and ``block_table [B, max_blocks]``, int32."""
    ck.check_rank(op, "context_lens", context_lens, 2, "[B, next_n] (visible KV tokens per query token)")
    ck.check_arg(context_lens.dtype == torch.int32, op, "context_lens", "dtype", "torch.int32", context_lens.dtype)
    ck.check_arg(
        context_lens.shape[0] == B and context_lens.shape[1] == next_n,
        op,
        "context_lens",
        "shape",
        lambda: f"{ck.shape_str([B, next_n])} (B, next_n of q)",
        lambda: ck.shape_str(context_lens.shape),
    )
    ck.check_rank(op, "block_table", block_table, 2, "[B, max_blocks]")
    ck.check_arg(block_table.dtype == torch.int32, op, "block_table", "dtype", "torch.int32", block_table.dtype)
    ck.check_dim_size(op, "block_table", block_table, 0, "B", B, "q.size(0)")


def check_paged_call(op: str, q, q_sf, kv_cache, weights, context_lens, block_table, ascend, dtype):
    """What a paged call (dense or sparse) takes alike: q ``[B, next_n, H, D]``, the cache, weights and the tables;
    returns ``(gq, cache format, logits dtype)``."""
    gq = check_operand(op, "q", "q_sf", q, q_sf, 4, "[B, next_n, H, D] (or [B, next_n, H, D/2] packed FP4)", q)
    B, next_n, H, D = q.shape[0], q.shape[1], q.shape[2], head_dim(q)
    ck.check_arg(
        next_n > 0 and H > 0 and D > 0, op, "q", "shape", "next_n > 0, H > 0, D > 0", lambda: ck.shape_str(q.shape)
    )
    fmt = check_cache(op, kv_cache, D, ascend, q)
    out = check_weights(op, weights, q, B * next_n, H, "B * next_n", dtype)
    check_tables(op, context_lens, block_table, B, next_n)
    return gq, fmt, out


def paged_signature(q, q_sf, kv_cache, weights, context_lens, block_table, max_context_len, indices, ascend, dtype):
    """Checks a ``paged_mqa_logits`` call; returns ``(gq, cache format, logits dtype)``."""
    op = PAGED
    gq, fmt, out = check_paged_call(op, q, q_sf, kv_cache, weights, context_lens, block_table, ascend, dtype)
    B, next_n = q.shape[0], q.shape[1]
    ck.check_int_arg(op, "max_context_len", max_context_len, 0)
    if indices is not None:
        ck.check_arg(
            next_n == 1,
            op,
            "indices",
            "value",
            "None unless next_n == 1 (varlen: one query per row)",
            lambda: f"a tensor with next_n={ck._text(next_n)}",
        )
        ck.check_rank(op, "indices", indices, 1, "[B] (request id per query token)")
        ck.check_arg(indices.dtype == torch.int32, op, "indices", "dtype", "torch.int32", indices.dtype)
        ck.check_dim_size(op, "indices", indices, 0, "B", B, "q.size(0)")
    return gq, fmt, out


def check_context_lens_values(op: str, lens: list) -> None:
    """Every length >= 0. paged_mqa_logits and its schedule metadata both run this first, so one set of
    lengths gets one verdict from both."""
    for b, row in enumerate(lens):
        for t, n in enumerate(row):
            ck.check_arg(n >= 0, op, "context_lens", "values", "non-negative lengths", f"context_lens[{b}, {t}]={n}")


def check_paged_values(context_lens, block_table, max_context_len, block_kv, num_blocks, indices) -> None:
    """The paged call's lengths and the block ids they reach, on the data."""
    op = PAGED
    lens, table = context_lens.tolist(), block_table.tolist()
    check_context_lens_values(op, lens)
    max_blocks = block_table.shape[1]
    for b, row in enumerate(lens):
        for t, n in enumerate(row):
            ck.check_arg(
                0 <= n <= max_context_len and n <= max_blocks * block_kv,
                op,
                "context_lens",
                "values",
                f"0 <= context_lens[b, t] <= min(max_context_len={max_context_len}, "
                f"block_table.size(1) * block_kv={max_blocks * block_kv})",
                f"context_lens[{b}, {t}]={n}",
            )
            for p in range(-(-n // block_kv)):
                ck.check_arg(
                    0 <= table[b][p] < num_blocks,
                    op,
                    "block_table",
                    "values",
                    f"physical block ids in [0, num_blocks={num_blocks})",
                    f"block_table[{b}, {p}]={table[b][p]}",
                )
    if indices is not None:
        # Upstream reads one block-table row per run of equal indices: rows of a run must agree.
        ids = indices.tolist()
        for r in range(1, len(ids)):
            ck.check_arg(
                ids[r] != ids[r - 1] or table[r] == table[r - 1],
                op,
                "block_table",
                "values",
                "equal rows for query tokens of one request (equal indices)",
                f"rows {r - 1} and {r} differ",
            )


def metadata_signature(context_lens, block_kv, num_sms, indices) -> None:
    """Checks a ``paged_mqa_logits_metadata`` call."""
    op = METADATA
    ck.check_rank(op, "context_lens", context_lens, 2, "[B, next_n] (visible KV tokens per query token)")
    ck.check_arg(context_lens.dtype == torch.int32, op, "context_lens", "dtype", "torch.int32", context_lens.dtype)
    ck.check_int_arg(op, "block_kv", block_kv, 1)
    ck.check_int_arg(op, "num_sms", num_sms, 1)
    if indices is not None:
        ck.check_rank(op, "indices", indices, 1, "[B] (request id per query token)")
        ck.check_arg(indices.dtype == torch.int32, op, "indices", "dtype", "torch.int32", indices.dtype)
        ck.check_dim_size(op, "indices", indices, 0, "B", context_lens.shape[0], "context_lens.size(0)")


# ---- top-k selection over the logits ----


def topk_signature(logits, ks, ke, topk) -> None:
    """Checks an ``mqa_topk`` call."""
    op = TOPK
    ck.check_rank(op, "logits", logits, 2, "[S, columns]")
    ck.check_arg(
        logits.dtype in FLOAT_OPERANDS,
        op,
        "logits",
        "dtype",
        "torch.bfloat16, torch.float32 or torch.float64",
        logits.dtype,
    )
    check_index_vector(op, "ks", ks, logits.shape[0], logits, "logits")
    check_index_vector(op, "ke", ke, logits.shape[0], logits, "logits")
    ck.check_int_arg(op, "topk", topk, 1)


def check_topk_values(ks, ke, columns: int, compressed: bool) -> None:
    """Every range ``[ks[i], ke[i])`` inside the logits' columns, on the data."""
    for i, (a, b) in enumerate(zip(ks.tolist(), ke.tolist())):
        ck.check_arg(0 <= a <= b, TOPK, "ks", "values", "0 <= ks[i] <= ke[i]", f"ks[{i}]={a}, ke[{i}]={b}")
        need = b - a if compressed else b
        ck.check_arg(
            need <= columns,
            TOPK,
            "ke",
            "values",
            ("ke[i] - ks[i]" if compressed else "ke[i]") + f" <= logits.size(1)={columns}",
            f"ke[{i}]={b}",
        )


def fused_signature(q, q_sf, k, k_sf, weights, ks, ke, topk, logits_dtype) -> MqaShapes:
    """``mqa_logits_topk``'s checks: ``mqa_logits``' (full logits) under its own name, then ``topk``."""
    sh = mqa_signature(FUSED, q, q_sf, k, k_sf, weights, ks, ke, 0, logits_dtype)
    ck.check_int_arg(FUSED, "topk", topk, 1)
    return sh


# ---- sparse (DeepSeek V4.1's hierarchical indexer: candidate KV blocks) ----


def check_sparse_indices(op: str, bi, rows, rows_what: str, rows_source: str, sbk: int, q):
    """``block_indices [rows, num_blocks]`` int32 next to ``q``; returns ``num_blocks``."""
    ck.check_rank(op, "block_indices", bi, 2, "[rows, num_blocks] (candidate KV blocks per query row)")
    ck.check_arg(bi.dtype == torch.int32, op, "block_indices", "dtype", "torch.int32", bi.dtype)
    check_same_device_as(op, "block_indices", bi, q)
    ck.check_dim_size(op, "block_indices", bi, 0, rows_what, rows, rows_source)
    ck.check_int_arg(op, "sparse_block_kv", sbk, 1)
    nb = bi.shape[1]
    ck.check_arg(
        nb <= ck.MAX_INT_ARG // sbk,
        op,
        "sparse_block_kv",
        "value",
        "num_blocks * sparse_block_kv <= 2147483647 (the output's columns)",
        lambda: f"{sbk} with num_blocks={ck._text(nb)}",
    )
    return nb


def sparse_signature(q, q_sf, k, k_sf, weights, ks, ke, block_indices, sparse_block_kv, logits_dtype):
    """``sparse_mqa_logits``' checks; returns ``(shapes, num_blocks)``."""
    sh = mqa_signature(SPARSE, q, q_sf, k, k_sf, weights, ks, ke, 0, logits_dtype)
    nb = check_sparse_indices(SPARSE, block_indices, sh.S, "S", "q.size(0)", sparse_block_kv, q)
    return sh, nb


def sparse_slots(length: int, nb: int, sbk: int) -> int:
    """A row's valid slots: ``min(num_blocks, ceil(length / SBK))``."""
    return min(nb, -(-length // sbk))


def check_sparse_row(op: str, idx: list, sbk: int, r: int, lo: int, hi: int, shift: int) -> int:
    """Row ``r``'s valid slots: strictly increasing ids, each block ``[id * SBK + shift, + SBK)`` overlapping
    ``[lo, hi)``; returns their number."""
    n = sparse_slots(hi - lo, len(idx), sbk)
    for s in range(n):
        a = idx[s] * sbk + shift
        at_rs = f"block_indices[{r}, {s}]={idx[s]}"
        ck.check_arg(
            a < hi and a + sbk > lo,
            op,
            "block_indices",
            "values",
            "blocks overlapping the row's KV range in its valid slots",
            f"{at_rs} (tokens [{a}, {a + sbk})), range [{lo}, {hi})",
        )
        ck.check_arg(
            s == 0 or idx[s] > idx[s - 1],
            op,
            "block_indices",
            "values",
            "strictly increasing block ids in the row's valid slots",
            f"{at_rs} after {idx[s - 1] if s else None}",
        )
    return n


def check_sparse_values(ks, ke, block_indices, sbk: int, unaligned: bool, s_kv: int) -> None:
    """The sparse call's ranges and candidate blocks, on the data."""
    check_range_values(SPARSE, ks, ke, s_kv, 0)
    for i, (a, b, row) in enumerate(zip(ks.tolist(), ke.tolist(), block_indices.tolist())):
        if not unaligned:
            ck.check_arg(
                b == a or a % sbk == 0,
                SPARSE,
                "ks",
                "values",
                f"multiples of sparse_block_kv={sbk} for non-empty ranges "
                "(aligned blocks; unaligned_ks=True otherwise)",
                f"ks[{i}]={a}",
            )
        check_sparse_row(SPARSE, row, sbk, i, a, b, a % sbk if unaligned else 0)


def paged_sparse_signature(
    q, q_sf, kv_cache, weights, context_lens, block_table, block_indices, sparse_block_kv, ascend, dtype
):
    """``paged_sparse_mqa_logits``' checks; returns ``(gq, cache format, logits dtype, num_blocks)``."""
    op = PAGED_SPARSE
    gq, fmt, out = check_paged_call(op, q, q_sf, kv_cache, weights, context_lens, block_table, ascend, dtype)
    B, next_n = q.shape[0], q.shape[1]
    nb = check_sparse_indices(op, block_indices, B * next_n, "B * next_n", "q.size(0) * q.size(1)", sparse_block_kv, q)
    ck.check_arg(
        fmt.block_kv % sparse_block_kv == 0,
        op,
        "sparse_block_kv",
        "value",
        lambda: f"a divisor of the cache's block_kv={ck._text(fmt.block_kv)}",
        sparse_block_kv,
    )
    return gq, fmt, out, nb


def check_paged_sparse_values(context_lens, block_table, block_indices, sbk: int, block_kv: int, num_blocks: int):
    """The paged sparse call's lengths, candidate blocks and the cache blocks they reach, on the data."""
    op = PAGED_SPARSE
    lens, table, idx = context_lens.tolist(), block_table.tolist(), block_indices.tolist()
    check_context_lens_values(op, lens)
    max_blocks = block_table.shape[1]
    next_n = context_lens.shape[1]
    for b, row in enumerate(lens):
        for t, n in enumerate(row):
            ck.check_arg(
                n <= max_blocks * block_kv,
                op,
                "context_lens",
                "values",
                f"context_lens[b, t] <= block_table.size(1) * block_kv={max_blocks * block_kv}",
                f"context_lens[{b}, {t}]={n}",
            )
            r = b * next_n + t
            for s in range(check_sparse_row(op, idx[r], sbk, r, 0, n, 0)):
                p = idx[r][s] * sbk // block_kv
                ck.check_arg(
                    0 <= table[b][p] < num_blocks,
                    op,
                    "block_table",
                    "values",
                    f"physical block ids in [0, num_blocks={num_blocks})",
                    f"block_table[{b}, {p}]={table[b][p]}",
                )
