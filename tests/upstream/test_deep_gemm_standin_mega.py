"""Self-tests of the stand-in ``deep_gemm`` Mega MoE (``tests/standins/deep_gemm/_cuda_mega.py``, DeepGEMM 2.6.1 on
SM100, CPU tensors).

Every value check compares bitwise against an fp64-based reference of ``shared/specs/deepgemm_api.md`` §10.1 written
here from the UNTRANSFORMED weights (its own FP4 / UE8M0 / FP8 encoders and decoders, per-(token, slot) loops,
``2 ** ceil(log2(amax / 448))`` found exactly in float64), independent of the stand-in's code. In one process the
buffer's group is a one-rank group object (``size() == 1``, as DeepGEMM treats any group of one); on 2 spawned gloo
ranks it is a one-rank gloo group per process, then ``dist.group.WORLD``, every rank regenerating every rank's inputs
from seeds so that it can compute the expected output of its own tokens and the pair counts of its own experts.
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

FP8, I8, BF16, F32, F64, I32, I64 = (
    torch.float8_e4m3fn,
    torch.int8,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.int32,
    torch.int64,
)
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=F64)
E_PER_RANK, TOPK = 4, 2
SHAPES = {False: (256, 256), True: (512, 512)}  # (H, I): FP8 x FP4 needs H, I multiples of 512 (H/32 bytes % 16)


class Solo:
    """What DeepGEMM reads of a one-rank process group."""

    def size(self):
        return 1

    def rank(self):
        return 0

    def barrier(self):
        return None


@pytest.fixture
def dg():
    with installed("deep_gemm", flavor="cuda", arch=10) as module:
        yield module


# ---------------------------------------------------------------------------------------------------------------------
# Independent encoders and the §10.1 reference
# ---------------------------------------------------------------------------------------------------------------------


E2M1_SIGNED = torch.cat([E2M1, -E2M1])  # code bit 3 is the sign


def fp4_decode(codes):
    return E2M1_SIGNED[codes]


def fp4_pack(codes):
    """[.., K] codes -> int8 [.., K/2], element 2j in the low nibble."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8).view(I8)


def ue8m0_words(exponents):
    """[.., S] biased exponents (S % 4 == 0) -> int32 [.., S/4], scale 4i+j in byte j of word i."""
    c = exponents.reshape(*exponents.shape[:-1], -1, 4)
    v = c[..., 0] | (c[..., 1] << 8) | (c[..., 2] << 16) | (c[..., 3] << 24)
    return torch.where(v >= 2**31, v - 2**32, v).to(I32)


