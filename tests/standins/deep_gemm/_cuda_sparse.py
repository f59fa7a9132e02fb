"""The "cuda" flavor's DeepGEMM 2.8.0 sparse indexer (DeepSeek V4.1's candidate-block MQA logits), exported with
``configure(version="2.8.0")``. Written from shared/specs/upstream_2609.md §1 (main ``fw-ai/DeepGEMM@66081d4``
``csrc/apis/attention.hpp``; the kernel, scheduler and layout files read in ``wangyicong52/DeepGEMM@be6df75`` and
``deepseek-ai/DeepGEMM@e824173``). Host checks name ``attention.hpp`` (66081d4; the spec gives no line numbers).

* Metadata: a uint8 tensor of upstream's size (``16 + M·(16 + 8·split_kv/SBK) + align(M, num_sms)·16``) whose bytes
  are garbage here; the schedule it stands for is kept on the side, keyed by the tensor's storage, so a logits call
  with a metadata tensor that no metadata call returned, or built for other arguments, panics (the real kernel would
  walk a wrong schedule).
* Logits: BF16 ``[S, NB·SBK]``, a view of an ``[align(S, 2), align(NB·SBK, 512)]`` buffer; upstream's exact order
  (FP32 scores, ReLU and BF16 rounding per head, four BF16 fused multiply-add chains over heads ``h ≡ 0..3 (mod 4)``
  in increasing order, then ``bf16(bf16(A + C) + bf16(B + D))``). Every column the kernel does not write (slots past
  a query's ``n_q``) is NaN; tokens of a valid slot outside ``[ks, ke)`` are scored from whatever row lies there
  (NaN past the tensor), as upstream's comment says.
"""

from __future__ import annotations

import torch

from . import _ref
from ._cuda import BF16, FP4, FP8, I32, _pair, _tensor
from ._ref import F64, align, ceil_div
from ._standin import STATE, check, panic, public

ATTN = "csrc/apis/attention.hpp (66081d4)"
NUM_HEADS, HEAD_DIM = 32, 128
MAX_TOKENS = 1 << 20
_SCHEDULES: dict[int, dict] = {}


def _split_kv(fp4: bool) -> int:
    return 640 if fp4 else 512  # get_sparse_mqa_split_kv (e824173): MXFP4 640, MXFP8 512


def _qk_fp4(qk_dtype) -> bool:
    if isinstance(qk_dtype, str):
        qk_dtype = getattr(torch, qk_dtype.removeprefix("torch."), None)
    check(qk_dtype in (torch.int8, FP8), ATTN, "qk_dtype == torch::kInt8 or qk_dtype == torch::kFloat8_e4m3fn")
    return qk_dtype == torch.int8


def _metadata(kind: str, s: int, nb: int, sbk: int, fp4: bool, record: dict) -> torch.Tensor:
    blocks = _split_kv(fp4) // sbk
    m = ceil_div(s, 2) * ceil_div(2 * nb, blocks) if kind == "ragged" else s * ceil_div(nb, blocks)
    num_sms = 148
    size = 16 + m * (16 + 8 * blocks) + align(m, num_sms) * 16
    out = torch.randint(0, 256, (size,), dtype=torch.uint8)
    _SCHEDULES[out.untyped_storage().data_ptr()] = dict(record, kind=kind, s=s, nb=nb, sbk=sbk, fp4=fp4)
    return out


def _common_checks(bi, sbk):
    check(STATE.arch == 10, ATTN, "arch_major == 10")
    check(sbk in (8, 16), ATTN, "sparse_block_kv == 8 or sparse_block_kv == 16")
    check(bi.dim() == 2 and bi.dtype == I32 and bi.is_contiguous(), ATTN, "sparse_kv_block_indices int32 [S, NB]")
    s, nb = bi.shape
    check(0 < nb <= 4096 and nb % 4 == 0, ATTN, "num_max_sparse_blocks > 0 and <= 4096 and % 4 == 0")
    check(s <= MAX_TOKENS, ATTN, "seq_len <= kNumMaxTokens")
    return s, nb


