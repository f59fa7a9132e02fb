"""``deep_ep.EventHandle`` / ``deep_ep.EventOverlap`` (``csrc/utils/event.hpp``, ``deep_ep/utils/event.py``).

On CPU every "kernel" has finished when the call returns, so an event is a no-op token; ``EventOverlap`` is upstream's
Python class line for line (the hook, ``release_handle``, the ``with`` protocol and its asserts).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class EventHandle:
    """``EventHandle()`` records an event on the current stream (a no-op on CPU); ``current_stream_wait()`` makes the
    current stream wait for it (nothing to wait for on CPU)."""

    def __init__(self) -> None:
        self.tensors_to_record = []

    def current_stream_wait(self) -> None:
        return None


class EventOverlap:
    """Upstream's ``deep_ep.utils.event.EventOverlap`` (event.py:8-96)."""

    def __init__(self, event: EventHandle | None = None, extra_tensors: tuple | None = None) -> None:
        self.event = event
        self.extra_tensors = extra_tensors
        self._release_handle_by_call = False
        self.hook_after_wait: Callable | None = None

    def current_stream_wait(self, release_handle: bool = False) -> None:
        assert self.event is not None
        self.event.current_stream_wait()
        if self.hook_after_wait is not None:
            self.hook_after_wait()
            self.hook_after_wait = None
        if release_handle:
            self.event = None

    def register_hook_after_wait(self, hook_after_wait: Callable) -> None:
        assert self.hook_after_wait is None, "A hook is already registered on this `EventOverlap`"
        self.hook_after_wait = hook_after_wait

    def __call__(self, release_handle: bool = False) -> EventOverlap:
        self._release_handle_by_call = release_handle
        return self

    def __enter__(self) -> Any:
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        if self.event is not None:
            self.current_stream_wait(release_handle=self._release_handle_by_call)
        self._release_handle_by_call = False
