"""Argument errors are worded by one helper: ``checks.message`` (or ``checks.check_arg``) writes
``<op>: argument '<arg>' <what>: expected <expected>, got <actual>``; no module formats one by hand.

Read from the source (``ast``): every string literal and f-string of the package (docstrings excluded; comments
are not in the tree) that contains ``: argument '`` outside ``torch_ascend_moe/checks/`` is a hand-formatted
message, unless it is allowed below. A new module is checked without being listed."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "torch_ascend_moe"
NEEDLE = ": argument '"

# Files other work owns for now; their messages are converted there. Remove an entry once its file is done.
OWNED_ELSEWHERE: set[str] = set()

# Messages that are not of checks.message's form, so the helper cannot write them word for word (and tests pin
# the words): no <what> between the argument and ": expected", no "expected ..., got ..." part, or free text
# about autograd. Each is the literal as written, "{}" standing for a replacement field. To be decided later
# (reword to the shared form, or a second helper); an entry no longer found fails too, so the list only shrinks.
NOT_THE_FORM = {
    "torch_ascend_moe/autograd/fp8_gemm.py": [
        "ascend_moe::{}: argument '{}' requires grad, but scale factors are not differentiable here; quantize "
        "from a high-precision tensor inside fp8_linear / fp8_quant_gemm (straight-through estimator) and train "
        "that instead",
    ],
    "torch_ascend_moe/autograd/fp8_linear.py": [
        "ascend_moe::fp8_quant_gemm: argument '{}' requires grad, but the pre-quantized weight is not "
        "differentiable; train a high-precision weight with fp8_linear instead",
    ],
    "torch_ascend_moe/autograd/grouped.py": [
        "ascend_moe::{}: argument 'quant_gran_k' is {}, but the FP8 output has no gradient; train with quant_gran_k=0",
        "ascend_moe::{}: argument '{}' requires grad, but the pre-quantized experts are not differentiable; train "
        "high-precision experts with m_grouped_fp8_linear instead",
        "ascend_moe::{}: argument '{}' requires grad, but scale factors are not differentiable here{}",
        "ascend_moe::{}: argument '{}' requires grad, but scale factors are not differentiable here{}",
    ],
    "torch_ascend_moe/autograd/quant.py": [
        "ascend_moe::dequantize: argument 'scale' requires grad, but only FP32 scales are differentiable (got {}: "
        "UE8M0 scales are exponent codes)",
    ],
    "torch_ascend_moe/backends/portable/ep/expand.py": [
        "{}: argument 'num_rows' value: too small for the layout",
    ],
    "torch_ascend_moe/deep_ep/utils/testing.py": [
        "bench_kineto: argument 'kernel_names': expected a str or tuple, got {}",
    ],
    "torch_ascend_moe/deep_gemm/epilogue.py": [
        "{}: argument 'epilogue': expected None, {}, got {}",
        "{}: argument 'alpha': expected None when epilogue=Alpha(...) is given, got {}",
    ],
    "torch_ascend_moe/deep_gemm/fp8_gemm.py": [
        "{}: argument '{}': expected a (data, scale factors) tuple, got {}",
    ],
    "torch_ascend_moe/deep_gemm/layout.py": [
        "{}: argument 'recipe': expected a supported combination (FP32 (1, gk) or (128, 128) with "
        "disable_ue8m0_cast; FP32 or int32 with gran_k 32 or 128), got sf {}, recipe {}, disable_ue8m0_cast={}",
    ],
    "torch_ascend_moe/deep_gemm/runtime.py": [
        "deep_gemm.set_block_size_multiple_of: argument 'value': expected a positive int or pair, got {}",
        "set_mk_alignment_for_contiguous_layout: argument 'alignment': expected a positive int, got {}",
    ],
    "torch_ascend_moe/deep_gemm/testing/bench.py": [
        "bench_kineto: argument 'kernel_names': expected a str or tuple, got {}",
    ],
    "torch_ascend_moe/deep_gemm/utils/math.py": [
        "get_tma_aligned_size: argument 'element_size': expected a divisor of 16, got {}",
    ],
    "torch_ascend_moe/demo.py": [
        "demo: argument '--hidden': expected a multiple of 128 with --fp8, got {}",
        "demo: argument '--hidden': expected a multiple of the {} heads, got {}",
        "demo: argument '--experts': expected an even count (2 expert groups), got {}",
        "demo: argument '--topk': expected in [1, {}] (the experts of the 1 kept group of 2), got {}",
        "demo: argument '--hidden': expected a multiple of 16 with --mhc, got {}",
        "demo: argument '--experts': expected a multiple of --ep={}, got {}",
        "[red]demo: argument '--ep': expected the torchrun world size, got --ep {} with WORLD_SIZE={} "
        "(run: torchrun --nproc-per-node {} -m torch_ascend_moe demo --ep {})[/red]",
    ],
    "torch_ascend_moe/flash_mla/dense.py": [
        "{}: argument '{}': expected {}, got {}",
    ],
    "torch_ascend_moe/hf.py": [
        "swap_moe_blocks: {}: argument 'state_dict': missing {}",
    ],
    "torch_ascend_moe/nn/fp8_linear.py": [
        "FP8Linear: argument 'in_features': expected a multiple of block={}, got {}",
        "convert_to_fp8_linear: argument 'model': expected a module containing nn.Linear layers (a bare "
        "nn.Linear cannot be swapped in place; use FP8Linear.from_linear), got nn.Linear",
    ],
    "torch_ascend_moe/nn/grouped_experts.py": [
        "{}: argument 'activation': expected a callable or one of {}, got {}",
        "GroupedExperts: argument 'block': expected a positive integer with fp8=True, got {}",
    ],
    "torch_ascend_moe/nn/moe.py": [
        "{}: argument '{}': expected {}, got {}",
    ],
    "torch_ascend_moe/nn/sparse_attention.py": [
        "PagedDSACache: argument 'kv_format' value: 'fp8' (DeepSeek-V3.2's 656-byte records) needs kv_lora_rank "
        "512 and rope_dim 64, got {} and {}",
    ],
}


def _docstrings(tree: ast.Module) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _literals(source: str) -> list[str]:
    """Every string literal and f-string's text ("{}" for a replacement field), docstrings excluded."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip.update(id(v) for v in node.values)  # an f-string's parts count once, as the whole
        elif isinstance(node, ast.FormattedValue) and node.format_spec is not None:
            skip.add(id(node.format_spec))
    texts = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            texts.append(node.value)
        elif isinstance(node, ast.JoinedStr):
            texts.append("".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values))
    return texts


