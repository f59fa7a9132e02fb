"""``deep_ep.utils.semantic``: DeepEP V2's small language helpers, upstream's names and semantics.

``value_or(value, default)`` and ``weak_lru(maxsize=128, typed=False)``, an ``functools.lru_cache`` for methods
that holds ``self`` only weakly. Nothing here touches a device, so it is upstream's behaviour unchanged.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any


def value_or(value: Any | None, default: Any) -> Any:
    """``default`` if ``value`` is ``None``, else ``value`` (falsy values such as 0 are kept)."""
    return default if value is None else value


def weak_lru(maxsize: int | None = 128, typed: bool = False):
    """LRU-cache decorator for methods that keys on a weak reference to ``self``: ``functools.lru_cache`` on a
    method would keep every instance alive as long as its cache entry."""

    def wrapper(func):
        # Keyed on weakref.ref(self): refs to a live object hash and compare as the object does.
        @functools.lru_cache(maxsize, typed)
        def _func(_self, *args, **kwargs):
            return func(_self(), *args, **kwargs)

        @functools.wraps(func)
        def inner(self, *args, **kwargs):
            return _func(weakref.ref(self), *args, **kwargs)

        return inner

    return wrapper


__all__ = ["value_or", "weak_lru"]
