"""Self-tests of the CPU stand-in for ``deep_gemm`` (``tests/standins/deep_gemm``).

Every value check compares against an fp64 computation written here with plain torch (its own FP4/UE8M0 encoders and
a ``repeat_interleave`` dequantizer), independent of the stand-in's code. Inputs are random and never zero.
"""

import math

import pytest
import torch

from tests.upstream.standin import installed

FP8, I8, BF16, F32, I32, I16 = torch.float8_e4m3fn, torch.int8, torch.bfloat16, torch.float32, torch.int32, torch.int16
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


@pytest.fixture
def dg():
    with installed("deep_gemm", flavor="cuda", arch=9) as module:
        yield module


def use(dg, flavor, arch=9):
    dg._standin.configure(flavor, arch)
    dg._standin.reset()
    return dg


# ---------------------------------------------------------------------------------------------------------------------
# Independent encoders / reference
# ---------------------------------------------------------------------------------------------------------------------


def gen(seed):
    return torch.Generator().manual_seed(seed)


def nonzero(shape, g, lo=0.25, hi=3.0):
    mag = torch.rand(shape, generator=g) * (hi - lo) + lo
    sign = torch.randint(0, 2, shape, generator=g) * 2 - 1
    return mag * sign


def fp8(shape, g):
    return nonzero(shape, g).to(FP8)


def any_scales(shape, g):
    return (torch.rand(shape, generator=g) * 1.5 + 0.5).float()


def pow2(shape, g):
    return torch.pow(2.0, torch.randint(-3, 4, shape, generator=g).float())


def fp4_codes(shape, g):
    """Non-zero E2M1 codes (magnitude index 1..7, random sign)."""
    return torch.randint(1, 8, shape, generator=g) | (torch.randint(0, 2, shape, generator=g) << 3)


def fp4_ref(codes):
    return E2M1[codes & 7] * torch.where((codes & 8) != 0, -1.0, 1.0).double()


def pack_fp4_last(codes):
    """[.., X] codes -> int8 [.., X/2], element 2j in the low nibble."""
    return ((codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)).view(I8)


def exps(s):
    return torch.log2(s).round().long() + 127


