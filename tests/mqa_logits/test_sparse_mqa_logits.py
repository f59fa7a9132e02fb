"""The sparse indexer (DeepSeek V4.1, DeepGEMM 2.8's ``fp8_fp4_(paged_)sparse_mqa_logits``; specs/upstream_2609.md §1):

* upstream's own check, on our ops and through the compat API: on the valid columns (slot < n_q, token inside the
  range) the sparse BF16 logits are **bitwise** the dense op's at the same token (ragged: aligned and unaligned ``ks``,
  ranges clamped to ``num_kv_tokens``; paged: varlen rows with per-token tables, MXFP4 and MXFP8 caches); every other
  column is -inf; repeated calls bitwise equal;
* the same bitwise property on the portable kernel vs itself is not promised (ATen einsum), but it is within BF16
  rounding of the fp64 reference;
* metadata: our documented layout, reusable across calls, header checked against the call, upstream's limits;
* gradients of a float sparse call equal the dense op's gradients restricted to the selected tokens.
"""

from __future__ import annotations

import pytest
import torch

import torch_ascend_moe.deep_gemm as deep_gemm
from tests.mqa_logits import specs as T
from torch_ascend_moe import quant
from torch_ascend_moe.backends.portable import mqa_logits as portable
from torch_ascend_moe.deep_gemm import sparse_mqa as compat
from torch_ascend_moe.ops.mqa_logits import (
    mqa_logits,
    paged_mqa_logits,
    paged_sparse_mqa_logits,
    sparse_mqa_logits,
)
from torch_ascend_moe.testing import calc_diff

INT32_MAX = 2**31 - 1


def _mx(x: torch.Tensor, fp4: bool):
    """Upstream's MX operand: (int8 packed FP4 or E4M3 data, int32 scales with four UE8M0 codes per 128 values)."""
    rows = x.reshape(-1, x.shape[-1]).float()
    if fp4:
        data, sf = quant.per_token_cast_to_fp4(rows, True, gran_k=32)
        data = data.view(torch.int8)
    else:
        data, sf = quant.per_token_cast_to_fp8(rows, True, gran_k=32)
    codes = (sf.view(torch.int32) >> 23) & 0xFF
    packed = codes[:, 0] | (codes[:, 1] << 8) | (codes[:, 2] << 16) | (codes[:, 3] << 24)
    return data.view(*x.shape[:-1], -1), packed.to(torch.int32).view(x.shape[:-1])


def _blocks(ks, ke, sbk, nb, g, unaligned=False, pad=INT32_MAX):
    rows = [
        T.candidate_blocks(a, b, sbk, nb, a % sbk if unaligned else 0, g, pad) for a, b in zip(ks.tolist(), ke.tolist())
    ]
    return torch.tensor(rows, dtype=torch.int32).reshape(len(rows), nb)


def _check_bitwise(sparse, dense, lo, hi, shift, bi, sbk, dense_offset=None):
    """Valid columns bitwise the dense logits at their tokens, every other column -inf."""
    token, valid = portable.sparse_columns(lo, hi, shift, bi, sbk)
    cols = torch.where(valid, token - (dense_offset if dense_offset is not None else 0), 0)
    want = dense.gather(1, cols)
    assert valid.any()
    assert torch.equal(sparse[valid].view(torch.int16), want[valid].view(torch.int16))
    assert bool((sparse[~valid] == float("-inf")).all())


@pytest.mark.parametrize("fp4", [True, False], ids=["mxfp4", "mxfp8"])
@pytest.mark.parametrize("unaligned", [False, True], ids=["aligned", "unaligned"])
@pytest.mark.parametrize("sbk", [8, 16])
def test_compat_ragged_is_bitwise_the_dense_logits(fp4, unaligned, sbk):
    g = torch.Generator().manual_seed(sbk + 2 * fp4 + unaligned)
    s, n_kv, nb = 9, 900, 8
    q, q_sf = _mx(torch.randn(s, 32, 128, generator=g), fp4)
    k, k_sf = _mx(torch.randn(n_kv, 128, generator=g), fp4)
    w = torch.rand(s, 32, generator=g).bfloat16()
    ks = torch.tensor([0, 0, 64, 64, 128, 128, 256, 640, 5], dtype=torch.int32)
    if unaligned:
        ks = ks + torch.tensor([3, 1, 0, 7, 5, 2, 9, 4, 0], dtype=torch.int32)
    ke = (ks + torch.tensor([1, 100, 200, 40, 600, 7, 644, 300, 0], dtype=torch.int32)).clamp(max=n_kv)
    ke[6] = n_kv + 50  # past num_kv_tokens: clamped as upstream's scheduler clamps
    bi = _blocks(ks, ke.clamp(max=n_kv), sbk, nb, g, unaligned)
    qk = torch.int8 if fp4 else torch.float8_e4m3fn
    meta = deep_gemm.get_sparse_mqa_logits_metadata(ks, ke, n_kv, bi, qk, sbk, unaligned)
    assert meta.dtype == torch.uint8 and meta.dim() == 1
    out = deep_gemm.fp8_fp4_sparse_mqa_logits((q, q_sf), (k, k_sf), w, meta, nb, sbk, unaligned)
    assert out.dtype == torch.bfloat16 and out.shape == (s, nb * sbk)
    ke_c = ke.clamp(max=n_kv)
    dense = deep_gemm.fp8_fp4_mqa_logits(
        (q, q_sf), (k, k_sf), w, ks, ke_c, clean_logits=False, max_seqlen_k=0, logits_dtype=torch.bfloat16
    )
    _check_bitwise(out, dense, ks, ke_c, portable.sparse_shift(ks, sbk, unaligned), bi, sbk)
    for _ in range(3):  # the schedule is reused by every layer; repeated calls are bitwise equal
        again = deep_gemm.fp8_fp4_sparse_mqa_logits((q, q_sf), (k, k_sf), w, meta, nb, sbk, unaligned)
        assert torch.equal(again.view(torch.int16), out.view(torch.int16))


