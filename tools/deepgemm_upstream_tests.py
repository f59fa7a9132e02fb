"""Run DeepGEMM's own tests against ``torch_ascend_moe.deep_gemm`` on the CPU.

    python tools/deepgemm_upstream_tests.py /path/to/DeepGEMM [test files ...] [--arch 9|10] [--cases N]
        [--max-dim D] [--seed S]

``/path/to/DeepGEMM`` is a checkout of deepseek-ai/DeepGEMM (tested with 54e2261, 2.6.1; and with 2.8.0 "Public
Release 26/09" test files from the forks wangyicong52/DeepGEMM@be6df75, and vllm-project/DeepGEMM@63aa62a for its
self-contained ``test_mega_mhc.py``): its ``tests/`` files (and the helper modules beside them, ``generators.py`` and,
from 2.8, ``utils.py``) are copied to a temporary directory with every ``'cuda'`` device string turned into ``'cpu'``
and run by pytest with ``import deep_gemm`` resolving to our package. Upstream's shape generators
(``tests/generators.py``, and the test files' own ``enumerate_*`` lists named in ``LOCAL_GENERATORS``) are scaled for
a CPU: every case's sizes above ``--max-dim`` (default 576) become ``256 + size % 256`` (keeping the tails and the
128-alignment that matter to the kernels), and each generator yields ``--cases`` of its cases (default 6, drawn with
``--seed``); ``test_attention.py``'s and ``test_einsum.py``'s own size lists are scaled in their text
(``SCALED_TEXT``), the former's cases sampled by its ``DG_MQA_NUM_CASES``. ``get_arch_major()`` answers ``--arch`` (9:
SM90's FP32 scales and 1D2D kernels; 10: SM100's UE8M0 scales, FP4 operands and MN-major inputs, and 2.8's SM100-only
sparse MQA logits, Mega Gate and Mega mHC), and ``bench_kineto`` returns at once (``DG_USE_NVIDIA_TOOLS=1``), so the
tests check values with upstream's own references and thresholds, not speed.

Not run in CI (it needs the upstream checkout). Files that need CUDA itself (``test_sanitizer.py``: CUDA's
compute-sanitizer; ``test_lazy_init.py``: a CUDA context) or several GPUs (``test_mega_moe.py``) are not in the
default list; the default list's files a checkout lacks (2.6.1 has no Mega Gate or Mega mHC) are left out. Within a
file, the parts that only mean something on a GPU are cut from its text (``CUDA_ONLY_TEXT``), and CUDA streams are
plain CPU stand-ins (work runs in order on the CPU).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

DEFAULT_TESTS = [
    "test_attention.py",
    "test_bf16.py",
    "test_einsum.py",
    "test_fp8_fp4.py",
    "test_hyperconnection.py",
    "test_layout.py",
    "test_legacy.py",
    "test_mega_gate.py",
    "test_mega_mhc.py",
]

CONFTEST = """
import contextlib
import functools
import random
from pathlib import Path

import torch

import torch_ascend_moe.deep_gemm as dg
from torch_ascend_moe.testing.upstream import install_as
import torch_ascend_moe.deep_gemm.testing

install_as(dg, "deep_gemm")  # every module under upstream's name
try:
    import tile_kernels  # noqa: F401
except ImportError:
    # 2.8's test_mega_gate.py imports TileKernels' gate for its timing baseline (never run here: bench_kineto returns
    # at once); our TileKernels package stands in so that the file imports.
    import torch_ascend_moe.tile_kernels as tk

    install_as(tk, "tile_kernels")

dg.testing.get_arch_major = lambda: ARCH
torch.Tensor.cuda = lambda self, *a, **k: self
for name in ("synchronize", "empty_cache", "reset_peak_memory_stats", "manual_seed", "set_device"):
    setattr(torch.cuda, name, lambda *a, **k: None)
torch.cuda.max_memory_allocated = torch.cuda.max_memory_reserved = lambda *a, **k: 0


class _Stream:
    # 2.8's Mega mHC test runs the op on side streams (per-stream split barriers): on the CPU work runs in order, so a
    # stream is a name with nothing to wait for, and the check becomes "repeated calls are bitwise equal".
    def __init__(self, *args, **kwargs):
        pass

    def synchronize(self):
        pass

    def wait_stream(self, other):
        pass


torch.cuda.Stream = _Stream
torch.cuda.stream = lambda stream=None: contextlib.nullcontext()

import generators  # noqa: E402  (upstream's tests/generators.py, next to this file)


