"""CUDA overrides: a family module here (``backends/cuda/<family>.py``) registers the kernels CUDA has beyond
the portable ones (cuBLAS through ATen already serves them with FP32 accumulation).

Imported by ``torch_ascend_moe.backends.register_available`` when torch is built with CUDA; no family has an
override yet.
"""

from __future__ import annotations


def register() -> None:
    """Import every family module of this package (each registers its own overrides on the CUDA key)."""
    from torch_ascend_moe._registry import import_families

    import_families(__name__, __path__)