def make_case(fp8, num_ranks, seed, masked=0.25):
    """Every rank's tokens and every expert's weights (raw, float64 dequantised), reproducible on any rank."""
    h, inter = SHAPES[fp8]
    e_total = E_PER_RANK * num_ranks
    g = torch.Generator().manual_seed(seed)
    ranks = []
    for r in range(num_ranks):
        t = 10 + 3 * r
        idx = torch.stack([torch.randperm(e_total, generator=g)[:TOPK] for _ in range(t)])
        idx[torch.rand(t, TOPK, generator=g) < masked] = -1
        idx[0] = -1  # a token routed nowhere
        w = torch.rand(t, TOPK, generator=g) + 0.25
        if fp8:
            exps = torch.randint(124, 130, (t, h // 32), generator=g)
            q = (torch.randn(t, h, generator=g) * 64).clamp(-448, 448).to(FP8)
            xd = q.double() * torch.pow(2.0, (exps - 127).double()).repeat_interleave(32, -1)
            ranks.append({"x": q, "x_sf": ue8m0_words(exps), "xd": xd, "idx": idx, "w": w})
        else:
            x = torch.randn(t, h, generator=g).to(BF16)
            ranks.append({"x": x, "x_sf": None, "xd": x.double(), "idx": idx, "w": w})
    experts = {}
    for name, (n, k) in (("l1", (2 * inter, h)), ("l2", (h, inter))):
        if fp8:
            codes = torch.randint(0, 16, (e_total, n, k), generator=g)
            sf = torch.pow(2.0, torch.randint(-7, -3, (e_total, n, k // 32), generator=g).float())
            deq = fp4_decode(codes) * sf.double().repeat_interleave(32, -1)
            experts[name] = (fp4_pack(codes), sf, deq)
        else:
            wt = (torch.randn(e_total, n, k, generator=g) * k**-0.5).to(BF16)
            experts[name] = (wt, None, wt.double())
    return {"fp8": fp8, "h": h, "inter": inter, "ranks": ranks, "experts": experts, "num_experts": e_total}


def quantise_ref(act):
    """§10.1 step 5: per 32 columns sf = 2^ceil(log2(amax / 448)) (found exactly), e4m3(act / sf) * sf."""
    out = torch.zeros(act.shape, dtype=F64)
    for j in range(0, act.numel(), 32):
        a = act[j : j + 32]
        amax = float(a.abs().max())
        if amax == 0.0:
            continue
        e = math.frexp(amax / 448.0)[1]  # 2^(e-1) <= amax/448 < 2^e (approximately): fix up exactly below
        while 448.0 * 2.0 ** (e - 1) >= amax:
            e -= 1
        while 448.0 * 2.0**e < amax:
            e += 1
        sf = 2.0**e
        out[j : j + 32] = (a.double() / sf).float().to(FP8).double() * sf
    return out


def reference(case, rank, clamp):
    """y of ``rank``'s tokens, from the untransformed weights, one (token, slot) at a time."""
    inter, fp8 = case["inter"], case["fp8"]
    w1, w2 = case["experts"]["l1"][2], case["experts"]["l2"][2]
    mine = case["ranks"][rank]
    t_count, h = mine["xd"].shape
    y = torch.zeros(t_count, h, dtype=F32)
    for t in range(t_count):
        for k in range(TOPK):
            e = int(mine["idx"][t, k])
            if e < 0:
                continue
            hk = (w1[e] @ mine["xd"][t]).float().to(BF16)
            gate, up = hk[:inter].float(), hk[inter:].float()
            if clamp is not None:
                c = torch.tensor(clamp, dtype=F32).to(BF16).float()
                gate = torch.minimum(gate, c)
                up = torch.maximum(torch.minimum(up, c), -c)
            silu = gate / (torch.tensor(1.0, dtype=F32) + torch.exp(-gate.double()).float())
            act = (silu * up) * mine["w"][t, k]
            act_deq = quantise_ref(act) if fp8 else act.to(BF16).double()
            yk = (w2[e] @ act_deq).float().to(BF16)
            y[t] = y[t] + yk.float()
    return y.to(BF16)


def expected_counts(case, rank):
    counts = torch.zeros(E_PER_RANK, dtype=I64)
    for r in case["ranks"]:
        for e_local in range(E_PER_RANK):
            counts[e_local] += int((r["idx"] == rank * E_PER_RANK + e_local).sum())
    return counts


def local_weights(dg, case, rank, transform=True):
    """This rank's experts as the kernel takes them (``transform_weights_for_mega_moe``) or untransformed."""
    lo, hi = rank * E_PER_RANK, (rank + 1) * E_PER_RANK
    (w1, s1, _), (w2, s2, _) = case["experts"]["l1"], case["experts"]["l2"]
    if not case["fp8"]:
        l1, l2 = w1[lo:hi].contiguous(), w2[lo:hi].contiguous()
        return dg.transform_weights_for_mega_moe(l1, l2) if transform else (l1, l2)
    h, inter = case["h"], case["inter"]
    sf1 = dg.transform_sf_into_required_layout(s1[lo:hi].contiguous(), 2 * inter, h, (1, 32), E_PER_RANK)
    sf2 = dg.transform_sf_into_required_layout(s2[lo:hi].contiguous(), h, inter, (1, 32), E_PER_RANK)
    l1, l2 = (w1[lo:hi].contiguous(), sf1), (w2[lo:hi].contiguous(), sf2)
    return dg.transform_weights_for_mega_moe(l1, l2) if transform else (l1, l2)


def fill(buffer, case, rank):
    mine = case["ranks"][rank]
    t = mine["idx"].shape[0]
    buffer.x[:t].copy_(mine["x"])
    if case["fp8"]:
        buffer.x_sf[:t].copy_(mine["x_sf"])
    buffer.topk_idx[:t].copy_(mine["idx"])
    buffer.topk_weights[:t].copy_(mine["w"])
    return t


def make_buffer(dg, group, case, tokens=16):
    mma = "fp8xfp4" if case["fp8"] else "bf16xbf16"
    return dg.get_symm_buffer_for_mega_moe(
        group, case["num_experts"], tokens, TOPK, case["h"], case["inter"], mma_type=mma
    )


def run(dg, buffer, case, rank, weights, clamp=None, stats=None, fast_math=True):
    t = fill(buffer, case, rank)
    y = torch.full((t, case["h"]), float("nan"), dtype=BF16)
    fn = dg.fp8_fp4_mega_moe if case["fp8"] else dg.bf16_mega_moe
    fn(y, *weights, buffer, stats, activation_clamp=clamp, fast_math=fast_math)
    return y


# ---------------------------------------------------------------------------------------------------------------------
# API surface and buffer layout
# ---------------------------------------------------------------------------------------------------------------------


def test_signatures_and_flavors(dg):
    sig = {n: list(inspect.signature(getattr(dg, n)).parameters) for n in ("fp8_fp4_mega_moe", "bf16_mega_moe")}
    common = ["y", "l1_weights", "l2_weights", "sym_buffer", "cumulative_local_expert_recv_stats"]
    assert sig["fp8_fp4_mega_moe"] == [*common, "recipe", "activation", "activation_clamp", "fast_math"]
    assert sig["bf16_mega_moe"] == [*common, "activation", "activation_clamp", "fast_math"]
    params = inspect.signature(dg.get_symm_buffer_for_mega_moe).parameters
    assert list(params)[-3:] == ["use_fp8_dispatch", "mma_type", "activation"]
    assert params["mma_type"].default == "fp8xfp4"
    assert list(inspect.signature(dg.SymmBuffer).parameters) == [
        "group",
        "num_experts",
        "num_max_tokens_per_rank",
        "num_topk",
        "hidden",
        "intermediate_hidden",
        "num_ring_tokens",
        "mma_type",
        "activation",
    ]
    assert inspect.signature(dg.fp8_fp4_mega_moe).parameters["recipe"].default == (1, 1, 32)
    dg._standin.configure("ascend")
    assert not hasattr(dg, "bf16_mega_moe") and not hasattr(dg, "get_symm_buffer_for_mega_moe")
    # DeepGEMM-Ascend's own Mega MoE (fused shared experts; tests/upstream/test_deep_gemm_standin_ascend_mega.py)
    assert "shared_l1_weights" in inspect.signature(dg.fp8_fp4_mega_moe).parameters


def test_buffer_layout_fp8(dg):
    """Offsets worked out by hand from mega.hpp:53-158 / layout/mega_moe.cuh for R=1, E=4, T=16->384, K=2, H=I=512."""
    buf = dg.get_symm_buffer_for_mega_moe(Solo(), 4, 16, 2, 512, 512)
    assert (buf.num_max_tokens_per_rank, buf.num_ring_tokens) == (384, 1536)
    base = buf.buffer.data_ptr()
    assert buf.buffer.dtype == I8 and buf.buffer.nbytes == 3391616 and not bool(buf.buffer.any())
    views = {
        "x": (27776, (384, 512), (512, 1), FP8),
        "x_sf": (224384, (384, 4), (4, 1), I32),
        "topk_idx": (230528, (384, 2), (2, 1), I64),
        "topk_weights": (236672, (384, 2), (2, 1), F32),
        "l1_acts": (239744, (1536, 512), (512, 1), FP8),
        "l1_acts_sf": (1026176, (24576, 4), (1, 24576), I32),
        "l2_acts": (1425536, (1536, 512), (512, 1), FP8),
        "l2_acts_sf": (2211968, (24576, 4), (1, 24576), I32),
    }
    for name, (off, shape, stride, dtype) in views.items():
        v = getattr(buf, name)
        assert (v.data_ptr() - base, tuple(v.shape), v.stride(), v.dtype) == (off, shape, stride, dtype), name
    buf.destroy()
    assert buf.buffer is None and buf.x is None and buf.x_sf is None and buf.handle is None and buf.group is None


def test_buffer_bf16_and_ring(dg):
    buf = dg.get_symm_buffer_for_mega_moe(Solo(), 4, 385, 2, 256, 256, mma_type="bf16xbf16")
    # ring: min(768 * 4, align(768 * 2 + 4 * 383, 384)) (the decode-sized default is larger)
    assert buf.num_max_tokens_per_rank == 768 and buf.num_ring_tokens == 3072
    assert buf.x.dtype == BF16 and buf.x_sf is None and buf.l1_acts_sf is None and buf.l2_acts_sf is None
    assert buf.topk_idx.shape == (768, 2) and buf.l2_acts.shape == (3072, 256)
    with pytest.warns(DeprecationWarning, match="use_fp8_dispatch"):
        dg.get_symm_buffer_for_mega_moe(Solo(), 4, 16, 2, 512, 512, use_fp8_dispatch=True)
    with pytest.raises(AssertionError):
        dg.get_symm_buffer_for_mega_moe(Solo(), 4, 16, 2, 512, 512, use_fp8_dispatch=False)


def test_buffer_host_checks(dg):
    with pytest.raises(RuntimeError, match=r"layout/mega_moe\.cuh:208\): num_bytes % 16 == 0 or not require_tma"):
        dg.get_symm_buffer_for_mega_moe(Solo(), 4, 16, 2, 128, 128)  # H / 32 = 4 scale bytes per token
    with pytest.raises(AssertionError, match="Only `swiglu` activation is supported, got `geglu`"):
        dg.get_symm_buffer_for_mega_moe(Solo(), 4, 16, 2, 512, 512, activation="geglu")

    class Three(Solo):
        def size(self):
            return 3

    with pytest.raises(RuntimeError, match=r"csrc/apis/mega\.hpp:37\): num_experts % num_ranks == 0"):
        dg.get_symm_buffer_for_mega_moe(Three(), 4, 16, 2, 512, 512)
    with pytest.raises(RuntimeError, match=r"heuristics/mega_moe\.hpp:68\): mma_type_str == \"fp8xfp4\""):
        dg.get_symm_buffer_for_mega_moe(Solo(), 4, 16, 2, 512, 512, mma_type="fp4xfp4")
    with pytest.raises(RuntimeError, match=r"heuristics/mega_moe\.hpp:82\): num_max_tokens_per_rank % block_m"):
        dg.SymmBuffer(Solo(), 4, 100, 2, 512, 512, 384)
    with pytest.raises(RuntimeError, match=r"mega\.hpp:45\): num_min_ring_tokens <= num_ring_tokens"):
        dg.SymmBuffer(Solo(), 4, 384, 2, 512, 512, 384 * 5)


# ---------------------------------------------------------------------------------------------------------------------
# Values (one process, one-rank group)
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8xfp4"])
@pytest.mark.parametrize("clamp", [None, 0.75], ids=["noclamp", "clamp"])
def test_values_one_rank(dg, fp8, clamp):
    case = make_case(fp8, 1, seed=11 + fp8)
    buf = make_buffer(dg, Solo(), case)
    stats = torch.randint(0, 100, (E_PER_RANK,), dtype=I32)
    before = stats.clone()
    y = run(dg, buf, case, 0, local_weights(dg, case, 0), clamp=clamp, stats=stats)
    expected = reference(case, 0, clamp)
    assert torch.equal(y.view(torch.int16), expected.view(torch.int16))
    assert bool((y[0] == 0).all())  # token 0 routed nowhere
    assert torch.equal(stats, before + expected_counts(case, 0).to(I32))
    if clamp is not None:
        assert not torch.equal(expected, reference(case, 0, None))  # the clamp bites in this case


def test_fast_math_model_and_repeat(dg):
    case = make_case(True, 1, seed=5)
    buf = make_buffer(dg, Solo(), case)
    weights = local_weights(dg, case, 0)
    y1 = run(dg, buf, case, 0, weights, fast_math=True)
    y2 = run(dg, buf, case, 0, weights, fast_math=False)
    assert torch.equal(y1, y2) and torch.equal(y1, reference(case, 0, None))


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8xfp4"])
def test_untransformed_weights_give_wrong_result(dg, fp8):
    """Mutation: a backend that forgets transform_weights_for_mega_moe (or only the UTCCP scale permutation)."""
    case = make_case(fp8, 1, seed=23)
    buf = make_buffer(dg, Solo(), case)
    expected = reference(case, 0, None).float()
    raw = local_weights(dg, case, 0, transform=False)
    y = run(dg, buf, case, 0, raw).float()
    assert (y - expected).norm() > 0.1 * expected.norm()
    if fp8:
        good = local_weights(dg, case, 0)
        half = ((good[0][0], raw[0][1]), (good[1][0], raw[1][1]))  # weights interleaved, scales not permuted
        y = run(dg, buf, case, 0, half).float()
        assert not torch.equal(y, expected)


def test_no_tokens(dg):
    case = make_case(False, 1, seed=3)
    buf = make_buffer(dg, Solo(), case)
    stats = torch.arange(E_PER_RANK, dtype=I32)
    y = torch.empty(0, case["h"], dtype=BF16)
    dg.bf16_mega_moe(y, *local_weights(dg, case, 0), buf, stats)
    assert torch.equal(stats, torch.arange(E_PER_RANK, dtype=I32))


def test_kernel_debug_env_zeroes_buffer(dg, monkeypatch):
    case = make_case(False, 1, seed=3)
    buf = make_buffer(dg, Solo(), case)
    monkeypatch.setenv("DG_COMM_KERNEL_DEBUG", "1")
    run(dg, buf, case, 0, local_weights(dg, case, 0))
    assert not bool(buf.buffer.any())


def test_call_log(dg):
    case = make_case(False, 1, seed=3)
    buf = make_buffer(dg, Solo(), case)
    weights = local_weights(dg, case, 0)
    y = run(dg, buf, case, 0, weights)
    names = [n for n, _ in dg._standin.CALLS]
    assert names == ["get_symm_buffer_for_mega_moe", "SymmBuffer", "transform_weights_for_mega_moe", "bf16_mega_moe"]
    entry = dg._standin.CALLS[-1][1]
    assert entry["y"] == (BF16, tuple(y.shape), tuple(y.stride()), y.data_ptr())
    assert entry["activation"] == "swiglu" and entry["sym_buffer"] is buf


# ---------------------------------------------------------------------------------------------------------------------
# Host checks, SM90, Panics
# ---------------------------------------------------------------------------------------------------------------------


def _fp8_setup(dg):
    case = make_case(True, 1, seed=7)
    buf = make_buffer(dg, Solo(), case)
    fill(buffer=buf, case=case, rank=0)
    t = case["ranks"][0]["idx"].shape[0]
    return case, buf, local_weights(dg, case, 0), torch.empty(t, case["h"], dtype=BF16)


def test_kernel_host_checks(dg):
    case, buf, (l1, l2), y = _fp8_setup(dg)
    h = case["h"]
    cases = [
        (dict(recipe=(1, 1, 128)), r"mega\.hpp:182\): rm == 1 and rn == 1 and rk == 32"),
        (dict(activation="relu"), r"mega\.hpp:183\): activation == \"swiglu\""),
        (dict(activation_clamp=-1.0), r"mega\.hpp:188\): activation_clamp >= 0"),
        (dict(l1_weights=(l1[0].transpose(1, 2), l1[1])), r"mega\.hpp:191\): get_major_type_ab\(l1_weights\)"),
        (dict(y=torch.empty(400, h, dtype=BF16)), r"mega\.hpp:198\): num_tokens <= num_max_tokens_per_rank"),
        (dict(l2_weights=(l2[0][:, :, :128].contiguous(), l2[1])), r"mega\.hpp:201\): intermediate_hidden_2 == 2"),
        (dict(l1_weights=(l1[0], case["experts"]["l1"][1][:4])), r"layout\.hpp:89\): sf.scalar_type\(\) == type_check"),
        (dict(l1_weights=(l1[0], l1[1].contiguous())), r"layout\.hpp:103\): sf.stride\(-3\) == sf.stride\(-1\)"),
        (
            dict(cumulative_local_expert_recv_stats=torch.zeros(4, dtype=I64)),
            r"mega\.hpp:213\): cumulative_local_expert_recv_stats->scalar_type\(\) == torch::kInt",
        ),
        (
            dict(cumulative_local_expert_recv_stats=torch.zeros(3, dtype=I32)),
            r"mega\.hpp:214\): cumulative_local_expert_recv_stats->numel\(\) == num_experts_per_rank",
        ),
    ]
    for kwargs, words in cases:
        args = dict(y=y, l1_weights=l1, l2_weights=l2, sym_buffer=buf) | kwargs
        with pytest.raises(RuntimeError, match=words):
            dg.fp8_fp4_mega_moe(**args)
    bcase = make_case(False, 1, seed=7)
    bbuf = make_buffer(dg, Solo(), bcase)
    b1, b2 = local_weights(dg, bcase, 0)
    with pytest.raises(RuntimeError, match=r"mega\.hpp:285\): l1_weights.scalar_type\(\) == torch::kBFloat16"):
        dg.bf16_mega_moe(y[:, :256], b1.float(), b2, bbuf)
    with pytest.raises(RuntimeError, match=r"mega\.hpp:308\): sym_buffer.nbytes\(\) >= "):
        dg.bf16_mega_moe(y, (torch.zeros(4, 1024, 512, dtype=BF16)), torch.zeros(4, 512, 512, dtype=BF16), bbuf)


def test_jit_static_assert(dg, capsys):
    """BF16 with H = 128: the buffer is fine, but the kernel's scheduler needs an even count of 128-wide L2 N blocks."""
    g = torch.Generator().manual_seed(0)
    buf = dg.get_symm_buffer_for_mega_moe(Solo(), 4, 16, 2, 128, 128, mma_type="bf16xbf16")
    l1 = torch.randn(4, 256, 128, generator=g).to(BF16)
    l2 = torch.randn(4, 128, 128, generator=g).to(BF16)
    with pytest.raises(RuntimeError, match=r"compiler\.hpp:228\): false and \"NVCC compilation failed\""):
        dg.bf16_mega_moe(torch.empty(1, 128, dtype=BF16), l1, l2, buf)
    assert "L2 N block count must be even" in capsys.readouterr().out


def test_sm90_refuses(dg):
    case, buf, (l1, l2), y = _fp8_setup(dg)
    bcase = make_case(False, 1, seed=7)
    bbuf = make_buffer(dg, Solo(), bcase)
    b1, b2 = local_weights(dg, bcase, 0)
    dg._standin.configure("cuda", 9)
    with pytest.raises(RuntimeError, match=r"layout\.hpp:57\): ab.scalar_type\(\) == kPackedFP4 and arch_major == 10"):
        dg.fp8_fp4_mega_moe(y, l1, l2, buf)
    with pytest.raises(RuntimeError, match=r"mega\.hpp:327\): Unsupported architecture"):
        dg.bf16_mega_moe(y[:, :256], b1, b2, bbuf)
    sm90_buf = make_buffer(dg, Solo(), bcase)  # the buffer itself is host code: fine on SM90
    assert sm90_buf.x.dtype == BF16


def test_panics(dg):
    case, buf, (l1, l2), y = _fp8_setup(dg)
    Panic = dg._standin.Panic
    with pytest.raises(Panic, match="contiguous, 16-byte aligned BF16"):
        dg.fp8_fp4_mega_moe(y.float(), l1, l2, buf)
    with pytest.raises(Panic, match="address % 16 = 2"):
        dg.fp8_fp4_mega_moe(torch.empty(y.numel() + 1, dtype=BF16)[1:].view(y.shape), l1, l2, buf)
    buf.topk_idx[1, 0] = 4
    with pytest.raises(Panic, match=r"topk_idx\[1, 0\] = 4"):
        dg.fp8_fp4_mega_moe(y, l1, l2, buf)
    fill(buf, case, 0)
    with pytest.raises(Panic, match="unpacked E2M1"):
        dg.fp8_fp4_mega_moe(
            y, (torch.zeros(4, 1024, 512, dtype=FP8), l1[1]), (torch.zeros(4, 512, 512, dtype=FP8), l2[1]), buf
        )
    bbuf = dg.get_symm_buffer_for_mega_moe(Solo(), 4, 16, 2, 512, 512, mma_type="bf16xbf16")
    with pytest.raises(Panic, match="built for mma_type='bf16xbf16'"):
        dg.fp8_fp4_mega_moe(y, l1, l2, bbuf)


# ---------------------------------------------------------------------------------------------------------------------
# Spawned gloo ranks
# ---------------------------------------------------------------------------------------------------------------------


def _check_values(rank, world):
    with installed("deep_gemm", flavor="cuda", arch=10) as dg:
        # A real gloo group of one rank per process (DeepGEMM: no symmetric memory, a plain buffer)
        solo = [dist.new_group([r], backend="gloo") for r in range(world)][rank]
        case = make_case(True, 1, seed=90 + rank)
        buf = make_buffer(dg, solo, case)
        stats = torch.zeros(E_PER_RANK, dtype=I32)
        y = run(dg, buf, case, 0, local_weights(dg, case, 0), clamp=0.75, stats=stats)
        assert torch.equal(y.view(torch.int16), reference(case, 0, 0.75).view(torch.int16))
        assert torch.equal(stats, expected_counts(case, 0).to(I32))

        group = dist.group.WORLD
        for fp8 in (False, True):
            for clamp in (None, 0.75):
                case = make_case(fp8, world, seed=100 + 2 * fp8 + (clamp is not None))
                buf = make_buffer(dg, group, case)
                assert len(buf.handle.buffer_ptrs) == world
                stats = torch.full((E_PER_RANK,), 7, dtype=I32)
                y = run(dg, buf, case, rank, local_weights(dg, case, rank), clamp=clamp, stats=stats)
                expected = reference(case, rank, clamp)
                assert torch.equal(y.view(torch.int16), expected.view(torch.int16)), (rank, fp8, clamp)
                assert torch.equal(stats, 7 + expected_counts(case, rank).to(I32)), (rank, stats)

        # Mutation across ranks: untransformed weights
        case = make_case(False, world, seed=300)
        buf = make_buffer(dg, group, case)
        y = run(dg, buf, case, rank, local_weights(dg, case, rank, transform=False)).float()
        expected = reference(case, rank, None).float()
        assert (y - expected).norm() > 0.1 * expected.norm()

        if world > 1:
            Panic = dg._standin.Panic
            # one rank's bad expert id: every rank raises
            fill(buf, case, rank)
            if rank == 1:
                buf.topk_idx[2, 1] = case["num_experts"]
            with pytest.raises(Panic, match=r"rank 1: topk_idx\[2, 1\]"):
                run_raw(dg, buf, case, rank)
            # ranks whose buffers disagree (T_max 384 vs 768): every rank raises
            other = make_buffer(dg, group, case, tokens=16 if rank == 0 else 500)
            with pytest.raises(Panic, match="disagree"):
                run(dg, other, case, rank, local_weights(dg, case, rank))


def run_raw(dg, buf, case, rank):
    t = case["ranks"][rank]["idx"].shape[0]
    y = torch.empty(t, case["h"], dtype=BF16)
    dg.bf16_mega_moe(y, *local_weights(dg, case, rank), buf)


CHECKS = {"values": _check_values}


def rank_checks(rank: int, world_size: int, store_path: str) -> None:
    run_named(CHECKS, rank, world_size, store_path, "values", timeout_s=60)


def test_on_ranks(tmp_path):
    """2 gloo ranks: a one-rank gloo group each, then the world group (values, stats, mutation, Panics)."""
    mp.spawn(rank_checks, args=(2, str(tmp_path / "store")), nprocs=2, join=True)