def _small(value):
    if isinstance(value, bool) or not isinstance(value, int) or value <= MAX_DIM:
        return value
    return 256 + value % 256


def _scaled(name, enumerate_fn):
    @functools.wraps(enumerate_fn)
    def wrapper(*args, **kwargs):
        # Two passes: some generators set global state (the contiguous-layout alignment) as they yield a case, so
        # the kept cases are taken lazily from a second run, in step with that state.
        count = sum(1 for _ in enumerate_fn(*args, **kwargs))
        kept = set(random.Random(f"{SEED}/{name}").sample(range(count), min(CASES, count)))
        for i, case in enumerate(enumerate_fn(*args, **kwargs)):
            if i in kept:
                yield FIXUPS.get(name, lambda case, c: c)(case, tuple(_small(v) for v in case))

    return wrapper


def _k_grouped(case, c):
    # (num_groups, m, n, major_a, major_b, real_ks, aligned_ks, expected_k, gran_k, k_alignment, ...): the K
    # alignment is a layout parameter the generator has just set globally (2.8's FP4 uses 768), not a size; the
    # per-group K sizes (a list, which _small leaves alone) are scaled too, as each K group costs a GEMM per call
    # (2.8 repeats every call 20 times), and the aligned sizes follow them.
    alignment = case[9]
    real_ks = [_small(k) for k in case[5]]
    return (*c[:5], real_ks, [-(-k // alignment) * alignment for k in real_ks], *c[7:9], alignment, *c[10:])


# Sizes that must stay consistent after scaling (each fixup gets the case before and after): a masked batch's max_m
# holds 1.3x the expected rows per group; the k-grouped K lists; Mega mHC takes only hidden sizes that are
# multiples of 1024 (cases: (sf_layout, tokens, hidden)).
FIXUPS = {
    "enumerate_m_grouped_masked": lambda case, c: (*c[:3], max(c[3], 2 * c[4]), *c[4:]),
    "enumerate_k_grouped_contiguous": _k_grouped,
    "test_mega_mhc.py:enumerate_cases": lambda case, c: (*c[:2], 1024),
}

# Test files' own case generators, scaled and sampled as generators.py's are (names of either 2.8 variant: the
# be6df75 form's enumerate_perf_cases, the vllm-project form's enumerate_cases).
LOCAL_GENERATORS = {
    "test_mega_gate.py": ("enumerate_perf_cases", "enumerate_cases"),
    "test_mega_mhc.py": ("enumerate_cases",),
}


def pytest_collection_modifyitems(config, items):
    # deep_gemm.testing.test_filter (a decorator the files import) is not a test: upstream runs the files as scripts.
    items[:] = [item for item in items if item.name != "test_filter"]
    # The test functions look their generators up at call time, so wrapping the module attribute now is enough.
    for module in {item.module for item in items}:
        file = Path(module.__file__).name
        for name in LOCAL_GENERATORS.get(file, ()):
            if hasattr(module, name):
                setattr(module, name, _scaled(f"{file}:{name}", getattr(module, name)))


for name in dir(generators):
    if name.startswith("enumerate_") and name != "enumerate_k_grouped_contiguous_test_variants":
        setattr(generators, name, _scaled(name, getattr(generators, name)))
"""


# test_attention.py and test_einsum.py enumerate their own cases (not through generators.py): their sizes are
# scaled in their text (every occurrence). Each group of replacements applies where its guard (a text the file holds
# in the versions that have those lists; None: every version) is found, and then each of its texts must be there.
SCALED_TEXT = {
    "test_attention.py": [
        (
            None,
            [
                ("for m in (128, 4096):", "for m in (128, 256):"),
                ("[(32768, 512), (8192, 512)]", "[(1024, 512), (512, 512)]"),
                ("for seq_len in (2048, 8192):", "for seq_len in (128, 256):"),
                ("for seq_len_kv in (8192, 65536):", "for seq_len_kv in (512, 1024):"),
                ("for batch_size in (256, 4096):", "for batch_size in (4, 8):"),
                ("for avg_kv in (8192, 65536):", "for avg_kv in (256, 1024):"),
            ],
        ),
        # 2.8's sparse MQA logits: every size 64x smaller, so that the sampled blocks still cover a fraction of the
        # context (NB * sparse_block_kv < avg_kv: the random, 80%-kept block choice) and NB stays a multiple of 4. The
        # metadata edge cases keep their S (from num_sms) and small kv (0, 1, 639-641: the 640-token MXFP4 split),
        # the long contexts shrink (the dense reference is computed over the whole context).
        (
            "def test_sparse_mqa_logits",
            [
                (
                    "avg_kv_lens = (4 * 1024, 8 * 1024, 16 * 1024, 32 * 1024, 64 * 1024, 128 * 1024, 256 * 1024)",
                    "avg_kv_lens = (64, 128, 256, 512, 1024, 2048, 4096)",
                ),
                ("for num_max_sparse_blocks in (2048, 1024, 512):", "for num_max_sparse_blocks in (32, 16, 8):"),
                ("for num_q_tokens in (8192, ):", "for num_q_tokens in (128, ):"),
                ("for num_q_tokens in (512, ):", "for num_q_tokens in (32, ):"),
                ("16 * 1024 + 3", "1024 + 3"),
                ("64 * 1024 + 7", "4 * 1024 + 7"),
                ("(True, 3, 1024 * 1024, 8, 2048)", "(True, 3, 64 * 1024, 8, 2048)"),
            ],
        ),
    ],
    "test_einsum.py": [
        (
            None,
            [
                ("for s in (129, 4096, 8192):", "for s in (129, 256):"),
                ("for b in (4, 32, 128, 4096, 8192):", "for b in (4, 32, 129):"),
                ("(8, 4096, 1024)]", "(8, 512, 256)]"),
                ("for b in (4096, 8192):", "for b in (256, 384):"),
            ],
        ),
    ],
}

# Parts of a test function that only mean something on a GPU, cut from the text: from the line holding the first
# text up to (not including) the line holding the second. 2.8's Mega mHC API-contract test captures a CUDA graph and
# expects the capture to fail until the stream has run the op once (its barriers are allocated outside capture);
# the CPU has no capture to fail.
CUDA_ONLY_TEXT = {
    "test_mega_mhc.py": [
        (
            "# A stream must initialize its split barriers before CUDA Graph capture",
            "# FP8-only calls remain bitwise stable",
        ),
    ],
}


def _cut(rel: str, source: str, first: str, last: str) -> str:
    lines = source.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if first in line]
    ends = [i for i, line in enumerate(lines) if last in line]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise SystemExit(f"{rel}: expected {first!r} once, then {last!r} (another DeepGEMM version?)")
    return "".join(lines[: starts[0]] + lines[ends[0] :])


def _adapt(rel: str, source: str) -> str:
    source = source.replace("'cuda'", "'cpu'").replace('"cuda"', '"cpu"')  # every device string
    for guard, replacements in SCALED_TEXT.get(rel, []):
        if guard is not None and guard not in source:
            continue
        for before, after in replacements:
            if before not in source:
                raise SystemExit(f"{rel}: expected {before!r} (another DeepGEMM version?)")
            source = source.replace(before, after)
    for first, last in CUDA_ONLY_TEXT.get(rel, []):
        source = _cut(rel, source, first, last)
    return source


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", type=Path)
    parser.add_argument("tests", nargs="*")
    parser.add_argument("--arch", type=int, choices=(9, 10), default=10)
    parser.add_argument("--cases", type=int, default=6)
    parser.add_argument("--max-dim", type=int, default=576)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    tests_dir = args.checkout / "tests"
    # The default list holds every version's files; a named file must exist.
    tests = args.tests or [rel for rel in DEFAULT_TESTS if (tests_dir / rel).exists()]
    # Upstream's helper modules, imported by the tests as top-level modules: generators.py, and from 2.8 utils.py.
    helpers = sorted(p.name for p in tests_dir.glob("*.py") if not p.name.startswith(("test_", "conftest")))
    os.environ["DG_USE_NVIDIA_TOOLS"] = "1"  # bench_kineto: no profiling, values only
    os.environ["DG_MQA_NUM_CASES"] = str(args.cases)  # test_attention.py's own sampling of its cases
    import pytest

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "dg_tests"
        root.mkdir()
        header = f"ARCH, CASES, MAX_DIM, SEED = {args.arch}, {args.cases}, {args.max_dim}, {args.seed}\n"
        (root / "conftest.py").write_text(header + CONFTEST)
        for rel in [*helpers, *tests]:
            (root / rel).write_text(_adapt(rel, (tests_dir / rel).read_text()))
        sys.path.insert(0, str(root))  # upstream's tests import their helpers as top-level modules
        return pytest.main([str(root), "-q", "-p", "no:cacheprovider", "-rf"])


if __name__ == "__main__":
    sys.exit(main())
