"""``mega_moe`` through DeepGEMM's Mega MoE (backends/upstream/deep_gemm/mega_moe.py) with the stand-in ``deep_gemm``
(tests/standins/deep_gemm/_cuda_mega.py: upstream's API, buffer views, host checks and math, reading the weights in
their transformed layout) as DeepGEMM 2.6.1 on SM100, CPU tensors on the CUDA chain:

* DeepGEMM-shaped calls (H, I multiples of 128, power-of-two scales) reach it, locally and on 2 gloo ranks, within
  the op's threshold of the fp64 reference and of the chain without DeepGEMM, pair counts equal;
* what it refuses (SM90, shared experts, scales not powers of two, H not a multiple of 128 in FP8) and why;
* weights transformed once per version (an in-place update transforms again); bad ids get our words and never
  reach it; a compiled graph still reaches it;
* mutation: a backend that hands it untransformed weights is caught;
* DeepGEMM-Ascend's (1 and 2 gloo ranks, the NPU chain): FP8 x FP4 with 0, 1 and 2 fused shared experts within the
  bound of the chain without it, its refusals (BF16, no group, I below 512, 3 shared experts), bad ids on one rank,
  untransformed weights caught.
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from tests.distributed import run_named
from tests.mega_moe.specs import fp4_experts, reference
from tests.upstream.standin import installed
from torch_ascend_moe._registry import arguments, full_call
from torch_ascend_moe.backends import chain
from torch_ascend_moe.backends.upstream.deep_gemm import mega_moe as backend  # declares the kernel
from torch_ascend_moe.distributed.groups import group_name_of
from torch_ascend_moe.ops.mega_moe import mega_moe
from torch_ascend_moe.quant import per_token_cast_to_fp8
from torch_ascend_moe.testing import calc_diff

# The CUDA chain on CPU tensors: our Triton kernels are switched off wherever the chain runs (interpreted on a CPU
# they would only slow the comparison down; what is checked is DeepGEMM against the chain without it).
BOUND = 1e-5  # the op's BF16 threshold (tests/mega_moe/specs.py)
SM100 = {"flavor": "cuda", "arch": 10}


def _calls(lib) -> list[str]:
    return [name for name, _ in lib._standin.CALLS]


def _call(seed: int, fp8: bool, t=10, h=512, inter=512, e=4, k=2, clamp=None, rank=0):
    """One DeepGEMM-shaped call's arguments (as ``mega_moe``'s keywords), with -1 slots."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=torch.Generator().manual_seed(seed * 10 + rank))
    idx = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    idx[torch.rand(t, k, generator=g) < 0.2] = -1
    w = torch.rand(t, k, generator=g)
    el = e  # experts held by this process (all of them locally; the caller divides for EP)
    l1 = torch.randn(el, 2 * inter, h, generator=g) * h**-0.5
    l2 = torch.randn(el, h, inter, generator=g) * inter**-0.5
    call = dict(x=x.bfloat16(), x_sf=None, topk_idx=idx, topk_weights=w)
    call.update(l1_weights=l1.bfloat16(), l1_sf=None, l2_weights=l2.bfloat16(), l2_sf=None)
    if fp8:
        xq, xsf = per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32)
        (w1, s1), (w2, s2) = fp4_experts(l1), fp4_experts(l2)
        call.update(x=xq, x_sf=xsf, l1_weights=w1, l1_sf=s1, l2_weights=w2, l2_sf=s2)
    call["activation_clamp"] = clamp
    return call


def _fp64(call) -> torch.Tensor:
    return reference(arguments("mega_moe", full_call("mega_moe", **call)))[0]


CASES = [(fp8, clamp) for fp8 in (False, True) for clamp in (None, 1.0)]


