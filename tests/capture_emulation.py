"""A device graph capture emulated on CPU: every check of ``torch_ascend_moe.distributed.capture`` answers yes, so
CPU tests run the path a captured CUDA / NPU graph takes (no host reads, no host syncs, the ep family's tensor-op
path instead of its CPU helper kernels). The product module has no switch for this: the tests replace its two
functions, in the module and wherever a module bound them by name."""

from __future__ import annotations

import contextlib
import sys
from unittest import mock

from torch_ascend_moe.distributed import capture

_REAL = {"capturing": capture.capturing, "capturing_current_stream": capture.capturing_current_stream}
_FAKES = {"capturing": lambda device: True, "capturing_current_stream": lambda: True}


@contextlib.contextmanager
def capturing_everywhere():
    """Inside the block ``capture.capturing(device)`` and ``capture.capturing_current_stream()`` answer True (and so
    ``host_readable`` False, ``host_kernels`` False) for every caller."""
    with contextlib.ExitStack() as stack:
        for name, module in list(sys.modules.items()):
            if module is None or not (name == "torch_ascend_moe" or name.startswith("torch_ascend_moe.")):
                continue
            for attr, real in _REAL.items():
                if getattr(module, attr, None) is real:
                    stack.enter_context(mock.patch.object(module, attr, _FAKES[attr]))
        yield
