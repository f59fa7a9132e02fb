"""Run DeepGEMM's own tests against ``torch_ascend_moe.deep_gemm`` on the CPU.

    python tools/deepgemm_upstream_tests.py /path/to/DeepGEMM [test files ...] [--arch 9|10] [--cases N]
        [--max-dim D] [--seed S]

``/path/to/DeepGEMM`` is a checkout of deepseek-ai/DeepGEMM (tested with 54e2261): its ``tests/`` files are copied
to a temporary directory with every ``'cuda'`` device string turned into ``'cpu'`` and run by pytest with
``import deep_gemm`` resolving to our package. Upstream's shape generators (``tests/generators.py``) are scaled for a
CPU: every case's sizes above ``--max-dim`` (default 576) become ``256 + size % 256`` (keeping the tails and the
128-alignment that matter to the kernels), and each generator yields ``--cases`` of its cases (default 6, drawn with
``--seed``); ``test_attention.py``'s and ``test_einsum.py``'s own size lists are scaled in their text
(``SCALED_TEXT``), the former's cases sampled by its ``DG_MQA_NUM_CASES``. ``get_arch_major()`` answers ``--arch``
(9: SM90's FP32 scales and 1D2D kernels; 10: SM100's UE8M0 scales, FP4 operands and MN-major inputs), and
``bench_kineto`` returns at once (``DG_USE_NVIDIA_TOOLS=1``), so the tests check values with upstream's own
references and thresholds, not speed.

Not run in CI (it needs the upstream checkout). Files that need CUDA itself (``test_sanitizer.py``: CUDA's
compute-sanitizer; ``test_lazy_init.py``: a CUDA context) or several GPUs (``test_mega_moe.py``) are not in the
default list.
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
]

CONFTEST = """
import functools
import random

import torch

import torch_ascend_moe.deep_gemm as dg
from torch_ascend_moe.testing.upstream import install_as
import torch_ascend_moe.deep_gemm.testing

install_as(dg, "deep_gemm")  # every module under upstream's name

dg.testing.get_arch_major = lambda: ARCH
torch.Tensor.cuda = lambda self, *a, **k: self
for name in ("synchronize", "empty_cache", "reset_peak_memory_stats", "manual_seed", "set_device"):
    setattr(torch.cuda, name, lambda *a, **k: None)
torch.cuda.max_memory_allocated = torch.cuda.max_memory_reserved = lambda *a, **k: 0

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
                yield FIXUPS.get(name, lambda c: c)(tuple(_small(v) for v in case))

    return wrapper


# Sizes that must stay consistent after scaling: a masked batch's max_m holds 1.3x the expected rows per group.
FIXUPS = {"enumerate_m_grouped_masked": lambda c: (*c[:3], max(c[3], 2 * c[4]), *c[4:])}



def pytest_collection_modifyitems(config, items):
    # deep_gemm.testing.test_filter (a decorator the files import) is not a test: upstream runs the files as scripts.
    items[:] = [item for item in items if item.name != "test_filter"]


for name in dir(generators):
    if name.startswith("enumerate_") and name != "enumerate_k_grouped_contiguous_test_variants":
        setattr(generators, name, _scaled(name, getattr(generators, name)))
"""


# test_attention.py and test_einsum.py enumerate their own cases (not through generators.py): their sizes are
# scaled in their text (every occurrence).
SCALED_TEXT = {
    "test_attention.py": [
        ("for m in (128, 4096):", "for m in (128, 256):"),
        ("[(32768, 512), (8192, 512)]", "[(1024, 512), (512, 512)]"),
        ("for seq_len in (2048, 8192):", "for seq_len in (128, 256):"),
        ("for seq_len_kv in (8192, 65536):", "for seq_len_kv in (512, 1024):"),
        ("for batch_size in (256, 4096):", "for batch_size in (4, 8):"),
        ("for avg_kv in (8192, 65536):", "for avg_kv in (256, 1024):"),
    ],
    "test_einsum.py": [
        ("for s in (129, 4096, 8192):", "for s in (129, 256):"),
        ("for b in (4, 32, 128, 4096, 8192):", "for b in (4, 32, 129):"),
        ("(8, 4096, 1024)]", "(8, 512, 256)]"),
        ("for b in (4096, 8192):", "for b in (256, 384):"),
    ],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", type=Path)
    parser.add_argument("tests", nargs="*", default=DEFAULT_TESTS)
    parser.add_argument("--arch", type=int, choices=(9, 10), default=10)
    parser.add_argument("--cases", type=int, default=6)
    parser.add_argument("--max-dim", type=int, default=576)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.environ["DG_USE_NVIDIA_TOOLS"] = "1"  # bench_kineto: no profiling, values only
    os.environ["DG_MQA_NUM_CASES"] = str(args.cases)  # test_attention.py's own sampling of its cases
    import pytest

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "dg_tests"
        root.mkdir()
        header = f"ARCH, CASES, MAX_DIM, SEED = {args.arch}, {args.cases}, {args.max_dim}, {args.seed}\n"
        (root / "conftest.py").write_text(header + CONFTEST)
        for rel in ["generators.py", *args.tests]:
            source = (args.checkout / "tests" / rel).read_text()
            source = source.replace("'cuda'", "'cpu'").replace('"cuda"', '"cpu"')  # every device string
            for before, after in SCALED_TEXT.get(rel, []):
                if before not in source:
                    raise SystemExit(f"{rel}: expected {before!r} (another DeepGEMM version?)")
                source = source.replace(before, after)
            (root / rel).write_text(source)
        sys.path.insert(0, str(root))  # upstream's tests import `generators` as a top-level module
        return pytest.main([str(root), "-q", "-p", "no:cacheprovider", "-rf"])


if __name__ == "__main__":
    sys.exit(main())