@pytest.mark.parametrize("fp8,clamp", CASES)
def test_reaches_deep_gemm_locally(fp8, clamp):
    call = _call(3, fp8, clamp=clamp)
    with installed("deep_gemm", **SM100) as lib, chain.on_cpu("cuda"), chain.disabled("triton"):
        steps = chain.explain("mega_moe", "cuda", **call)
        assert steps[0].kernel.library == "deep_gemm" and steps[0].status == "chosen", steps
        y, counts = mega_moe(**call)
        assert "fp8_fp4_mega_moe" in _calls(lib) or "bf16_mega_moe" in _calls(lib), _calls(lib)
        with chain.disabled("deep_gemm"):
            y_ours, counts_ours = mega_moe(**call)
    want = _fp64(call)
    assert calc_diff(y, want) < BOUND, calc_diff(y, want)
    assert calc_diff(y, y_ours) < BOUND, calc_diff(y, y_ours)
    assert torch.equal(counts, counts_ours), (counts, counts_ours)
    assert y.dtype == torch.bfloat16 and y.shape == call["x"].shape


def test_refusals():
    bf16, fp8 = _call(4, False), _call(4, True)
    g = torch.Generator().manual_seed(29)
    shared = dict(
        bf16,
        shared_l1_weights=torch.randn(64, 512, generator=g).bfloat16(),
        shared_l2_weights=torch.randn(512, 32, generator=g).bfloat16(),
    )
    odd_scale = dict(fp8, x_sf=fp8["x_sf"] * 1.5)
    narrow = _call(4, True, h=256, inter=512)
    reasons = {
        "shared experts": (SM100, shared),
        "not all powers of two": (SM100, odd_scale),
        "H a multiple of 512": (SM100, narrow),
        "SM9x": ({"flavor": "cuda", "arch": 9}, bf16),
    }
    for reason, (config, call) in reasons.items():
        with installed("deep_gemm", **config) as lib, chain.on_cpu("cuda"), chain.disabled("triton"):
            steps = chain.explain("mega_moe", "cuda", **call)
            assert steps[0].status == "refused" and reason in steps[0].reason, (reason, steps)
            y, _ = mega_moe(**call)  # our pipeline instead, never the library
            assert not any("mega_moe" in c for c in _calls(lib)), (reason, _calls(lib))
            with chain.disabled("deep_gemm"):
                # Not bitwise: the pipeline's own GEMMs (the shared experts') may still run DeepGEMM's bf16_gemm_nt.
                assert calc_diff(y, mega_moe(**call)[0]) < BOUND, reason


def test_weights_transformed_once_per_version():
    call = _call(5, True)
    with installed("deep_gemm", **SM100) as lib, chain.on_cpu("cuda"), chain.disabled("triton"):
        first = mega_moe(**call)[0]
        again = mega_moe(**dict(call, topk_weights=call["topk_weights"] * 0.5))[0]
        assert _calls(lib).count("transform_weights_for_mega_moe") == 1, _calls(lib)
        assert not torch.equal(first, again)
        call["l2_sf"].mul_(2)  # an in-place update (a new version): transformed again, and the result follows it
        doubled = mega_moe(**call)[0]
        assert _calls(lib).count("transform_weights_for_mega_moe") == 2, _calls(lib)
        with chain.disabled("deep_gemm"):
            assert calc_diff(doubled, mega_moe(**call)[0]) < BOUND


def test_bad_ids_never_reach_it():
    call = _call(6, False)
    call["topk_idx"][0, 0] = 9
    with installed("deep_gemm", **SM100) as lib, chain.on_cpu("cuda"), chain.disabled("triton"):
        with pytest.raises(ValueError, match=r"argument 'topk_idx' values: expected expert ids in \[-1, 4\), got 9"):
            mega_moe(**call)
        assert not any("mega_moe" in c for c in _calls(lib)), _calls(lib)


def test_compiled_graph_reaches_it():
    call = _call(7, False)

    def step(x, idx, w, l1, l2):
        return mega_moe(x, idx, w, l1, l2)[0] * 2

    args = (call["x"], call["topk_idx"], call["topk_weights"], call["l1_weights"], call["l2_weights"])
    with installed("deep_gemm", **SM100) as lib, chain.on_cpu("cuda"), chain.disabled("triton"):
        got = torch.compile(step, fullgraph=True, backend="aot_eager")(*args)
        assert "bf16_mega_moe" in _calls(lib), _calls(lib)
        assert calc_diff(got, step(*args)) < 1e-12


