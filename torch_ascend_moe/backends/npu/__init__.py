"""Ascend NPU overrides, on PrivateUse1 (which torch_npu renames to "npu"): a family module here
(``backends/npu/<family>.py``) registers its torch_npu adapters (grouped matmul, MoE dispatch, ...).

An adapter (``chain.kernel(device="npu", library="torch_npu", takes=...)``) takes the cases a torch_npu op computes
exactly (same rounding points, same layout after our conversions); the chain hands every other case to the next
kernel and, last, to the family's portable kernel, which reaches torch_npu's ACLNN ops through
``CompositeExplicitAutograd``; each module's docstring says which cases map and why the rest do not. Some mappings
have no op of ours to sit under yet (fused MC2 dispatch + expand, the lightning indexer's logits + top-k): they are
plain functions for the compiler passes. Adapter modules touch ``torch.ops.npu`` only when called, so ``info``
imports them anywhere. Registered only after ``import torch_npu`` succeeded; checked in CI against the pinned
torch_npu wheel's own schemas and Meta kernels (``testing.npu_wheel``, ``tests/npu``); nothing here has run on
Ascend hardware.
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.chain import TAKEN, Verdict, refuse


def register() -> None:
    """Import every family module of this package (each registers its own adapters on PrivateUse1)."""
    from torch_ascend_moe._registry import import_families

    import_families(__name__, __path__)


def register_ge_converters() -> None:
    """Register every family's TorchAir GE converter (``_registry.npu_ge_converter``); called once TorchAir's
    converter module imports (on Ascend: after ``import torch_npu``; in CI: ``testing.npu_wheel.torchair``)."""
    from torchair._ge_concrete_graph.fx2ge_converter import register_fx_node_ge_converter

    from torch_ascend_moe._registry import NPU_GE_CONVERTERS

    register()
    for op, converter in NPU_GE_CONVERTERS.items():
        register_fx_node_ge_converter(getattr(torch.ops.ascend_moe, op).default)(converter)


def has_op(name: str):
    """A torch_npu kernel's ``available``: ``torch.ops.npu.<name>`` is loaded (by ``import torch_npu``; in CI, by the
    pinned wheel's schemas)."""

    def available() -> Verdict:
        return TAKEN if hasattr(torch.ops.npu, name) else refuse(f"torch_npu is not loaded (no torch.ops.npu.{name})")

    return available
