"""``deep_ep.utils.event``: ``EventHandle`` and ``EventOverlap`` (specs/deepep_api.md §2.3).

The ep ops finish before they return, so an ``EventHandle`` has nothing to wait for and an ``EventOverlap``
only runs its hook; the API is upstream's.
"""

from __future__ import annotations


class EventHandle:
    """DeepEP's event handle; our ops finish before they return, so there is nothing to wait for."""

    def current_stream_wait(self) -> None:
        return None


class HookAlreadyRegistered(RuntimeError, AssertionError):
    """A second hook on one ``EventOverlap``: upstream asserts, so DeepEP code may catch ``AssertionError``."""


class EventOverlap:
    """DeepEP's ``EventOverlap``: ``current_stream_wait()`` waits on the event, then runs the hook registered
    with ``register_hook_after_wait`` once and returns its result (DeepEP-Ascend's semantics: the hook is taken
    before it runs, so a failing or re-entrant hook is not repeated and a hook may register a successor; a failed
    wait keeps the hook). The operation itself has already completed."""

    def __init__(self, event: EventHandle | None = None, extra_tensors: tuple | None = None):
        self.event, self.extra_tensors = event, extra_tensors
        self.hook_after_wait = None

    def register_hook_after_wait(self, hook) -> None:
        if self.hook_after_wait is not None:
            raise HookAlreadyRegistered("deep_ep.EventOverlap: a hook is already registered on this EventOverlap")
        self.hook_after_wait = hook

    def current_stream_wait(self, release_handle: bool = False):
        if self.event is not None:
            self.event.current_stream_wait()
        hook, self.hook_after_wait = self.hook_after_wait, None
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


__all__ = ["EventHandle", "EventOverlap", "HookAlreadyRegistered"]
