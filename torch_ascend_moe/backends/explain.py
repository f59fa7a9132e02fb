"""Explaining a kernel choice for a call given on the command line or saved from a program: ``python -m
torch_ascend_moe info --explain OP --device cuda --args "..."`` or ``--call FILE`` (``save_call``).

A call written as text: arguments separated by spaces, tensors as ``dtype[d0,d1,...]`` (random values; a trailing
``T`` makes a transposed view of the last two dims: ``float8_e4m3fn[7168,128]T`` is ``[128, 7168]`` MN-major),
everything else a Python literal (``None``, ``1.0``, ``[1,128]``, ``True``) or a dtype name (``bfloat16``).
Trailing arguments with schema defaults may be left out. Tensors are made on the device when this machine has it,
else on the CPU (the report then says so: device-dependent answers, such as a GPU's capability, are the CPU's).
"""

from __future__ import annotations

import ast
import re
from typing import NamedTuple

import torch

from torch_ascend_moe import _registry
from torch_ascend_moe.backends import chain

_TENSOR = re.compile(r"^([a-z0-9_]+)\[([0-9, ]*)\](T?)$")


class Call(NamedTuple):
    op: str
    args: tuple


def _device_here(device: str) -> torch.device:
    if device == "cuda" and torch.cuda.is_available():
        return torch.device("cuda")
    if device == "npu" and hasattr(torch, "npu") and torch.npu.is_available():
        return torch.device("npu")
    return torch.device("cpu")


def _dtype(name: str) -> torch.dtype | None:
    dtype = getattr(torch, name, None)
    return dtype if isinstance(dtype, torch.dtype) else None


def _tensor(dtype: torch.dtype, shape: list[int], transposed: bool, device: torch.device) -> torch.Tensor:
    stored = [*shape[:-2], shape[-1], shape[-2]] if transposed and len(shape) >= 2 else shape
    if dtype.is_floating_point or dtype.is_complex:
        t = torch.randn(stored, device=device).clamp(-100, 100).to(dtype)
    elif dtype == torch.bool:
        t = torch.ones(stored, dtype=dtype, device=device)
    else:
        t = torch.zeros(stored, dtype=dtype, device=device)
    return t.transpose(-1, -2) if transposed and len(shape) >= 2 else t


def parse_value(text: str, device: torch.device):
    """One argument of a call written as text (see the module docstring)."""
    m = _TENSOR.match(text)
    if m:
        dtype = _dtype(m.group(1))
        if dtype is None:
            raise ValueError(f"unknown dtype {m.group(1)!r} in {text!r}")
        shape = [int(d) for d in m.group(2).replace(" ", "").split(",") if d]
        return _tensor(dtype, shape, bool(m.group(3)), device)
    dtype = _dtype(text)
    if dtype is not None:
        return dtype
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError) as e:
        raise ValueError(f"cannot read argument {text!r}: expected dtype[shape], a dtype name or a literal") from e


def parse_args(op: str, text: str, device: str = "cuda") -> Call:
    """``op``'s call from its arguments as text, every schema default filled."""
    if op not in _registry.op_names():
        raise ValueError(f"no op ascend_moe::{op}")
    here = _device_here(device)
    args = tuple(parse_value(part, here) for part in text.split())
    try:
        return Call(op, _registry.full_call(op, *args))
    except TypeError as e:
        raise ValueError(str(e)) from e


def save_call(path: str, op: str, *args, **kwargs) -> None:
    """Save a call of ``ascend_moe::op`` (its tensors on the CPU, shapes, strides and dtypes kept) for ``info
    --explain OP --call path`` on another machine."""
    full = _registry.full_call(op, *args, **kwargs)
    cpu = tuple(a.detach().cpu() if isinstance(a, torch.Tensor) else a for a in full)
    torch.save({"op": op, "args": cpu}, path)


def load_call(path: str, device: str = "cuda") -> Call:
    saved = torch.load(path, weights_only=True)
    here = _device_here(device)
    return Call(saved["op"], tuple(a.to(here) if isinstance(a, torch.Tensor) else a for a in saved["args"]))


def report(op: str, device: str, args: tuple) -> str:
    """``chain.explain`` as text: one line per kernel of ``op``'s chain on ``device``."""
    lines = [f"ascend_moe::{op} on {device}: kernel chain, first choice first"]
    tensors_on = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
    if tensors_on is not None and tensors_on.type != device and device != "cpu":
        lines.append(f"  (no {device} device here: the tensors are on {tensors_on}; device-dependent answers are its)")
    try:
        steps = chain.explain(op, device, *args)
    except (ValueError, RuntimeError, TypeError) as e:
        return "\n".join([*lines, f"  the op refuses the call: {e}"])
    for i, step in enumerate(steps, 1):
        lines.append(f"  {i}. {step.kernel.label:<48} {step.status}: {step.reason}")
    return "\n".join(lines)
