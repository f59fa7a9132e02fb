"""``sparse_mqa_logits`` / ``paged_sparse_mqa_logits`` through DeepGEMM 2.8's sparse indexer
(backends/upstream/deep_gemm/mqa_logits.py) with the stand-in ``deep_gemm`` configured as 2.8.0 on SM100
(tests/standins/deep_gemm/_cuda_sparse.py: upstream's host checks, an opaque schedule, the kernel's BF16 head
reduction, NaN in every column it does not write), CPU tensors on the CUDA chain:

* MXFP4 and MXFP8 calls (aligned and unaligned ranges, padding slots, paged MXFP4 and MXFP8 pages with a 512-byte
  stride) reach it and agree with the chain without it on every column: the valid ones within BF16 rounding (the
  library's BF16 chains against our FP32 sum), -inf exactly where our op puts it (no NaN left);
* refusals and reasons: DeepGEMM 2.6.1 (no sparse indexer), SM90, FP32 weights, 16 heads, NB not a multiple of 4,
  FP8 with per-token FP32 scales, next_n 2, a cache page stride off 512;
* bad block ids get our words and never reach it.
"""

from __future__ import annotations

import pytest
import torch

from tests.mqa_logits import specs as T
from tests.upstream.standin import installed
from torch_ascend_moe.backends import chain
from torch_ascend_moe.backends.upstream.deep_gemm import mqa_logits as backend  # noqa: F401  (declares the kernels)
from torch_ascend_moe.ops.mqa_logits import paged_sparse_mqa_logits, sparse_mqa_logits
from torch_ascend_moe.testing import calc_diff

SM100_28 = {"flavor": "cuda", "arch": 10, "version": "2.8.0"}
BF16 = torch.bfloat16
E8M0 = torch.float8_e8m0fnu


def _mx(x: torch.Tensor, fmt: str):
    data, sf = T.quantize(x, "fp4" if fmt == "mxfp4" else "fp8-32")
    return data, sf.to(E8M0)


def _blocks(ks, ke, sbk, nb, g, unaligned=False):
    rows = [
        T.candidate_blocks(a, b, sbk, nb, a % sbk if unaligned else 0, g, 2**31 - 1)
        for a, b in zip(ks.tolist(), ke.tolist())
    ]
    return torch.tensor(rows, dtype=torch.int32).reshape(len(rows), nb)


def _ragged(fmt="mxfp4", heads=32, nb=8, sbk=8, unaligned=False, weights=BF16, seed=0):
    g = torch.Generator().manual_seed(seed)
    s, n_kv = 7, 400
    q, q_sf = _mx(torch.randn(s, heads, 128, generator=g), fmt)
    k, k_sf = _mx(torch.randn(n_kv, 128, generator=g), fmt)
    w = torch.rand(s, heads, generator=g).to(weights)
    ks = torch.tensor([0, 0, 32, 64, 64, 128, 192], dtype=torch.int32)
    if unaligned:
        ks = ks + torch.tensor([3, 0, 5, 1, 7, 2, 4], dtype=torch.int32)
    ke = (ks + torch.tensor([1, 90, 150, 40, 300, 9, 200], dtype=torch.int32)).clamp(max=n_kv)
    bi = _blocks(ks, ke, sbk, nb, g, unaligned)
    return dict(q=q, k=k, weights=w, ks=ks, ke=ke, block_indices=bi, sparse_block_kv=sbk, q_sf=q_sf, k_sf=k_sf,
                unaligned_ks=unaligned, logits_dtype=BF16)  # fmt: skip


