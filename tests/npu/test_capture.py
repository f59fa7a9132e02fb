"""NPU graph capture (torch_npu's NPUGraph, the ``npugraph_ex`` backend): an adapter reads no value on the host
while a capture is under way (``distributed.capture``, emulated here), and computes what it computes eagerly."""

from __future__ import annotations

import contextlib
import importlib
import sys
from unittest import mock

import pytest
import torch

from tests.capture_emulation import capturing_everywhere
from tests.chains import npu_chain
from tests.grouped.specs import SPECS as GROUPED_SPECS
from tests.moe_routing.specs import SPECS as ROUTING_SPECS
from torch_ascend_moe.backends.npu import grouped, moe_routing

# The FP8 grouped adapters' capture path (E8M0 scales only) is tested with their MX samples in
# test_grouped_adapters.py; their other samples go to the portable kernel, which tests/test_capture.py names as
# host-bound.
CASES = [(grouped, s) for s in GROUPED_SPECS if hasattr(grouped, s.name) and "_fp8_" not in s.name]
CASES += [(moe_routing, s) for s in ROUTING_SPECS if hasattr(moe_routing, s.name)]


@contextlib.contextmanager
def no_host_reads():
    """Every way a tensor's value reaches Python raises, what a capture forbids, except inside our CPU
    references of torch_npu's ops (tests/npu/*_refs.py: they stand in for device kernels)."""

    def guard(method):
        real = getattr(torch.Tensor, method)

        def refuse(self, *args, **kwargs):
            frame = sys._getframe(1)
            while frame is not None:
                if frame.f_code.co_filename.endswith("_refs.py"):
                    return real(self, *args, **kwargs)
                frame = frame.f_back
            raise AssertionError(f"host read (Tensor.{method}) during a capture")

        return refuse

    with contextlib.ExitStack() as stack:
        for method in ("item", "tolist", "__bool__", "__int__", "__float__", "numpy"):
            stack.enter_context(mock.patch.object(torch.Tensor, method, guard(method)))
        yield


@pytest.fixture
def refs(npu_ops, monkeypatch):
    importlib.import_module("tests.npu.grouped_refs")
    importlib.import_module("tests.npu.quant_routing_refs").register()
    monkeypatch.setattr(moe_routing, "soc_version", lambda: 250)  # A3's rules (no torch_npu to ask)


@pytest.mark.parametrize(("module", "spec"), CASES, ids=[s.name for _, s in CASES])
def test_adapters_make_no_host_read_while_capturing(module, spec, refs):
    adapter = getattr(npu_chain, spec.name)  # the adapter where it takes the sample, else the portable kernel
    for dtype in spec.dtypes:
        for s in spec.sample_inputs("cpu", dtype):
            eager = adapter(*s.args)
            with capturing_everywhere(), no_host_reads():
                captured = adapter(*s.args)
            for e, c in zip(*(o if isinstance(o, tuple) else (o,) for o in (eager, captured))):
                assert torch.equal(e, c), f"{spec.name}[{s.name}, {dtype}]"
