"""Every op has an Ascend adapter or a declared reason to stay portable there (``chain.stays_portable`` in its
family's NPU module, ``backends/npu/<family>.py``), which ``info`` prints beside the chain; never both."""

from __future__ import annotations

import json
import pkgutil

import pytest

from torch_ascend_moe import _registry, backends, cli
from torch_ascend_moe.backends import chain, npu, portable


def test_every_family_has_an_npu_module():
    # ``_``-prefixed modules are helpers the families import, not families (``_registry.import_families``).
    families = {m.name for m in pkgutil.iter_modules(portable.__path__) if not m.name.startswith("_")}
    npu_modules = {m.name for m in pkgutil.iter_modules(npu.__path__)}
    assert families <= npu_modules, f"families without backends/npu/<family>.py: {sorted(families - npu_modules)}"


def test_every_op_has_an_adapter_or_a_reason():
    """An adapter is a torch_npu (vendor) kernel; an upstream library's kernel (DeepGEMM-Ascend, ...) may come
    before the portable one either way."""
    backends.register_all()
    adapted = {op for op in _registry.op_names() if any(k.tier == "vendor" for k in chain.chain(op, "npu"))}
    unexplained = [op for op in _registry.op_names() if op not in adapted and not chain.portable_why(op, "npu")]
    assert not unexplained, f"ops with neither an Ascend adapter nor a declared reason: {unexplained}"
    both = sorted(op for op in adapted if chain.portable_why(op, "npu"))
    assert not both, f"ops with an Ascend adapter declared portable by design: {both}"


def test_info_shows_the_reason(capsys):
    assert cli.main(["info", "--json"]) == 0
    whys = json.loads(capsys.readouterr().out)["portable by design"]["npu"]
    assert whys["rms_norm"] == chain.portable_why("rms_norm", "npu")
    assert "ACLNN" in whys["bf16_gemm"]


def test_a_reason_names_real_ops():
    with pytest.raises(ValueError, match="unknown ops"):
        chain.stays_portable("no_such_op", device="npu", why="x")
    with pytest.raises(ValueError, match="device must be"):
        chain.stays_portable("rms_norm", device="cpu", why="x")
