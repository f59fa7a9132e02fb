"""deep_gemm's MegaMoE API (upstream signatures) on the mega_moe op: buffer views, the weight transform
(gate/up interleave in chunks of 8, UTCCP scale permutation), FP8 x FP4 and BF16 calls bitwise equal to the op
on untransformed weights (with and without DeepGEMM-Ascend's fused shared experts), recv stats accumulation, and
argument errors."""

import pytest
import torch

import torch_ascend_moe.deep_gemm as deep_gemm
from torch_ascend_moe import mega_moe
from torch_ascend_moe.deep_gemm import mega
from torch_ascend_moe.quant import per_token_cast_to_fp4, per_token_cast_to_fp8

T, H, INTER, E, K = 10, 128, 128, 4, 2


def _inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, H, generator=g)
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    idx[0, 1] = -1
    w = torch.rand(T, K, generator=g)
    l1 = torch.randn(E, 2 * INTER, H, generator=g) * H**-0.5
    l2 = torch.randn(E, H, INTER, generator=g) * INTER**-0.5
    return x, idx, w, l1, l2


def _fp4(w):
    packed, sf = zip(*(per_token_cast_to_fp4(w[e], use_ue8m0=True, gran_k=32) for e in range(w.shape[0])))
    return torch.stack(packed), torch.stack(sf)


def test_transform_layout():
    _, _, _, l1, _ = _inputs()
    t1, _ = deep_gemm.transform_weights_for_mega_moe(l1.bfloat16(), None)
    gate, up = l1.bfloat16()[:, :INTER], l1.bfloat16()[:, INTER:]
    assert torch.equal(t1[:, :8], gate[:, :8]) and torch.equal(t1[:, 8:16], up[:, :8])
    assert torch.equal(t1[:, 16:24], gate[:, 8:16])


def test_fp8_fp4_call_matches_the_op():
    x, idx, w, l1, l2 = _inputs()
    (w1, s1), (w2, s2) = _fp4(l1), _fp4(l2)
    sf_layout = [
        deep_gemm.transform_sf_into_required_layout(s, s.shape[1], H if i == 0 else INTER, (1, 32), E)
        for i, s in enumerate((s1, s2))
    ]
    l1_t, l2_t = deep_gemm.transform_weights_for_mega_moe((w1, sf_layout[0]), (w2, sf_layout[1]))
    buf = deep_gemm.get_symm_buffer_for_mega_moe(None, E, T, K, H, INTER)
    assert buf.num_max_tokens_per_rank == deep_gemm.get_token_alignment_for_mega_moe()
    xq, xsf = per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    buf.x[:T], buf.x_sf[:T], buf.topk_idx[:T], buf.topk_weights[:T] = xq, xsf, idx, w
    y = torch.empty(T, H, dtype=torch.bfloat16)
    stats = torch.randint(0, 100, (E,), dtype=torch.int32)
    before = stats.clone()
    deep_gemm.fp8_fp4_mega_moe(y, l1_t, l2_t, buf, cumulative_local_expert_recv_stats=stats, activation_clamp=10.0)
    xq2, xsf2 = per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32)
    expected, counts = mega_moe(
        xq2, idx, w, w1.view(torch.uint8), w2.view(torch.uint8), x_sf=xsf2, l1_sf=s1, l2_sf=s2, activation_clamp=10.0
    )
    assert torch.equal(y.view(torch.int16), expected.view(torch.int16))
    assert torch.equal(stats, before + counts)


