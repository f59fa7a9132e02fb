"""Run FlashMLA's own correctness tests against ``torch_ascend_moe.flash_mla`` on the CPU.

    python tools/flashmla_upstream_tests.py /path/to/FlashMLA {prefill,decode,dense,fmha} [cases] [--max-batch B]

``/path/to/FlashMLA`` is a checkout of deepseek-ai/FlashMLA (tested with 9241ae3, the G2 API: its ``tests/`` are
imported as they are). ``import flash_mla`` resolves to our package; the CUDA-only calls of its harness
(``torch.cuda.synchronize``, ``Tensor.cuda``, ...) become no-ops, tensors are made on the CPU. Each mode draws
``cases`` random cases (seeded) of upstream's correctness grids and runs upstream's ``test_flash_mla`` /
``run_test``, which compare with upstream's reference and thresholds (``kernelkit.check_is_allclose``):

- ``prefill``: ``tests/test_flash_mla_sparse_prefill.py``'s correctness grid (d_qk 512/576, h_q 64/128, its
  (s_kv, topk) pairs, s_q 1/62/213, sinks, topk lengths, all-invalid rows);
- ``decode``: ``tests/test_flash_mla_sparse_decoding.py``'s correctness and corner cases (656-byte V3.2 and
  584-byte V4 records, the extra cache, topk lengths, sinks, zero-length caches), batch capped at
  ``--max-batch`` (default 8: upstream's b = 321 needs ~20 GB for its own fp32 reference);
- ``dense``: ``tests/test_flash_mla_dense_decoding.py``'s grid (b 1/2/6, s_q 1/2/4, s_k 20/140/1024, h_q, h_kv,
  varlen, causal);
- ``fmha``: ``tests/test_fmha_sm100.py``'s ``test_flash_attention`` (``flash_attn_varlen_func``: its (h, h_k) and
  (d, dv) pairs, varlen, causal, the backward where h == h_k, the determinism reruns) at mean lengths 64 / 96
  instead of 4096 / 8192 (``triton.testing.do_bench`` runs the function once).

Not run in CI (it needs the upstream checkout); on this 2-core machine 12 prefill cases take ~20 s, 80 decode
cases ~150 s, 40 dense cases ~25 s.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch


def _cpu_harness() -> None:
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.set_device = lambda *a, **k: None
    torch.cuda.manual_seed = lambda *a, **k: None
    torch.cuda.empty_cache = lambda *a, **k: None
    torch.Tensor.cuda = lambda self, *a, **k: self
    import torch_ascend_moe.flash_mla as flash_mla

    sys.modules["flash_mla"] = flash_mla
    torch.set_default_dtype(torch.bfloat16)
    torch.set_default_device("cpu")


def _prefill(rng: random.Random, n: int) -> None:
    import test_flash_mla_sparse_prefill as T
    from lib import TestParam

    pairs = [(128, 128), (256, 256), (512, 512), (592, 128), (1840, 256), (1592, 384), (1521, 512), (95, 128)]
    pairs += [(153, 256), (114, 384), (32, 2048)]
    cases = [
        TestParam(
            s_q,
            s_kv,
            topk,
            h_q=h_q,
            num_runs=0,
            d_qk=d_qk,
            have_attn_sink=sink,
            have_topk_length=length,
            is_all_indices_invalid=invalid,
        )  # fmt: skip
        for d_qk in (512, 576)
        for h_q in (128, 64)
        for s_kv, topk in pairs
        for s_q in (1, 62, 213)
        for sink in (False, True)
        for length in (False, True)
        for invalid in (False, True)
    ]
    for case in rng.sample(cases, n):
        assert T.run_test(case), case


def _decode(rng: random.Random, n: int, max_batch: int) -> None:
    import test_flash_mla_sparse_decoding as T

    cases = [c for c in T.gen_testcase() if c.check_correctness and c.num_runs == 0]
    for case in rng.sample(cases, n):
        case.b = min(case.b, max_batch)
        assert T.test_flash_mla(case.to_test_param()).is_correct, case


def _dense(rng: random.Random, n: int) -> None:
    import test_flash_mla_dense_decoding as T

    cases = [
        T.TestParam(b, s_q, s_k, varlen, causal, test_performance=False, h_q=h_q, h_kv=h_kv)
        for b in (1, 2, 6)
        for s_q in (1, 2, 4)
        for s_k in (20, 140, 1024)
        for h_q in (1, 3, 9, 64, 128)
        for h_kv in (1, 2, 3, 8)
        for varlen in (False, True)
        for causal in (False, True)
        if h_q % h_kv == 0
    ]
    for case in rng.sample(cases, n):
        T.test_flash_mla(case)  # asserts itself


def _fmha(rng: random.Random, n: int) -> None:
    import test_fmha_sm100 as T
    import triton.testing

    triton.testing.do_bench = lambda fn, **kwargs: (fn(), 1.0)[1]  # its timer: one run, no CUDA events
    cases = [
        (h, h_k, d, dv, varlen, causal)
        for h, h_k in ((16, 16), (8, 2))
        for d, dv in ((128, 128), (192, 128))
        for varlen in (False, True)
        for causal in (False, True)
    ]
    for h, h_k, d, dv, varlen, causal in rng.sample(cases, min(n, len(cases))):
        T.h, T.h_k = h, h_k  # its reference reads them as globals (set by its __main__)
        T.test_flash_attention(2, 64, 96, varlen, h, h_k, d, dv, causal, 0, h == h_k)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("flashmla", type=Path, help="a checkout of deepseek-ai/FlashMLA")
    parser.add_argument("mode", choices=("prefill", "decode", "dense", "fmha"))
    parser.add_argument("cases", type=int, nargs="?", default=20)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sys.path.insert(0, str(args.flashmla / "tests"))
    _cpu_harness()
    rng, start = random.Random(args.seed), time.time()
    if args.mode == "prefill":
        _prefill(rng, args.cases)
    elif args.mode == "decode":
        _decode(rng, args.cases, args.max_batch)
    elif args.mode == "dense":
        _dense(rng, args.cases)
    else:
        _fmha(rng, args.cases)
    print(f"upstream {args.mode}: {args.cases} cases passed in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
