"""Self-tests of the stand-in ``deep_gemm`` Ascend Mega MoE (``tests/standins/deep_gemm/_ascend_mega.py``,
DeepGEMM-Ascend 0.1.0 as in the fork Afloat16/DeepGEMM-Ascend @ 8491bbb, CPU tensors).

Every value check compares bitwise against a float64-based reference written here from the UNTRANSFORMED weights
(routed experts: packed E2M1 codes with power-of-two 1x32 scales packed as int16 UE8M0 pairs; shared experts: E4M3 with
the same scales, one FFN per shared expert), with its own encoders and decoders, per-(token, slot) loops and the
kernel's requantisation rule (``sf`` = the smallest power of two with ``max(amax, 1e-4f) / sf <= 448``, found exactly
in float64), independent of the stand-in's code. In one process the buffer's group is a one-rank group object; on 2
spawned gloo ranks it is a one-rank gloo group per process, then ``dist.group.WORLD``, every rank regenerating every
rank's inputs from seeds so that it can compute the expected output of its own tokens and the counts of its experts.
Smallest legal shapes: ``BLOCK_N = 256`` so ``H = 256``; ``intermediate_hidden >= 512`` so ``I = 512``.
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.distributed import run_named
from tests.upstream.standin import installed

FP8, I8, I16, BF16, F32, F64, I32, I64, U8 = (
    torch.float8_e4m3fn,
    torch.int8,
    torch.int16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.int32,
    torch.int64,
    torch.uint8,
)
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=F64)
E2M1_SIGNED = torch.cat([E2M1, -E2M1])  # code bit 3 is the sign
H, INTER, E_PER_RANK, TOPK, T_MAX = 256, 512, 2, 2, 16
API = r"DeepGEMM-Ascend csrc/apis/mega_moe\.hpp"


class Solo:
    """What DeepGEMM-Ascend reads of a one-rank process group."""

    def size(self):
        return 1

    def rank(self):
        return 0

    def barrier(self):
        return None


@pytest.fixture
def dg():
    with installed("deep_gemm", flavor="ascend") as module:
        yield module


# ---------------------------------------------------------------------------------------------------------------------
# Independent encoders and the reference
# ---------------------------------------------------------------------------------------------------------------------


def fp4_pack(codes):
    """[.., K] codes -> int8 [.., K/2], element 2j in the low nibble."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(U8).view(I8)


def ue8m0_pairs(exponents):
    """[.., S] biased exponents (S even) -> int16 [.., S/2], scale 2i+j in byte j of short i."""
    v = exponents[..., 0::2].long() | (exponents[..., 1::2].long() << 8)
    return torch.where(v >= 2**15, v - 2**16, v).to(I16)


def scales(exponents):
    return torch.pow(2.0, (exponents - 127).double()).repeat_interleave(32, -1)


