"""Self-tests of the stand-in ``deep_gemm``'s MQA logits, paged metadata, HC prenorm GEMM and einsum APIs
(``tests/standins/deep_gemm/_cuda_extra.py``, ``_ascend_extra.py``, ``_mqa.py``).

As in ``test_deep_gemm_standin.py``: every value is checked against a float64 computation written here with plain
torch (own packers for the fused KV caches, own UE8M0 / FP4 encoders, own TF32 / HF32 rounding through ``frexp``) on
random non-zero inputs; each function has a failing host check, the panics of the ranges a kernel would read past,
and a mutation check (shifted or transposed scales change the result).
"""

import pytest
import torch

from tests.upstream.standin import installed
from tests.upstream.test_deep_gemm_standin import (
    BF16,
    F32,
    I16,
    I32,
    calc_diff,
    exps,
    fp4_codes,
    fp4_ref,
    fp8,
    gen,
    nonzero,
    pack_fp4_last,
    pow2,
    raises_check,
    use,
    words,
)

U8 = torch.uint8
NEG_INF = float("-inf")


@pytest.fixture
def dg():
    with installed("deep_gemm", flavor="cuda", arch=9) as module:
        yield module


# ---------------------------------------------------------------------------------------------------------------------
# Independent references
# ---------------------------------------------------------------------------------------------------------------------


def ref_logits(q, k, w, post=None):
    """``q [T, H, D]``, ``k [J, D]``, ``w [T, H]`` -> ``sum_h w * relu(q . k)`` (times ``post[j]``), float64."""
    prod = (q.double()[:, :, None, :] * k.double()[None, None, :, :]).sum(-1)  # [T, H, J]
    out = (w.double()[:, :, None] * torch.relu(prod)).sum(1)
    return out if post is None else out * post.double()


def per32(s, d):
    """Per-32 scales ``[..., d / 32]`` -> per element ``[..., d]``."""
    return s.double().repeat_interleave(32, -1)[..., :d]


def i32_words(s):
    """Power-of-two scales ``[..., G <= 4]`` -> one int32 word each (byte j = UE8M0 of scale j, padding 0x7F = 1.0)."""
    codes = exps(s)
    pad = torch.full((*codes.shape[:-1], 4 - codes.shape[-1]), 127, dtype=torch.long)
    return words(torch.cat([codes, pad], -1), 4)[..., 0].to(I32)


def i16_pairs(s):
    """Power-of-two scales ``[..., 2P]`` -> int16 ``[..., P]`` (Ascend UE8M0 pairs, byte j of pair p = scale 2p + j)."""
    return words(exps(s), 2).to(I16)


def round_mantissa(x, bits, ties_even):
    """Round FP32 ``x`` to ``bits`` significant bits, to nearest with ties to even or away from zero (ties do occur:
    one FP32 value in 2^(24 - bits) sits exactly halfway)."""
    m, e = torch.frexp(x.double())
    y = m * 2.0**bits
    r = torch.round(y) if ties_even else torch.sign(y) * torch.floor(y.abs() + 0.5)
    return torch.ldexp(r / 2.0**bits, e)


def as_bytes(t):
    return t.contiguous().view(U8).reshape(-1)


def cuda_cache(data_bytes, scale_bytes, pad=0):
    """``uint8 [blocks, block_kv, 1, row]`` with every block = ``[all tokens' data | all tokens' scale words]``;
    ``pad`` extra bytes between blocks (a multiple of 16 keeps TMA legal)."""
    nb, bkv, db = data_bytes.shape
    sb = scale_bytes.shape[-1]
    row = db + sb // bkv
    store = torch.zeros(nb, bkv * row + pad, dtype=U8)
    store[:, : bkv * db] = data_bytes.reshape(nb, -1)
    store[:, bkv * db : bkv * row] = scale_bytes
    return torch.as_strided(store, (nb, bkv, 1, row), (bkv * row + pad, row, row, 1))


