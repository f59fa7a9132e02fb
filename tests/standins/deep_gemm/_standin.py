"""Control surface of the CPU stand-in for ``deep_gemm`` (see the package docstring for sources).

This module is *not* part of DeepGEMM's API. It holds:

* ``configure(flavor="cuda" | "ascend", arch=9 | 10)``: which library the package imitates (a fresh "library load":
  runtime settings such as ``set_num_sms`` / ``set_mk_alignment_for_contiguous_layout`` go back to their defaults);
* ``CALLS`` / ``reset()``: the call log. Every public ``deep_gemm`` function appends
  ``(function_name, {arg_name: description})`` *before* any check runs; a tensor is described as
  ``(dtype, tuple(shape), tuple(stride), data_ptr)``, tuples/lists element-wise, anything else as-is;
* ``Panic``: raised where the real library would *not* raise but compute garbage, trap on the device, or "panic"
  (e.g. FP32 scale factors that are not powers of two on the UE8M0 paths, layouts whose indices run past their range).
  It subclasses ``RuntimeError`` so ``pytest.raises(RuntimeError)`` also catches it; tests that want to prove a call
  never reaches the library assert ``Panic`` specifically;
* the helpers that raise the host-check errors: ``RuntimeError("DeepGEMM stand-in: Assertion error (<file>:<line>):
  <condition>")``, mirroring upstream's ``DGException`` text (``"Assertion error (file:line): cond"``).
"""

from __future__ import annotations

import functools
import inspect

import torch

__all__ = ["CALLS", "Panic", "configure", "reset", "flavor", "arch"]

PREFIX = "DeepGEMM stand-in: "

#: The call log (see module docstring).
CALLS: list = []


class Panic(RuntimeError):
    """The real kernel would not raise here: it would trap on the device, panic, or silently compute garbage."""


# SM counts of the devices the CUDA flavor imitates (H800/H100 SXM: 132 SMs, B200: 148 SMs) and the AI-core count of
# the Ascend 950 (``num_ai_cores=32`` in DeepGEMM-Ascend ``csrc/jit_kernels/heuristics.hpp`` ``get_hw_desc``).
DEVICE_SMS = {9: 132, 10: 148}
ASCEND_AI_CORES = 32
# ``get_npu_arch()`` returns the device's arch when never set; the 950 is "dav-3510" [ASSUMED value].
ASCEND_DEFAULT_NPU_ARCH = 3510


class _State:
    def __init__(self):
        self.load("cuda", 9)

    def load(self, flavor_: str, arch_: int):
        self.flavor = flavor_
        self.arch = arch_
        self.version = "2.6.1" if flavor_ == "cuda" else "0.1.0"
        # csrc/jit/device_runtime.hpp: num_sms = 0 means "all SMs"; tc_util 0 reads back as 100
        self.num_sms = 0
        self.tc_util = 0
        self.pdl = False
        # csrc/jit_kernels/heuristics/runtime.hpp: kLegacyMKAlignmentForContiguousLayout = 128
        # DeepGEMM-Ascend csrc/jit/jit.hpp: kMkAlignment = 256 (fixed)
        self.mk_alignment = 128 if flavor_ == "cuda" else 256
        self.ignore_compile_dims = False
        self.block_size_multiple_of = (1, 1)
        self.npu_arch = 0
        self.deterministic = False
        self.dry_run = False


STATE = _State()


def configure(flavor: str = "cuda", arch: int = 9, version: str = "2.6.1") -> None:
    """Select the imitated library: ``"cuda"`` (DeepGEMM 2.6.1 on SM90 or SM100; ``version="2.8.0"`` adds 2.8's
    sparse indexer, ``_cuda_sparse.py``) or ``"ascend"`` (DeepGEMM-Ascend 0.1.0; ``arch`` is ignored). Resets the
    runtime settings to their defaults (the call log is kept; ``reset()``)."""
    if flavor not in ("cuda", "ascend"):
        raise ValueError(f"{PREFIX}configure: flavor must be 'cuda' or 'ascend', got {flavor!r}")
    if flavor == "cuda" and arch not in (9, 10):
        raise ValueError(f"{PREFIX}configure: arch must be 9 (SM90) or 10 (SM100), got {arch!r}")
    if version not in ("2.6.1", "2.8.0"):
        raise ValueError(f"{PREFIX}configure: version must be '2.6.1' or '2.8.0', got {version!r}")
    STATE.load(flavor, int(arch))
    STATE.version = version if flavor == "cuda" else "0.1.0"


def reset() -> None:
    """Clear the call log."""
    CALLS.clear()


def flavor() -> str:
    return STATE.flavor


def arch() -> int:
    return STATE.arch


# ---------------------------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------------------------


def fail(where: str, cond: str):
    raise RuntimeError(f"{PREFIX}Assertion error ({where}): {cond}")


def check(ok, where: str, cond: str) -> None:
    """``DG_HOST_ASSERT(cond)`` / ``DJ_HOST_ASSERT(cond, ...)``: ``where`` names the upstream file (and line)."""
    if not ok:
        fail(where, cond)


def panic(msg: str):
    raise Panic(f"{PREFIX}Panic: {msg}")


def incompatible(name: str, msg: str):
    """pybind11 rejects an argument it cannot convert with a TypeError ("incompatible function arguments")."""
    raise TypeError(f"{PREFIX}{name}(): incompatible function arguments: {msg}")


# ---------------------------------------------------------------------------------------------------------------------
# Call log
# ---------------------------------------------------------------------------------------------------------------------


def describe(value):
    if isinstance(value, torch.Tensor):
        return (value.dtype, tuple(value.shape), tuple(value.stride()), value.data_ptr())
    if isinstance(value, tuple):
        return tuple(describe(v) for v in value)
    if isinstance(value, list):
        return [describe(v) for v in value]
    return value


def public(name: str | None = None):
    """Wrap an API function: bind the arguments like pybind11 does (names and defaults), log, then run it."""

    def decorate(fn):
        api_name = name or fn.__name__
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError as e:
                incompatible(api_name, str(e))
            bound.apply_defaults()
            CALLS.append((api_name, {k: describe(v) for k, v in bound.arguments.items()}))
            return fn(*bound.args, **bound.kwargs)

        wrapper.__name__ = api_name
        wrapper.__qualname__ = api_name
        wrapper.__signature__ = sig
        return wrapper

    return decorate


def not_implemented(api_name: str, params: str = "*args, **kwargs", why: str = ""):
    """An API name that exists (so detection by attribute works) but is not modelled by the stand-in."""

    @public(api_name)
    def stub(*args, **kwargs):
        raise NotImplementedError(f"{PREFIX}{api_name} is not modelled by the stand-in{': ' + why if why else ''}")

    stub.__doc__ = f"{api_name}({params}): exists in the imitated library; not modelled by the stand-in."
    return stub
