"""Makes ``experts_implementation="ascend_moe"`` available after ``import torch_ascend_moe`` in any import order
with transformers, without importing transformers: the implementations are registered (``torch_ascend_moe.hf``)
as soon as ``transformers.integrations.moe`` (home of ``ExpertsInterface``) exists, at once if it is already
imported, else right after it is, through a ``sys.meta_path`` finder that wraps that one module's loader."""

from __future__ import annotations

import importlib.abc
import sys
import warnings

TARGET = "transformers.integrations.moe"


def _register() -> None:
    import torch_ascend_moe.hf  # noqa: F401  (registers on import)


class _Loader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def __getattr__(self, name):  # get_source, get_filename, ... (tracebacks, inspect) from the real loader
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        try:
            _register()
        except Exception as e:  # noqa: BLE001  (a failed registration must not break the user's transformers)
            warnings.warn(
                f"torch_ascend_moe: experts implementations not registered with transformers: {e!r}", stacklevel=2
            )


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for ``TARGET`` it asks the other finders (the path finder, an editable install's)
    and wraps the loader they return."""

    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)  # one shot
        for finder in sys.meta_path:
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


def install() -> None:
    """Register now if transformers' experts interface is imported, else once it is (idempotent)."""
    if TARGET in sys.modules:
        _register()
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