def make_case(num_ranks, seed, num_shared=0):
    """Every rank's tokens, every routed expert's and the shared experts' weights (raw and float64)."""
    e_total = E_PER_RANK * num_ranks
    g = torch.Generator().manual_seed(seed)
    ranks = []
    for r in range(num_ranks):
        t = 9 + 3 * r
        idx = torch.stack([torch.randperm(e_total, generator=g)[:TOPK] for _ in range(t)])
        idx[torch.rand(t, TOPK, generator=g) < 0.25] = -1
        w = torch.rand(t, TOPK, generator=g) + 0.25
        idx[0] = -1  # routed nowhere
        idx[1, 1] = idx[1, 0] = r % e_total  # the same expert twice, with opposite huge weights: the routed slots
        w[1] = torch.tensor([1e8, -1e8])  # cancel exactly, and only if the shared output is added last does it survive
        idx[2, 1] = e_total  # an id >= num_experts: no route either (uint64 compare in the kernel)
        idx[3] = torch.tensor([(r + 1) % e_total, -1])
        w[3, 0] = 1e-12  # activations far below 1e-4: the scale floor decides
        exps = torch.randint(124, 130, (t, H // 32), generator=g)
        q = (torch.randn(t, H, generator=g) * 64).clamp(-448, 448).to(FP8)
        ranks.append({"x": q, "x_sf": ue8m0_pairs(exps), "xd": q.double() * scales(exps), "idx": idx, "w": w})
    routed = {}
    for name, (n, k) in (("l1", (2 * INTER, H)), ("l2", (H, INTER))):
        codes = torch.randint(0, 16, (e_total, n, k), generator=g)
        exps = torch.randint(119, 124, (e_total, n, k // 32), generator=g)
        routed[name] = (fp4_pack(codes), ue8m0_pairs(exps), E2M1_SIGNED[codes] * scales(exps))
    shared = []
    for _ in range(num_shared):
        expert = {}
        for name, (n, k) in (("gate", (INTER, H)), ("up", (INTER, H)), ("down", (H, INTER))):
            q = (torch.randn(n, k, generator=g) * 8).clamp(-448, 448).to(FP8)
            exps = torch.randint(118, 122, (n, k // 32), generator=g)
            expert[name] = (q, exps, q.double() * scales(exps))
        shared.append(expert)
    return {"ranks": ranks, "routed": routed, "shared": shared, "num_experts": e_total}


def quantise_ref(act):
    """Per 32 columns: sf = smallest 2^e with max(amax, 1e-4f) / 2^e <= 448 (found exactly), e4m3(act / sf) * sf."""
    floor = float(torch.tensor(1e-4, dtype=F32))
    out = torch.zeros(act.shape, dtype=F64)
    for j in range(0, act.numel(), 32):
        a = act[j : j + 32].double()
        amax = max(float(a.abs().max()), floor)
        e = math.frexp(amax / 448.0)[1]
        while amax / 2.0 ** (e - 1) <= 448.0:
            e -= 1
        while amax / 2.0**e > 448.0:
            e += 1
        sf = 2.0**e
        out[j : j + 32] = (a / sf).float().to(FP8).double() * sf
    return out


def ffn_ref(x, gate_w, up_w, act_quant, clamp, weight):
    """One FFN's L1 + SwiGLU (FP32 steps) for a float64 token; returns the requantised activations."""
    gate = (gate_w @ x).float().to(BF16).float()
    up = (up_w @ x).float().to(BF16).float()
    if clamp is not None:
        c = torch.tensor(clamp, dtype=F32).to(BF16).float()
        gate = torch.minimum(gate, c)
        up = torch.maximum(torch.minimum(up, c), -c)
    silu = gate / (torch.exp(-gate.double()).float() + torch.tensor(1.0, dtype=F32))
    act = silu * up
    if weight is not None:
        act = act * torch.tensor(float(weight), dtype=F32)
    return act_quant(act)


def reference(case, rank, clamp, act_quant=quantise_ref):
    """y of ``rank``'s tokens from the untransformed weights: routed slots in order, then the shared experts."""
    w1, w2 = case["routed"]["l1"][2], case["routed"]["l2"][2]
    mine = case["ranks"][rank]
    t_count = mine["xd"].shape[0]
    y = torch.zeros(t_count, H, dtype=F32)
    for t in range(t_count):
        x = mine["xd"][t]
        for k in range(TOPK):
            e = int(mine["idx"][t, k])
            if not 0 <= e < case["num_experts"]:
                continue
            act = ffn_ref(x, w1[e][:INTER], w1[e][INTER:], act_quant, clamp, mine["w"][t, k])
            y[t] = y[t] + (w2[e] @ act).float().to(BF16).float()
        if case["shared"]:  # one FP32 accumulation over all shared experts, one BF16 rounding
            acc = torch.zeros(H, dtype=F64)
            for ex in case["shared"]:
                act = ffn_ref(x, ex["gate"][2], ex["up"][2], act_quant, clamp, None)
                acc = acc + ex["down"][2] @ act
            y[t] = y[t] + acc.float().to(BF16).float()
    return y.to(BF16)


def expected_recv(case, rank):
    """[src_rank, local expert] route counts into ``rank``'s experts."""
    counts = torch.zeros(len(case["ranks"]), E_PER_RANK, dtype=I32)
    for s, r in enumerate(case["ranks"]):
        for e_local in range(E_PER_RANK):
            counts[s, e_local] = int((r["idx"] == rank * E_PER_RANK + e_local).sum())
    return counts


def expected_stats(case, rank):
    return expected_recv(case, rank).sum(0, dtype=I32)


def raw_weights(case, rank):
    lo, hi = rank * E_PER_RANK, (rank + 1) * E_PER_RANK
    (w1, s1, _), (w2, s2, _) = case["routed"]["l1"], case["routed"]["l2"]
    return (w1[lo:hi].contiguous(), s1[lo:hi].contiguous()), (w2[lo:hi].contiguous(), s2[lo:hi].contiguous())


def raw_shared(case):
    """The shared experts as one FFN: L1 [gate_0; gate_1; up_0; up_1], L2 [down_0 | down_1] (FP8, int16 pairs)."""
    ex = case["shared"]
    l1 = torch.cat([e["gate"][0] for e in ex] + [e["up"][0] for e in ex])
    l1_sf = ue8m0_pairs(torch.cat([e["gate"][1] for e in ex] + [e["up"][1] for e in ex]))
    l2 = torch.cat([e["down"][0] for e in ex], dim=1)
    l2_sf = ue8m0_pairs(torch.cat([e["down"][1] for e in ex], dim=1))
    return (l1, l1_sf), (l2, l2_sf)


def weights(dg, case, rank):
    l1, l2 = dg.transform_weights_for_mega_moe(*raw_weights(case, rank))
    shared = dg.transform_weights_for_mega_moe(*raw_shared(case)) if case["shared"] else (None, None)
    return l1, l2, *shared


def fill(buffer, case, rank):
    mine = case["ranks"][rank]
    t = mine["idx"].shape[0]
    buffer.x[:t].copy_(mine["x"])
    buffer.x_sf[:t].copy_(mine["x_sf"])
    buffer.topk_idx[:t].copy_(mine["idx"])
    buffer.topk_weights[:t].copy_(mine["w"])
    return t


def make_buffer(dg, group, case, tokens=T_MAX, **kwargs):
    return dg.SymmBuffer(
        group, case["num_experts"], tokens, TOPK, H, INTER, num_shared_experts=len(case["shared"]), **kwargs
    )


def run(dg, buffer, case, rank, ws, clamp=None, stats=None, **kwargs):
    t = fill(buffer, case, rank)
    y = torch.full((t, H), float("nan"), dtype=BF16)
    l1, l2, s1, s2 = ws
    dg.fp8_fp4_mega_moe(y, l1, l2, buffer, s1, s2, stats, activation_clamp=clamp, **kwargs)
    return y


def same(a, b):
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


# ---------------------------------------------------------------------------------------------------------------------
# API surface, buffer layout, transform
# ---------------------------------------------------------------------------------------------------------------------


def test_exports_and_signatures(dg):
    assert dg.mega.BLOCK_N == 256
    for name in ("SymmBuffer", "transform_weights_for_mega_moe", "fp8_fp4_mega_moe"):
        assert getattr(dg, name) is getattr(dg.mega, name), name
    assert not hasattr(dg, "bf16_mega_moe") and not hasattr(dg, "get_symm_buffer_for_mega_moe")
    assert not hasattr(dg, "BLOCK_N")
    assert list(inspect.signature(dg.fp8_fp4_mega_moe).parameters) == [
        "y",
        "l1_weights",
        "l2_weights",
        "sym_buffer",
        "shared_l1_weights",
        "shared_l2_weights",
        "cumulative_local_expert_recv_stats",
        "recipe",
        "activation",
        "activation_clamp",
        "fast_math",
    ]
    params = inspect.signature(dg.SymmBuffer).parameters
    assert list(params)[6:] == ["num_shared_experts", "mma_type", "activation", "base"]
    assert params["num_shared_experts"].default == 0 and params["base"].default is None
    assert "fp8_fp4_mega_moe" in dg.__all__ and "SymmBuffer" in dir(dg)
    ascend_cls = dg.SymmBuffer
    dg._standin.configure("cuda", 10)
    assert dg.SymmBuffer is not ascend_cls and hasattr(dg, "bf16_mega_moe")


def test_buffer_layout(dg):
    """Offsets worked out by hand from layout/mega_moe.hpp's Workspace for R=1, E=2, T=16, K=2, H=256, I=512: ring rows
    min(ceil(16*2/256) + 2, 4*32) * 256 = 768, size aligned to 2 MiB."""
    for shared, shift, extra in ((0, 0, {}), (1, 512, {"shared_l2_acts": (1052672, (16, 512), FP8)})):
        buf = dg.SymmBuffer(Solo(), 2, T_MAX, TOPK, H, INTER, num_shared_experts=shared)
        base = buf.buffer.data_ptr()
        assert buf.buffer.dtype == I8 and buf.num_bytes == 2 * 1024 * 1024 and not bool(buf.buffer.any())
        assert buf.handle.buffer_ptrs == [base]
        views = {
            "x": (4608, (16, 256), FP8),
            "x_sf": (8704, (16, 4), I16),
            "topk_idx": (9216, (16, 2), I64),
            "topk_weights": (9728, (16, 2), F32),
            "l1_acts": (19968 + shift, (768, 256), FP8),
            "l1_acts_sf": (216576 + shift, (768, 4), I16),
            "l2_acts": (228864 + shift, (768, 512), FP8),
            "l2_acts_sf": (622080 + shift, (6144,), I16),
            "expert_recv_count": (1536, (1, 2), I32),
            **extra,
        }
        if shared:
            views["shared_l2_acts_sf"] = (1183744, (256 * 8,), I16)
        for name, (off, shape, dtype) in views.items():
            v = getattr(buf, name)
            assert (v.data_ptr() - base, tuple(v.shape), v.dtype, v.is_contiguous()) == (off, shape, dtype, True)
        assert buf.shared_l1_acts is buf.x
        if shared:
            assert buf.shared_l1_acts_sf is buf.x_sf
        else:
            assert buf.shared_l1_acts_sf is None and buf.shared_l2_acts is None and buf.shared_l2_acts_sf is None
        buf.destroy()
        assert buf.buffer is None and buf.handle is None and buf.group is None and buf.x is None
        assert buf.expert_recv_count is None and buf.shared_l2_acts_sf is None and buf.l2_acts is None


def test_buffer_checks_and_base(dg):
    with pytest.raises(AssertionError, match="Ascend MegaMoE currently supports only fp8xfp4"):
        dg.SymmBuffer(Solo(), 2, 16, 2, H, INTER, mma_type="bf16xbf16")
    with pytest.raises(AssertionError, match="Ascend MegaMoE currently supports only swiglu"):
        dg.SymmBuffer(Solo(), 2, 16, 2, H, INTER, activation="geglu")
    cases = [
        ((2, 16, 2, H, 256), 36, r"intermediate_hidden >= 512 and intermediate_hidden % layout::BLOCK_N == 0"),
        ((2, 16, 2, H, 768 + 128), 36, r"intermediate_hidden >= 512"),
        ((2, 16, 2, 128, INTER), 35, r"hidden > 0 and hidden % layout::BLOCK_N == 0"),
        ((2, 16, 33, H, INTER), 33, r"num_topk > 0 and num_topk <= 32"),
        ((2, 0, 2, H, INTER), 32, r"num_max_tokens_per_rank > 0"),
        ((0, 16, 2, H, INTER), 31, r"num_experts > 0 and num_experts % num_ranks == 0"),
        ((2, 2**23, 2, H, INTER), 38, r"static_cast<uint64_t>\(num_ranks\) \* num_max_tokens_per_rank \* num_topk <"),
    ]
    for args, line, words in cases:
        with pytest.raises(RuntimeError, match=rf"{API}:{line}\): {words}"):
            dg.SymmBuffer(Solo(), *args)
    with pytest.raises(RuntimeError, match=rf"{API}:34\): num_shared_experts <= 2"):
        dg.SymmBuffer(Solo(), 2, 16, 2, H, INTER, num_shared_experts=3)
    with pytest.raises(TypeError, match="incompatible function arguments"):
        dg.SymmBuffer(Solo(), 2, -1, 2, H, INTER)

    # base=: same allocation, new layout views, no re-zeroing
    group = Solo()
    base = dg.SymmBuffer(group, 2, 16, 2, H, INTER, num_shared_experts=1)
    base.buffer[100] = 7
    small = dg.SymmBuffer(group, 2, 8, 2, H, INTER, base=base)
    assert small.buffer is base.buffer and small.handle is base.handle and int(small.buffer[100]) == 7
    assert small.x.shape == (8, H) and small.x.data_ptr() == base.x.data_ptr()
    with pytest.raises(AssertionError, match="Cannot reuse an invalid symmetric buffer"):
        dg.SymmBuffer(Solo(), 2, 8, 2, H, INTER, base=base)  # another group object
    with pytest.raises(AssertionError, match=r"Requires \d+ bytes, but the base buffer has 2097152"):
        dg.SymmBuffer(group, 2, 4096, 2, H, INTER, base=base)
    base.destroy()
    with pytest.raises(AssertionError, match="Cannot reuse an invalid symmetric buffer"):
        dg.SymmBuffer(group, 2, 8, 2, H, INTER, base=base)


def test_transform_layout(dg):
    case = make_case(1, seed=1, num_shared=1)
    (w1, s1), (w2, s2) = raw_weights(case, 0)
    s1[0, 5, 1] = (255 | (248 << 8)) - 2**16  # NaN scale kept, largest finite exponent that survives the +6
    (t1, ts1), (t2, ts2) = dg.transform_weights_for_mega_moe((w1, s1), (w2, s2))
    assert t1.shape == (2, INTER // 128, 256, H // 2) and ts1.shape == (2, INTER // 128, H // 64, 256)
    assert t2.shape == (2, H // 256, 256, INTER // 2) and ts2.shape == (2, H // 256, INTER // 64, 256)
    assert t1.dtype == I8 and ts1.dtype == I16 and ts1.is_contiguous()
    for q in range(INTER // 128):
        assert torch.equal(t1[:, q, :128], w1[:, 128 * q : 128 * q + 128])
        assert torch.equal(t1[:, q, 128:], w1[:, INTER + 128 * q : INTER + 128 * q + 128])
        gate_sf = s1[:, 128 * q : 128 * q + 128].transpose(1, 2).contiguous().view(U8).long()
        got = ts1[:, q, :, :128].contiguous().view(U8).long()
        assert torch.equal(got, torch.where(gate_sf == 255, gate_sf, gate_sf + 6))
    assert int(ts1[0, 0, 1, 5]) & 0xFFFF == 255 | (254 << 8)
    assert torch.equal(t2, w2.view(2, 1, 256, INTER // 2))
    assert torch.equal(ts2.view(U8), s2.view(2, 1, 256, INTER // 64).transpose(2, 3).contiguous().view(U8) + 6)

    # Shared FP8: interleaved, NZ bytes [n_block][K/32][256][32], scales not biased
    (f1, fs1), (f2, fs2) = raw_shared(case)
    (g1, gs1), (g2, gs2) = dg.transform_weights_for_mega_moe((f1, fs1), (f2, fs2))
    assert g1.shape == (INTER // 128, 256, H) and g1.dtype == FP8 and gs1.shape == (INTER // 128, H // 64, 256)
    inter_rows = torch.cat(
        [torch.cat([f1[128 * q : 128 * q + 128], f1[INTER + 128 * q : INTER + 128 * q + 128]]) for q in range(4)]
    )
    nz = g1.view(U8).reshape(INTER // 128, H // 32, 256, 32)
    logical = inter_rows.view(U8).reshape(INTER // 128, 256, H // 32, 32)
    assert torch.equal(nz, logical.transpose(1, 2))
    assert torch.equal(gs1[0, :, :128], fs1[:128].T) and torch.equal(gs1[0, :, 128:], fs1[INTER : INTER + 128].T)
    assert torch.equal(
        g2.view(U8).reshape(1, INTER // 32, 256, 32), f2.view(U8).reshape(1, 256, INTER // 32, 32).transpose(1, 2)
    )
    assert torch.equal(gs2, fs2.view(1, 256, INTER // 64).transpose(1, 2))


def test_transform_asserts(dg):
    case = make_case(1, seed=2)
    (w1, s1), (w2, s2) = raw_weights(case, 0)
    bad = s1.clone()
    bad[1, 7, 3] = 249
    with pytest.raises(ValueError, match=r"FP4 weight scale exponent must be 0\.\.248 or 255"):
        dg.transform_weights_for_mega_moe((w1, bad), (w2, s2))
    with pytest.raises(AssertionError, match="Ascend MegaMoE requires FP4/FP8 weight-scale pairs"):
        dg.transform_weights_for_mega_moe([w1, s1], (w2, s2))
    with pytest.raises(AssertionError, match=r"Only `swiglu` activation is supported, got `geglu`"):
        dg.transform_weights_for_mega_moe((w1, s1), (w2, s2), activation="geglu")
    for l1, l2 in (
        ((w1, s1.int()), (w2, s2)),  # SF must be int16
        ((w1, s1[..., :2].contiguous()), (w2, s2)),  # K = SF.size(-1) * 64
        ((w1[:, :-1], s1), (w2, s2)),  # row counts differ
        ((w1, s1), (w2.view(FP8), s2)),  # dtypes differ
        ((w1[:, : 2 * 192].contiguous(), s1[:, : 2 * 192].contiguous()), (w2, s2)),  # half % (BLOCK_N / 2) != 0
    ):
        with pytest.raises(AssertionError):
            dg.transform_weights_for_mega_moe(l1, l2)


# ---------------------------------------------------------------------------------------------------------------------
# Values (one process, one-rank group)
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_shared", [0, 1, 2])
@pytest.mark.parametrize("clamp", [None, 0.7], ids=["noclamp", "clamp"])
def test_values_one_rank(dg, num_shared, clamp):
    case = make_case(1, seed=11 + num_shared, num_shared=num_shared)
    buf = make_buffer(dg, Solo(), case)
    stats = torch.randint(0, 100, (E_PER_RANK,), dtype=I32)
    before = stats.clone()
    y = run(dg, buf, case, 0, weights(dg, case, 0), clamp=clamp, stats=stats)
    expected = reference(case, 0, clamp)
    assert same(y, expected)
    if num_shared == 0:
        assert bool((y[0] == 0).all())  # token 0 routed nowhere
    assert torch.equal(buf.expert_recv_count, expected_recv(case, 0))
    assert torch.equal(stats, before + expected_stats(case, 0))
    if clamp is not None:
        assert not same(expected, reference(case, 0, None))  # the clamp bites


def test_scale_floor_bites(dg):
    """Token 3 has one slot with routing weight 1e-12: its activations are far below 1e-4, so the kernel's 1e-4 floor
    on amax (a coarser scale than amax alone would give) shows in y."""
    case = make_case(1, seed=11)
    buf = make_buffer(dg, Solo(), case)
    y = run(dg, buf, case, 0, weights(dg, case, 0))
    expected = reference(case, 0, None)
    assert same(y, expected) and bool((y[3] != 0).any())

    def no_floor(act):
        out = torch.zeros(act.shape, dtype=F64)
        for j in range(0, act.numel(), 32):
            a = act[j : j + 32].double()
            sf = 2.0 ** math.ceil(math.log2(float(a.abs().max()) / 448.0))
            out[j : j + 32] = (a / sf).float().to(FP8).double() * sf
        return out

    assert not same(expected[3], reference(case, 0, None, act_quant=no_floor)[3])


def test_mutations_give_different_results(dg):
    """A caller that skips transform_weights_for_mega_moe (weights only reshaped to pass the host checks), forgets the
    +6 FP4 scale bias, or forgets the NZ order of the shared FP8 weights gets a different (wrong) result."""
    case = make_case(1, seed=23, num_shared=1)
    buf = make_buffer(dg, Solo(), case)
    expected = reference(case, 0, None)
    good = weights(dg, case, 0)
    assert same(run(dg, buf, case, 0, good), expected)
    (w1, s1), (w2, s2) = raw_weights(case, 0)
    reshaped = (
        (w1.view(2, 4, 256, H // 2), s1.view(2, 4, H // 64, 256)),
        (w2.view(2, 1, 256, INTER // 2), s2.view(2, 1, INTER // 64, 256)),
    )
    unbiased = tuple((w, sf.view(U8).sub(6).view(I16)) for w, sf in good[:2])
    not_nz = tuple(
        (w.view(U8).reshape(n, k // 32, 256, 32).transpose(1, 2).contiguous().view(n, 256, k).view(FP8), sf)
        for (w, sf), n, k in ((good[2], 4, H), (good[3], 1, INTER))
    )
    for bad in ((*reshaped, *good[2:]), (*unbiased, *good[2:]), (*good[:2], *not_nz)):
        y = run(dg, buf, case, 0, bad)
        assert not same(y, expected)
    y = run(dg, buf, case, 0, (*unbiased, *good[2:])).float()
    assert (y - expected.float()).norm() > 0.5 * expected.float().norm()


def test_no_tokens_and_repeat(dg):
    case = make_case(1, seed=3)
    buf = make_buffer(dg, Solo(), case)
    ws = weights(dg, case, 0)
    stats = torch.arange(E_PER_RANK, dtype=I32)
    buf.expert_recv_count.fill_(5)
    dg.fp8_fp4_mega_moe(torch.empty(0, H, dtype=BF16), ws[0], ws[1], buf, cumulative_local_expert_recv_stats=stats)
    assert torch.equal(stats, torch.arange(E_PER_RANK, dtype=I32)) and not bool(buf.expert_recv_count.any())
    y1 = run(dg, buf, case, 0, ws, stats=stats)
    y2 = run(dg, buf, case, 0, ws, stats=stats)
    assert same(y1, y2) and torch.equal(stats, torch.arange(E_PER_RANK, dtype=I32) + 2 * expected_stats(case, 0))


def test_call_log(dg):
    case = make_case(1, seed=3, num_shared=1)
    buf = make_buffer(dg, Solo(), case)
    ws = weights(dg, case, 0)
    y = run(dg, buf, case, 0, ws, clamp=2.0)
    buf.destroy()
    names = [n for n, _ in dg._standin.CALLS]
    assert names == [
        "SymmBuffer",
        "transform_weights_for_mega_moe",
        "transform_weights_for_mega_moe",
        "fp8_fp4_mega_moe",
        "SymmBuffer.destroy",
    ]
    assert dg._standin.CALLS[0][1]["num_shared_experts"] == 1
    entry = dg._standin.CALLS[3][1]
    assert entry["y"] == (BF16, tuple(y.shape), tuple(y.stride()), y.data_ptr())
    assert entry["sym_buffer"] is buf and entry["activation_clamp"] == 2.0 and entry["recipe"] == (1, 1, 32)
    assert entry["shared_l1_weights"][0][0] == FP8 and entry["fast_math"] is True


# ---------------------------------------------------------------------------------------------------------------------
# Host checks
# ---------------------------------------------------------------------------------------------------------------------


def test_kernel_host_checks(dg):
    case = make_case(1, seed=7, num_shared=1)
    buf = make_buffer(dg, Solo(), case)
    t = fill(buf, case, 0)
    l1, l2, s1, s2 = weights(dg, case, 0)
    y = torch.empty(t, H, dtype=BF16)
    cases = [
        (dict(recipe=(1, 1, 128)), 147, r"rm == 1 and rn == 1 and rk == 32"),
        (dict(fast_math=False), 148, r"activation == \"swiglu\" and fast_math"),
        (dict(activation="relu"), 148, r"activation == \"swiglu\" and fast_math"),
        (dict(y=torch.empty(t, 2 * H, dtype=BF16)), 155, r"y.dim\(\) == 2 and y.size\(0\) <= num_max_tokens_per_rank"),
        (dict(y=torch.empty(T_MAX + 1, H, dtype=BF16)), 155, r"y.dim\(\) == 2"),
        (dict(shared_l2_weights=None), 156, r"shared_l1_weights_tuple_opt.has_value\(\) == \(num_shared_experts > 0\)"),
        (dict(y=y.float()), 167, r"y.scalar_type\(\) == torch::kBFloat16 and y.is_contiguous\(\)"),
        (dict(y=torch.empty(H, t, dtype=BF16).T), 167, r"y.scalar_type\(\) == torch::kBFloat16"),
        (
            dict(cumulative_local_expert_recv_stats=torch.zeros(2, dtype=I64)),
            173,
            r"cumulative_local_expert_recv_stats->scalar_type\(\) == torch::kInt32",
        ),
        (
            dict(cumulative_local_expert_recv_stats=torch.zeros(3, dtype=I32)),
            174,
            r"cumulative_local_expert_recv_stats->numel\(\) == num_experts_per_rank",
        ),
        (dict(l1_weights=(l1[0].view(FP8), l1[1])), 116, r"weights.scalar_type\(\) == \(is_shared \?"),
        (dict(l2_weights=(l2[0], l2[1].int())), 117, r"weights_sf.scalar_type\(\) == torch::kInt16"),
        (dict(l1_weights=raw_weights(case, 0)[0]), 123, r"weights.sizes\(\) == torch::IntArrayRef\(weight_shape"),
        (dict(l1_weights=(l1[0], l1[1].transpose(2, 3).contiguous())), 124, r"weights_sf.sizes\(\) =="),
        (dict(shared_l1_weights=(s1[0].view(I8), s1[1])), 116, r"weights.scalar_type\(\) == \(is_shared \?"),
        (dict(shared_l2_weights=(s2[0][None], s2[1][None])), 123, r"weights.sizes\(\) =="),
        (dict(activation_clamp=-1.0), 191, r"activation_clamp >= 0"),
        (dict(activation_clamp=float("nan")), 191, r"activation_clamp >= 0"),
    ]
    for kwargs, line, words in cases:
        args = dict(y=y, l1_weights=l1, l2_weights=l2, sym_buffer=buf, shared_l1_weights=s1, shared_l2_weights=s2)
        with pytest.raises(RuntimeError, match=rf"{API}:{line}\): {words}"):
            dg.fp8_fp4_mega_moe(**(args | kwargs))
    plain = make_buffer(dg, Solo(), make_case(1, seed=7))
    with pytest.raises(RuntimeError, match=rf"{API}:156\): shared_l1_weights_tuple_opt"):
        dg.fp8_fp4_mega_moe(y, l1, l2, plain, s1, s2)
    dg.set_num_sms(16)
    with pytest.raises(RuntimeError, match=rf"{API}:159\): runtime->get_num_sms\(\) == kNumAICores"):
        dg.fp8_fp4_mega_moe(y, l1, l2, buf, s1, s2)
    dg.set_num_sms(32)
    with pytest.raises(TypeError, match="incompatible function arguments"):
        dg.fp8_fp4_mega_moe(y, l1[0], l2, buf, s1, s2)
    dead = make_buffer(dg, Solo(), case)
    dead.destroy()
    with pytest.raises(AssertionError):
        dg.fp8_fp4_mega_moe(y, l1, l2, dead, s1, s2)
    run(dg, buf, case, 0, (l1, l2, s1, s2))  # still fine afterwards


# ---------------------------------------------------------------------------------------------------------------------
# Spawned gloo ranks
# ---------------------------------------------------------------------------------------------------------------------


def _check_values(rank, world):
    with installed("deep_gemm", flavor="ascend") as dg:
        # A real gloo group of one rank per process
        solo = [dist.new_group([r], backend="gloo") for r in range(world)][rank]
        case = make_case(1, seed=90 + rank, num_shared=1)
        buf = make_buffer(dg, solo, case)
        y = run(dg, buf, case, 0, weights(dg, case, 0), clamp=0.7)
        assert same(y, reference(case, 0, 0.7))

        group = dist.group.WORLD
        for num_shared, clamp in ((0, None), (1, 0.7), (2, None)):
            case = make_case(world, seed=100 + num_shared, num_shared=num_shared)
            buf = make_buffer(dg, group, case)
            assert len(buf.handle.buffer_ptrs) == world and buf.expert_recv_count.shape == (world, E_PER_RANK)
            stats = torch.full((E_PER_RANK,), 7, dtype=I32)
            y = run(dg, buf, case, rank, weights(dg, case, rank), clamp=clamp, stats=stats)
            assert same(y, reference(case, rank, clamp)), (rank, num_shared, clamp)
            assert torch.equal(buf.expert_recv_count, expected_recv(case, rank)), (rank, buf.expert_recv_count)
            assert torch.equal(stats, 7 + expected_stats(case, rank)), (rank, stats)

        # base= on the world group: a smaller layout over the same allocation
        case = make_case(world, seed=200)
        small = make_buffer(dg, group, case, tokens=14, base=buf)
        assert small.buffer is buf.buffer
        y = run(dg, small, case, rank, weights(dg, case, rank))
        assert same(y, reference(case, rank, None))

        # ranks whose buffers disagree (T_max 16 vs 15): every rank raises
        other = make_buffer(dg, group, case, tokens=16 - rank)
        with pytest.raises(dg._standin.Panic, match="disagree"):
            run(dg, other, case, rank, weights(dg, case, rank))


CHECKS = {"values": _check_values}


def rank_checks(rank: int, world_size: int, store_path: str) -> None:
    run_named(CHECKS, rank, world_size, store_path, "values", timeout_s=60)


def test_on_ranks(tmp_path):
    """2 gloo ranks: a one-rank gloo group each, then the world group (0/1/2 shared experts, clamp, recv counts, stats,
    base= reuse, disagreeing buffers)."""
    mp.spawn(rank_checks, args=(2, str(tmp_path / "store")), nprocs=2, join=True)