def test_fp8_fp4_call_with_fused_shared_experts():
    """DeepGEMM-Ascend: two shared experts (one MLP of 2·I) as FP8 weights with packed UE8M0 scales."""
    x, idx, w, l1, l2 = _inputs()
    (w1, s1), (w2, s2) = _fp4(l1), _fp4(l2)
    g = torch.Generator().manual_seed(1)
    sl1, sl2 = torch.randn(4 * INTER, H, generator=g) * H**-0.5, torch.randn(H, 2 * INTER, generator=g) * 0.05
    (q1, f1), (q2, f2) = (per_token_cast_to_fp8(m, use_ue8m0=True, gran_k=32) for m in (sl1, sl2))
    packed = [per_token_cast_to_fp8(m, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)[1] for m in (sl1, sl2)]
    l1_t, l2_t = deep_gemm.transform_weights_for_mega_moe(
        (w1, deep_gemm.transform_sf_into_required_layout(s1, 2 * INTER, H, (1, 32), E)),
        (w2, deep_gemm.transform_sf_into_required_layout(s2, H, INTER, (1, 32), E)),
    )
    buf = mega.SymmBuffer(None, E, T, K, H, INTER, 2)
    xq, xsf = per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    buf.x[:], buf.x_sf[:], buf.topk_idx[:], buf.topk_weights[:] = xq, xsf, idx, w
    y = torch.empty(T, H, dtype=torch.bfloat16)
    deep_gemm.fp8_fp4_mega_moe(y, l1_t, l2_t, buf, (q1, packed[0]), (q2, packed[1]), activation_clamp=10.0)
    xq2, xsf2 = per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32)
    expected, _ = mega_moe(
        xq2,
        idx,
        w,
        w1.view(torch.uint8),
        w2.view(torch.uint8),
        x_sf=xsf2,
        l1_sf=s1,
        l2_sf=s2,
        shared_l1_weights=q1,
        shared_l1_sf=f1,
        shared_l2_weights=q2,
        shared_l2_sf=f2,
        activation_clamp=10.0,
    )
    assert torch.equal(y.view(torch.int16), expected.view(torch.int16))
    # the buffer was sized for shared experts: calling without them is an error, and vice versa
    with pytest.raises(ValueError, match=r"argument 'shared_l1_weights' value: expected weights"):
        deep_gemm.fp8_fp4_mega_moe(y, l1_t, l2_t, buf)
    plain = mega.SymmBuffer(None, E, T, K, H, INTER)
    with pytest.raises(ValueError, match=r"argument 'shared_l1_weights' value: expected None"):
        deep_gemm.fp8_fp4_mega_moe(y, l1_t, l2_t, plain, (q1, f1), (q2, f2))
    with pytest.raises(ValueError, match=r"argument 'shared_l1_weights' size\(0\): expected 2·S·I = 256"):
        deep_gemm.fp8_fp4_mega_moe(y, l1_t, l2_t, mega.SymmBuffer(None, E, T, K, H, INTER, 1), (q1, f1), (q2, f2))


def test_bf16_call_matches_the_op():
    x, idx, w, l1, l2 = _inputs()
    l1, l2 = l1.bfloat16(), l2.bfloat16()
    l1_t, l2_t = deep_gemm.transform_weights_for_mega_moe(l1, l2)
    buf = mega.SymmBuffer(None, E, T, K, H, INTER, mma_type="bf16xbf16")
    buf.x[:], buf.topk_idx[:], buf.topk_weights[:] = x.bfloat16(), idx, w
    y = torch.empty(T, H, dtype=torch.bfloat16)
    deep_gemm.bf16_mega_moe(y, l1_t, l2_t, buf)
    expected, _ = mega_moe(x.bfloat16(), idx, w, l1, l2)
    assert torch.equal(y.view(torch.int16), expected.view(torch.int16))
    shared = mega.SymmBuffer(None, E, T, K, H, INTER, 1, "bf16xbf16", base=buf)
    shared.x[:], shared.topk_idx[:], shared.topk_weights[:] = x.bfloat16(), idx, w
    sl1, sl2 = l1[0] * 0.5, l2[1] * 0.5
    deep_gemm.bf16_mega_moe(y, l1_t, l2_t, shared, shared_l1_weights=sl1, shared_l2_weights=sl2)
    expected, _ = mega_moe(x.bfloat16(), idx, w, l1, l2, shared_l1_weights=sl1, shared_l2_weights=sl2)
    assert torch.equal(y.view(torch.int16), expected.view(torch.int16))


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"SymmBuffer: argument 'hidden' value: expected a multiple of 128"):
        mega.SymmBuffer(None, E, T, K, 96, INTER)
    with pytest.raises(ValueError, match=r"SymmBuffer: argument 'num_shared_experts' value: expected 0, 1 or 2"):
        mega.SymmBuffer(None, E, T, K, H, INTER, 768 * 1024)  # upstream CUDA's positional num_ring_tokens
    with pytest.raises(ValueError, match=r"argument 'use_fp8_dispatch' value"):
        deep_gemm.get_symm_buffer_for_mega_moe(None, E, T, K, H, INTER, use_fp8_dispatch=False)
    buf = mega.SymmBuffer(None, E, T, K, H, INTER, mma_type="bf16xbf16")
    with pytest.raises(ValueError, match=r"argument 'recipe' value: expected \(1, 1, 32\)"):
        deep_gemm.fp8_fp4_mega_moe(torch.empty(T, H), (None, None), (None, None), buf, recipe=(1, 1, 128))


