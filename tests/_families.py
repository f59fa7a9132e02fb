"""Every op family's harness specs, found on disk: each ``tests/<family>/specs.py`` that lists ``SPECS``.

No family list is typed anywhere: the bad-input campaign, the integer-bounds test and the inventory test
(``tests/test_package.py``) all read this, so a new family's specs are picked up by adding the module.
"""

from __future__ import annotations

import importlib
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent  # the repository root: ``tests.<family>.specs`` imports with it on sys.path


def spec_modules() -> dict[str, str]:
    """``{family: module name}`` of every ``tests/<family>/specs.py``, in name order."""
    return {path.parent.name: f"{__package__}.{path.parent.name}.specs" for path in sorted(TESTS.glob("*/specs.py"))}


def family_specs() -> dict[str, list]:
    """``{family: its OpSpecs}`` for every spec module (imported on demand) that lists ``SPECS``."""
    specs = {}
    for family, name in spec_modules().items():
        module = importlib.import_module(name)
        if hasattr(module, "SPECS"):
            specs[family] = list(module.SPECS)
    return specs