@public("get_sparse_mqa_logits_metadata")
def get_sparse_mqa_logits_metadata(
    cu_seq_len_k_start, cu_seq_len_k_end, num_kv_tokens, sparse_kv_block_indices, qk_dtype, sparse_block_kv,
    use_unaligned_ks=False,
):  # fmt: skip
    api = "get_sparse_mqa_logits_metadata"
    bi = _tensor(sparse_kv_block_indices, api, "sparse_kv_block_indices")
    s, nb = _common_checks(bi, sparse_block_kv)
    for name, t in (("cu_seq_len_k_start", cu_seq_len_k_start), ("cu_seq_len_k_end", cu_seq_len_k_end)):
        check(
            t.dim() == 1 and t.shape[0] == s and t.dtype == I32 and t.is_contiguous(),
            ATTN,
            f"{name} int32 [S] contiguous",
        )
    check(num_kv_tokens >= 0, ATTN, "num_kv_tokens >= 0")
    ks = cu_seq_len_k_start.long().clamp(max=num_kv_tokens)
    ke = torch.maximum(ks, cu_seq_len_k_end.long().clamp(max=num_kv_tokens))
    record = dict(ks=ks.clone(), ke=ke.clone(), blocks=bi.long().clone(), unaligned=bool(use_unaligned_ks))
    return _metadata("ragged", s, nb, sparse_block_kv, _qk_fp4(qk_dtype), record)


@public("get_paged_sparse_mqa_logits_metadata")
def get_paged_sparse_mqa_logits_metadata(
    context_lens, block_table, indices, page_kv, sparse_kv_block_indices, qk_dtype, sparse_block_kv
):
    api = "get_paged_sparse_mqa_logits_metadata"
    bi = _tensor(sparse_kv_block_indices, api, "sparse_kv_block_indices")
    s, nb = _common_checks(bi, sparse_block_kv)
    check(context_lens.dtype == I32 and context_lens.numel() == s, ATTN, "context_lens int32, numel == S")
    check(block_table.dim() == 2 and block_table.shape[0] == s, ATTN, "block_table [S, P]")
    check(block_table.dtype == I32 and block_table.stride(1) == 1, ATTN, "block_table int32, stride(1) == 1")
    check(indices.dtype == I32 and indices.numel() == s, ATTN, "indices int32 [S]")
    check(page_kv % sparse_block_kv == 0, ATTN, "page_kv % sparse_block_kv == 0")
    lens, ids, table = context_lens.reshape(-1).tolist(), indices.tolist(), block_table.tolist()
    for t in range(1, s):
        # The scheduler pairs two tokens of one request starting at an even offset and reads the first token's
        # block-table row for both (an asserted contract comment).
        start = next(i for i in range(t, -1, -1) if i == 0 or ids[i - 1] != ids[t])
        if ids[t] == ids[t - 1] and (t - 1 - start) % 2 == 0 and table[t] != table[t - 1]:
            panic(f"paired tokens {t - 1} and {t} (request {ids[t]}) have different block-table rows")
    record = dict(lens=torch.tensor(lens), table=block_table.long().clone(), blocks=bi.long().clone(), page_kv=page_kv)
    return _metadata("paged", s, nb, sparse_block_kv, _qk_fp4(qk_dtype), record)


def _schedule(metadata, kind, s, nb, sbk, **expected) -> dict:
    rec = _SCHEDULES.get(metadata.untyped_storage().data_ptr())
    if rec is None or rec["kind"] != kind:
        panic(f"metadata is not a {kind} schedule returned by get_*sparse_mqa_logits_metadata")
    for key, value in dict(s=s, nb=nb, sbk=sbk, **expected).items():
        if rec[key] != value:
            panic(f"metadata built for {key}={rec[key]}, called with {value}")
    return rec