def _paged_case(fp4: bool, page_kv: int, g):
    """Varlen decode rows (requests of 1-3 tokens, one table row per token) in a 512-byte-aligned page stride."""
    d_bytes = 64 if fp4 else 128
    lengths = [130, 64, 300, 9]
    runs = [2, 1, 3, 1]
    cache = T.build_paged_cache(
        [torch.randn(n, 128, generator=g) for n in lengths], page_kv, "fp4" if fp4 else "fp8", not fp4, g
    )
    row = d_bytes + 4
    stride = -(-page_kv * row // 512) * 512
    padded = torch.randint(0, 256, (cache.cache.shape[0], stride), generator=g, dtype=torch.uint8)
    padded[:, : page_kv * row] = cache.cache.reshape(cache.cache.shape[0], -1)
    kv = padded.as_strided((cache.cache.shape[0], page_kv, 1, row), (stride, row, row, 1))
    rows = torch.tensor([r for r, n in enumerate(runs) for _ in range(n)])
    lens = torch.cat([torch.arange(L - n + 1, L + 1) for L, n in zip(lengths, runs)]).to(torch.int32)
    return kv, cache.block_table[rows].contiguous(), rows.to(torch.int32), lens


@pytest.mark.parametrize("fp4", [True, False], ids=["mxfp4", "mxfp8"])
@pytest.mark.parametrize("sbk", [8, 16])
def test_compat_paged_is_bitwise_the_dense_paged_logits(fp4, sbk):
    g = torch.Generator().manual_seed(40 + sbk + fp4)
    page_kv, nb = 64, 8
    kv, table, indices, lens = _paged_case(fp4, page_kv, g)
    s = lens.numel()
    q, q_sf = _mx(torch.randn(s, 1, 32, 128, generator=g), fp4)
    w = torch.rand(s, 32, generator=g).bfloat16()
    zero = torch.zeros_like(lens)
    bi = _blocks(zero, lens, sbk, nb, g)
    qk = torch.int8 if fp4 else torch.float8_e4m3fn
    meta = deep_gemm.get_paged_sparse_mqa_logits_metadata(lens, table, indices, page_kv, bi, qk, sbk)
    out = deep_gemm.fp8_fp4_paged_sparse_mqa_logits((q, q_sf), kv, w, meta, nb, sbk)
    assert out.dtype == torch.bfloat16 and out.shape == (s, nb * sbk)
    schedule = deep_gemm.get_paged_mqa_logits_metadata(lens.view(-1, 1), page_kv, 4, indices)
    dense = deep_gemm.fp8_fp4_paged_mqa_logits(
        (q, q_sf), kv, w, lens.view(-1, 1), table, schedule, int(lens.max()), False, torch.bfloat16, indices
    )
    _check_bitwise(out, dense, zero, lens, zero, bi, sbk)


def test_ops_bitwise_on_every_quantized_format_of_the_family():
    """Beyond upstream's formats: FP8 with per-token FP32 scales, FP4 with E8M0 scales, BF16 logits from FP32
    weights; the ops' own samples (random ranges, unaligned)."""
    checked = 0
    for sample in T.sparse_samples("cpu", torch.bfloat16):
        q, q_sf, k, k_sf, w, ks, ke, bi, sbk, unaligned, _ = sample.args
        if q.shape[0] == 0:
            continue
        out = sparse_mqa_logits(
            q, k, w, ks, ke, bi, sbk, q_sf=q_sf, k_sf=k_sf, unaligned_ks=unaligned, logits_dtype=torch.bfloat16
        )
        dense = mqa_logits(q, k, w, ks, ke, q_sf=q_sf, k_sf=k_sf, logits_dtype=torch.bfloat16)
        _check_bitwise(out, dense, ks, ke, portable.sparse_shift(ks, sbk, unaligned), bi, sbk)
        checked += 1
    for sample in T.paged_sparse_samples("cpu", torch.bfloat16):
        q, q_sf, cache, w, lens, table, bi, sbk, ascend, _ = sample.args
        bf16 = torch.bfloat16
        out = paged_sparse_mqa_logits(
            q, cache, w, lens, table, bi, sbk, q_sf=q_sf, ascend_kv_layout=ascend, logits_dtype=bf16
        )
        dense = paged_mqa_logits(
            q, cache, w, lens, table, int(lens.max()), q_sf=q_sf, ascend_kv_layout=ascend, logits_dtype=bf16
        )
        flat = lens.flatten()
        zero = torch.zeros_like(flat)
        _check_bitwise(out, dense, zero, flat, zero, bi, sbk)
        checked += 1
    assert checked >= 4


def test_portable_kernels_within_bf16_of_the_cpu_kernels():
    for sample in T.sparse_samples("cpu", torch.bfloat16) + T.paged_sparse_samples("cpu", torch.bfloat16):
        name = "paged_sparse_mqa_logits" if sample.args[2].dtype == torch.uint8 and sample.args[2].dim() == 4 else None
        op = getattr(torch.ops.ascend_moe, name or "sparse_mqa_logits").default
        kernel = portable.paged_sparse_mqa_logits if name else portable.sparse_mqa_logits
        ours, theirs = op(*sample.args), kernel(*sample.args)
        finite = torch.isfinite(ours)
        assert torch.equal(finite, torch.isfinite(theirs)), sample.name
        if finite.any():
            assert calc_diff(ours[finite], theirs[finite]) < 1e-5, sample.name


def test_gradients_are_the_dense_gradients_on_the_selected_tokens():
    g = torch.Generator().manual_seed(9)
    s, h, d, n_kv, sbk, nb = 5, 4, 32, 48, 4, 3
    q = torch.randn(s, h, d, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(n_kv, d, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.rand(s, h, generator=g, dtype=torch.float64, requires_grad=True)
    ks = torch.tensor([0, 3, 8, 20, 0], dtype=torch.int32)
    ke = torch.tensor([48, 30, 9, 40, 0], dtype=torch.int32)
    bi = _blocks(ks, ke, sbk, nb, g, unaligned=True)
    out = sparse_mqa_logits(q, k, w, ks, ke, bi, sbk, unaligned_ks=True)
    token, valid = portable.sparse_columns(ks, ke, portable.sparse_shift(ks, sbk, True), bi, sbk)
    grad = torch.randn(out.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad((torch.where(valid, out, 0) * grad).sum(), (q, k, w))
    # The dense op's gradient with the upstream gradient scattered onto the selected tokens.
    dense = mqa_logits(q, k, w, ks, ke)
    g_dense = torch.zeros(s, n_kv, dtype=torch.float64).scatter_add_(
        1, torch.where(valid, token, 0), torch.where(valid, grad, 0)
    )
    want = torch.autograd.grad((torch.where(torch.isfinite(dense), dense, 0) * g_dense).sum(), (q, k, w))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_padding_slots_are_never_read():
    """Slots past a query's valid count may hold anything (repeats, INT32_MAX, negative): same logits."""
    g = torch.Generator().manual_seed(5)
    q, k, w = torch.randn(3, 4, 32, generator=g), torch.randn(64, 32, generator=g), torch.rand(3, 4, generator=g)
    ks, ke = torch.tensor([0, 8, 16], dtype=torch.int32), torch.tensor([10, 20, 17], dtype=torch.int32)
    base = torch.tensor([[0, 1, 0, 0], [1, 2, 0, 0], [2, 0, 0, 0]], dtype=torch.int32)
    outs = []
    for pad in (0, INT32_MAX, -5, 7):
        bi = base.clone()
        bi[0, 2:], bi[1, 2:], bi[2, 1:] = pad, pad, pad
        outs.append(sparse_mqa_logits(q, k, w, ks, ke, bi, 8))
    for o in outs[1:]:
        assert torch.equal(o, outs[0])
    assert torch.isinf(outs[0][:, 16:]).all() and torch.isinf(outs[0][2, 8:]).all()


def test_metadata_header_is_checked_against_the_call():
    g = torch.Generator().manual_seed(6)
    q, q_sf = _mx(torch.randn(2, 32, 128, generator=g), True)
    k, k_sf = _mx(torch.randn(64, 128, generator=g), True)
    w = torch.rand(2, 32, generator=g).bfloat16()
    ks, ke = torch.zeros(2, dtype=torch.int32), torch.tensor([40, 64], dtype=torch.int32)
    bi = _blocks(ks, ke, 8, 4, g)
    meta = deep_gemm.get_sparse_mqa_logits_metadata(ks, ke, 64, bi, "int8", 8)
    with pytest.raises(ValueError, match=r"argument 'metadata' sparse_block_kv: expected 16, got 8"):
        deep_gemm.fp8_fp4_sparse_mqa_logits((q, q_sf), (k, k_sf), w, meta, 4, 16)
    with pytest.raises(ValueError, match=r"argument 'metadata' length: expected the schedule of S=2 query tokens"):
        deep_gemm.fp8_fp4_sparse_mqa_logits((q, q_sf), (k, k_sf), w, meta, 8, 8)
    with pytest.raises(ValueError, match=r"argument 'metadata' header word 4: expected 1, got 0"):
        deep_gemm.fp8_fp4_sparse_mqa_logits((q, q_sf), (k, k_sf), w, meta, 4, 8, True)
    assert (compat.MAGIC, 2, 4, 8) == tuple(meta.view(torch.int32)[:4].tolist())


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(sparse_block_kv=4), r"metadata: argument 'sparse_block_kv' value: expected 8 or 16"),
        (dict(nb=6), r"'sparse_kv_block_indices' size\(1\) \(num_max_sparse_blocks\): expected a multiple of 4"),
        (dict(qk_dtype=torch.bfloat16), r"argument 'qk_dtype' value: expected torch.int8 \(MXFP4\)"),
        (dict(ks_dtype=torch.int64), r"argument 'cu_seq_len_k_start' dtype: expected torch.int32"),
    ],
)
def test_metadata_refuses_what_upstream_refuses(change, match):
    nb = change.get("nb", 4)
    bi = torch.zeros(2, nb, dtype=torch.int32)
    ks = torch.zeros(2, dtype=change.get("ks_dtype", torch.int32))
    ke = torch.full((2,), 16, dtype=torch.int32)
    with pytest.raises(ValueError, match=match):
        deep_gemm.get_sparse_mqa_logits_metadata(
            ks, ke, 16, bi, change.get("qk_dtype", torch.int8), change.get("sparse_block_kv", 8)
        )


def test_logits_refuse_what_upstream_refuses():
    g = torch.Generator().manual_seed(7)
    q, q_sf = _mx(torch.randn(2, 16, 128, generator=g), True)
    k, k_sf = _mx(torch.randn(64, 128, generator=g), True)
    w = torch.rand(2, 16, generator=g).bfloat16()
    ks, ke = torch.zeros(2, dtype=torch.int32), torch.tensor([40, 64], dtype=torch.int32)
    meta = deep_gemm.get_sparse_mqa_logits_metadata(ks, ke, 64, _blocks(ks, ke, 8, 4, g), torch.int8, 8)
    with pytest.raises(ValueError, match=r"fp8_fp4_sparse_mqa_logits: argument 'q' shape: expected \[S, 32, 64\]"):
        deep_gemm.fp8_fp4_sparse_mqa_logits((q, q_sf), (k, k_sf), w, meta, 4, 8)
    q32, q32_sf = _mx(torch.randn(2, 32, 128, generator=g), True)
    with pytest.raises(ValueError, match=r"argument 'weights' dtype: expected torch.bfloat16"):
        deep_gemm.fp8_fp4_sparse_mqa_logits((q32, q32_sf), (k, k_sf), torch.rand(2, 32), meta, 4, 8)
    with pytest.raises(ValueError, match=r"argument 'q' value: expected \(q, q_sf\): the scales are mandatory"):
        deep_gemm.fp8_fp4_sparse_mqa_logits(q32, (k, k_sf), w, meta, 4, 8)


def test_dense_schedule_meta_changes_nothing():
    """DeepGEMM 2.8's ``get_mqa_logits_metadata`` / ``schedule_meta=``: bitwise the same logits, as upstream's test."""
    g = torch.Generator().manual_seed(8)
    q, q_sf = _mx(torch.randn(6, 32, 128, generator=g), True)
    k, k_sf = _mx(torch.randn(300, 128, generator=g), True)
    w = torch.rand(6, 32, generator=g)
    ks, ke = T.random_ranges(6, 300, g)
    meta = deep_gemm.get_mqa_logits_metadata(ks, ke, 300, 32)
    assert meta.dtype == torch.int32 and meta.shape == (deep_gemm.get_num_sms() + 1, 2)
    plain = deep_gemm.fp8_fp4_mqa_logits((q, q_sf), (k, k_sf), w, ks, ke)
    scheduled = deep_gemm.fp8_fp4_mqa_logits((q, q_sf), (k, k_sf), w, ks, ke, schedule_meta=meta)
    assert torch.equal(plain, scheduled)
