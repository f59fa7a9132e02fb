"""The kernel chains as tests read them (``backends.chain``): every device's kernels declared, whatever this
machine has, and the labels of an op's chain."""

from __future__ import annotations

from torch_ascend_moe import _registry, backends
from torch_ascend_moe.backends import chain

backends.register_all()


def labels(op: str, device: str) -> list[str]:
    """``op``'s chain on ``device``, first choice first (``Kernel.label``: "library: what it calls")."""
    return [k.label for k in chain.chain(op, device)]


def has(op: str, device: str, label: str) -> bool:
    return label in labels(op, device)


def ops_running(device: str, label: str) -> set[str]:
    """The ops whose chain on ``device`` holds the kernel ``label``."""
    return {op for op in chain.ops_with_kernels(device) if has(op, device, label)}


# Every op with kernels on the device as a function running that device's chain on any tensors (CPU ones here).
cuda_chain = chain.runners("cuda")
npu_chain = chain.runners("npu")


def chosen(op: str, device: str, *args) -> str:
    """The label of the kernel ``op(*args)`` runs on ``device`` (schema defaults filled)."""
    return chain.choose(op, device, _registry.full_call(op, *args)).label
