"""``deep_gemm.testing.utils``: the architecture query and test decorators of DeepGEMM's tests."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import torch

__all__ = ["get_arch_major", "ignore_env", "test_filter"]


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
