"""Running an upstream project's own tests against our compatibility package (``tools/*_upstream_tests.py``)."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from types import ModuleType


def install_as(package: ModuleType, name: str) -> None:
    """Make ``import <name>`` and ``from <name>.x.y import z`` resolve to ``package`` and its submodules (each
    imported now, so upstream's test files find every module under upstream's name)."""
    sys.modules[name] = package
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        module = importlib.import_module(info.name)
        sys.modules[name + "." + info.name[len(package.__name__) + 1 :]] = module