def ascend_cache(data, sf16, nz):
    """Ascend fused pages ``[KV | SF]``: ``data`` uint8 ``[P, page, ds]``, ``sf16`` int16 ``[P, page, pairs]``; with
    ``nz`` the data is stored as 32-byte fragments ``[ds / 32][page][32]`` and two SF pairs pair-major per 16 tokens."""
    npg, page, ds = data.shape
    pairs = sf16.shape[-1]
    if nz:
        data = data.reshape(npg, page, ds // 32, 32).permute(0, 2, 1, 3)
        if pairs == 2:
            sf16 = sf16.reshape(npg, page // 16, 16, 2).permute(0, 1, 3, 2)
    row = ds + 2 * pairs
    store = torch.zeros(npg, page * row, dtype=U8)
    store[:, : page * ds] = data.contiguous().reshape(npg, -1)
    store[:, page * ds :] = sf16.contiguous().view(U8).reshape(npg, -1)
    return store.view(npg, page, 1, row)


def ranges(g, s, skv, lo=1):
    ks = torch.randint(0, skv // 2, (s,), generator=g)
    ke = torch.minimum(ks + torch.randint(lo, skv // 2, (s,), generator=g), torch.tensor(skv))
    return ks.to(I32), ke.to(I32)


def check_rows(out, full, ks, ke, outside, compressed=False):
    """Row ``i`` equals ``full[i, ks:ke]`` (at column ks or 0) and ``outside`` elsewhere (NaN compared as NaN)."""
    for i, (s, e) in enumerate(zip(ks.tolist(), ke.tolist())):
        lo = 0 if compressed else s
        got = out[i].double()
        assert calc_diff(got[lo : lo + e - s], full[i, s:e]) < 1e-5, i
        rest = torch.cat([got[:lo], got[lo + e - s :]])
        if outside != outside:  # NaN
            assert torch.isnan(rest).all(), i
        else:
            assert (rest == outside).all(), i


# ---------------------------------------------------------------------------------------------------------------------
# Ragged MQA logits
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", [9, 10])
def test_mqa_logits_fp8(dg, arch):
    use(dg, "cuda", arch)
    g = gen(100)
    S, H, D, SKV = 6, 32, 64, 300
    q, kv = fp8((S, H, D), g), fp8((SKV, D), g)
    kv_sf = (torch.rand(SKV, generator=g) + 0.5).float()
    w = nonzero((S, H), g).float()
    ks, ke = ranges(g, S, SKV)
    full = ref_logits(q, kv, w, kv_sf)
    out = dg.fp8_fp4_mqa_logits((q, None), (kv, kv_sf), w, ks, ke)  # clean_logits=True by default
    assert out.shape == (S, SKV) and out.dtype == F32 and out.stride() == (768, 1)  # align(300 + 256, 1024 B / 4)
    assert out.untyped_storage().nbytes() == 8 * 768 * 4  # align(S, 128 / H) = 8 rows
    check_rows(out, full, ks, ke, NEG_INF)
    raw = dg.fp8_mqa_logits(q, (kv, kv_sf), w, ks, ke, clean_logits=False)  # legacy form
    check_rows(raw, full, ks, ke, float("nan"))
    comp = dg.fp8_fp4_mqa_logits((q, None), (kv, kv_sf), w, ks, ke, False, 160)
    assert comp.shape == (S, 160) and comp.stride() == (256, 1)
    check_rows(comp, full, ks, ke, float("nan"), compressed=True)
    if arch == 10:  # BF16 weights need BF16 logits
        w16 = w.to(BF16)
        out16 = dg.fp8_fp4_mqa_logits((q, None), (kv, kv_sf), w16, ks, ke, logits_dtype=BF16)
        assert out16.dtype == BF16 and out16.stride() == (1024, 1)
        check_rows(out16, ref_logits(q, kv, w16, kv_sf), ks, ke, NEG_INF)


def test_mqa_logits_fp4_sm100(dg):
    use(dg, "cuda", 10)
    g = gen(101)
    S, H, D, SKV = 5, 8, 64, 200
    cq, ck = fp4_codes((S, H, D), g), fp4_codes((SKV, D), g)
    sq, sk = pow2((S, H, D // 32), g), pow2((SKV, D // 32), g)
    w = nonzero((S, H), g).float()
    ks, ke = ranges(g, S, SKV)
    out = dg.fp8_fp4_mqa_logits((pack_fp4_last(cq), i32_words(sq)), (pack_fp4_last(ck), i32_words(sk)), w, ks, ke)
    full = ref_logits(fp4_ref(cq) * per32(sq, D), fp4_ref(ck) * per32(sk, D), w)
    check_rows(out, full, ks, ke, NEG_INF)


@pytest.mark.parametrize("kind", ["fp8", "fp4"])
def test_mqa_logits_ascend(dg, kind):
    use(dg, "ascend")
    g = gen(102)
    S, H, D, SKV, MAX = 5, 8, 128, 150, 100
    sq, sk = pow2((S, H, D // 32), g), pow2((SKV, D // 32), g)
    if kind == "fp8":
        q, kv = fp8((S, H, D), g), fp8((SKV, D), g)
        qv, kvv = q.double(), kv.double()
    else:
        cq, ck = fp4_codes((S, H, D), g), fp4_codes((SKV, D), g)
        q, kv = pack_fp4_last(cq), pack_fp4_last(ck)
        qv, kvv = fp4_ref(cq), fp4_ref(ck)
    w = nonzero((S, H), g).to(BF16)
    ks, ke = ranges(g, S, SKV)
    ke = torch.minimum(ke, ks + MAX).to(I32)
    sq16 = i16_pairs(sq)  # [S, H, 2]
    sk16 = i16_pairs(sk).T.contiguous().T  # MN-major KV scales are accepted as well
    out = dg.fp8_fp4_mqa_logits((q, sq16), (kv, sk16), w, ks, ke, MAX)
    assert out.dtype == BF16 and out.shape == (S, MAX) and out.stride() == (256, 1)
    assert out.untyped_storage().nbytes() == ((S - 1) * 256 + MAX) * 2  # empty_strided: no padding after the last row
    full = ref_logits(qv * per32(sq, D), kvv * per32(sk, D), w)
    check_rows(out, full, ks, ke, float("nan"), compressed=True)
    flat = dg.fp8_fp4_mqa_logits((q, sq16.reshape(S * H, 2)), (kv, sk16), w, ks, ke, MAX)  # [S * H, D / 64] form
    assert torch.equal(flat.nan_to_num(), out.nan_to_num())


# ---------------------------------------------------------------------------------------------------------------------
# Paged MQA logits and schedule metadata
# ---------------------------------------------------------------------------------------------------------------------


def _paged_case_cuda(g, fp4, B, next_n, H, D, bkv, nb, lens, width, pad=16):
    rows = B * next_n
    w = nonzero((rows, H), g).float()
    perm = torch.randperm(nb, generator=g)[: B * width].reshape(B, width).to(I32)
    if fp4:
        cq, ck = fp4_codes((B, next_n, H, D), g), fp4_codes((nb, bkv, D), g)
        sq, sk = pow2((B, next_n, H, D // 32), g), pow2((nb, bkv, D // 32), g)
        q = (pack_fp4_last(cq), i32_words(sq))
        cache = cuda_cache(pack_fp4_last(ck).view(U8), as_bytes(i32_words(sk)).reshape(nb, -1), pad)
        qv, kv, post = fp4_ref(cq) * per32(sq, D), fp4_ref(ck) * per32(sk, D), None
    else:
        qf, kf = fp8((B, next_n, H, D), g), fp8((nb, bkv, D), g)
        ksf = (torch.rand(nb, bkv, generator=g) + 0.5).float()
        q = (qf, None)
        cache = cuda_cache(kf.view(U8), as_bytes(ksf).reshape(nb, -1), pad)
        qv, kv, post = qf.double(), kf.double(), ksf.double()
    ctx = torch.tensor(lens, dtype=I32).reshape(B, next_n)
    return q, cache, w, ctx, perm, qv.reshape(rows, H, D), kv, post


def ref_paged(qv, w, kv, post, table_rows, lens):
    """Row r: logits over the tokens of the pages ``table_rows[r]`` up to ``lens[r]``."""
    out = []
    for r, n in enumerate(lens):
        ids = table_rows[r].long()
        k = kv[ids].flatten(0, 1)[:n]
        p = None if post is None else post[ids].flatten()[:n]
        out.append(ref_logits(qv[r : r + 1], k, w[r : r + 1], p)[0])
    return out


def check_paged(out, refs, lens, max_ctx):
    for r, (ref, n) in enumerate(zip(refs, lens)):
        assert calc_diff(out[r, :n].double(), ref[:n]) < 1e-5, r
        assert torch.isnan(out[r, min(n, max_ctx) :].double()).all(), r


@pytest.mark.parametrize("arch,fp4", [(9, False), (10, False), (10, True)])
def test_paged_mqa_logits_cuda(dg, arch, fp4):
    use(dg, "cuda", arch)
    g = gen(103)
    B, next_n, H, D, bkv, nb = 3, 2, (8 if arch == 10 else 32), 64, 64, 16
    lens = [150, 190, 3, 7, 250, 256]  # per request, the last token's length is the largest
    q, cache, w, ctx, table, qv, kv, post = _paged_case_cuda(g, fp4, B, next_n, H, D, bkv, nb, lens, 4)
    meta = dg.get_paged_mqa_logits_metadata(ctx, bkv, dg.get_num_sms())
    sms = dg.get_num_sms()
    assert meta.dtype == I32 and meta.shape == (sms + 1, 2)
    # work: one 256-wide split per request; SM90 counts requests (sentinel B), SM100 query tokens (sentinel B*next_n)
    assert meta[-1].tolist() == ([B, 0] if arch == 9 else [B * next_n, 0])
    starts = meta[:, 0].tolist()
    assert starts == sorted(starts) and starts[0] == 0
    out = dg.fp8_fp4_paged_mqa_logits(q, cache, w, ctx, table, meta, 256)
    assert out.shape == (B * next_n, 256) and out.dtype == F32 and out.stride() == (256, 1)
    refs = ref_paged(qv, w, kv, post, table.repeat_interleave(next_n, 0), lens)
    check_paged(out, refs, lens, 256)
    out2 = dg.fp8_fp4_paged_mqa_logits(q, cache, w, ctx, table, meta, 200)  # narrower view, same math
    assert out2.shape == (6, 200) and out2.stride() == (256, 1)
    check_paged(out2, refs, [min(n, 200) for n in lens], 200)
    if not fp4:
        legacy = dg.fp8_paged_mqa_logits(q[0], cache, w, ctx, table, meta, 256)
        assert torch.equal(legacy.nan_to_num(), out.nan_to_num())


def test_paged_mqa_logits_sm100_varlen(dg):
    use(dg, "cuda", 10)
    g = gen(104)
    T, H, D, bkv, nb = 6, 16, 64, 32, 32
    lens = [40, 70, 5, 100, 120, 130]
    indices = torch.tensor([7, 7, 3, 9, 9, 9], dtype=I32)  # requests: tokens {0, 1}, {2}, {3, 4, 5}
    q, cache, w, ctx, table, qv, kv, post = _paged_case_cuda(g, False, T, 1, H, D, bkv, nb, lens, 5)
    table[1] = table[0]  # the kernel reads the block-table row of a request's first token
    table[4:] = table[3]
    meta = dg.get_paged_mqa_logits_metadata(ctx, bkv, dg.get_num_sms(), indices=indices)
    assert meta[0].tolist() == [0, 0] and meta[-1].tolist() == [T, 0]
    out = dg.fp8_fp4_paged_mqa_logits(q, cache, w, ctx, table, meta, 130, indices=indices)
    check_paged(out, ref_paged(qv, w, kv, post, table, lens), lens, 130)


@pytest.mark.parametrize("kind,nz", [("fp8", False), ("fp8", True), ("fp4", False)])
def test_paged_mqa_logits_ascend(dg, kind, nz):
    use(dg, "ascend")
    g = gen(105)
    T, H, D, page, npg = 5, 8, 128, 64, 12
    lens = [100, 130, 20, 60, 200]
    indices = torch.tensor([1, 1, 4, 4, 6], dtype=I32)
    table = torch.randperm(npg, generator=g)[:12].reshape(3, 4).to(I32)
    table = table[[0, 0, 1, 1, 2]].contiguous()
    sq, sk = pow2((T, 1, H, D // 32), g), pow2((npg, page, D // 32), g)
    if kind == "fp8":
        qd, kd = fp8((T, 1, H, D), g), fp8((npg, page, D), g)
        qv, kvv, data = qd.double(), kd.double(), kd.view(U8)
    else:
        cq, ck = fp4_codes((T, 1, H, D), g), fp4_codes((npg, page, D), g)
        qd = pack_fp4_last(cq)
        qv, kvv, data = fp4_ref(cq), fp4_ref(ck), pack_fp4_last(ck).view(U8)
    cache = ascend_cache(data, i16_pairs(sk), nz)
    w = nonzero((T, H), g).to(BF16)
    ctx = torch.tensor(lens, dtype=I32).reshape(T, 1)
    meta = dg.get_paged_mqa_logits_metadata(ctx, H, indices)
    assert meta.shape == (33, 2) and meta[0].tolist() == [0, 0] and meta[-1].tolist() == [T, 0]
    out = dg.fp8_fp4_paged_mqa_logits((qd, i16_pairs(sq)), cache, w, ctx, table, meta, 200, indices, nz)
    assert out.dtype == BF16 and out.shape == (T, 200) and out.stride() == (256, 1)
    qs = (qv * per32(sq, D)).reshape(T, H, D)
    check_paged(out, ref_paged(qs, w, kvv * per32(sk, D), None, table, lens), lens, 200)
    other = dg.get_paged_mqa_logits_metadata(ctx, 64, indices)  # another cost model: still an exact partition
    dg.fp8_fp4_paged_mqa_logits((qd, i16_pairs(sq)), cache, w, ctx, table, other, 200, indices, nz)


# ---------------------------------------------------------------------------------------------------------------------
# HC prenorm GEMM
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", [9, 10])
def test_tf32_hc_prenorm_gemm_cuda(dg, arch):
    use(dg, "cuda", arch)
    g = gen(106)
    M, N, K = 20, 24, 256
    a, b = nonzero((M, K), g).to(BF16), torch.randn(N, K, generator=g)
    b_tf32 = round_mantissa(b, 11, ties_even=False)  # TF32: 10 stored mantissa bits [ASSUMED ties away]
    d, s = torch.empty(M, N), torch.empty(M)
    dg.tf32_hc_prenorm_gemm(a, b, d, s)
    ref = a.double() @ b_tf32.T
    assert torch.allclose(d.double(), ref, rtol=1e-6, atol=1e-5)
    assert (d.double() - a.double() @ b.double().T).abs().max() > 1e-4  # the FP32 b would give another result
    assert torch.allclose(s.double(), a.double().square().sum(-1), rtol=1e-6)
    d3, s3 = torch.full((3, M, N), 9.0), torch.full((3, M), 9.0)
    dg.tf32_hc_prenorm_gemm(a, b, d3, s3, num_splits=3)  # 4 K blocks of 64: splits [0, 2), [2, 3), [3, 4)
    for i, (lo, hi) in enumerate([(0, 128), (128, 192), (192, 256)]):
        assert torch.allclose(d3[i].double(), a.double()[:, lo:hi] @ b_tf32[:, lo:hi].T, rtol=1e-6, atol=1e-5)
        assert torch.allclose(s3[i].double(), a.double()[:, lo:hi].square().sum(-1), rtol=1e-6)
    if arch == 9:  # SM90: a split without K blocks stores zeros
        d5, s5 = torch.full((5, M, N), 9.0), torch.full((5, M), 9.0)
        dg.tf32_hc_prenorm_gemm(a, b, d5, s5, num_splits=5)
        assert (d5[4] == 0).all() and (s5[4] == 0).all()
        raises_check(lambda: dg.tf32_hc_prenorm_gemm(a, b[:8].repeat(5, 1), torch.empty(M, 40), s), "n <= 32")
    else:
        d5, s5 = torch.empty(5, M, N), torch.empty(5, M)
        raises_check(lambda: dg.tf32_hc_prenorm_gemm(a, b, d5, s5, num_splits=5), "TMEM", panic=True)
        raises_check(lambda: dg.tf32_hc_prenorm_gemm(a, b[:, :200], d, s), "m == m_ and m == m__ and n == n_")


def test_tf32_hc_prenorm_gemm_ascend(dg):
    use(dg, "ascend")
    g = gen(107)
    M, N, K = 20, 24, 512
    a, b = nonzero((M, K), g).to(BF16), torch.randn(N, K, generator=g)
    d, s = torch.empty(1, M, N), torch.empty(1, M)
    dg.tf32_hc_prenorm_gemm(a, b, d, s, num_splits=1)
    assert torch.allclose(
        d[0].double(), a.double() @ round_mantissa(b, 12, ties_even=True).T, rtol=1e-6, atol=1e-5
    )  # HF32
    assert torch.allclose(s[0].double(), a.double().square().sum(-1), rtol=1e-6)
    with pytest.raises(AssertionError, match="reduces the K split internally"):
        dg.tf32_hc_prenorm_gemm(a, b, torch.empty(2, M, N), torch.empty(2, M), num_splits=2)
    with pytest.raises(AssertionError, match="positive multiple of 256"):
        dg.tf32_hc_prenorm_gemm(a[:, :320], b[:, :320], d[0], s[0])


# ---------------------------------------------------------------------------------------------------------------------
# einsum / fp8_einsum
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", [9, 10])
def test_einsum_cuda(dg, arch):
    use(dg, "cuda", arch)
    g = gen(108)
    S, M, N, K = 3, 64, 128, 64
    A, B = nonzero((S, M, K), g).to(BF16), nonzero((S, N, K), g).to(BF16)
    ref = torch.einsum("smk,snk->mn", A.double(), B.double())
    d = nonzero((M, N), g).float()
    d0 = d.clone()
    dg.einsum("bmk,bnk->mn", A, B, d, c=d)
    assert calc_diff(d, d0.double() + ref) < 1e-10
    d16 = torch.full((M, N), 7.0, dtype=BF16)
    dg.einsum("bmk,bnk->mn", A, B, d16)
    assert torch.equal(d16, ref.float().to(BF16))  # FP32 workspace, then cast
    Bt, H, R, Dd = 4, 3, 64, 32
    a, bw = nonzero((Bt, H, R), g).to(BF16), nonzero((H, Dd + 8, R), g).to(BF16)[:, :Dd]  # B: a row slice is fine
    out = torch.empty(Bt, H, Dd, dtype=BF16)
    dg.einsum("bhr,hdr->bhd", a, bw, out)
    assert calc_diff(out, torch.einsum("bhr,hdr->bhd", a.double(), bw.double())) < 1e-5
    a2, b2 = nonzero((Bt, H, Dd), g).to(BF16), nonzero((H, Dd, R), g).to(BF16)
    out2 = torch.empty(Bt, H, R, dtype=BF16)
    dg.einsum("bhd,hdr->bhr", a2, b2, out2, use_cublaslt=True)
    assert calc_diff(out2, torch.einsum("bhd,hdr->bhr", a2.double(), b2.double())) < 1e-5
    raises_check(lambda: dg.einsum("bhd,bhr->hdr", a2, a2, out2), "Unsupported einsum expression: bhd,bhr->hdr")
    raises_check(lambda: dg.einsum("bmk,bnk->mn", A, B, d16, use_cublaslt=True), "not use_cublaslt")
    raises_check(
        lambda: dg.einsum("bmk,bnk->mn", A[:, :32].contiguous(), B[:, :32].contiguous(), d16[:32, :32]),
        "m % 64 == 0 and n % 64 == 0",
    )


def test_fp8_einsum_cuda(dg):
    g = gen(109)
    Bt, H, R, Dd = 4, 2, 256, 128
    a, b = fp8((Bt, H, R), g), fp8((H, Dd, R), g)
    use(dg, "cuda", 9)
    sfa, sfb = (torch.rand(Bt, H, R // 128, generator=g) + 0.5), (torch.rand(H, Dd // 128, R // 128, generator=g) + 0.5)
    out = torch.empty(Bt, H, Dd, dtype=BF16)
    dg.fp8_einsum("bhr,hdr->bhd", (a, sfa), (b, sfb), out)
    ref = torch.einsum(
        "bhr,hdr->bhd", a.double() * sfa.double().repeat_interleave(128, -1), b.double() * _blocks(sfb, 128, 128)
    )
    assert calc_diff(out, ref) < 1e-5
    raises_check(
        lambda: dg.fp8_einsum("bhd,hdr->bhr", (a, sfa), (b, sfb), out), "Unsupported einsum expression: bhd,hdr->bhr"
    )
    use(dg, "cuda", 10)
    # 'bhd,bhr->hdr': a per-channel weight-gradient contraction over the tokens b, FP32 d accumulated in place
    T, D2, R2 = 256, 64, 32
    x, y = fp8((T, H, D2), g), fp8((T, H, R2), g)
    sx, sy = pow2((T // 128, H, D2), g), pow2((T // 128, H, R2), g)
    acc = nonzero((H, D2, R2), g).float()
    acc0 = acc.clone()
    dg.fp8_einsum("bhd,bhr->hdr", (x, sx), (y, sy), acc, c=acc, recipe=(1, 1, 128))
    xr = x.double() * sx.double().repeat_interleave(128, 0)
    yr = y.double() * sy.double().repeat_interleave(128, 0)
    assert calc_diff(acc, acc0.double() + torch.einsum("bhd,bhr->hdr", xr, yr)) < 1e-10
    # 'bhd,hdr->bhr' on SM100 (FP32 scales become packed UE8M0)
    a3, b3 = fp8((Bt, H, Dd), g), fp8((H, Dd, R), g)
    s3a, s3b = pow2((Bt, H, Dd // 128), g), pow2((H, Dd // 128, R // 128), g)
    out3 = torch.empty(Bt, H, R, dtype=BF16)
    dg.fp8_einsum("bhd,hdr->bhr", (a3, s3a), (b3, s3b), out3)
    ref3 = torch.einsum(
        "bhd,hdr->bhr",
        a3.double() * s3a.double().repeat_interleave(128, -1),
        b3.double() * _blocks(s3b.transpose(1, 2), 128, 128).transpose(1, 2),
    )
    assert calc_diff(out3, ref3) < 1e-5


def _blocks(s, gr, gc):
    return s.double().repeat_interleave(gr, -2).repeat_interleave(gc, -1)


def test_einsum_ascend(dg):
    use(dg, "ascend")
    g = gen(110)
    Bt, H, Dd, R = 4, 2, 64, 32
    a, bw = nonzero((Bt, H, R), g).to(BF16), nonzero((H, Dd, R), g).to(BF16)
    out = torch.empty(Bt, H, Dd)
    dg.einsum("bhr,hdr->bhd", a, bw, out)
    assert calc_diff(out, torch.einsum("bhr,hdr->bhd", a.double(), bw.double())) < 1e-10
    x, y = nonzero((Bt, H, Dd), g).to(BF16), nonzero((Bt, H, R), g).to(BF16)
    acc = nonzero((H, Dd, R), g).float()
    acc0 = acc.clone()
    dg.einsum("bhd,bhr->hdr", x, y, acc, c=acc, epilogue=dg.epilogue.Alpha(0.5))
    assert calc_diff(acc, acc0.double() + 0.5 * torch.einsum("bhd,bhr->hdr", x.double(), y.double())) < 1e-10
    raises_check(lambda: dg.einsum("bhd,bhr->hdr", x, y, acc, c=acc.clone()), "c must be the same tensor as d")
    raises_check(lambda: dg.einsum("bhr,hdr->bhd", a, bw, out, use_cublaslt=True), "use_cublaslt")
    raises_check(lambda: dg.einsum("bmk,bnk->mn", a, a, out), "Unsupported einsum expression")
    # fp8_einsum: UE8M0 per-32 scales (FP32 powers of two or int16 pairs)
    a8, b8 = fp8((Bt, H, R * 2), g), fp8((H, Dd, R * 2), g)
    sa, sb = pow2((Bt, H, 2), g), pow2((H, Dd, 2), g)
    out8 = torch.empty(Bt, H, Dd, dtype=BF16)
    dg.fp8_einsum("bhr,hdr->bhd", (a8, sa), (b8, i16_pairs(sb)), out8)
    ref8 = torch.einsum("bhr,hdr->bhd", a8.double() * per32(sa, 64), b8.double() * per32(sb, 64))
    assert calc_diff(out8, ref8) < 1e-5
    raises_check(
        lambda: dg.fp8_einsum("bhd,hdr->bhr", (a8, sa), (b8, sb), (out8, torch.empty(1, dtype=I16))),
        "std::holds_alternative<torch::Tensor>(d)",
    )


# ---------------------------------------------------------------------------------------------------------------------
# Host checks, panics and mutations
# ---------------------------------------------------------------------------------------------------------------------


def test_attention_host_checks(dg):
    g = gen(111)
    use(dg, "cuda", 9)
    S, D, SKV = 4, 64, 64
    q, kv, kv_sf = fp8((S, 16, D), g), fp8((SKV, D), g), torch.ones(SKV)
    ks, ke = torch.zeros(S, dtype=I32), torch.full((S,), SKV, dtype=I32)
    raises_check(
        lambda: dg.fp8_fp4_mqa_logits((q, None), (kv, kv_sf), torch.ones(S, 16), ks, ke),
        "(arch_major == 9 and (num_heads == 32 or num_heads == 64))",
    )
    q32, w32 = fp8((S, 32, D), g), torch.ones(S, 32)
    raises_check(
        lambda: dg.fp8_fp4_mqa_logits((q32, None), (kv, kv_sf), w32, ks, ke, max_seqlen_k=64), "not clean_logits"
    )
    raises_check(
        lambda: dg.fp8_mqa_logits(q32, (kv, kv_sf.double()), w32, ks, ke), "kv_sf.scalar_type() == torch::kFloat"
    )
    raises_check(
        lambda: dg.fp8_fp4_mqa_logits((q32, None), (kv, kv_sf), w32, ks, ke, logits_dtype=torch.float16),
        "runtime_utils.hpp:61",
    )
    with pytest.raises(TypeError):
        dg.fp8_fp4_mqa_logits(q32, (kv, kv_sf), w32, ks, ke)  # q must be a (q, sf) pair
    ctx = torch.full((2, 1), 64, dtype=I32)
    raises_check(lambda: dg.get_paged_mqa_logits_metadata(ctx, 32, 132), "attention.hpp:224): block_kv == 64")
    raises_check(
        lambda: dg.get_paged_mqa_logits_metadata(torch.full((2, 2), 64, dtype=I32).T, 64, 132),
        "context_lens.is_contiguous()",
    )
    use(dg, "cuda", 10)
    raises_check(
        lambda: dg.get_paged_mqa_logits_metadata(torch.full((2, 2), 64, dtype=I32), 64, 148, indices=ctx[:, 0]),
        "arch_major == 10 and next_n == 1",
    )
    qp = fp8((2, 1, 8, D), g)
    cache = cuda_cache(fp8((4, 64, D), g).view(U8), as_bytes(torch.ones(4, 64)).reshape(4, -1))
    meta = dg.get_paged_mqa_logits_metadata(ctx, 64, 148)
    table = torch.arange(4, dtype=I32).reshape(2, 2)
    w = torch.ones(2, 8)
    raises_check(
        lambda: dg.fp8_fp4_paged_mqa_logits((qp, None), cache, w, ctx, table, meta, 64, clean_logits=True),
        "not is_context_lens_2d",
    )
    raises_check(
        lambda: dg.fp8_fp4_paged_mqa_logits((qp, None), cache, w, ctx, table, meta[:10], 64),
        "_schedule_meta_size == num_sms + 1",
    )
    raises_check(
        lambda: dg.fp8_paged_mqa_logits(qp, cache, w, ctx, table.T.contiguous().T, meta, 64),
        "block_table.stride(1) == 1",
    )
    raises_check(
        lambda: dg.fp8_fp4_paged_mqa_logits((qp, None), cache[:, :, :, :D], w, ctx, table, meta, 64),
        "head_dim_with_sf == head_dim + static_cast<int>(sizeof(float))",
    )
    use(dg, "ascend")
    sq = i16_pairs(pow2((S, 8, 2), g))
    skv = i16_pairs(pow2((SKV, 2), g))
    w16 = torch.ones(S, 8, dtype=BF16)
    q8 = fp8((S, 8, D), g)
    raises_check(
        lambda: dg.fp8_fp4_mqa_logits((q8, None), (kv, skv), w16, ks, ke, 64), "MQA logits requires Q scale factors"
    )
    raises_check(lambda: dg.fp8_fp4_mqa_logits((q8, sq), (kv, skv), w16.float(), ks, ke, 64), "expects bf16 weights")
    raises_check(lambda: dg.fp8_fp4_mqa_logits((q8, sq), (kv, skv), w16, ks, ke, 0), "max_seqlen_k > 0")
    with pytest.raises(TypeError):
        dg.fp8_fp4_mqa_logits((q8, sq), (kv, skv), w16, ks, ke, -1)  # uint32_t
    raises_check(lambda: dg.get_paged_mqa_logits_metadata(ctx, 6, torch.zeros(2, dtype=I32)), "num_heads % 4 == 0")
    with pytest.raises(TypeError):
        dg.get_paged_mqa_logits_metadata(ctx, 8, None)  # indices is mandatory
    qa = fp8((2, 2, 8, D), g)
    cache_a = ascend_cache(fp8((4, 64, D), g).view(U8), i16_pairs(pow2((4, 64, 2), g)), False)
    meta_a = dg.get_paged_mqa_logits_metadata(ctx, 8, torch.arange(2, dtype=I32))
    raises_check(
        lambda: dg.fp8_fp4_paged_mqa_logits(
            (qa, sq[:2]), cache_a, w16[:2], ctx, table, meta_a, 64, torch.arange(2, dtype=I32)
        ),
        "q_data.size(1) == 1",
    )
    raises_check(
        lambda: dg.fp8_fp4_paged_mqa_logits(
            (qa[:, :1], sq[:2]), cache_a[:, :32], w16[:2], ctx, table, meta_a, 64, torch.arange(2, dtype=I32)
        ),
        "page_size == 64 or page_size == 128",
    )
    use(dg, "cuda", 9)
    a, b = nonzero((8, 128), g).to(BF16), torch.randn(8, 128, generator=g)
    raises_check(lambda: dg.tf32_hc_prenorm_gemm(a, b.T.contiguous().T, torch.empty(8, 8), torch.empty(8)), "Major::K")
    raises_check(
        lambda: dg.tf32_hc_prenorm_gemm(a, b, torch.empty(0, 8, 8), torch.empty(0, 8), num_splits=0),
        "num_splits.value() >= 1",
    )
    raises_check(
        lambda: dg.tf32_hc_prenorm_gemm(a, b.double(), torch.empty(8, 8), torch.empty(8)),
        "b.scalar_type() == torch::kFloat",
    )
    A = nonzero((2, 64, 64), g).to(BF16)
    raises_check(
        lambda: dg.einsum("bmk,bnk->mn", A, A, torch.empty(64, 64, dtype=BF16), c=torch.empty(64, 64, dtype=BF16)),
        "not c.has_value()",
    )
    raises_check(
        lambda: dg.einsum("bmk,bnk->mn", A.float(), A, torch.empty(64, 64)), "a.scalar_type() == torch::kBFloat16"
    )
    a8, b8 = fp8((4, 2, 256), g), fp8((2, 128, 256), g)
    raises_check(
        lambda: dg.fp8_einsum(
            "bhr,hdr->bhd", (a8, torch.ones(4, 2, 2)), (b8, torch.ones(2, 1, 2)), torch.empty(4, 2, 128)
        ),
        "d.scalar_type() == torch::kBFloat16",
    )


def test_attention_panics(dg):
    g = gen(112)
    use(dg, "cuda", 9)
    S, H, D, SKV = 4, 32, 64, 64
    q, kv, kv_sf, w = fp8((S, H, D), g), fp8((SKV, D), g), torch.ones(SKV), torch.ones(S, H)
    zeros, full = torch.zeros(S, dtype=I32), torch.full((S,), SKV, dtype=I32)
    for ks, ke, text in (
        (zeros, full + 1, "[0, 65) is not a range inside [0, seq_len_kv = 64]"),
        (zeros - 1, full, "[-1, 64)"),
        (full, zeros, "[64, 0)"),
    ):
        raises_check(lambda ks=ks, ke=ke: dg.fp8_mqa_logits(q, (kv, kv_sf), w, ks, ke), text, panic=True)
    kv_long = fp8((600, D), g)
    raises_check(
        lambda: dg.fp8_mqa_logits(q, (kv_long, torch.ones(600)), w, zeros, zeros + 300, False, 100),
        "into the next row",
        panic=True,
    )
    w_strided = torch.ones(S, H + 8)[:, :H]
    raises_check(
        lambda: dg.fp8_mqa_logits(q, (kv, kv_sf), w_strided, zeros, full), "outer stride num_heads", panic=True
    )
    # paged: negative lengths, a token longer than its request's last one, block-table rows and stale schedules
    ctx = torch.tensor([[10, 70]], dtype=I32)
    qp = fp8((1, 2, H, D), g)
    cache = cuda_cache(fp8((4, 64, D), g).view(U8), as_bytes(torch.ones(4, 64)).reshape(4, -1))
    table = torch.tensor([[2, 3]], dtype=I32)
    meta = dg.get_paged_mqa_logits_metadata(ctx, 64, 132)
    wp = torch.ones(2, H)
    dg.fp8_paged_mqa_logits(qp, cache, wp, ctx, table, meta, 128)
    raises_check(lambda: dg.get_paged_mqa_logits_metadata(-ctx, 64, 132), "holds -10", panic=True)
    bad_ctx = torch.tensor([[90, 70]], dtype=I32)
    meta_bad = dg.get_paged_mqa_logits_metadata(bad_ctx, 64, 132)
    raises_check(
        lambda: dg.fp8_paged_mqa_logits(qp, cache, wp, bad_ctx, table, meta_bad, 128),
        "the length of its request's last token",
        panic=True,
    )
    raises_check(
        lambda: dg.fp8_paged_mqa_logits(qp, cache, wp, ctx, table[:, :1], meta, 128),
        "block_table has 1 columns",
        panic=True,
    )
    raises_check(
        lambda: dg.fp8_paged_mqa_logits(qp, cache, wp, ctx, torch.tensor([[2, 4]], dtype=I32), meta, 128),
        "block_table[0, 1] = 4",
        panic=True,
    )
    long_ctx = torch.tensor([[10, 300]], dtype=I32)
    raises_check(
        lambda: dg.fp8_paged_mqa_logits(qp, cache, wp, long_ctx, torch.tensor([[0, 1, 2, 3, 0]], dtype=I32), meta, 128),
        "schedule_meta is not the metadata",
        panic=True,
    )
    raises_check(
        lambda: dg.fp8_paged_mqa_logits(
            qp,
            cache,
            wp,
            long_ctx,
            torch.tensor([[0, 1, 2, 3, 0]], dtype=I32),
            dg.get_paged_mqa_logits_metadata(long_ctx, 64, 132),
            128,
        ),
        "past the row stride",
        panic=True,
    )
    A = nonzero((2, 64, 64), g).to(BF16)
    raises_check(lambda: dg.einsum("bmk,bnk->mn", A, A, torch.zeros(64, 64)), "dereferences the empty c", panic=True)
    use(dg, "ascend")
    sq, skv = i16_pairs(pow2((S, 8, 2), g)), i16_pairs(pow2((SKV, 2), g))
    w16 = torch.ones(S, 8, dtype=BF16)
    q8 = fp8((S, 8, D), g)
    raises_check(
        lambda: dg.fp8_fp4_mqa_logits((q8, sq), (kv, skv), w16, zeros, full, 32),
        "past the logits allocation",
        panic=True,
    )
    raises_check(
        lambda: dg.fp8_fp4_mqa_logits((q8, sq), (kv, skv), w16, zeros + 5, full + 5, 64),
        "is not a range inside [0, num_kv_tokens = 64]",
        panic=True,
    )
    ctx = torch.tensor([[60], [70]], dtype=I32)
    indices = torch.tensor([0, 0], dtype=I32)
    cache_a = ascend_cache(fp8((4, 64, D), g).view(U8), i16_pairs(pow2((4, 64, 2), g)), False)
    meta_a = dg.get_paged_mqa_logits_metadata(ctx, 8, indices)
    qa, sqa, wa = fp8((2, 1, 8, D), g), i16_pairs(pow2((2, 1, 8, 2), g)), torch.ones(2, 8, dtype=BF16)
    table = torch.tensor([[3, 4], [3, 4]], dtype=I32)  # 70 tokens: pages 0 and 1 of the request, page 4 does not exist
    raises_check(
        lambda: dg.fp8_fp4_paged_mqa_logits((qa, sqa), cache_a, wa, ctx, table, meta_a, 128, indices),
        "block_table[0, 1] = 4 is not a page of the cache",
        panic=True,
    )


def test_attention_mutations(dg):
    """Shifted or transposed scale tensors change the logits (or the call refuses them)."""
    g = gen(113)
    use(dg, "cuda", 10)
    S, H, D, SKV = 4, 8, 64, 128
    q, kv, w = fp8((S, H, D), g), fp8((SKV, D), g), nonzero((S, H), g).float()
    kv_sf = (torch.rand(SKV, generator=g) + 0.5).float()
    ks, ke = torch.zeros(S, dtype=I32), torch.full((S,), SKV, dtype=I32)
    good = dg.fp8_mqa_logits(q, (kv, kv_sf), w, ks, ke)
    shifted = dg.fp8_mqa_logits(q, (kv, kv_sf.roll(1)), w, ks, ke)
    ref = ref_logits(q, kv, w, kv_sf)
    assert calc_diff(good, ref) < 1e-10 and calc_diff(shifted, ref) > 1e-4
    # FP4: Q scales of [S, H] transposed (same shape when S == H)
    S4 = H4 = 8
    cq, ck = fp4_codes((S4, H4, D), g), fp4_codes((SKV, D), g)
    sq, sk = pow2((S4, H4, 2), g), pow2((SKV, 2), g)
    ww = nonzero((S4, H4), g).float()
    args = ((pack_fp4_last(ck), i32_words(sk)), ww, ks[:1].repeat(S4), ke[:1].repeat(S4))
    right = dg.fp8_fp4_mqa_logits((pack_fp4_last(cq), i32_words(sq)), *args)
    wrong = dg.fp8_fp4_mqa_logits((pack_fp4_last(cq), i32_words(sq).T.contiguous()), *args)
    ref4 = ref_logits(fp4_ref(cq) * per32(sq, D), fp4_ref(ck) * per32(sk, D), ww)
    assert calc_diff(right, ref4) < 1e-10 and calc_diff(wrong, ref4) > 1e-4
    raises_check(
        lambda: dg.fp8_fp4_mqa_logits((pack_fp4_last(cq), i32_words(sq).T), *args), "q_sf.value().is_contiguous()"
    )
    # paged: a cache whose scales are shifted by one token
    ctx = torch.tensor([[100]], dtype=I32)
    kd, ksf = fp8((2, 64, D), g), (torch.rand(2, 64, generator=g) + 0.5).float()
    qp, wp = fp8((1, 1, H, D), g), nonzero((1, H), g).float()
    meta = dg.get_paged_mqa_logits_metadata(ctx, 64, 148)
    table = torch.tensor([[1, 0]], dtype=I32)
    outs = [
        dg.fp8_paged_mqa_logits(qp, cuda_cache(kd.view(U8), as_bytes(s).reshape(2, -1)), wp, ctx, table, meta, 100)
        for s in (ksf, ksf.roll(1, -1))
    ]
    refp = ref_paged(qp.double().reshape(1, H, D), wp, kd.double(), ksf.double(), table, [100])[0]
    assert calc_diff(outs[0][0], refp) < 1e-10 and calc_diff(outs[1][0], refp) > 1e-4
    # Ascend ragged: the KV scale pairs of the two halves of the head dim swapped
    use(dg, "ascend")
    D2 = 128
    qa, ka = fp8((S, H, D2), g), fp8((SKV, D2), g)
    sqa, ska = pow2((S, H, 4), g), pow2((SKV, 4), g)
    wa = nonzero((S, H), g).to(BF16)
    refa = ref_logits(qa.double() * per32(sqa, D2), ka.double() * per32(ska, D2), wa)
    outa = dg.fp8_fp4_mqa_logits((qa, i16_pairs(sqa)), (ka, i16_pairs(ska)), wa, ks, ke, SKV)
    swapped = dg.fp8_fp4_mqa_logits((qa, i16_pairs(sqa)), (ka, i16_pairs(ska).flip(-1)), wa, ks, ke, SKV)
    assert calc_diff(outa, refa) < 1e-4 and calc_diff(swapped, refa) > 1e-3
    # fp8_einsum on SM90: the square per-block SFB transposed
    use(dg, "cuda", 9)
    a8, b8 = fp8((4, 2, 256), g), fp8((2, 256, 256), g)
    sfa = torch.rand(4, 2, 2, generator=g) + 0.5
    sfb = torch.rand(2, 2, 2, generator=g) + 0.5
    o1, o2 = torch.empty(4, 2, 256, dtype=BF16), torch.empty(4, 2, 256, dtype=BF16)
    dg.fp8_einsum("bhr,hdr->bhd", (a8, sfa), (b8, sfb), o1)
    dg.fp8_einsum("bhr,hdr->bhd", (a8, sfa), (b8, sfb.transpose(1, 2).contiguous()), o2)
    ref8 = torch.einsum(
        "bhr,hdr->bhd", a8.double() * sfa.double().repeat_interleave(128, -1), b8.double() * _blocks(sfb, 128, 128)
    )
    assert calc_diff(o1, ref8) < 1e-5 and calc_diff(o2, ref8) > 1e-4
