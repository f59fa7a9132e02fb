"""Every op has an Ascend adapter or a stated reason to stay portable: an op without an adapter is named in the
docstring of its family's NPU module (``backends/npu/<family>.py``), which says why."""

from __future__ import annotations

import importlib
import pkgutil

from torch_ascend_moe import _registry
from torch_ascend_moe.backends import chain, npu, portable


def test_every_family_has_an_npu_module():
    # ``_``-prefixed modules are helpers the families import, not families (``_registry.import_families``).
    families = {m.name for m in pkgutil.iter_modules(portable.__path__) if not m.name.startswith("_")}
    npu_modules = {m.name for m in pkgutil.iter_modules(npu.__path__)}
    assert families <= npu_modules, f"families without backends/npu/<family>.py: {sorted(families - npu_modules)}"


def test_every_op_without_an_adapter_is_explained():
    npu.register()
    docs = {
        m.name: importlib.import_module(f"{npu.__name__}.{m.name}").__doc__ or ""
        for m in pkgutil.iter_modules(npu.__path__)
    }
    npu_ops = set(chain.ops_with_kernels("npu"))
    unexplained = [
        op for op in _registry.op_names() if op not in npu_ops and not any(f"``{op}``" in d for d in docs.values())
    ]
    assert not unexplained, f"ops with neither an Ascend adapter nor a stated reason: {unexplained}"
