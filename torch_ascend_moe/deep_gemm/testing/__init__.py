"""``deep_gemm.testing``: the utilities DeepGEMM's own tests use (specs/deepgemm_api.md §14.1)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import torch

from torch_ascend_moe.deep_gemm.testing.bench import bench, bench_kineto, empty_suppress, suppress_stdout_stderr
from torch_ascend_moe.testing import calc_diff, count_bytes

__all__ = [
    "assert_bitwise_equal",
    "bench",
    "bench_kineto",
    "calc_diff",
    "count_bytes",
    "empty_suppress",
    "get_arch_major",
    "ignore_env",
    "suppress_stdout_stderr",
    "test_filter",
]


def assert_bitwise_equal(x: torch.Tensor, y: torch.Tensor, label: str = "") -> None:
    """Raise AssertionError naming the first differing element unless ``x`` and ``y`` match byte for byte."""
    if x.shape != y.shape or x.dtype != y.dtype:
        raise AssertionError(f"{label}: {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}")
    xb = x.contiguous().view(torch.uint8).flatten()
    yb = y.contiguous().view(torch.uint8).flatten()
    diff = (xb != yb).nonzero()
    if diff.numel():
        first = int(diff[0]) // x.element_size()
        raise AssertionError(
            f"{label}: {diff.numel()} bytes differ; first at element {first}: "
            f"{x.flatten()[first].item()} vs {y.flatten()[first].item()}"
        )


def get_arch_major() -> int:
    """CUDA compute-capability major of the current device, 0 without CUDA."""
    return torch.cuda.get_device_capability()[0] if torch.cuda.is_available() else 0


def test_filter(condition: Callable[[], bool]):
    """Decorator: run the test function only when ``condition()`` holds (upstream's skip helper)."""

    def decorator(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if condition():
                return fn(*args, **kwargs)
            print(f"skipping {fn.__name__}: condition not met")
            return None

        return wrapper

    return decorator


def ignore_env(name: str, condition: Callable[[], bool]):
    """Decorator: run with environment variable ``name`` removed while ``condition()`` holds."""

    def decorator(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if not condition() or name not in os.environ:
                return fn(*args, **kwargs)
            saved = os.environ.pop(name)
            try:
                return fn(*args, **kwargs)
            finally:
                os.environ[name] = saved

        return wrapper

    return decorator
