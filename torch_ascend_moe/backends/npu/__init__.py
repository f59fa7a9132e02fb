"""Ascend NPU overrides, on PrivateUse1 (which torch_npu renames to "npu"): a family module here
(``backends/npu/<family>.py``) registers its torch_npu adapters (grouped matmul, MoE dispatch, ...).

The portable kernels already reach torch_npu's ops (ACLNN matmul, FP32 accumulation) through
``CompositeExplicitAutograd``. Imported only after ``import torch_npu`` succeeded; no family has an adapter yet
and nothing here has run on Ascend hardware (see the README's verification table).
"""

from __future__ import annotations


def register() -> None:
    """Import every family module of this package (each registers its own adapters on PrivateUse1)."""
    from torch_ascend_moe._registry import import_families

    import_families(__name__, __path__)
