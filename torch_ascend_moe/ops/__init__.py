"""Typed Python entry points to the ascend_moe ops, one module per family.

A family module's function named after one of its ops is that op's public wrapper; the package exports every
such function (no list of names is kept: the ops come from the dispatcher, the wrappers from the modules).
"""

import importlib
import pkgutil

from torch_ascend_moe._registry import op_names

__all__: list[str] = []
for _family in pkgutil.iter_modules(__path__):
    _module = importlib.import_module(f"{__name__}.{_family.name}")
    for _name in op_names():
        _fn = getattr(_module, _name, None)
        if callable(_fn) and getattr(_fn, "__module__", None) == _module.__name__:
            globals()[_name] = _fn
            __all__.append(_name)
__all__.sort()
