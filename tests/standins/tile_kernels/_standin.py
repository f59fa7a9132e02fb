"""Control surface of the ``tile_kernels`` stand-in (not TileKernels' API).

* ``configure(version="36d9e45" | "cd8f86c", arch=9 | 10)``: which release the package imitates (see the package
  docstring) and the GPU's SM major (the vector width the casts load: 16 bytes on SM90, 32 on SM100,
  ``quant/common.py`` ``get_best_vectorize_size``). Names a release lacks are removed from the package (``hasattr`` is
  how a caller tells releases apart); ``import tile_kernels.transform`` fails on 36d9e45.
* ``CALLS`` / ``reset()``: every public kernel function appends ``(name, {argument: description})`` before any check
  runs; a tensor is described as ``(dtype, shape, stride, data_ptr)``, a tuple element-wise, anything else as is.
* ``Panic`` (a ``RuntimeError``): where the real kernel would not raise but trap (a misaligned vector load) or write
  garbage (a weight slot it never loads, a ``grad_out`` it reads as BF16 whatever its dtype).
* ``check(cond, where, text)``: upstream's bare ``assert`` as an ``AssertionError`` naming upstream's file:line and
  condition (upstream's asserts carry no message).
"""

from __future__ import annotations

import sys

import torch

CALLS: list = []
VERSIONS = ("36d9e45", "cd8f86c")
STATE = {"version": "36d9e45", "arch": 9, "num_sms": 0}
DEVICE_SMS = {9: 132, 10: 148}


class Panic(RuntimeError):
    """The real kernel would not raise here: it would trap on the device or write garbage."""


def configure(version: str = "36d9e45", arch: int = 9) -> None:
    if version not in VERSIONS:
        raise ValueError(f"tile_kernels stand-in: version must be one of {VERSIONS}, got {version!r}")
    if arch not in DEVICE_SMS:
        raise ValueError(f"tile_kernels stand-in: arch must be 9 (SM90) or 10 (SM100), got {arch!r}")
    STATE.update(version=version, arch=arch, num_sms=0)
    _apply_version()


def reset() -> None:
    CALLS.clear()


def later() -> bool:
    """Whether the imitated release is the later one (cd8f86c: ``norm_forward``, ``transform``)."""
    return STATE["version"] == "cd8f86c"


def vector_bytes() -> int:
    return 32 if STATE["arch"] >= 10 else 16


def describe(v):
    if isinstance(v, torch.Tensor):
        return (v.dtype, tuple(v.shape), tuple(v.stride()), v.data_ptr())
    if isinstance(v, (tuple, list)):
        return tuple(describe(e) for e in v)
    return v


def record(name: str, **arguments) -> None:
    CALLS.append((name, {k: describe(v) for k, v in arguments.items()}))


def check(cond: bool, where: str, text: str) -> None:
    if not cond:
        raise AssertionError(f"tile_kernels stand-in: {where}: assert {text}")


def aligned_loads(name: str, t: torch.Tensor) -> None:
    """The kernel's vector loads: a base or row stride off the vector width traps (misaligned address)."""
    width = vector_bytes()
    if t.numel() and (
        t.data_ptr() % width or (t.dim() > 1 and t.shape[0] > 1 and t.stride(0) * t.element_size() % width)
    ):
        raise Panic(f"{name}: {width}-byte vector loads from a misaligned address (the kernel traps)")


# The package's modules (kept here: ``import tile_kernels.transform`` is made to fail on 36d9e45).
MODULES: dict = {}
# Later-release names, removed from the package while it imitates 36d9e45.
_LATER = {
    "tile_kernels.quant": ("norm_forward", "norm_forward_and_per_token_cast"),
    "tile_kernels.config": ("is_ascend", "get_pdl", "set_pdl"),
}


def _apply_version() -> None:
    package = sys.modules.get("tile_kernels")
    if package is None:
        return
    _later, quant, transform = (MODULES[n] for n in ("_later", "quant", "transform"))

    for module_name, names in _LATER.items():
        module = sys.modules[module_name]
        for name in names:
            if later():
                setattr(module, name, getattr(_later, name))
            elif hasattr(module, name):
                delattr(module, name)
    # The later release's fused SwiGLU kernels take the psum layout (Butterfingrz/TileKernels @ 66258df shows the
    # form); 36d9e45's take pos_to_token_topk.
    quant.swiglu_forward_and_per_token_cast = (
        _later.swiglu_forward_and_per_token_cast if later() else quant.v1_swiglu_forward_and_per_token_cast
    )
    quant.swiglu_backward_and_per_token_cast = (
        _later.swiglu_backward_and_per_token_cast if later() else quant.v1_swiglu_backward_and_per_token_cast
    )
    if later():
        package.transform = transform
        sys.modules["tile_kernels.transform"] = transform
    else:
        if hasattr(package, "transform"):
            delattr(package, "transform")
        sys.modules["tile_kernels.transform"] = None  # ``import tile_kernels.transform`` raises ImportError