def test_symm_buffer_call_forms_of_2_6_and_2_8():
    """DeepGEMM 2.8 put ``num_shared_experts`` seventh (an int); 2.6.1 had ``use_fp8_dispatch`` (bool or None) there,
    then ``mma_type`` and ``activation``: both positional forms build what they mean."""
    old = deep_gemm.get_symm_buffer_for_mega_moe(None, E, T, K, H, INTER, None, "bf16xbf16", "swiglu")
    assert old.x.dtype == torch.bfloat16 and old.num_shared_experts == 0
    new = deep_gemm.get_symm_buffer_for_mega_moe(None, E, T, K, H, INTER, 2, None, "fp8xfp4")
    assert new.x.dtype == torch.float8_e4m3fn and new.num_shared_experts == 2
    keyword = deep_gemm.get_symm_buffer_for_mega_moe(None, E, T, K, H, INTER, num_shared_experts=1)
    assert keyword.num_shared_experts == 1


def test_fp8_routed_weights_select_fp8xfp8():
    """DeepGEMM 2.8: E4M3 routed weights pick the fp8xfp8 MMA. E2M1 weights re-encoded as E4M3 (exactly) with the
    same scales give the same layer output as the FP4 ones, through the op and through the compat entry."""
    from tests.mega_moe.specs import fp4_experts
    from torch_ascend_moe.ops.mega_moe import mega_moe
    from torch_ascend_moe.quant import decode_e2m1, per_token_cast_to_fp8, unpack_e2m1
    from torch_ascend_moe.testing import calc_diff

    g = torch.Generator().manual_seed(12)
    t, h, inter, e, k = 9, 512, 512, 4, 2
    x, x_sf = per_token_cast_to_fp8(torch.randn(t, h, generator=g), use_ue8m0=True, gran_k=32)
    idx = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    w = torch.rand(t, k, generator=g)
    (w1, s1), (w2, s2) = (fp4_experts(torch.randn(e, *shape, generator=g)) for shape in ((2 * inter, h), (h, inter)))
    w1_8, w2_8 = (decode_e2m1(unpack_e2m1(q)).to(torch.float8_e4m3fn) for q in (w1, w2))
    y4, c4 = mega_moe(x, idx, w, w1, w2, x_sf=x_sf, l1_sf=s1, l2_sf=s2)
    y8, c8 = mega_moe(x, idx, w, w1_8, w2_8, x_sf=x_sf, l1_sf=s1, l2_sf=s2)
    assert torch.equal(c4, c8) and calc_diff(y4, y8) < 1e-6, calc_diff(y4, y8)


def test_fp8xfp8_compat_call_matches_the_op():
    """``fp8_fp4_mega_moe`` with E4M3 routed weights (DeepGEMM 2.8's fp8xfp8), transformed as upstream."""
    x, idx, w, l1, l2 = _inputs()
    (q1, s1), (q2, s2) = (
        map(torch.stack, zip(*(per_token_cast_to_fp8(m[e], use_ue8m0=True, gran_k=32) for e in range(E))))
        for m in (l1, l2)
    )
    sf_layout = [
        deep_gemm.transform_sf_into_required_layout(s, s.shape[1], H if i == 0 else INTER, (1, 32), E)
        for i, s in enumerate((s1, s2))
    ]
    l1_t, l2_t = deep_gemm.transform_weights_for_mega_moe((q1, sf_layout[0]), (q2, sf_layout[1]))
    buf = deep_gemm.get_symm_buffer_for_mega_moe(None, E, T, K, H, INTER)
    xq, xsf = per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    buf.x[:T], buf.x_sf[:T], buf.topk_idx[:T], buf.topk_weights[:T] = xq, xsf, idx, w
    y = torch.empty(T, H, dtype=torch.bfloat16)
    deep_gemm.fp8_fp4_mega_moe(y, l1_t, l2_t, buf)
    xq2, xsf2 = per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32)
    expected, _ = mega_moe(xq2, idx, w, q1, q2, x_sf=xsf2, l1_sf=s1, l2_sf=s2)
    assert torch.equal(y.view(torch.int16), expected.view(torch.int16))


