"""Registration by name: each family module wires its own kernels here; the op inventory is the dispatcher's.

No list of op names is kept anywhere: ``op_names()`` reads the namespace from the dispatcher, and a portable
kernel registers under the schema name it is decorated with.
"""

from __future__ import annotations

import functools
import types
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


@functools.cache
def _schema(name: str) -> tuple[tuple[str, bool, object], ...]:
    """(argument name, has a default, the default) for every argument of ``ascend_moe::name``, in order."""
    schema = getattr(torch.ops.ascend_moe, name).default._schema
    return tuple((a.name, a.has_default_value(), a.default_value) for a in schema.arguments)


def arguments(name: str, inputs: tuple) -> types.SimpleNamespace:
    """An op's call arguments by NAME (``args.timeout_s``), the schema's defaults where the caller passed fewer
    (the dispatcher may drop trailing defaults): what autograd's ``setup_context`` reads instead of indices."""
    values = {}
    for i, (arg, has_default, default) in enumerate(_schema(name)):
        if i < len(inputs):
            values[arg] = inputs[i]
        elif has_default:
            values[arg] = default
        else:
            raise TypeError(f"{NAMESPACE}::{name}: missing argument '{arg}'")
    return types.SimpleNamespace(**values)


def gradients(name: str, **grads) -> tuple:
    """One gradient per schema argument of ``ascend_moe::name``: the named ones, None for every other."""
    names = [arg for arg, _, _ in _schema(name)]
    unknown = set(grads) - set(names)
    if unknown:
        raise TypeError(f"{NAMESPACE}::{name} has no argument(s) {sorted(unknown)}")
    return tuple(grads.get(arg) for arg in names)


def needs_grad(ctx, name: str, arg: str) -> bool:
    """Whether the backward of ``ascend_moe::name`` must produce ``arg``'s gradient (``ctx.needs_input_grad`` by
    argument name; it may be shorter than the schema when the dispatcher dropped trailing defaults)."""
    i = _position(name, arg)
    return i < len(ctx.needs_input_grad) and ctx.needs_input_grad[i]


@functools.cache
def _position(name: str, arg: str) -> int:
    return next(i for i, (a, _, _) in enumerate(_schema(name)) if a == arg)