def words(codes_row_major, per_word):
    """[.., S] exponent codes -> [.., ceil(S / per_word)] little-endian words (int64 two's complement)."""
    s = codes_row_major.shape[-1]
    n = -(-s // per_word)
    pad = torch.zeros((*codes_row_major.shape[:-1], n * per_word - s), dtype=torch.long)
    c = torch.cat([codes_row_major, pad], -1).reshape(*codes_row_major.shape[:-1], n, per_word)
    w = sum(c[..., j] << (8 * j) for j in range(per_word))
    bits = 8 * per_word
    return torch.where(w >= 2 ** (bits - 1), w - 2**bits, w)


def ue8m0_int32_mn_major(s):
    """FP32 power-of-two scales [MN, S] -> packed int32 [MN, ceil(S/4)], MN-major with the TMA-aligned MN stride."""
    mn = s.shape[0]
    w = words(exps(s), 4)
    out = torch.empty_strided(tuple(w.shape), (1, -(-mn // 4) * 4), dtype=I32)
    out.copy_(w.to(I32))
    return out


def ue8m0x2_int16_mn_major(s):
    """FP32 power-of-two scales [.., MN, S] -> Ascend int16 [.., MN, ceil(S/2)] MN-major (stride(-1) == MN)."""
    w = words(exps(s), 2).to(I16)
    return w.transpose(-2, -1).contiguous().transpose(-2, -1)


def expand(s, gmn, gk, mn, k):
    return s.double().repeat_interleave(gmn, -2)[..., :mn, :].repeat_interleave(gk, -1)[..., :k]


def ref_mm(a, b):
    return a.double() @ b.double().transpose(-1, -2)


def calc_diff(x, y):
    x, y = x.double(), y.double()
    den = (x * x + y * y).sum()
    return 0.0 if den == 0 else float(1 - 2 * (x * y).sum() / den)


def close(d, ref, tol=1e-5):
    assert not torch.isnan(d.double()).any()
    assert calc_diff(d, ref) < tol
    assert torch.allclose(d.double(), ref.to(d.dtype).double(), rtol=1e-2, atol=1e-2 * float(ref.abs().max()))


def raises_check(fn, text, panic=False):
    with pytest.raises(RuntimeError) as info:
        fn()
    msg = str(info.value)
    assert msg.startswith("DeepGEMM stand-in: "), msg
    assert text in msg, msg
    assert (type(info.value).__name__ == "Panic") == panic, msg
    return info.value


# ---------------------------------------------------------------------------------------------------------------------
# Flavors and attributes
# ---------------------------------------------------------------------------------------------------------------------


def test_flavors_versions_and_attribute_detection(dg):
    use(dg, "cuda", 9)
    assert dg.__version__ == "2.6.1" and dg.testing.get_arch_major() == 9
    assert dg.fp8_gemm_nt is dg.fp8_fp4_gemm_nt and dg.m_grouped_fp8_gemm_nt_masked is dg.fp8_m_grouped_gemm_nt_masked
    assert dg.get_m_alignment_for_contiguous_layout is dg.get_mk_alignment_for_contiguous_layout
    assert not hasattr(dg, "fp8_bmm") and not hasattr(dg, "aclnn_bf16_gemm_nt") and not hasattr(dg, "set_npu_arch")
    from deep_gemm import fp8_fp4_gemm_nt  # noqa: F401  (PEP 562 from-import)

    use(dg, "cuda", 10)
    assert dg.testing.get_arch_major() == 10
    use(dg, "ascend")
    assert dg.__version__ == "0.1.0"
    for name in (
        "fp8_bmm",
        "bf16_bmm",
        "set_npu_arch",
        "get_npu_arch",
        "aclnn_fp8_fp4_gemm_nt",
        "aclnn_bf16_gemm_tt",
        "transform_k_grouped_sf_into_required_layout",
        "use_deterministic_algorithms",
        "epilogue",
    ):
        assert hasattr(dg, name), name
    for name in ("m_grouped_fp8_fp4_gemm_nt_masked", "m_grouped_fp8_gemm_nt_masked", "m_grouped_bf16_gemm_nt_masked"):
        assert not hasattr(dg, name)
        with pytest.raises(AttributeError, match="not implemented in this backend"):
            getattr(dg, name)
    assert not hasattr(dg.testing, "get_arch_major") and not hasattr(dg, "set_pdl")
    with pytest.raises(NotImplementedError):
        dg.aclnn_bf16_gemm_nt(None, None, None)
    dg.set_npu_arch(3510)
    assert dg.get_npu_arch() == 3510


# ---------------------------------------------------------------------------------------------------------------------
# Dense GEMMs
# ---------------------------------------------------------------------------------------------------------------------


def _variant_args(variant, A, sfa, B, sfb):
    """Pass the logical NT operands in the layout the alias expects (transposed *views*)."""
    a = (A.T, sfa.T) if variant[0] == "t" else (A, sfa)
    b = (B.T, sfb.T) if variant[1] == "n" else (B, sfb)
    return a, b


@pytest.mark.parametrize("variant", ["nt", "nn", "tn", "tt"])
def test_fp8_sm90_1d2d_all_variants(dg, variant):
    use(dg, "cuda", 9)
    g = gen(1)
    M, N, K = 48, 256, 384
    A, B = fp8((M, K), g), fp8((N, K), g)
    sfa, sfb = any_scales((M, K // 128), g), any_scales((N // 128, K // 128), g)  # SM90 keeps FP32 scales as is
    full = torch.full((M, N + 8), float("nan"), dtype=BF16)
    d = full[:, :N]  # padded row stride: the result goes through d's strides
    a, b = _variant_args(variant, A, sfa, B, sfb)
    getattr(dg, f"fp8_gemm_{variant}")(a, b, d)
    ref = ref_mm(A.double() * expand(sfa, 1, 128, M, K), B.double() * expand(sfb, 128, 128, N, K))
    close(d, ref)
    assert torch.isnan(full[:, N:]).all()


def test_fp8_sm90_1d1d_accumulate(dg):
    use(dg, "cuda", 9)
    g = gen(2)
    M, N, K = 40, 72, 256
    A, B = fp8((M, K), g), fp8((N, K), g)
    sfa, sfb = any_scales((M, K // 128), g), any_scales((N, K // 128), g)
    c = nonzero((M, N), g).float()
    d = torch.empty(M, N, dtype=F32)
    dg.fp8_gemm_nt((A, sfa), (B, sfb), d, c=c, recipe=(1, 1, 128))
    ref = c.double() + ref_mm(A.double() * expand(sfa, 1, 128, M, K), B.double() * expand(sfb, 1, 128, N, K))
    close(d, ref, 1e-12)


@pytest.mark.parametrize("variant", ["nt", "nn", "tn", "tt"])
def test_fp8_fp4_sm100_packed_scales_and_accumulate(dg, variant):
    use(dg, "cuda", 10)
    g = gen(3)
    M, N, K = 42, 64, 256
    A = fp8((M, K), g)
    codes = fp4_codes((N, K), g)
    B = pack_fp4_last(codes)  # K-major packed FP4 [N, K/2]
    sfa = pow2((M, K // 128), g)
    sfb = pow2((N, K // 32), g)
    c = nonzero((M, N), g).to(BF16)
    d = torch.empty(M, N, dtype=BF16)
    sfa_packed = ue8m0_int32_mn_major(sfa)
    a, b = _variant_args(variant, A, sfa_packed, B, sfb)  # transposed views of the same buffers
    getattr(dg, f"fp8_fp4_gemm_{variant}")(a, b, d, c=c, recipe_a=(1, 128), recipe_b=(1, 32))
    ref = c.double() + ref_mm(A.double() * expand(sfa, 1, 128, M, K), fp4_ref(codes) * expand(sfb, 1, 32, N, K))
    close(d, ref)


def test_fp8_sm100_legacy_recipe_and_mn_major_fp4(dg):
    use(dg, "cuda", 10)
    g = gen(4)
    M, N, K = 32, 256, 256
    A, B = fp8((M, K), g), fp8((N, K), g)
    sfa, sfb = pow2((M, K // 128), g), pow2((N // 128, K // 128), g)  # default recipe (1, 128, 128): SFB broadcast
    d = torch.empty(M, N, dtype=BF16)
    dg.fp8_gemm_nt((A, sfa), (B, sfb), d)
    close(d, ref_mm(A.double() * expand(sfa, 1, 128, M, K), B.double() * expand(sfb, 128, 128, N, K)))
    # MN-major FP4 B: storage [K, N/2] packed along N, passed as the [N/2, K] view (stride(-2) == 1)
    codes = fp4_codes((N, K), g)
    b_store = pack_fp4_last(codes.T.contiguous())  # [K, N/2]
    sfb4 = pow2((N, K // 32), g)
    d2 = torch.empty(M, N, dtype=F32)
    dg.fp8_fp4_gemm_nt((A, sfa), (b_store.T, sfb4), d2, recipe_a=(1, 128), recipe_b=(1, 32))
    close(d2, ref_mm(A.double() * expand(sfa, 1, 128, M, K), fp4_ref(codes) * expand(sfb4, 1, 32, N, K)), 1e-12)


@pytest.mark.parametrize("variant", ["nt", "nn", "tn", "tt"])
def test_fp8_fp4_ascend_alpha_and_in_place(dg, variant):
    use(dg, "ascend")
    g = gen(5)
    M, N, K = 36, 48, 192
    A = fp8((M, K), g)
    codes = fp4_codes((N, K), g)
    B = pack_fp4_last(codes)
    sfa = pow2((M, K // 32), g)
    sfb16 = ue8m0x2_int16_mn_major(pow2((N, K // 32), g))
    sfb_vals = torch.pow(2.0, _unpack16(sfb16) - 127.0)
    d = nonzero((M, N), g).float()
    d0 = d.clone()
    a, b = _variant_args(variant, A, sfa, B, sfb16)
    getattr(dg, f"fp8_gemm_{variant}")(a, b, d, c=d, alpha=-0.75)
    ref = d0.double() - 0.75 * ref_mm(
        A.double() * expand(sfa, 1, 32, M, K), fp4_ref(codes) * expand(sfb_vals, 1, 32, N, K)
    )
    close(d, ref, 1e-12)


def _unpack16(t):
    v = t.long() & 0xFFFF
    return torch.stack([v & 0xFF, v >> 8], -1).flatten(-2).double()


def test_fp4_x_fp4_ascend(dg):
    use(dg, "ascend")
    g = gen(6)
    M, N, K = 16, 32, 128
    ca, cb = fp4_codes((M, K), g), fp4_codes((N, K), g)
    sfa, sfb = pow2((M, K // 32), g), pow2((N // 16, K // 32), g)
    d = torch.empty(M, N, dtype=BF16)
    dg.fp8_fp4_gemm_nt((pack_fp4_last(ca), sfa), (pack_fp4_last(cb), sfb), d, recipe_a=(1, 32), recipe_b=(16, 32))
    close(d, ref_mm(fp4_ref(ca) * expand(sfa, 1, 32, M, K), fp4_ref(cb) * expand(sfb, 16, 32, N, K)))


@pytest.mark.parametrize("flavor,arch", [("cuda", 9), ("cuda", 10), ("ascend", 0)])
@pytest.mark.parametrize("variant", ["nt", "nn", "tn", "tt"])
def test_bf16_dense(dg, flavor, arch, variant):
    use(dg, flavor, arch)
    g = gen(7)
    M, N, K = 24, 40, 72
    A, B = nonzero((M, K), g).to(BF16), nonzero((N, K), g).to(BF16)
    a = A.T if variant[0] == "t" else A
    b = B.T if variant[1] == "n" else B
    d = nonzero((M, N), g).float()
    d0 = d.clone()
    kwargs = dict(alpha=2.0) if flavor == "ascend" else {}
    getattr(dg, f"bf16_gemm_{variant}")(a, b, d, c=d, **kwargs)
    close(d, d0.double() + (2.0 if kwargs else 1.0) * ref_mm(A, B), 1e-12)
    d_bf = torch.empty(M, N, dtype=BF16)
    getattr(dg, f"bf16_gemm_{variant}")(a, b, d_bf)
    close(d_bf, ref_mm(A, B))


# ---------------------------------------------------------------------------------------------------------------------
# M-grouped contiguous / masked
# ---------------------------------------------------------------------------------------------------------------------


def _id_layout(sizes, alignment):
    ids = []
    for gi, s in enumerate(sizes):
        ids += [gi] * s + [-1] * (-(-s // alignment) * alignment - s)
    return torch.tensor(ids, dtype=I32)


@pytest.mark.parametrize("arch", [9, 10])
@pytest.mark.parametrize("kind", ["fp8", "bf16"])
def test_m_grouped_id_layout(dg, arch, kind):
    use(dg, "cuda", arch)
    g = gen(8)
    G, N, K = 3, 64, 128
    layout = _id_layout([100, 0, 60], 128)
    M = layout.numel()
    d = torch.full((M, N), float("nan"), dtype=BF16)
    if kind == "fp8":
        A, B = fp8((M, K), g), fp8((G, N, K), g)
        sfa = any_scales((M, 1), g) if arch == 9 else pow2((M, 1), g)
        sfb = any_scales((G, 1, 1), g) if arch == 9 else pow2((G, 1, 1), g)
        dg.m_grouped_fp8_gemm_nt_contiguous((A, sfa), (B, sfb), d, layout)
        a_ref, b_ref = A.double() * expand(sfa, 1, 128, M, K), B.double() * expand(sfb, 128, 128, N, K)
    else:
        A, B = nonzero((M, K), g).to(BF16), nonzero((G, N, K), g).to(BF16)
        dg.m_grouped_bf16_gemm_nt_contiguous(A, B, d, layout)
        a_ref, b_ref = A.double(), B.double()
    for gi in range(G):
        rows = (layout == gi).nonzero().flatten()
        if rows.numel():
            close(d[rows], ref_mm(a_ref[rows], b_ref[gi]))
    assert (d[layout == -1] == 0).all()


@pytest.mark.parametrize(
    "flavor,arch,zero",
    [("cuda", 9, True), ("cuda", 10, True), ("cuda", 10, False), ("ascend", 0, True), ("ascend", 0, False)],
)
@pytest.mark.parametrize("kind", ["fp8", "bf16"])
def test_m_grouped_psum_layout(dg, flavor, arch, zero, kind):
    use(dg, flavor, arch)
    g = gen(9)
    al = 128 if flavor == "cuda" else 256
    G, N, K = 3, 32, 128
    ends = [100, al + 60, 2 * al]  # group 2 empty; gaps [100, al) and [al + 60, 2 al)
    M = 2 * al + 20  # 20 rows after the last group: never touched
    layout = torch.tensor(ends, dtype=I32)
    d = torch.full((M, N), 7.0, dtype=BF16)
    if kind == "fp8":
        A, B = fp8((M, K), g), fp8((G, N, K), g)
        if flavor == "ascend":
            sfa, sfb = pow2((M, K // 32), g), pow2((G, N, K // 32), g)
            gk, gn = 32, 1
        else:
            sfa = any_scales((M, 1), g) if arch == 9 else pow2((M, 1), g)
            sfb = any_scales((G, 1, 1), g) if arch == 9 else pow2((G, 1, 1), g)
            gk, gn = 128, 128
        dg.m_grouped_fp8_fp4_gemm_nt_contiguous(
            (A, sfa), (B, sfb), d, layout, use_psum_layout=True, ensure_zero_padding=zero
        )
        a_ref, b_ref = A.double() * expand(sfa, 1, gk, M, K), B.double() * expand(sfb, gn, gk, N, K)
    else:
        A, B = nonzero((M, K), g).to(BF16), nonzero((G, N, K), g).to(BF16)
        dg.m_grouped_bf16_gemm_nt_contiguous(A, B, d, layout, use_psum_layout=True, ensure_zero_padding=zero)
        a_ref, b_ref = A.double(), B.double()
    close(d[:100], ref_mm(a_ref[:100], b_ref[0]))
    close(d[al : al + 60], ref_mm(a_ref[al : al + 60], b_ref[1]))
    gap_expected = 0.0 if (zero and not (flavor == "cuda" and arch == 9)) else 7.0
    assert (d[100:al] == gap_expected).all() and (d[al + 60 : 2 * al] == gap_expected).all()
    assert (d[2 * al :] == 7.0).all()


@pytest.mark.parametrize("arch", [9, 10])
def test_m_grouped_masked(dg, arch):
    use(dg, "cuda", arch)
    g = gen(10)
    G, Mmax, N, K = 3, 64, 32, 128
    masked = torch.tensor([40, 0, 64], dtype=I32)
    A, B = fp8((G, Mmax, K), g), fp8((G, N, K), g)
    sfa = any_scales((G, Mmax, 1), g) if arch == 9 else pow2((G, Mmax, 1), g)
    sfb = any_scales((G, 1, 1), g) if arch == 9 else pow2((G, 1, 1), g)
    d = torch.full((G, Mmax, N), 5.0, dtype=BF16)
    dg.m_grouped_fp8_fp4_gemm_nt_masked((A, sfa), (B, sfb), d, masked, expected_m=48)
    a_ref, b_ref = A.double() * expand(sfa, 1, 128, Mmax, K), B.double() * expand(sfb, 128, 128, N, K)
    close(d[0, :40], ref_mm(a_ref[0, :40], b_ref[0]))
    close(d[2], ref_mm(a_ref[2], b_ref[2]))
    assert (d[0, 40:] == 5.0).all() and (d[1] == 5.0).all()
    Ab, Bb = nonzero((G, Mmax, K), g).to(BF16), nonzero((G, N, K), g).to(BF16)
    d2 = torch.full((G, Mmax, N), 5.0, dtype=BF16)
    dg.m_grouped_bf16_gemm_nt_masked(Ab, Bb, d2, masked, 48)
    close(d2[0, :40], ref_mm(Ab[0, :40], Bb[0]))
    assert (d2[0, 40:] == 5.0).all() and (d2[1] == 5.0).all()


@pytest.mark.parametrize("flavor,arch", [("cuda", 10), ("ascend", 0)])
def test_m_grouped_nn_variants(dg, flavor, arch):
    use(dg, flavor, arch)
    g = gen(22)
    G, N, K = 2, 32, 64
    al = dg.get_mk_alignment_for_contiguous_layout()
    layout = torch.tensor([10, al + 5], dtype=I32)
    M = al + 5
    A, B = fp8((M, K), g), fp8((G, N, K), g)
    sfa, sfb = pow2((M, K // 32), g), pow2((G, N, K // 32), g)
    d = torch.zeros(M, N, dtype=BF16)
    dg.m_grouped_fp8_fp4_gemm_nn_contiguous(
        (A, sfa), (B.transpose(1, 2), sfb.transpose(1, 2)), d, layout, recipe=(1, 1, 32), use_psum_layout=True
    )
    a_ref, b_ref = A.double() * expand(sfa, 1, 32, M, K), B.double() * expand(sfb, 1, 32, N, K)
    close(d[:10], ref_mm(a_ref[:10], b_ref[0]))
    close(d[al:], ref_mm(a_ref[al:], b_ref[1]))
    Ab, Bb = nonzero((M, K), g).to(BF16), nonzero((G, N, K), g).to(BF16)
    d2 = torch.zeros(M, N, dtype=BF16)
    dg.m_grouped_bf16_gemm_nn_contiguous(Ab, Bb.transpose(1, 2), d2, layout, use_psum_layout=True)
    close(d2[al:], ref_mm(Ab[al:], Bb[1]))


# ---------------------------------------------------------------------------------------------------------------------
# K-grouped
# ---------------------------------------------------------------------------------------------------------------------


def test_k_grouped_fp8_sm100_plain_and_psum(dg):
    use(dg, "cuda", 10)
    g = gen(11)
    M, N = 32, 48
    # plain layout: per-group K sizes (multiples of the 128 alignment), one empty group; gran_k 128
    ks = [128, 0, 256]
    S = sum(ks)
    A, B = fp8((S, M), g), fp8((S, N), g)
    sfa_rows = [pow2((k // 128, M), g) for k in ks]
    sfb_rows = [pow2((k // 128, N), g) for k in ks]
    sfa, sfb = torch.cat(sfa_rows), torch.cat(sfb_rows)
    d = nonzero((3, M, N), g).float()
    d0 = d.clone()
    dg.k_grouped_fp8_gemm_tn_contiguous((A, sfa), (B, sfb), d, ks, torch.tensor(ks, dtype=I32), c=d)
    start = 0
    for gi, k in enumerate(ks):
        a_g = A[start : start + k].double() * sfa_rows[gi].double().repeat_interleave(128, 0)
        b_g = B[start : start + k].double() * sfb_rows[gi].double().repeat_interleave(128, 0)
        close(d[gi], d0[gi].double() + a_g.T @ b_g, 1e-12)
        start += k
    # psum layout with unaligned group sizes, gran_k 32, ks_cpu=None
    ends = [100, 128 + 50]
    S2 = 256
    A2, B2 = fp8((S2, M), g), fp8((S2, N), g)
    groups = [(0, 100), (128, 178)]
    sfa2 = [pow2((-(-(e - s) // 32), M), g) for s, e in groups]
    sfb2 = [pow2((-(-(e - s) // 32), N), g) for s, e in groups]
    d2 = nonzero((2, M, N), g).float()
    d20 = d2.clone()
    dg.k_grouped_fp8_gemm_tn_contiguous(
        (A2, torch.cat(sfa2)),
        (B2, torch.cat(sfb2)),
        d2,
        None,
        torch.tensor(ends, dtype=I32),
        c=d2,
        recipe=(1, 1, 32),
        use_psum_layout=True,
    )
    for gi, (s, e) in enumerate(groups):
        a_g = A2[s:e].double() * sfa2[gi].double().repeat_interleave(32, 0)[: e - s]
        b_g = B2[s:e].double() * sfb2[gi].double().repeat_interleave(32, 0)[: e - s]
        close(d2[gi], d20[gi].double() + a_g.T @ b_g, 1e-12)


def test_k_grouped_fp8_sm90_flat_nt(dg):
    use(dg, "cuda", 9)
    g = gen(12)
    M, N, ks = 16, 24, [128, 256]
    S = sum(ks)
    blocks_a = [fp8((M, k), g) for k in ks]
    blocks_b = [fp8((N, k), g) for k in ks]
    A = torch.cat([x.flatten() for x in blocks_a])
    B = torch.cat([x.flatten() for x in blocks_b])
    sfa, sfb = any_scales((M, S // 128), g), any_scales((N, S // 128), g)
    c = nonzero((2, M, N), g).float()
    d = torch.empty(2, M, N)
    dg.k_grouped_fp8_gemm_nt_contiguous((A, sfa), (B, sfb), d, ks, torch.tensor(ks, dtype=I32), c=c)
    col = 0
    for gi, k in enumerate(ks):
        sa = sfa[:, col // 128 : (col + k) // 128].double().repeat_interleave(128, 1)
        sb = sfb[:, col // 128 : (col + k) // 128].double().repeat_interleave(128, 1)
        close(d[gi], c[gi].double() + ref_mm(blocks_a[gi].double() * sa, blocks_b[gi].double() * sb), 1e-12)
        col += k


@pytest.mark.parametrize("flavor,arch", [("cuda", 9), ("cuda", 10), ("ascend", 0)])
def test_k_grouped_bf16(dg, flavor, arch):
    use(dg, flavor, arch)
    g = gen(13)
    M, N = 24, 32
    al = 128 if flavor == "cuda" else 256
    if arch == 9:
        ks, psum = [128, 256], False
        layout = torch.tensor(ks, dtype=I32)
        groups = [(0, 128), (128, 384)]
        S = 384
    else:
        psum = True
        groups = [(0, 70), (al, al + 33)]
        layout = torch.tensor([70, al + 33], dtype=I32)
        ks, S = None, al + 40
    A, B = nonzero((S, M), g).to(BF16), nonzero((S, N), g).to(BF16)
    d = nonzero((2, M, N), g).float()
    d0 = d.clone()
    dg.k_grouped_bf16_gemm_tn_contiguous(A, B, d, ks, layout, c=d, use_psum_layout=psum)
    for gi, (s, e) in enumerate(groups):
        close(d[gi], d0[gi].double() + A[s:e].double().T @ B[s:e].double(), 1e-12)


def test_k_grouped_fp8_ascend_psum(dg):
    use(dg, "ascend")
    g = gen(14)
    M, N = 32, 16
    ends, S = [70, 256 + 45], 320
    A, B = fp8((S, M), g), fp8((S, N), g)
    sfa, sfb = pow2((S // 32, M), g), pow2((S // 32, N), g)  # in A's orientation: [ceil(K / 32), M]
    d = nonzero((2, M, N), g).float()
    d0 = d.clone()
    dg.k_grouped_fp8_gemm_tn_contiguous((A, sfa), (B, sfb), d, None, torch.tensor(ends, dtype=I32), c=d)
    a_deq = A.double() * sfa.double().repeat_interleave(32, 0)
    b_deq = B.double() * sfb.double().repeat_interleave(32, 0)
    for gi, (s, e) in enumerate([(0, 70), (256, 301)]):
        close(d[gi], d0[gi].double() + a_deq[s:e].T @ b_deq[s:e], 1e-12)
    with pytest.warns(DeprecationWarning):
        d1 = d0.clone()
        dg.k_grouped_fp8_gemm_nt_contiguous((A.T, sfa.T), (B.T, sfb.T), d1, None, torch.tensor(ends, dtype=I32), c=d1)
    assert torch.equal(d1, d)


def test_ascend_bmm(dg):
    use(dg, "ascend")
    g = gen(15)
    Bt, M, N, K = 2, 8, 16, 64
    A, Bm = fp8((Bt, M, K), g), fp8((Bt, N, K), g)
    sfa, sfb = pow2((Bt, M, K // 32), g), pow2((Bt, N, K // 32), g)
    d = torch.empty(Bt, M, N, dtype=BF16)
    dg.fp8_bmm((A, sfa), (Bm, sfb), d)
    close(d, ref_mm(A.double() * expand(sfa, 1, 32, M, K), Bm.double() * expand(sfb, 1, 32, N, K)))
    Ab, Bb = nonzero((Bt, M, K), g).to(BF16), nonzero((Bt, N, K), g).to(BF16)
    d2 = nonzero((Bt, M, N), g).float()
    d20 = d2.clone()
    dg.bf16_bmm(Ab, Bb, d2, c=d2)
    close(d2, d20.double() + ref_mm(Ab, Bb), 1e-12)


# ---------------------------------------------------------------------------------------------------------------------
# Layout utilities and runtime settings
# ---------------------------------------------------------------------------------------------------------------------


def test_transform_sf_into_required_layout(dg):
    g = gen(16)
    use(dg, "cuda", 9)
    sf = any_scales((50, 3), g)
    out = dg.transform_sf_into_required_layout(sf, 50, 384, (1, 128), None, None)
    assert out.dtype == F32 and out.stride() == (1, 52) and torch.equal(out, sf)
    sfb = any_scales((2, 3), g)
    assert dg.transform_sf_into_required_layout(sfb, 256, 384, (1, 128, 128), is_sfa=False) is sfb
    use(dg, "cuda", 10)
    sf2 = pow2((50, 6), g)
    out2 = dg.transform_sf_into_required_layout(sf2, 50, 192, (1, 32))
    assert out2.dtype == I32 and out2.shape == (50, 2) and out2.stride() == (1, 52)
    assert torch.equal(out2, ue8m0_int32_mn_major(sf2))
    assert dg.transform_sf_into_required_layout(out2, 50, 192, (1, 32)) is out2
    use(dg, "ascend")
    sf3 = pow2((3, 20, 4), g)
    out3 = dg.transform_sf_into_required_layout(sf3, 40, 128, (2, 1, 32), num_groups=3, is_sfa=True)
    assert out3.dtype == I16 and out3.shape == (3, 40, 2) and out3.stride(-2) == 1 and out3.stride(-1) == 40
    assert torch.equal(out3, ue8m0x2_int16_mn_major(sf3.repeat_interleave(2, 1)))
    assert dg.transform_sf_into_required_layout(out3, 40, 128, (1, 1, 32), num_groups=3, is_sfa=True) is out3


def test_runtime_settings(dg):
    use(dg, "cuda", 9)
    assert dg.get_mk_alignment_for_contiguous_layout() == 128 == dg.get_theoretical_mk_alignment_for_contiguous_layout()
    dg.set_mk_alignment_for_contiguous_layout(64)
    assert dg.get_k_alignment_for_contiguous_layout() == 64 == dg.get_m_alignment_for_contiguous_layout()
    assert dg.get_num_sms() == 132
    dg.set_num_sms(100)
    assert dg.get_num_sms() == 100
    raises_check(lambda: dg.set_num_sms(200), "new_num_sms <= get_prop()->multiProcessorCount")
    use(dg, "cuda", 10)
    assert dg.get_mk_alignment_for_contiguous_layout() == 128 and dg.get_num_sms() == 148
    assert dg.get_theoretical_mk_alignment_for_contiguous_layout() == 224
    assert dg.get_theoretical_mk_alignment_for_contiguous_layout(24) == 32
    assert dg.get_theoretical_mk_alignment_for_contiguous_layout(230) == 224
    use(dg, "ascend")
    assert dg.get_mk_alignment_for_contiguous_layout() == 256 == dg.get_theoretical_mk_alignment_for_contiguous_layout()
    dg.set_mk_alignment_for_contiguous_layout(256)
    raises_check(lambda: dg.set_mk_alignment_for_contiguous_layout(128), "mk_alignment is fixed at 256")
    raises_check(lambda: dg.set_num_sms(0), "n > 0 and n <= jit->device.get_num_sms()")
    assert not hasattr(dg, "get_m_alignment_for_contiguous_layout")


# ---------------------------------------------------------------------------------------------------------------------
# Host checks (RuntimeError) and kernel-side failures (Panic)
# ---------------------------------------------------------------------------------------------------------------------


def _dense_fp8(g, M=32, N=64, K=256, pow_two=False):
    A, B = fp8((M, K), g), fp8((N, K), g)
    mk = pow2 if pow_two else any_scales
    return A, B, mk((M, K // 128), g), mk((N // 128 + (N % 128 > 0), K // 128), g)


def test_host_checks_cuda(dg):
    g = gen(17)
    use(dg, "cuda", 9)
    A, B, sfa, sfb = _dense_fp8(g, N=128)
    d = torch.empty(32, 128, dtype=BF16)
    b_mn = B.T.contiguous().T  # MN-major
    raises_check(lambda: dg.fp8_gemm_nt((A, sfa), (b_mn, sfb), d), "major_b == cute::UMMA::Major::K")
    raises_check(
        lambda: dg.fp8_gemm_nt((A.to(BF16), sfa), (B, sfb), d), "ab.scalar_type() == kPackedFP4 and arch_major == 10"
    )
    a4 = pack_fp4_last(fp4_codes((32, 256), g))
    raises_check(
        lambda: dg.fp8_fp4_gemm_nt((a4, sfa), (B, sfb), d), "ab.scalar_type() == kPackedFP4 and arch_major == 10"
    )
    raises_check(
        lambda: dg.fp8_gemm_nt((A, sfa), (B, sfb), d, c=torch.zeros_like(d)),
        "not c.has_value() and d.scalar_type() == torch::kBFloat16",
    )
    raises_check(
        lambda: dg.fp8_gemm_nt((A, sfa), (B, any_scales((128, 2), g)), torch.empty(32, 128), recipe=(1, 1, 128)),
        "c.has_value() and d.scalar_type() == torch::kFloat",
    )
    raises_check(lambda: dg.fp8_gemm_nt((A, sfa[:, :1]), (B, sfb), d), "sf.size(-1) == ceil_div(k, gran_k")
    raises_check(lambda: dg.fp8_gemm_nt((A, sfa), (B, sfb), torch.empty(128, 32, dtype=BF16).T), "t.stride(-1) == 1")
    dg.set_num_sms(131)
    raises_check(lambda: dg.fp8_gemm_nt((A, sfa), (B, sfb), d), "num_sms % 2 == 0")
    dg.set_num_sms(0)
    a_odd, sfa_odd = fp8((32, 200), g), any_scales((32, 2), g)  # K = 200: FP8 rows of 200 bytes break TMA's 16 B rule
    raises_check(
        lambda: dg.fp8_gemm_nt((a_odd, sfa_odd), (fp8((128, 200), g), any_scales((1, 2), g)), d),
        "globalStrides[0] % 16 == 0",
    )
    ab, bb = nonzero((256, 96), g).to(BF16), nonzero((2, 32, 96), g).to(BF16)
    raises_check(
        lambda: dg.m_grouped_bf16_gemm_nt_contiguous(
            ab, bb, torch.empty(256, 32, dtype=BF16), _id_layout([100, 60], 128)
        ),
        "k % 64 == 0",
    )
    raises_check(
        lambda: dg.m_grouped_fp8_gemm_nt_contiguous(
            (A, sfa), (B.unsqueeze(0), sfb.unsqueeze(0)), torch.empty(32, 128), torch.zeros(32, dtype=I32)
        ),
        "d.scalar_type() == torch::kBFloat16",
    )
    raises_check(
        lambda: dg.k_grouped_fp8_gemm_tn_contiguous(
            (fp8((128, 16), g), any_scales((1, 16), g)),
            (fp8((128, 16), g), any_scales((1, 16), g)),
            torch.empty(1, 16, 16),
            [128],
            torch.tensor([128], dtype=I32),
            c=torch.zeros(1, 16, 16),
        ),
        "Unsupported architecture",
    )
    ks = [64]
    raises_check(
        lambda: dg.k_grouped_fp8_gemm_nt_contiguous(
            (fp8((16 * 64,), g), any_scales((16, 1), g)),
            (fp8((16 * 64,), g), any_scales((16, 1), g)),
            torch.empty(1, 16, 16),
            ks,
            torch.tensor(ks, dtype=I32),
            c=torch.zeros(1, 16, 16),
        ),
        "k % k_alignment == 0",
    )
    use(dg, "cuda", 10)
    A, B, sfa, sfb = _dense_fp8(g, pow_two=True)
    d = torch.empty(32, 64, dtype=BF16)
    raises_check(
        lambda: dg.fp8_gemm_nt((A, sfa), (B, sfb), d, disable_ue8m0_cast=True),
        "Unsupported architecture or scaling factor types",
    )
    raises_check(
        lambda: dg.k_grouped_bf16_gemm_tn_contiguous(
            nonzero((128, 16), g).to(BF16),
            nonzero((128, 16), g).to(BF16),
            torch.empty(1, 16, 16),
            [128],
            torch.tensor([128], dtype=I32),
        ),
        "c.has_value() and c.value().is_contiguous()",
    )
    # upstream's early_return copies c into d before the scale factors are checked
    c = nonzero((32, 64), g).to(BF16)
    d.fill_(0)
    raises_check(lambda: dg.fp8_gemm_nt((A, sfa[:, :1]), (B, sfb), d, c=c), "sf.size(-1) == ceil_div(k, gran_k")
    assert torch.equal(d, c)


def test_host_checks_ascend(dg):
    g = gen(18)
    use(dg, "ascend")
    M, N, K, G = 32, 32, 128, 2
    A, B = fp8((M, K), g), fp8((N, K), g)
    sfa, sfb = pow2((M, K // 32), g), pow2((N, K // 32), g)
    d = torch.zeros(M, N)
    raises_check(lambda: dg.fp8_gemm_nt((A, sfa), (B, sfb), d, c=torch.zeros(M, N)), "c must be the same tensor as d")
    raises_check(
        lambda: dg.fp8_gemm_nt((A, pow2((M, 1), g)), (B, pow2((N, 1), g)), d, recipe=(1, 1, 128)), "gran_k must be 32"
    )
    raises_check(
        lambda: dg.fp8_gemm_nt((A, sfa), (B, sfb), d, recipe=(1, 1, 32), recipe_a=(1, 32)),
        "not (recipe.has_value() and (recipe_a.has_value() or recipe_b.has_value()))",
    )
    raises_check(
        lambda: dg.fp8_gemm_nt((A, sfa), (B, sfb), d, alpha=1.0, epilogue=dg.epilogue.Identity()), "are exclusive"
    )
    Bg, sfbg = fp8((G, N, K), g), pow2((G, N, K // 32), g)
    layout = torch.tensor([20, 256 + 10], dtype=I32)
    Am, sfam = fp8((512, K), g), pow2((512, K // 32), g)
    raises_check(
        lambda: dg.m_grouped_fp8_gemm_nt_contiguous(
            (Am, sfam), (Bg, sfbg), torch.zeros(512, N), layout, use_psum_layout=False
        ),
        "use_psum_layout == true",
    )
    raises_check(
        lambda: dg.m_grouped_fp8_gemm_nt_contiguous(
            (Am, sfam), (Bg, sfbg), torch.zeros(512, N), torch.tensor([20, 30, 40], dtype=I32)
        ),
        "Conflicting shape dimension 'g'",
    )
    raises_check(
        lambda: dg.k_grouped_bf16_gemm_tn_contiguous(
            nonzero((256, 16), g).to(BF16),
            nonzero((256, 16), g).to(BF16),
            torch.zeros(1, 16, 16),
            None,
            torch.tensor([256], dtype=I32),
        ),
        "K-grouped GEMM requires accumulation into C",
    )
    raises_check(
        lambda: dg.fp8_bmm((A.to(BF16).unsqueeze(0), sfa[None]), (B.unsqueeze(0), sfb[None]), torch.zeros(1, M, N)),
        "a.scalar_type() == at::kFloat8_e4m3fn",
    )
    raises_check(
        lambda: dg.bf16_gemm_nt(A.to(BF16), B.to(BF16), torch.zeros(M, N, dtype=torch.float16)),
        "d.scalar_type() == torch::kBFloat16 or d.scalar_type() == torch::kFloat",
    )


def test_more_host_checks(dg):
    g = gen(23)
    use(dg, "cuda", 9)
    A, B = fp8((2, 16, 128), g), fp8((2, 32, 128), g)
    sfa, sfb = any_scales((2, 16, 1), g), any_scales((2, 1, 1), g)
    raises_check(
        lambda: dg.m_grouped_fp8_gemm_nt_masked(
            (A, sfa),
            (B.transpose(1, 2).contiguous().transpose(1, 2), sfb),
            torch.empty(2, 16, 32, dtype=BF16),
            torch.tensor([16, 8], dtype=I32),
            16,
        ),
        "major_a == cute::UMMA::Major::K and major_b == cute::UMMA::Major::K",
    )
    raises_check(
        lambda: dg.transform_sf_into_required_layout(torch.ones(16, 1, dtype=I32), 16, 512, (1, 128)),
        "Unknown SF transformation",
    )
    raises_check(
        lambda: dg.transform_sf_into_required_layout(torch.ones(16, 1), 16, 128, (1, 1, 128)), "is_sfa.has_value()"
    )
    use(dg, "ascend")
    raises_check(
        lambda: dg.bf16_bmm(nonzero((2, 8, 64), g), nonzero((2, 8, 64), g).to(BF16), torch.empty(2, 8, 8)),
        "a.scalar_type() == at::kBFloat16",
    )
    raises_check(
        lambda: dg.transform_sf_into_required_layout(pow2((6, 2), g), 16, 64, (3, 1, 32), is_sfa=True),
        "gran_mn only support a power of two in [1, 128]",
    )
    with pytest.raises(TypeError):  # pybind11: the Ascend transform takes 3-tuple recipes only
        dg.transform_sf_into_required_layout(pow2((16, 2), g), 16, 64, (1, 32))


def test_calc_diff_and_star_import(dg):
    g = gen(24)
    x, y = nonzero((8, 8), g), nonzero((8, 8), g)
    assert abs(float(dg.testing.calc_diff(x, y)) - calc_diff(x, y)) < 1e-12
    assert dg.testing.calc_diff(torch.zeros(3), torch.zeros(3)) == 0.0
    use(dg, "ascend")
    ns = {}
    exec("from deep_gemm import *", ns)
    assert "fp8_bmm" in ns and "m_grouped_fp8_gemm_nt_masked" not in ns


def test_early_return(dg):
    g = gen(25)
    for flavor, arch in (("cuda", 9), ("cuda", 10), ("ascend", 0)):
        use(dg, flavor, arch)
        a, b = nonzero((0, 4), g).to(BF16).T, nonzero((0, 8), g).to(BF16).T  # K == 0 (MN-major views)
        c = nonzero((4, 8), g)
        d = torch.zeros(4, 8)
        if flavor == "cuda":
            dg.bf16_gemm_nt(a, b, d, c=c)  # d := c
            assert torch.equal(d, c)
        d2 = c.clone()
        dg.bf16_gemm_nt(a, b, d2)  # d := 0
        assert (d2 == 0).all()
        d3 = torch.full((0, 8), 1.0)
        dg.bf16_gemm_nt(nonzero((0, 16), g).to(BF16), nonzero((8, 16), g).to(BF16), d3)  # M == 0: nothing


def test_panics(dg):
    g = gen(19)
    use(dg, "cuda", 10)
    A, B, sfa, sfb = _dense_fp8(g, pow_two=True)
    d = torch.empty(32, 64, dtype=BF16)
    bad = sfa.clone()
    bad[3, 1] = 0.75  # not a power of two: the SM100 UE8M0 cast would trap on the device
    raises_check(lambda: dg.fp8_gemm_nt((A, bad), (B, sfb), d), "element [3, 1] is 0.75", panic=True)
    raises_check(lambda: dg.fp8_gemm_nt((A, -sfa), (B, sfb), d), "zero sign and mantissa", panic=True)
    # psum gap rows of SFA are skipped by the pack kernel: garbage there is fine
    G, N, K = 2, 32, 128
    Am, Bg = fp8((256, K), g), fp8((G, N, K), g)
    sfam, sfbg = pow2((256, 1), g), pow2((G, N, 1), g)
    sfam[100:128] = 0.3
    layout = torch.tensor([100, 128 + 30], dtype=I32)
    dg.m_grouped_fp8_gemm_nt_contiguous(
        (Am, sfam), (Bg, sfbg), torch.empty(256, N, dtype=BF16), layout, recipe=(1, 1, 128), use_psum_layout=True
    )
    sfam[5] = 0.3
    raises_check(
        lambda: dg.m_grouped_fp8_gemm_nt_contiguous(
            (Am, sfam), (Bg, sfbg), torch.empty(256, N, dtype=BF16), layout, recipe=(1, 1, 128), use_psum_layout=True
        ),
        "element [5, 0]",
        panic=True,
    )
    sfam[5] = 1.0
    raises_check(
        lambda: dg.m_grouped_fp8_gemm_nt_contiguous(
            (Am, sfam),
            (Bg, sfbg),
            torch.empty(256, N, dtype=BF16),
            torch.tensor([100, 110], dtype=I32),
            recipe=(1, 1, 128),
            use_psum_layout=True,
        ),
        "smaller than the group's start 128",
        panic=True,
    )
    sfam[100:128] = 1.0  # the id layout packs every SFA row
    ids = _id_layout([100, 60], 128)
    ids[120] = 1  # a row of group 1 inside group 0's tile
    raises_check(
        lambda: dg.m_grouped_fp8_gemm_nt_contiguous(
            (Am, sfam), (Bg, sfbg), torch.empty(256, N, dtype=BF16), ids, recipe=(1, 1, 128)
        ),
        "BLOCK_M = 128 tile",
        panic=True,
    )
    ids[120] = 5
    raises_check(
        lambda: dg.m_grouped_fp8_gemm_nt_contiguous(
            (Am, sfam), (Bg, sfbg), torch.empty(256, N, dtype=BF16), ids, recipe=(1, 1, 128)
        ),
        "group index in [0, 2)",
        panic=True,
    )
    raises_check(
        lambda: dg.m_grouped_bf16_gemm_nt_masked(
            nonzero((2, 16, 64), g).to(BF16),
            nonzero((2, 16, 64), g).to(BF16),
            torch.empty(2, 16, 16, dtype=BF16),
            torch.tensor([16, 17], dtype=I32),
            16,
        ),
        "masked_m[1] = 17",
        panic=True,
    )
    use(dg, "cuda", 9)
    A, B, sfa, sfb = _dense_fp8(g, N=12)
    d12 = torch.empty(32, 16, dtype=BF16)[:, :12]  # TMA-legal row stride, but N % 8 != 0 traps in the 1D2D kernel
    raises_check(lambda: dg.fp8_gemm_nt((A, sfa), (B, sfb), d12), "shape_n % 8 == 0", panic=True)
    use(dg, "ascend")
    A, B = fp8((16, 64), g), fp8((16, 64), g)
    sfa, sfb = pow2((16, 2), g), pow2((16, 2), g)
    # m-grouped psum: SFA rows in the gaps [end_g, align(end_g, 256)) are cleared, not validated; other rows are
    Am, Bg = fp8((300, 64), g), fp8((2, 16, 64), g)
    sfam, sfbg = pow2((300, 2), g), pow2((2, 16, 2), g)
    sfam[20:256] = -3.3
    lay = torch.tensor([20, 256 + 30], dtype=I32)
    dg.m_grouped_fp8_gemm_nt_contiguous((Am, sfam), (Bg, sfbg), torch.zeros(300, 16), lay)
    sfam[290:] = 0.7  # the last group's gap [286, 512) is cleared too
    dg.m_grouped_fp8_gemm_nt_contiguous((Am, sfam), (Bg, sfbg), torch.zeros(300, 16), lay)
    sfam[10, 1] = 0.7  # inside group 0
    raises_check(
        lambda: dg.m_grouped_fp8_gemm_nt_contiguous((Am, sfam), (Bg, sfbg), torch.zeros(300, 16), lay),
        "element [10, 1]",
        panic=True,
    )
    sfa[0, 0] = 1.5  # non-zero mantissa: "otherwise the kernel will panic"
    raises_check(lambda: dg.fp8_gemm_nt((A, sfa), (B, sfb), torch.empty(16, 16)), "kernel will panic", panic=True)
    ca, cb = fp4_codes((16, 128), g), fp4_codes((16, 128), g)
    a4 = pack_fp4_last(ca.T.contiguous()).T  # MN-major FP4 A (packed along M): the FP4 x FP4 kernel is K-major only
    raises_check(
        lambda: dg.fp8_fp4_gemm_nt((a4, pow2((16, 4), g)), (pack_fp4_last(cb), pow2((16, 4), g)), torch.empty(16, 16)),
        "K-major A/B only",
        panic=True,
    )


# ---------------------------------------------------------------------------------------------------------------------
# Call log and mutation checks
# ---------------------------------------------------------------------------------------------------------------------


def test_call_log(dg):
    g = gen(20)
    use(dg, "cuda", 9)
    A, B, sfa, sfb = _dense_fp8(g, N=128)
    d = torch.empty(32, 128, dtype=BF16)
    dg.fp8_gemm_nt((A, sfa), (B, sfb), d)
    with pytest.raises(RuntimeError):
        dg.fp8_gemm_nt((A, sfa), (B, sfb), d, c=d)  # logged before the check fails
    calls = dg._standin.CALLS
    assert [name for name, _ in calls] == ["fp8_fp4_gemm_nt", "fp8_fp4_gemm_nt"]
    args = calls[0][1]
    assert list(args) == ["a", "b", "d", "c", "recipe", "recipe_a", "recipe_b", "compiled_dims", "disable_ue8m0_cast"]
    assert args["a"] == ((FP8, (32, 256), (256, 1), A.data_ptr()), (F32, (32, 2), (2, 1), sfa.data_ptr()))
    assert args["d"] == (BF16, (32, 128), (128, 1), d.data_ptr())
    assert args["c"] is None and args["recipe"] is None and args["compiled_dims"] == "nk"
    assert calls[1][1]["c"] == args["d"]
    dg._standin.reset()
    assert dg._standin.CALLS == []
    dg.get_num_sms()
    assert dg._standin.CALLS == [("get_num_sms", {})]


def test_mutations_change_the_output(dg):
    """A transposed scale tensor or a wrong recipe must not go unnoticed: the output differs or the call raises."""
    g = gen(21)
    use(dg, "cuda", 9)
    M, N, K = 32, 256, 256
    A, B = fp8((M, K), g), fp8((N, K), g)
    sfa, sfb = any_scales((M, K // 128), g), any_scales((N // 128, K // 128), g)  # sfb is square [2, 2]
    ref = ref_mm(A.double() * expand(sfa, 1, 128, M, K), B.double() * expand(sfb, 128, 128, N, K))
    good, bad = torch.empty(M, N, dtype=BF16), torch.empty(M, N, dtype=BF16)
    dg.fp8_gemm_nt((A, sfa), (B, sfb), good)
    dg.fp8_gemm_nt((A, sfa), (B, sfb.T), bad)  # transposed scale view, same shape
    assert calc_diff(good, ref) < 1e-5 and calc_diff(bad, ref) > 1e-3
    use(dg, "cuda", 10)
    sfa2, sfb2 = pow2((M, K // 128), g), pow2((N // 128, K // 128), g)
    ref2 = ref_mm(A.double() * expand(sfa2, 1, 128, M, K), B.double() * expand(sfb2, 128, 128, N, K))
    right, wrong = torch.empty(M, N, dtype=BF16), torch.empty(M, N, dtype=BF16)
    dg.fp8_gemm_nt((A, sfa2), (B, sfb2), right, recipe_a=(1, 128), recipe_b=(128, 128))
    dg.fp8_gemm_nt((A, sfa2), (B, sfb2), wrong, recipe_a=(1, 128), recipe_b=(192, 128))  # same scale shape
    assert calc_diff(right, ref2) < 1e-5 and calc_diff(wrong, ref2) > 1e-3
    raises_check(
        lambda: dg.fp8_gemm_nt((A, sfa2), (B, sfb2), wrong, recipe_a=(1, 32), recipe_b=(128, 128)),
        "sf.size(-1) == ceil_div(k, gran_k",
    )
    assert math.isfinite(calc_diff(right, ref2))