def test_block_m_for_mega_moe_follows_the_expected_load():
    # expected tokens per expert = tokens * ranks * topk / experts: (8, 384 experts, top-6) -> tokens / 8
    picks = [deep_gemm.get_block_m_for_mega_moe(8, 384, 4096, t, 6, "fp8xfp4") for t in (0, 68, 69, 132, 133, 260)]
    assert picks == [16, 16, 32, 32, 64, 64]
    picks = [deep_gemm.get_block_m_for_mega_moe(8, 384, 4096, t, 6, "bf16xbf16") for t in (516, 517, 772, 773, 10**6)]
    assert picks == [96, 128, 128, 192, 192]
    with pytest.raises(ValueError, match=r"get_block_m_for_mega_moe: argument 'num_tokens' value: expected a non-neg"):
        deep_gemm.get_block_m_for_mega_moe(8, 384, 4096, -1, 6, "fp8xfp4")
    with pytest.raises(ValueError, match=r"get_block_m_for_mega_moe: argument 'mma_type' value"):
        deep_gemm.get_block_m_for_mega_moe(8, 384, 4096, 1, 6, "fp4xfp4")


def test_shared_views_take_mega_mhcs_shared_scales():
    """DeepGEMM 2.8's buffer views for fused shared experts: ``shared_l1_acts`` is ``x``; ``shared_l1_acts_sf`` is
    M-major with room for any BLOCK_M's layout, so Mega mHC writes the shared scales of this call's BLOCK_M into
    it and they read back (at ``shared_sf_rows``) as the routed ``x_sf``."""
    from tests.hc_prenorm.test_deep_gemm_mega_mhc import _call, _inputs
    from torch_ascend_moe.deep_gemm.mega_mhc import shared_sf_rows

    t, h, inter = 70, 1024, 256
    buf = deep_gemm.get_symm_buffer_for_mega_moe(None, 8, t, 2, h, inter, 2)
    rows = buf.num_max_tokens_per_rank // 16 * 128  # the largest layout: BLOCK_M 16
    assert buf.shared_l1_acts is buf.x and buf.shared_l1_acts_sf.shape == (rows, h // 128)
    assert buf.shared_l1_acts_sf.stride() == (1, rows) and buf.shared_l2_acts.shape == (buf.x.shape[0], 2 * inter)
    assert buf.shared_l2_acts_sf.shape == (rows, 2 * inter // 128) and buf.shared_l2_acts_sf.stride() == (1, rows)
    block = deep_gemm.get_block_m_for_mega_moe(1, 8, buf.num_max_tokens_per_rank, t, 2, "fp8xfp4")
    _call(_inputs(t, h, 1, False), False, t, h, y_fp8=buf.x[:t], y_routed_sf=buf.x_sf[:t],
          y_shared_sf=buf.shared_l1_acts_sf[:t], shared_sf_block_m=block)  # fmt: skip
    assert torch.equal(buf.shared_l1_acts_sf[shared_sf_rows(t, block)], buf.x_sf[:t])
    plain = deep_gemm.get_symm_buffer_for_mega_moe(None, 8, t, 2, h, inter, mma_type="bf16xbf16")
    assert plain.shared_l1_acts is plain.x and plain.shared_l1_acts_sf is None and plain.shared_l2_acts.numel() == 0


def _sm90_reference(x, x_sf, idx, w, w1, s1, w2, s2, clamp):
    """DeepGEMM nv_dev's ``_reference_fused`` as specs/upstream_2609.md §5.2 gives it, in FP64: x per 128 and the
    weights per 128x128 block dequantized; ``h = x̂ Ŵ1ᵀ``; ``a = silu(min(gate, c)) · clamp(up, ±c) · w``; ``a``
    quantized per 64 with ``sf = max(amax, 1e-4) / 448``; ``y_k = bf16(â Ŵ2ᵀ)``; ``y = bf16(Σ_k y_k)``."""

    def blocks(q, sf):
        return q.double() * sf.double().repeat_interleave(128, 1).repeat_interleave(128, 2)

    xd = x.double() * x_sf.double().repeat_interleave(128, 1)
    w1d, w2d = blocks(w1, s1), blocks(w2, s2)
    inter = w1.shape[1] // 2
    y = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for k in range(idx.shape[1]):
            e = int(idx[t, k])
            if e < 0:
                continue
            h = w1d[e] @ xd[t]
            a = torch.nn.functional.silu(h[:inter].clamp(max=clamp)) * h[inter:].clamp(-clamp, clamp) * float(w[t, k])
            groups = a.float().view(-1, 64)
            sf = groups.abs().amax(1, keepdim=True).clamp(min=1e-4) / 448
            a_hat = ((groups / sf).to(torch.float8_e4m3fn).double() * sf.double()).view(-1)
            y[t] += (w2d[e] @ a_hat).bfloat16().double()
    return y.bfloat16()


def test_sm90_fp8_mega_moe_matches_upstreams_reference():
    """nv_dev's SM90 FP8 Mega MoE (spec §5.2) through the compat entry points: the buffer's views, the weight
    transform (W1 gate/up interleave, scales untouched), recv stats, and upstream's pass rule ``calc_diff < 0.01``
    against its reference (ours lands far below it)."""
    from tests.mega_moe.specs import block_experts
    from torch_ascend_moe.ops.quant import quantize_fp8
    from torch_ascend_moe.testing import calc_diff

    t, h, inter, e, k = 12, 512, 256, 4, 2
    g = torch.Generator().manual_seed(3)
    (w1, s1), (w2, s2) = (
        block_experts(torch.randn(e, 2 * inter, h, generator=g) / 20),
        block_experts(torch.randn(e, h, inter, generator=g) / 20),
    )
    buf = deep_gemm.get_symm_buffer_for_sm90_mega_moe(None, e, t, k, h, inter)
    assert buf.num_max_tokens_per_rank == 128 and buf.x_sf.dtype == torch.float32 and buf.x_sf.shape == (128, 4)
    assert buf.l2_acts_sf.shape[1] == inter // 64
    x, x_sf = quantize_fp8(torch.randn(t, h, generator=g), (1, 128), use_ue8m0=False)
    idx = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    idx[3, 0] = -1
    w = torch.rand(t, k, generator=g)
    buf.x[:t], buf.x_sf[:t], buf.topk_idx[:t], buf.topk_weights[:t] = x, x_sf, idx, w
    l1, l2 = deep_gemm.transform_weights_for_mega_moe_sm90((w1, s1), (w2, s2))
    assert torch.equal(l1[0][:, 8:16].view(torch.uint8), w1[:, inter : inter + 8].view(torch.uint8)) and l1[1] is s1
    y = torch.empty(t, h, dtype=torch.bfloat16)
    stats = torch.zeros(e, dtype=torch.int32)
    deep_gemm.fp8_mega_moe(y, l1, l2, buf, cumulative_local_expert_recv_stats=stats, activation_clamp=4.0)
    assert calc_diff(y, _sm90_reference(x, x_sf, idx, w, w1, s1, w2, s2, 4.0)) < 1e-5
    assert stats.tolist() == [int((idx == i).sum()) for i in range(e)]
    with pytest.raises(ValueError, match=r"fp8_mega_moe: argument 'recipe' value: expected \(128, 128, 128\)"):
        deep_gemm.fp8_mega_moe(y, l1, l2, buf, recipe=(1, 1, 32))
    with pytest.raises(ValueError, match=r"SM90SymmBuffer: argument 'use_fp8_dispatch' value: expected True"):
        deep_gemm.get_symm_buffer_for_sm90_mega_moe(None, e, t, k, h, inter, use_fp8_dispatch=False)
