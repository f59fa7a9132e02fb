"""Registration by name: each family module wires its own kernels here; the op inventory is the dispatcher's.

No list of op names is kept anywhere: ``op_names()`` reads the namespace from the dispatcher, and a portable
kernel registers under the schema name it is decorated with.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

NAMESPACE = "ascend_moe"

# One library object for every portable kernel (it must stay alive for the registrations to stay).
_PORTABLE = torch.library.Library(NAMESPACE, "IMPL")


def portable_kernel(name: str | Callable | None = None):
    """Register a device-generic kernel for ``ascend_moe::<name>`` (default: the function's name), ONCE, under
    ``CompositeExplicitAutograd``: it serves CUDA, PrivateUse1 (Ascend) and any other device; a C++ CPU kernel,
    where the family has one, still wins on CPU, and the fake still serves Meta.

    >>> @portable_kernel
    ... def bf16_gemm(a, b, c=None, alpha=1.0, out_dtype=None): ...
    """

    def register(fn: Callable, op: str | None = None) -> Callable:
        _PORTABLE.impl(op or fn.__name__, fn, "CompositeExplicitAutograd")
        return fn

    if callable(name):
        return register(name)
    return lambda fn: register(fn, name)


def op_names() -> list[str]:
    """Every op of the ``ascend_moe`` namespace, sorted, as the dispatcher knows them."""
    prefix = NAMESPACE + "::"
    return sorted(n[len(prefix) :] for n in torch._C._dispatch_get_all_op_names() if n.startswith(prefix))
