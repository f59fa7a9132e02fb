"""CUDA overrides: a family module here (``backends/cuda/<family>.py``) registers the kernels CUDA has beyond
the portable ones (``_registry.cuda_kernel``; cuBLAS through ATen already serves the dense GEMMs with FP32
accumulation): each takes the cases its kernel computes exactly, with no host sync while a CUDA graph is
captured, and hands the rest to the portable kernel. ``info``'s "on CUDA" column lists them.

Imported by ``torch_ascend_moe.backends.register_available`` when torch is built with CUDA.
"""

from __future__ import annotations


def register() -> None:
    """Import every family module of this package (each registers its own overrides on the CUDA key)."""
    from torch_ascend_moe._registry import import_families

    import_families(__name__, __path__)