def _paged(fmt="mxfp4", next_n=1, sbk=8, nb=8, pad_stride=True, seed=1):
    g = torch.Generator().manual_seed(seed)
    page_kv = 64
    lengths = [130, 64, 300, 9]
    cache = T.build_paged_cache(
        [torch.randn(n, 128, generator=g) for n in lengths],
        page_kv,
        "fp4" if fmt == "mxfp4" else "fp8",
        fmt != "mxfp4",
        g,
    )
    row = cache.cache.shape[3]
    stride = -(-page_kv * row // 512) * 512 if pad_stride else page_kv * row
    padded = torch.randint(0, 256, (cache.cache.shape[0], stride), generator=g, dtype=torch.uint8)
    padded[:, : page_kv * row] = cache.cache.reshape(cache.cache.shape[0], -1)
    kv = padded.as_strided((cache.cache.shape[0], page_kv, 1, row), (stride, row, row, 1))
    b = len(lengths)
    lens = torch.tensor(lengths, dtype=torch.int32).view(b, 1).repeat(1, next_n)
    q, q_sf = _mx(torch.randn(b, next_n, 32, 128, generator=g), fmt)
    w = torch.rand(b * next_n, 32, generator=g).to(BF16)
    zero = torch.zeros(b * next_n, dtype=torch.int32)
    bi = _blocks(zero, lens.flatten(), sbk, nb, g)
    return dict(q=q, kv_cache=kv, weights=w, context_lens=lens, block_table=cache.block_table, block_indices=bi,
                sparse_block_kv=sbk, q_sf=q_sf, ascend_kv_layout=fmt != "mxfp4", logits_dtype=BF16)  # fmt: skip


def _calls(lib):
    return [name for name, _ in lib._standin.CALLS if name != "get_arch_major"]


def _agree(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert not torch.isnan(ours).any()
    finite = torch.isfinite(theirs)
    assert torch.equal(torch.isfinite(ours), finite) and bool((ours[~finite] == float("-inf")).all())
    assert calc_diff(ours[finite], theirs[finite]) < 2e-5, calc_diff(ours[finite], theirs[finite])


@pytest.mark.parametrize(
    "fmt, unaligned, sbk", [("mxfp4", False, 8), ("mxfp4", True, 16), ("mxfp8", False, 16), ("mxfp8", True, 8)]
)
def test_ragged_reaches_deep_gemm(fmt, unaligned, sbk):
    call = _ragged(fmt, sbk=sbk, unaligned=unaligned)
    with installed("deep_gemm", **SM100_28) as lib, chain.on_cpu("cuda"), chain.disabled("triton"):
        steps = chain.explain("sparse_mqa_logits", "cuda", **call)
        assert steps[0].kernel.library == "deep_gemm" and steps[0].status == "chosen", steps
        ours = sparse_mqa_logits(**call)
        assert _calls(lib) == ["get_sparse_mqa_logits_metadata", "fp8_fp4_sparse_mqa_logits"], _calls(lib)
        with chain.disabled("deep_gemm"):
            theirs = sparse_mqa_logits(**call)
    _agree(ours, theirs)


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8"])
def test_paged_reaches_deep_gemm(fmt):
    call = _paged(fmt)
    with installed("deep_gemm", **SM100_28) as lib, chain.on_cpu("cuda"), chain.disabled("triton"):
        ours = paged_sparse_mqa_logits(**call)
        assert "fp8_fp4_paged_sparse_mqa_logits" in _calls(lib), _calls(lib)
        with chain.disabled("deep_gemm"):
            theirs = paged_sparse_mqa_logits(**call)
    _agree(ours, theirs)


@pytest.mark.parametrize(
    "config, change, reason",
    [
        ({"flavor": "cuda", "arch": 10}, {}, "older than 2.8"),
        ({"flavor": "cuda", "arch": 9, "version": "2.8.0"}, {}, "not SM100"),
        (SM100_28, {"weights": torch.float32}, "FP32 weights or logits"),
        (SM100_28, {"heads": 16}, "16 heads of 128"),
        (SM100_28, {"nb": 6}, "6 blocks"),
    ],
)
def test_ragged_refusals(config, change, reason):
    call = _ragged(heads=change.get("heads", 32), nb=change.get("nb", 8), weights=change.get("weights", BF16))
    with installed("deep_gemm", **config) as lib, chain.on_cpu("cuda"), chain.disabled("triton"):
        steps = chain.explain("sparse_mqa_logits", "cuda", **call)
        assert steps[0].status == "refused" and reason in steps[0].reason, steps
        sparse_mqa_logits(**call)
        assert not any("sparse" in c for c in _calls(lib)), _calls(lib)


def test_ragged_refuses_per_token_fp8_scales():
    call = _ragged("mxfp8")
    q8, k8 = call["q"], call["k"]
    call.update(q_sf=None, k_sf=torch.rand(k8.shape[0], 1) + 0.5, q=q8)
    with installed("deep_gemm", **SM100_28), chain.on_cpu("cuda"), chain.disabled("triton"):
        steps = chain.explain("sparse_mqa_logits", "cuda", **call)
        assert steps[0].status == "refused" and "UE8M0 scales per 32" in steps[0].reason, steps


@pytest.mark.parametrize(
    "change, reason", [({"next_n": 2}, "next_n 2"), ({"pad_stride": False}, "page stride not a multiple of 512")]
)
def test_paged_refusals(change, reason):
    call = _paged(**change)
    with installed("deep_gemm", **SM100_28) as lib, chain.on_cpu("cuda"), chain.disabled("triton"):
        steps = chain.explain("paged_sparse_mqa_logits", "cuda", **call)
        assert steps[0].status == "refused" and reason in steps[0].reason, steps
        paged_sparse_mqa_logits(**call)
        assert not any("sparse" in c for c in _calls(lib)), _calls(lib)


def test_bad_blocks_never_reach_it():
    call = _ragged()
    call["block_indices"][1, 0] = 30  # tokens [240, 248): outside the row's range [0, 90)
    with installed("deep_gemm", **SM100_28) as lib, chain.on_cpu("cuda"), chain.disabled("triton"):
        with pytest.raises(ValueError, match=r"sparse_mqa_logits: argument 'block_indices' values: expected blocks"):
            sparse_mqa_logits(**call)
        assert not any("sparse" in c for c in _calls(lib)), _calls(lib)