def hand_formatted(package: Path = PACKAGE) -> dict[str, list[str]]:
    """File (relative to the repository) -> its literals that read like an argument error."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).as_posix()
        if rel.startswith("torch_ascend_moe/checks/"):
            continue
        texts = [t for t in _literals(path.read_text()) if NEEDLE in t]
        if texts:
            found[rel] = texts
    return found


def test_literal_scan():
    source = (
        '"""A docstring: <op>: argument \'<arg>\' <what>."""\n'
        "# a comment: op: argument 'x' value\n"
        "def f(op, x):\n"
        '    """op: argument \'x\' here too."""\n'
        "    a = f\"{op}: argument 'x' value: expected 1, \" f'got {x!r:>4}'\n"
        "    b = 'op: argument ' + \"'y'\"\n"
        "    return a, b, 'ck: argument \\'z\\' rank'\n"
    )
    texts = [t for t in _literals(source) if NEEDLE in t]
    assert texts == ["{}: argument 'x' value: expected 1, got {}", "ck: argument 'z' rank"]


def test_argument_errors_go_through_checks_message():
    found = hand_formatted()
    stray, stale = [], []
    for rel, texts in found.items():
        if rel in OWNED_ELSEWHERE:
            continue
        left = Counter(texts)
        left.subtract(NOT_THE_FORM.get(rel, []))
        stray += [f"{rel}: {t!r}" for t, n in left.items() for _ in range(n)]
        stale += [f"{rel}: {t!r}" for t, n in left.items() for _ in range(-n)]
    stale += [f"{rel}: {t!r}" for rel in NOT_THE_FORM.keys() - found.keys() for t in NOT_THE_FORM[rel]]
    assert not stray, (
        "argument errors formatted by hand: word them with checks.message / checks.check_arg "
        "(torch_ascend_moe/checks/__init__.py):\n  " + "\n  ".join(stray)
    )
    assert not stale, "NOT_THE_FORM lists messages no longer in the sources: drop them:\n  " + "\n  ".join(stale)
