"""Stand-in upstream libraries (``tests/standins``) installed for one test: on ``sys.path``, imported, configured,
and the kernel chains told to look for libraries again; removed afterwards."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from torch_ascend_moe.backends import chain

STANDINS = str(Path(__file__).resolve().parents[1] / "standins")


@contextlib.contextmanager
def installed(library: str, **config):
    """``import library`` finds the stand-in within the block (``config`` goes to its ``_standin.configure``)."""
    sys.path.insert(0, STANDINS)
    try:
        module = __import__(library)
        module._standin.configure(**config)
        module._standin.reset()
        chain.refresh()
        yield module
    finally:
        for name in [n for n in sys.modules if n == library or n.startswith(library + ".")]:
            del sys.modules[name]
        sys.path.remove(STANDINS)
        chain.refresh()
