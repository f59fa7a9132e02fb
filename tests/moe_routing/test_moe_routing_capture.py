"""The routing family's portable kernels (what CUDA and Ascend run where no fused kernel maps) make no host sync
while a device graph is captured (emulated: every capture check answers yes and any host sync fails), and give
the same bits as outside a capture: so a whole MoE layer is capturable."""

from __future__ import annotations

import pytest
import torch

from tests.distributed.ep_bodies import emulated_capture
from tests.moe_routing.specs import SPECS
from torch_ascend_moe.backends.portable import moe_routing as portable

CASES = [s for s in SPECS if hasattr(portable, s.name)]


@pytest.mark.parametrize("spec", CASES, ids=str)
def test_no_host_sync_while_capturing(spec):
    kernel = getattr(portable, spec.name)
    for dtype in spec.dtypes:
        for s in [*spec.sample_inputs("cpu", dtype), *spec.sample_inputs("cpu", dtype, small=True)]:
            eager = kernel(*s.args)
            with emulated_capture():
                captured = kernel(*s.args)
            for e, c in zip(*(o if isinstance(o, tuple) else (o,) for o in (eager, captured)), strict=True):
                assert torch.equal(e, c), f"{spec.name}[{s.name}, {dtype}]"
