"""Run TileKernels' own tests against ``torch_ascend_moe.tile_kernels`` on the CPU.

    python tools/tilekernels_upstream_tests.py /path/to/TileKernels [test paths ...] [--cases N] [--tokens T]
        [--max-hidden H] [--seed S]

``/path/to/TileKernels`` is a checkout of deepseek-ai/TileKernels (tested with 36d9e45): its ``tests/`` files are
copied to a temporary directory with every ``'cuda'`` device string turned into ``'cpu'`` and run by pytest with
``import tile_kernels`` resolving to our package. Each test function runs ``--cases`` of its parametrized cases
(drawn with ``--seed``; default 4), benchmarks are skipped, and the MoE generators are scaled for a CPU:
``--tokens`` tokens per rank instead of 4001 (default 257), hidden sizes up to ``--max-hidden`` (default 2048).

Test paths are relative to ``tests/`` (default: every file: ``moe/`` gates, mapping, expand, reduce; ``mhc/``;
``engram/``; ``quant/`` casts and SwiGLU; ``transpose/``). Upstream's tests compare each kernel with
``tile_kernels.torch``'s reference, which here is the same implementation for most functions (so those comparisons
check the API: signatures, asserts, result structure, layouts, the mHC gradient protocol), while
``test_get_fused_mapping``, the cast tests' round trips and rounding-bias checks and the gate tests' own checks test
semantics. Our own tests judge the implementations against references
written from the spec. Not run in CI (it needs the upstream checkout).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

DEFAULT_TESTS = [
    "engram/test_engram_fused_weight.py",
    "engram/test_engram_gate_bwd.py",
    "engram/test_engram_gate_fwd.py",
    "engram/test_engram_grad_w_reduce.py",
    "engram/test_engram_hash.py",
    "moe/test_aux_fi.py",
    "moe/test_expand_to_fused.py",
    "moe/test_get_fused_mapping.py",
    "moe/test_group_count.py",
    "moe/test_inplace_unique_group_indices.py",
    "moe/test_mask_indices_by_tp.py",
    "moe/test_normalize_weight.py",
    "moe/test_reduce_fused.py",
    "moe/test_top2_sum_gate.py",
    "moe/test_topk_gate.py",
    "moe/test_topk_sum_and_topk_idx.py",
    "mhc/test_expand.py",
    "mhc/test_head_compute_mix.py",
    "mhc/test_multilayer_recompute.py",
    "mhc/test_norm_fn.py",
    "mhc/test_post.py",
    "mhc/test_pre_apply_mix.py",
    "mhc/test_pre_big_fuse.py",
    "mhc/test_pre_split_mixes.py",
    "mhc/test_sinkhorn.py",
    "quant/test_cast_back.py",
    "quant/test_cast_back_e5m6.py",
    "quant/test_per_token_cast_to_e5m6.py",
    "quant/test_per_block_cast.py",
    "quant/test_per_block_cast_lossless.py",
    "quant/test_per_channel_cast.py",
    "quant/test_per_channel_cast_and_transpose.py",
    "quant/test_per_channel_cast_fused.py",
    "quant/test_per_token_cast.py",
    "quant/test_swiglu_backward_and_per_token_cast.py",
    "quant/test_swiglu_forward_and_per_channel_cast_and_transpose.py",
    "quant/test_swiglu_forward_and_per_token_cast.py",
    "transpose/test_transpose.py",
]

CONFTEST = """
import hashlib
import random

import pytest
import torch

import torch_ascend_moe.tile_kernels as tk
from torch_ascend_moe.testing.upstream import install_as
from torch_ascend_moe.tile_kernels.testing import generator

install_as(tk, "tile_kernels")  # every module under upstream's name

torch.Tensor.cuda = lambda self, *a, **k: self
torch.cuda.synchronize = lambda *a, **k: None

_moe_params, _hidden_sizes, _tokens = (
    generator.generate_moe_params, generator.generate_hidden_sizes, generator.generate_num_tokens)
generator.generate_num_tokens = lambda alignment=1, is_benchmark=False: sorted(
    {min(t, -(-TOKENS // alignment) * alignment) for t in _tokens(alignment, is_benchmark)})
generator.generate_moe_params = lambda is_benchmark=False: [
    {**p, "num_send_tokens": min(p["num_send_tokens"], TOKENS)} for p in _moe_params(is_benchmark)]
generator.generate_hidden_sizes = lambda align=64: [h for h in _hidden_sizes(align) if h <= MAX_HIDDEN]


def pytest_configure(config):
    config.addinivalue_line("markers", "benchmark: upstream benchmark (skipped here)")


def pytest_collection_modifyitems(config, items):
    rng = random.Random(SEED)
    by_function, keep = {}, []
    for item in items:
        if item.get_closest_marker("benchmark") is None:
            by_function.setdefault((item.fspath, item.originalname), []).append(item)
    for group in by_function.values():
        keep += rng.sample(group, min(CASES, len(group)))
    items[:] = [i for i in items if i in keep]


@pytest.fixture(autouse=True)
def seed(request):
    value = SEED + int(hashlib.sha256(request.node.nodeid.encode()).hexdigest(), 16) % (2**31)
    torch.manual_seed(value)
    return value
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", type=Path)
    parser.add_argument("tests", nargs="*", default=DEFAULT_TESTS)
    parser.add_argument("--cases", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=257)
    parser.add_argument("--max-hidden", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import pytest

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "tk_tests"
        root.mkdir()
        header = f"TOKENS, MAX_HIDDEN, CASES, SEED = {args.tokens}, {args.max_hidden}, {args.cases}, {args.seed}\n"
        (root / "conftest.py").write_text(header + CONFTEST)
        for rel in args.tests:
            source = (args.checkout / "tests" / rel).read_text()
            source = source.replace("'cuda'", "'cpu'").replace('"cuda"', '"cpu"')  # every device string
            target = root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(source)
        return pytest.main([str(root), "-q", "-p", "no:cacheprovider", "--import-mode=importlib", "-rf"])


if __name__ == "__main__":
    sys.exit(main())
