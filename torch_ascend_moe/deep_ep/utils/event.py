"""``deep_ep.utils.event``: ``EventHandle`` and ``EventOverlap`` (specs/deepep_api.md §2.3).

The ep ops finish before they return, so an ``EventHandle`` has nothing to wait for and an ``EventOverlap``
only runs its hook; the API is upstream's.
"""

from __future__ import annotations


class EventHandle:
    """DeepEP's event handle; our ops finish before they return, so there is nothing to wait for."""

    def current_stream_wait(self) -> None:
        return None


class EventOverlap:
    """DeepEP's ``EventOverlap``: ``current_stream_wait()`` runs the hook registered with
    ``register_hook_after_wait`` once (the operation itself has already completed)."""

    def __init__(self, event: EventHandle | None = None, extra_tensors: tuple | None = None):
        self.event, self.extra_tensors, self._hook = event, extra_tensors, None

    def register_hook_after_wait(self, hook) -> None:
        if self._hook is not None:
            raise RuntimeError("deep_ep.EventOverlap: a hook is already registered (only one is allowed)")
        self._hook = hook

    def current_stream_wait(self, release_handle: bool = False):
        if self.event is not None:
            self.event.current_stream_wait()
        hook, self._hook = self._hook, None
        result = hook() if hook is not None else None
        if release_handle:
            self.event = None
        return result

    def wait(self):
        return self.current_stream_wait()

    def __call__(self, release_handle: bool = True) -> EventOverlap:
        self._release = release_handle
        return self

    def __enter__(self) -> EventOverlap:
        return self

    def __exit__(self, *exc) -> None:
        self.current_stream_wait(getattr(self, "_release", False))


__all__ = ["EventHandle", "EventOverlap"]
