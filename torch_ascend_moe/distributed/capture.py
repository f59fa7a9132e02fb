"""Whether a CUDA or NPU (aclgraph: torch_npu's ``NPUGraph``, the ``npugraph_ex`` backend) graph is being captured:
the static expert-parallel ops and the NPU adapters then skip their host-side value checks and make no host
sync. Callers look the checks up through this module (``capture.capturing(...)``), so a test can emulate a capture
on CPU by replacing them (tests/capture_emulation.py)."""

from __future__ import annotations

import torch


def capturing_current_stream() -> bool:
    """A capture is under way on the current CUDA stream."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def capturing(device: torch.device) -> bool:
    """A capture is under way for work on ``device``."""
    if device.type == "cuda":
        return torch.cuda.is_current_stream_capturing()
    # torch_npu registers torch.npu (with is_current_stream_capturing) when imported; no NPU tensor exists before
    return device.type == "npu" and torch.npu.is_current_stream_capturing()


def has_data(t: torch.Tensor) -> bool:
    """Whether ``t`` holds values at all: not a fake or meta tensor (shape checks trace kernels on them)."""
    from torch._subclasses.fake_tensor import FakeTensor

    return not isinstance(t, FakeTensor) and t.device.type != "meta"


def host_readable(t: torch.Tensor) -> bool:
    """Whether a kernel may read ``t``'s values on the host (its op's value checks, a data-dependent choice):
    not for tensors without data (our fakes skip the same checks) nor while a device graph is captured on its
    device, where a host read breaks the capture."""
    return has_data(t) and not capturing(t.device)


def host_kernels(device: torch.device) -> bool:
    """Whether the ep family's CPU helper kernels (``ascend_moe_kernels``) take a step: on CPU, except while
    ``capturing`` (only a test emulating a capture makes that true on CPU: it checks the tensor-op path a captured
    CUDA / NPU graph takes)."""
    return device.type == "cpu" and not capturing(device)