def test_mutation_untransformed_weights_caught(monkeypatch):
    for fp8 in (False, True):
        call = _call(8, fp8)
        with installed("deep_gemm", **SM100), chain.on_cpu("cuda"), chain.disabled("triton"):
            right = mega_moe(**call)[0]
            monkeypatch.setattr(backend, "_transformed", _untransformed)
            try:
                wrong = mega_moe(**call)[0]
                caught = calc_diff(wrong, right) > BOUND
            except RuntimeError:
                caught = True
            monkeypatch.undo()
        assert caught, f"untransformed weights not caught (fp8={fp8})"


def _untransformed(lib, args):
    if args.l1_sf is None:
        return args.l1_weights, args.l2_weights
    experts, two_i, h = args.l1_weights.shape[0], args.l1_weights.shape[1], args.x.shape[1]
    sf1 = lib.transform_sf_into_required_layout(args.l1_sf, two_i, h, (1, 32), experts)
    sf2 = lib.transform_sf_into_required_layout(args.l2_sf, h, two_i // 2, (1, 32), experts)
    return (args.l1_weights.view(torch.int8), sf1), (args.l2_weights.view(torch.int8), sf2)


# ---- expert-parallel: 2 gloo ranks ----


def _ep(rank, r):
    import torch.distributed as dist

    from tests.upstream.standin import STANDINS  # noqa: F401  (the spawned process imports the stand-in itself)

    e = 4 * r
    with installed("deep_gemm", **SM100) as lib, chain.on_cpu("cuda"), chain.disabled("triton"):
        for fp8 in (False, True):
            call = _call(9, fp8, t=6 + 3 * rank, e=e, rank=rank)
            # every rank holds its own experts: the slice of the full set the seed made
            lo, hi = rank * 4, rank * 4 + 4
            for name in ("l1_weights", "l1_sf", "l2_weights", "l2_sf"):
                if call.get(name) is not None:
                    call[name] = call[name][lo:hi].contiguous()
            lib._standin.reset()
            y, counts = mega_moe(**call, group=dist.group.WORLD)
            assert any("mega_moe" in c for c in _calls(lib)), _calls(lib)
            with chain.disabled("deep_gemm"):
                y_ours, counts_ours = mega_moe(**call, group=dist.group.WORLD)
            assert calc_diff(y, y_ours) < BOUND, (fp8, calc_diff(y, y_ours))
            assert torch.equal(counts, counts_ours), (counts, counts_ours)
        bad = _call(9, False, t=4, e=e, rank=rank)
        for name in ("l1_weights", "l2_weights"):
            bad[name] = bad[name][:4].contiguous()
        if rank == 1:
            bad["topk_idx"][0, 0] = e + 3
        lib._standin.reset()
        try:
            mega_moe(**bad, group=dist.group.WORLD)
        except ValueError as err:
            assert "expected expert ids in [-1" in str(err) and "rank(s) [1]" in str(err), err
        else:
            raise AssertionError("bad ids on one rank did not raise on every rank")
        assert not any("mega_moe" in c for c in _calls(lib)), _calls(lib)


def _spawned(rank, world_size, store):
    run_named({"ep": _ep}, rank, world_size, store, "ep", timeout_s=60)


def test_expert_parallel_on_two_ranks(tmp_path):
    mp.spawn(_spawned, args=(2, str(tmp_path / "store")), nprocs=2, join=True)


# ---- DeepGEMM-Ascend (its Mega MoE needs an HCCL group: spawned gloo ranks) ----

ASCEND = {"flavor": "ascend"}


def _ascend_call(seed: int, rank: int, r: int, shared: int, t=6, h=512, inter=512, k=2, clamp=None):
    """An FP8 x FP4 call for rank ``rank`` of ``r`` (2 experts each), ``shared`` fused shared experts of I."""
    call = _call(seed, True, t=t + rank, h=h, inter=inter, e=2 * r, k=k, clamp=clamp, rank=rank)
    for name in ("l1_weights", "l1_sf", "l2_weights", "l2_sf"):
        call[name] = call[name][2 * rank : 2 * rank + 2].contiguous()
    if shared:
        g = torch.Generator().manual_seed(seed + 100)
        sl1 = torch.randn(2 * shared * inter, h, generator=g) * h**-0.5
        sl2 = torch.randn(h, shared * inter, generator=g) * (shared * inter) ** -0.5
        (q1, f1), (q2, f2) = (per_token_cast_to_fp8(m, use_ue8m0=True, gran_k=32) for m in (sl1, sl2))
        call.update(shared_l1_weights=q1, shared_l1_sf=f1, shared_l2_weights=q2, shared_l2_sf=f2)
    return call


def _untransformed_ascend(lib, args):
    from torch_ascend_moe.backends.upstream.deep_gemm.mega_moe import ue8m0_pairs

    pair = lambda w, sf: None if w is None else (w, ue8m0_pairs(sf))  # noqa: E731
    routed = (pair(args.l1_weights.view(torch.int8), args.l1_sf), pair(args.l2_weights.view(torch.int8), args.l2_sf))
    return routed, (pair(args.shared_l1_weights, args.shared_l1_sf), pair(args.shared_l2_weights, args.shared_l2_sf))


def _ascend_ranks(rank, r):
    import torch.distributed as dist

    world = dist.group.WORLD
    with installed("deep_gemm", **ASCEND) as lib, chain.on_cpu("npu"):
        for case, (shared, clamp) in enumerate(((0, None), (1, 0.75), (2, None))):
            call = _ascend_call(20 + case, rank, r, shared, clamp=clamp)
            lib._standin.reset()
            y, counts = mega_moe(**call, group=world)
            assert "fp8_fp4_mega_moe" in _calls(lib), _calls(lib)
            with chain.disabled("deep_gemm"):
                y_ours, counts_ours = mega_moe(**call, group=world)
            assert calc_diff(y, y_ours) < BOUND, (shared, calc_diff(y, y_ours))
            assert torch.equal(counts, counts_ours), (counts, counts_ours)
        call = _ascend_call(30, rank, r, 1)
        reasons = {
            "FP8 x FP4 only": dict(_call(30, False, e=2 * r), group=world),
            "no process group": call,
            "I at least 512": dict(_ascend_call(31, rank, r, 0, inter=256), group=world),
            "1 or 2 of I": dict(_ascend_call(32, rank, r, 3), group=world),
        }
        for reason, kwargs in reasons.items():
            kwargs = dict(kwargs)
            group = kwargs.pop("group", None)
            if group is not None:
                kwargs["group_name"] = group_name_of(group)
            steps = chain.explain("mega_moe", "npu", **kwargs)
            assert steps[0].status == "refused" and reason in steps[0].reason, (reason, steps)
        # mutation: weights handed over untransformed
        right = mega_moe(**call, group=world)[0]
        real = backend._transformed_ascend
        backend._transformed_ascend = _untransformed_ascend
        try:
            caught = calc_diff(mega_moe(**call, group=world)[0], right) > BOUND
        except RuntimeError:
            caught = True
        finally:
            backend._transformed_ascend = real
        flags = [torch.zeros(1) for _ in range(r)]
        dist.all_gather(flags, torch.tensor([float(caught)]))
        assert any(bool(f) for f in flags), "untransformed weights not caught"
        bad = _ascend_call(33, rank, r, 0)
        if rank == r - 1:
            bad["topk_idx"][0, 0] = 2 * r + 1
        lib._standin.reset()
        try:
            mega_moe(**bad, group=world)
        except ValueError as err:
            assert "expected expert ids in [-1" in str(err) and f"rank(s) [{r - 1}]" in str(err), err
        else:
            raise AssertionError("bad ids did not raise on every rank")
        assert "fp8_fp4_mega_moe" not in _calls(lib), _calls(lib)


def _ascend_spawned(rank, world_size, store):
    run_named({"ascend": _ascend_ranks}, rank, world_size, store, "ascend", timeout_s=60)


@pytest.mark.parametrize("world_size", [1, 2])
def test_ascend_on_ranks(world_size, tmp_path):
    mp.spawn(_ascend_spawned, args=(world_size, str(tmp_path / "store")), nprocs=world_size, join=True)
