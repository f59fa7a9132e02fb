"""CUDA kernels: a family module here (``backends/cuda/<family>.py``) declares the kernels CUDA has beyond the
portable ones (``chain.kernel(device="cuda", ...)``: ATen/cuBLAS paths and our Triton kernels, each with the
calls it takes, no host sync while a CUDA graph is captured); the chain hands every other call to the next kernel
and, last, to the portable one. ``info`` prints the chains.

Imported by ``torch_ascend_moe.backends.register_available`` when torch is built with CUDA.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

from torch_ascend_moe.backends.chain import TAKEN, Verdict, refuse


def register() -> None:
    """Import every family module of this package (each registers its own overrides on the CUDA key)."""
    from torch_ascend_moe._registry import import_families

    import_families(__name__, __path__)


def triton_module(name: str) -> ModuleType | None:
    """``backends.cuda.<name>`` (a module of Triton kernels), or None where ``triton`` is not installed: its
    kernels are then declared but not available (``triton_available``)."""
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ImportError:
        return None


@functools.cache
def triton_available() -> Verdict:
    """Whether our Triton kernels can run at all: ``triton`` installed and importable."""
    return TAKEN if triton_module("_triton") is not None else refuse("triton is not installed (or does not import)")
