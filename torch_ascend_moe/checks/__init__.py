"""Argument validation: the shared helpers here (C++ twin: ``csrc/ops/checks.h``), one module per family.

``checks/<family>.py`` holds a family's signature checks and ``csrc/ops/<family>_checks.h`` their C++ twin:
the same functions, the same checks in the same order, the same words (tests/test_validation_twins.py
compares them). Fakes (``fakes/``), Python kernels and compat packages call the Python side.

Messages read ``<op>: argument '<arg>' <what>: expected <expected>, got <actual>`` everywhere, so a bad
call fails with the same words in eager (C++ kernel), under ``torch.compile`` (fake) and on CUDA/NPU.
Conditions may be SymBools: ``torch._check_value`` turns them into guards or runtime asserts.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

GEMM_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
GEMM_DTYPES_TEXT = "one of " + ", ".join(str(d) for d in GEMM_DTYPES)


def _text(x) -> str:
    """Format a message value; a symbolic size prints as the int eager would show."""
    x = x() if callable(x) else x
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(_text(v) for v in x) + "]"
    if isinstance(x, (int, torch.SymInt)) and not isinstance(x, bool):
        # Dynamo cannot print a size it is tracing (it sees SymInts as ints); fakes print the example
        # value (specializing it is harmless: this runs only on the failure path).
        return "<traced size>" if torch.compiler.is_dynamo_compiling() else str(int(x))
    return str(x)


def message(op: str, arg: str, what: str, expected: object, actual: object) -> str:
    return f"{op}: argument '{arg}' {what}: expected {_text(expected)}, got {_text(actual)}"


def check_arg(cond, op: str, arg: str, what: str, expected: object, actual: object) -> None:
    """Raise ValueError with the shared message unless ``cond`` holds.

    ``expected``/``actual`` may be zero-argument callables, formatted only on failure. A symbolic
    condition in a fake becomes a guard or runtime assert (``torch._check_value``); while Dynamo traces
    (compat functions under torch.compile) it is branched on, since Dynamo cannot take a message closure
    over tensors.
    """
    if isinstance(cond, torch.SymBool) and not torch.compiler.is_dynamo_compiling():
        torch._check_value(cond, lambda: message(op, arg, what, expected, actual))
    elif not cond:
        raise ValueError(message(op, arg, what, expected, actual))


# Upper bound of every integer argument (alignments, block sizes, counts, lengths): layouts and lengths are
# int32, and with every argument and size below 2^31 a product or round-up of two of them stays inside
# int64, where the C++ kernels compute (their build wraps on overflow, so an unbounded argument would
# corrupt results silently). Python ints never overflow, but both paths must give one verdict.
MAX_INT_ARG = 2147483647
MAX_INT_ARG_TEXT = "at most 2147483647 (integer arguments are int32-sized)"


def check_int_arg(op: str, arg: str, value, lo: int) -> None:
    """``value`` in ``[lo, 2^31 - 1]``; ``lo`` is 0 or 1, read as "non-negative" or "positive"."""
    check_arg(value >= lo, op, arg, "value", "a positive integer" if lo > 0 else "a non-negative integer", value)
    check_arg(value <= MAX_INT_ARG, op, arg, "value", MAX_INT_ARG_TEXT, value)


def check_recipe(op: str, arg: str, recipe) -> None:
    """A recipe ``[gran_mn, gran_k]``: two positive entries, each bounded as ``check_int_arg`` does."""
    check_arg(
        len(recipe) == 2 and recipe[0] > 0 and recipe[1] > 0,
        op,
        arg,
        "value",
        "[gran_mn, gran_k] with positive entries",
        lambda: list(recipe),
    )
    check_arg(
        recipe[0] <= MAX_INT_ARG and recipe[1] <= MAX_INT_ARG,
        op,
        arg,
        "value",
        "[gran_mn, gran_k] with entries at most 2147483647",
        lambda: list(recipe),
    )


# Scales a GEMM-like kernel reads as they are (packed int32/int16 UE8M0 words are unpacked by the caller first).
SCALE_DTYPES = (torch.float32, torch.float8_e8m0fnu)


def check_scale_dtype(op: str, sf_name: str, sf: torch.Tensor) -> None:
    """FP32 or E8M0 scales (fp8_gemm's and mqa_logits' operands)."""
    check_arg(
        sf.dtype in SCALE_DTYPES,
        op,
        sf_name,
        "dtype",
        "torch.float32 or torch.float8_e8m0fnu (unpack int32/int16 UE8M0 first)",
        sf.dtype,
    )


def shape_str(shape: Sequence) -> str:
    return _text(list(shape))


def check_rank(op: str, arg: str, t: torch.Tensor, rank: int, layout: str) -> None:
    check_arg(
        t.dim() == rank,
        op,
        arg,
        "rank",
        f"{rank}-D {layout}",
        lambda: f"{t.dim()}-D tensor of shape {shape_str(t.shape)}",
    )


def check_same_device(op: str, arg: str, t: torch.Tensor, ref: torch.Tensor) -> None:
    check_arg(t.device == ref.device, op, arg, "device", lambda: f"{ref.device} (same as 'a')", t.device)


def check_dim_size(op: str, arg: str, t: torch.Tensor, dim: int, what: str, expected, source: str) -> None:
    check_arg(
        t.shape[dim] == expected,
        op,
        arg,
        f"size({dim}) ({what})",
        lambda: f"{_text(expected)} ({source})",
        lambda: t.shape[dim],
    )


def check_operand_dtypes(op: str, a: torch.Tensor, b: torch.Tensor) -> None:
    check_arg(a.dtype in GEMM_DTYPES, op, "a", "dtype", GEMM_DTYPES_TEXT, a.dtype)
    check_arg(b.dtype == a.dtype, op, "b", "dtype", lambda: f"{a.dtype} (same as 'a')", b.dtype)


def resolve_out_dtype(op: str, a: torch.Tensor, c: torch.Tensor | None, out_dtype: torch.dtype | None) -> torch.dtype:
    """out_dtype if given, else c's dtype, else a's dtype; c must agree with it."""
    if out_dtype is not None:
        check_arg(out_dtype in GEMM_DTYPES, op, "out_dtype", "value", GEMM_DTYPES_TEXT, out_dtype)
    resolved = out_dtype if out_dtype is not None else (c.dtype if c is not None else a.dtype)
    if c is not None:
        check_arg(c.dtype == resolved, op, "c", "dtype", lambda: f"{resolved} (out_dtype)", c.dtype)
    return resolved


def check_accumulator(op: str, c: torch.Tensor | None, a: torch.Tensor, out_shape: Sequence) -> None:
    if c is None:
        return
    check_same_device(op, "c", c, a)
    same = c.dim() == len(out_shape) and all(x == y for x, y in zip(c.shape, out_shape))
    check_arg(same, op, "c", "shape", lambda: f"{shape_str(out_shape)} (the output shape)", lambda: shape_str(c.shape))