def _chain(r: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Upstream's head reduction: ``r [..., 32]`` (BF16 ReLU'd scores) and ``w [..., 32]`` BF16 -> BF16 ``[...]``."""
    lanes = []
    for lane in range(4):
        acc = torch.zeros(r.shape[:-1], dtype=F64)
        for h in range(lane, NUM_HEADS, 4):
            acc = (r[..., h].to(F64) * w[..., h].to(F64) + acc).to(BF16).to(F64)
        lanes.append(acc)
    a, b, c, d = lanes
    return ((a + c).to(BF16).to(F64) + (b + d).to(BF16).to(F64)).to(BF16)


def _mx_q(q, fp4: bool, lead: int):
    data, sf = q
    check(sf is not None and sf.dtype == I32 and sf.is_contiguous(), ATTN, "q_sf int32, contiguous (mandatory)")
    check(data.is_contiguous() and data.dtype == (FP4 if fp4 else FP8), ATTN, "q_fp MXFP4 int8 or MXFP8 e4m3")
    check(
        data.shape[lead] == NUM_HEADS and data.shape[-1] * (2 if fp4 else 1) == HEAD_DIM,
        ATTN,
        "num_heads == 32 and head_dim == 128",
    )
    values = _ref.fp4_values(data, -1) if fp4 else data.to(F64)
    codes = _ref.unpack_bytes(sf.unsqueeze(-1), 4)
    return values * _ref.ue8m0_values(codes).repeat_interleave(32, -1)


def _logits(qd, w, rows: int, nb: int, sbk: int, token_keys) -> torch.Tensor:
    """``token_keys(r, s)`` -> (FP64 keys ``[SBK, D]`` of slot ``s`` of row ``r`` (NaN past the tensor), or None for a
    slot the kernel does not visit)."""
    cols = nb * sbk
    buf = torch.full((align(rows, 2), align(cols, 512)), float("nan"), dtype=BF16)
    for r in range(rows):
        for s in range(nb):
            keys = token_keys(r, s)
            if keys is None:
                continue
            a = (keys @ qd[r].T).to(torch.float32)  # [SBK, H] FP32 scores (exact MX products)
            relu = a.clamp_min(0).to(BF16)
            buf[r, s * sbk : (s + 1) * sbk] = _chain(relu, w[r].expand(sbk, NUM_HEADS))
    return buf[:rows, :cols]


@public("fp8_fp4_sparse_mqa_logits")
def fp8_fp4_sparse_mqa_logits(q, kv, weights, metadata, num_max_sparse_blocks, sparse_block_kv, use_unaligned_ks=False):
    api = "fp8_fp4_sparse_mqa_logits"
    q, kv = _pair(q, api, "q"), _pair(kv, api, "kv")
    fp4 = q[0].dtype == FP4
    check(STATE.arch == 10, ATTN, "arch_major == 10")
    qd = _mx_q(q, fp4, 1)
    s = q[0].shape[0]
    k_fp, k_sf = kv
    check(
        k_fp.is_contiguous() and k_fp.dtype == q[0].dtype and k_fp.shape[-1] == q[0].shape[-1],
        ATTN,
        "kv_fp same format as q, contiguous",
    )
    check(k_sf.dtype == I32 and k_sf.dim() == 1 and k_sf.shape[0] == k_fp.shape[0], ATTN, "kv_sf int32 [N_kv]")
    check(
        weights.dtype == BF16 and list(weights.shape) == [s, NUM_HEADS] and weights.stride(1) == 1,
        ATTN,
        "weights bf16 [S, 32], stride(1) == 1",
    )
    rec = _schedule(metadata, "ragged", s, num_max_sparse_blocks, sparse_block_kv, unaligned=bool(use_unaligned_ks))
    kd = (_ref.fp4_values(k_fp, -1) if fp4 else k_fp.to(F64)) * _ref.ue8m0_values(
        _ref.unpack_bytes(k_sf.unsqueeze(-1), 4)
    ).repeat_interleave(32, -1)
    n_kv, sbk = kd.shape[0], sparse_block_kv
    ks, ke, blocks = rec["ks"].tolist(), rec["ke"].tolist(), rec["blocks"].tolist()

    def token_keys(r, slot):
        n_q = min(num_max_sparse_blocks, ceil_div(ke[r] - ks[r], sbk))
        if slot >= n_q:
            return None
        if not use_unaligned_ks and ks[r] % sbk:
            panic(f"aligned mode with ks[{r}]={ks[r]} not a multiple of {sbk} (a device assert)")
        start = blocks[r][slot] * sbk + (ks[r] % sbk if use_unaligned_ks else 0)
        rows = torch.full((sbk, HEAD_DIM), float("nan"), dtype=F64)
        lo, hi = max(start, 0), min(start + sbk, n_kv)
        if lo < hi:
            rows[lo - start : hi - start] = kd[lo:hi]
        return rows

    return _logits(qd, weights, s, num_max_sparse_blocks, sbk, token_keys)


@public("fp8_fp4_paged_sparse_mqa_logits")
def fp8_fp4_paged_sparse_mqa_logits(q, kv_cache, weights, metadata, num_max_sparse_blocks, sparse_block_kv):
    api = "fp8_fp4_paged_sparse_mqa_logits"
    q = _pair(q, api, "q")
    fp4 = q[0].dtype == FP4
    check(STATE.arch == 10, ATTN, "arch_major == 10")
    check(q[0].dim() == 4 and q[0].shape[1] == 1, ATTN, "q_fp [S, 1, 32, D'] (next_n == 1)")
    qd = _mx_q((q[0][:, 0], q[1].reshape(q[1].shape[0], -1)), fp4, 1)
    s = q[0].shape[0]
    d_bytes = HEAD_DIM // 2 if fp4 else HEAD_DIM
    check(kv_cache.dtype == torch.uint8 and kv_cache.dim() == 4, ATTN, "kv_cache uint8 [pages, page_kv, 1, D' + 4]")
    pages, page_kv = kv_cache.shape[0], kv_cache.shape[1]
    check(
        kv_cache.shape[3] == d_bytes + 4 and kv_cache.stride(1) == d_bytes + 4 and kv_cache.stride(3) == 1,
        ATTN,
        "kv_cache.stride(1) == D' + 4 and stride(3) == 1",
    )
    check(kv_cache.stride(0) % 512 == 0, ATTN, "kv_cache.stride(0) % 512 == 0")
    check(
        weights.dtype == BF16 and list(weights.shape) == [s, NUM_HEADS] and weights.stride(1) == 1,
        ATTN,
        "weights bf16 [S, 32], stride(1) == 1",
    )
    rec = _schedule(metadata, "paged", s, num_max_sparse_blocks, sparse_block_kv, page_kv=page_kv)
    sbk = sparse_block_kv
    lens, blocks, table = rec["lens"].tolist(), rec["blocks"].tolist(), rec["table"].tolist()
    flat = kv_cache.as_strided((pages, kv_cache.stride(0)), (kv_cache.stride(0), 1))

    def token(page: int, off: int) -> torch.Tensor:
        if not 0 <= page < pages:
            return torch.full((HEAD_DIM,), float("nan"), dtype=F64)
        data = flat[page, off * d_bytes : (off + 1) * d_bytes]
        word = flat[page, page_kv * d_bytes + 4 * off : page_kv * d_bytes + 4 * off + 4]
        values = _ref.fp4_values(data.view(torch.int8), -1) if fp4 else data.view(FP8).to(F64)
        return values * _ref.ue8m0_values(word.to(torch.int64)).repeat_interleave(32)

    def token_keys(r, slot):
        n_q = min(num_max_sparse_blocks, ceil_div(lens[r], sbk))
        if slot >= n_q:
            return None
        b = blocks[r][slot]
        page = table[r][(b * sbk) // page_kv] if 0 <= (b * sbk) // page_kv < len(table[r]) else -1
        off = (b * sbk) % page_kv
        return torch.stack([token(page, off + o) for o in range(sbk)])

    return _logits(qd, weights, s, num_max_sparse_blocks, sbk, token_keys)


EXPORTS = {
    "get_sparse_mqa_logits_metadata": get_sparse_mqa_logits_metadata,
    "get_paged_sparse_mqa_logits_metadata": get_paged_sparse_mqa_logits_metadata,
    "fp8_fp4_sparse_mqa_logits": fp8_fp4_sparse_mqa_logits,
    "fp8_fp4_paged_sparse_mqa_logits": fp8_fp4_paged_sparse_mqa_logits,
}
