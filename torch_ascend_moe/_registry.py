"""Registration by name: each family module wires its own kernels here; the op inventory is the dispatcher's.

No list of op names is kept anywhere: ``op_names()`` reads the namespace from the dispatcher, and a portable
kernel registers under the schema name it is decorated with.
"""

from __future__ import annotations

import collections
import functools
import importlib
import importlib.abc
import importlib.util
import inspect
import pkgutil
import sys
import types
from collections.abc import Callable

import torch

NAMESPACE = "ascend_moe"

# The device whose kernel chains CPU tensors run inside ``backends.chain.on_cpu(device)`` (None elsewhere): a fake
# whose shapes depend on the device's kernels (a transport's routing state) answers for that device then, so the
# CPU emulation of a device traces as the device would.
_CPU_STANDS_FOR: list[str | None] = [None]


def device_kind(device: torch.device) -> str:
    """``device``'s type as the kernel chains see it ("cpu", "cuda", "npu"), CPU tensors under ``chain.on_cpu``
    counted as the device they stand for."""
    if device.type == "cpu" and _CPU_STANDS_FOR[0] is not None:
        return _CPU_STANDS_FOR[0]
    if device.type == torch._C._get_privateuse1_backend_name():
        return "npu"
    return device.type


# One library object for every portable kernel (it must stay alive for the registrations to stay).
_PORTABLE = torch.library.Library(NAMESPACE, "IMPL")


def _by_name(name: str | Callable | None, register: Callable[[Callable, str], None]):
    """The decorator shape every registration here shares: ``@deco`` (the op is the function's name) or
    ``@deco("op")``. The module keeps the registered callable, so direct calls (tests, other kernels) get the
    schema's defaults as the dispatcher's calls do."""

    def decorate(fn: Callable, op: str | None = None) -> Callable:
        op = op or fn.__name__
        kernel = with_defaults(op, fn)
        register(kernel, op)
        return kernel

    if callable(name):
        return decorate(name)
    return lambda fn: decorate(fn, name)


def with_defaults(name: str, fn: Callable) -> Callable:
    """``fn`` called with every schema argument of ``ascend_moe::name``: the dispatcher drops trailing arguments
    equal to their defaults before calling a Python kernel, so the schema's defaults are filled back here and no
    kernel, fake or formula repeats them. Keywords the schema does not know (a kernel's own options) pass on.

    A function whose only parameter is ``args`` gets them as one namespace by name (``args.timeout_s``): what an
    op with many arguments uses, so its fake, kernel and checks do not each spell the whole list out.
    """
    by_namespace = list(inspect.signature(fn).parameters) == ["args"]

    @functools.wraps(fn)
    def call(*args, **kwargs):
        schema = _schema(name)
        if len(args) < len(schema):
            args = list(args)
            for arg, has_default, default in schema[len(args) :]:
                if arg in kwargs:
                    args.append(kwargs.pop(arg))
                elif has_default:
                    args.append(default)
                else:
                    raise TypeError(f"{NAMESPACE}::{name}: missing argument '{arg}'")
        if by_namespace:
            return fn(arguments(name, tuple(args)), **kwargs)
        return fn(*args, **kwargs)

    return call


def full_call(name: str, *args, **kwargs) -> tuple:
    """Every schema argument of a call of ``ascend_moe::name``, defaults filled (what its kernels receive)."""
    return with_defaults(name, lambda *a: a)(*args, **kwargs)


def fake(name: str | Callable | None = None):
    """Register the fake (meta) kernel of ``ascend_moe::<name>`` (default: the function's name); it receives
    every schema argument (``with_defaults``)."""

    def register(fn, op):
        # torch checks that a fake lives in the module the schema's set_python_module names, by looking at
        # the caller's frame: point it at the family module that applied the decorator.
        depth = 1
        while sys._getframe(depth).f_globals.get("__name__") == __name__:
            depth += 1
        torch.library.register_fake(f"{NAMESPACE}::{op}", fn, _stacklevel=depth + 1)

    return _by_name(name, register)


_FLOP_COUNTER = "torch.utils.flop_counter"
_AFTER_FLOP_COUNTER: list[Callable[[], None]] = []


class _ThenRegister(importlib.abc.Loader):
    """The loader of ``torch.utils.flop_counter``, wrapped: it runs the module, then the registrations waiting
    for it (``when_flop_counter``)."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _FlopCounterFinder)]
        while _AFTER_FLOP_COUNTER:
            _AFTER_FLOP_COUNTER.pop(0)()

    def __getattr__(self, name):  # get_source, get_filename, ... for inspect and linecache
        return getattr(self._loader, name)


class _FlopCounterFinder(importlib.abc.MetaPathFinder):
    """Finds ``torch.utils.flop_counter`` with the other finders and hands back its spec with the loader wrapped;
    every other import passes by."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _FLOP_COUNTER:
            return None
        sys.meta_path.remove(self)  # one import to watch; the other finders find the module
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _ThenRegister(spec.loader)
        return spec


def when_flop_counter(register: Callable[[], None]) -> None:
    """Run ``register`` once ``torch.utils.flop_counter`` is imported: now if it is, else right after whoever
    imports it first (``FlopCounterMode``'s user). The module imports ``triton`` at its top where Triton is
    installed, 75 MiB of a CPU process that never counts FLOPs, so importing this package must not import it."""
    if _FLOP_COUNTER in sys.modules:
        register()
        return
    _AFTER_FLOP_COUNTER.append(register)
    if not any(isinstance(f, _FlopCounterFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _FlopCounterFinder())


def flop_formula(name: str | Callable | None = None):
    """Register ``torch.utils.flop_counter``'s formula for ``ascend_moe::<name>`` (when that module is imported:
    ``when_flop_counter``): it receives every schema argument (tensors as shapes) and ``out_shape``."""

    def register(fn, op):
        def now():
            from torch.utils.flop_counter import register_flop_formula

            register_flop_formula(getattr(torch.ops.ascend_moe, op))(fn)

        when_flop_counter(now)

    return _by_name(name, register)


def flop_formula_for(ops: list, fn: Callable) -> Callable:
    """``fn`` as the FLOP formula of every op packet in ``ops`` (when ``torch.utils.flop_counter`` is imported)."""

    def now():
        from torch.utils.flop_counter import register_flop_formula

        register_flop_formula(ops)(fn)

    when_flop_counter(now)
    return fn


# Autocast's keys of the devices our kernels run on (the NPU is PrivateUse1), and all of them as one set.
_AUTOCAST_KEYS = ("AutocastCPU", "AutocastCUDA", "AutocastPrivateUse1")
_AUTOCAST_KEYSET = functools.reduce(
    lambda a, b: a | b, (torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, k)) for k in _AUTOCAST_KEYS)
)


def _without_autocast(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_KEYSET):
            return fn(*args, **kwargs)

    return run


def autograd(name: str, backward: Callable, setup_context: Callable, eager: Callable | None = None) -> None:
    """Make ``ascend_moe::name`` differentiable with ``setup_context(ctx, inputs, output)`` and
    ``backward(ctx, *grads)`` (torch.library's contract).

    The Autograd-key kernel is C++ (``csrc/ops/autograd_bridge.cpp``): a call where nothing needs a gradient
    redispatches below autograd without entering Python; otherwise it runs torch.library's autograd
    implementation of the two functions. Where that private builder is missing (another torch), this falls
    back to ``torch.library.register_autograd``: same semantics, Python on every call.

    ``eager(*inputs)``, where given, serves an eager call that needs a gradient first (plain tensors, no
    tracing, no dispatch mode): it returns the outputs with their own autograd history, or None to leave the call
    to the two functions. A composite op uses it to record its steps once (each step's formula keeping what its
    backward needs) where the op itself, a leaf whose kernel returns only its outputs, would recompute them in the
    backward; traced graphs keep the op as one node and the two functions.
    """
    qualname = f"{NAMESPACE}::{name}"
    # A formula's torch calls compute in the op's dtypes, as its kernels (run_without_autocast): the backward runs
    # under the autocast state of the code calling it.
    backward, eager = _without_autocast(backward), eager and _without_autocast(eager)
    try:
        from torch._library.autograd import Info, make_autograd_impl
    except ImportError:
        torch.library.register_autograd(qualname, backward, setup_context=setup_context)
        return
    from torch_ascend_moe import _C

    op = getattr(torch.ops.ascend_moe, name).default
    impl = make_autograd_impl(op, Info(_backward_fn=backward, _setup_context_fn=setup_context))
    if eager is not None:
        impl = _eager_first(eager, impl)
    _C._register_autograd(name, impl)


def _plain_call(inputs) -> bool:
    """Eager: no tracing (Dynamo, AOTAutograd, export), no dispatch mode (fake tensors, make_fx), no torch.func
    transform and every tensor a plain one (no subclass: FakeTensor, FunctionalTensor, DTensor)."""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack():
        return False
    if torch._C._are_functorch_transforms_active():
        return False
    return all(type(t) in (torch.Tensor, torch.nn.Parameter) for t in inputs if isinstance(t, torch.Tensor))


def _eager_first(eager: Callable, impl: Callable) -> Callable:
    def autograd_impl(keyset, *inputs, **kw):
        out = eager(*inputs, **kw) if _plain_call(inputs) else None
        return impl(keyset, *inputs, **kw) if out is None else out

    return autograd_impl


def _mark_outputs_non_differentiable(ctx, inputs, output):
    ctx.mark_non_differentiable(*(output if isinstance(output, (tuple, list)) else (output,)))


def _no_double_backward(ctx, *grads):
    raise RuntimeError("ascend_moe: this op's outputs are not differentiable (no double backward)")


def non_differentiable(name: str) -> None:
    """Register ``ascend_moe::name`` (a backward op, a layout op) as having no derivative: its outputs are marked
    non-differentiable, so autograd never asks for one."""
    autograd(name, _no_double_backward, _mark_outputs_non_differentiable)


def schema_default(name: str, arg: str):
    """The schema's default of ``arg`` of ``ascend_moe::name`` (a qualified name works too)."""
    name = name.removeprefix(f"{NAMESPACE}::")
    for a, has_default, default in _schema(name):
        if a == arg and has_default:
            return default
    raise TypeError(f"{NAMESPACE}::{name} has no default for '{arg}'")


class _FromSchema:
    def __repr__(self) -> str:
        return "FROM_SCHEMA"


# A wrapper parameter's default that ``schema_defaults`` replaces with the op schema's value.
FROM_SCHEMA = _FromSchema()


def schema_defaults(name: str | Callable | None = None):
    """Give a typed wrapper of ``ascend_moe::<name>`` (default: the function's name) the schema's defaults:
    every parameter whose default is ``FROM_SCHEMA`` gets the value of the schema argument of the same name
    (lists as tuples), so ``help()`` shows it and no wrapper restates it.

    >>> @schema_defaults  # doctest: +SKIP
    ... def bf16_gemm(a, b, c=None, *, alpha=FROM_SCHEMA, out_dtype=None): ...
    """

    def decorate(fn: Callable, op: str | None = None) -> Callable:
        op = op or fn.__name__

        def value(param: str, default):
            if default is not FROM_SCHEMA:
                return default
            v = schema_default(op, param)
            return tuple(v) if isinstance(v, list) else v

        code = fn.__code__
        positional = code.co_varnames[: code.co_argcount]
        if fn.__defaults__:
            names = positional[len(positional) - len(fn.__defaults__) :]
            fn.__defaults__ = tuple(value(p, d) for p, d in zip(names, fn.__defaults__))
        if fn.__kwdefaults__:
            fn.__kwdefaults__ = {p: value(p, d) for p, d in fn.__kwdefaults__.items()}
        return fn

    if callable(name):
        return decorate(name)
    return lambda fn: decorate(fn, name)


def portable_kernel(name: str | Callable | None = None):
    """Register a device-generic kernel for ``ascend_moe::<name>`` (default: the function's name), ONCE, under
    ``CompositeExplicitAutograd``: it serves CUDA, PrivateUse1 (Ascend) and any other device; a C++ CPU kernel,
    where the family has one, still wins on CPU, and the fake still serves Meta.

    It receives every schema argument (``with_defaults``).

    >>> @portable_kernel  # doctest: +SKIP
    ... def bf16_gemm(a, b, c, alpha, out_dtype): ...
    """

    def register(kernel: Callable, op: str) -> None:
        PORTABLE[op] = kernel
        _PORTABLE.impl(op, kernel, "CompositeExplicitAutograd")

    return _by_name(name, register)


# op -> its portable kernel (defaults filled): the last entry of every device's chain (``backends.chain``).
PORTABLE: dict[str, Callable] = {}


NPU_GE_CONVERTERS: dict[str, Callable] = {}


def npu_ge_converter(name: str, *, ir: str):
    """Declare ``fn`` the TorchAir GE converter of ``ascend_moe::<name>`` (GE graph mode on Ascend): it gets the
    op's arguments as GE tensors / Python values, every schema default filled, plus ``meta_outputs`` (TorchAir's
    TensorSpecs of our fake's outputs), and returns GE tensors built with ``torchair.ge`` ops; ``ir`` names the
    Ascend IR op it builds around (for ``info``). ``backends.npu.register_ge_converters`` hands them to
    TorchAir's ``register_fx_node_ge_converter`` once TorchAir imports.

    >>> @npu_ge_converter("m_grouped_bf16_gemm", ir="GroupedMatmul")  # doctest: +SKIP
    ... def m_grouped_bf16_gemm_ge(a, b, layout, psum, alignment, out_dtype, meta_outputs=None): ...
    """

    def register(fn: Callable) -> Callable:
        kernel = with_defaults(name, fn)
        functools.update_wrapper(kernel, fn)  # TorchAir reads the signature for ``meta_outputs``
        NPU_GE_CONVERTERS[name] = kernel
        NPU_GE_IR[name] = ir
        return fn

    return register


NPU_GE_IR: dict[str, str] = {}


def import_families(package: str, path) -> None:
    """Import every module of ``package`` (``__name__``, ``__path__``): each family module registers its own
    pieces by name at import, so no list of families or ops is kept here. ``_``-prefixed modules are helpers
    their families import (e.g. Triton kernels, which need ``triton``)."""
    for family in pkgutil.iter_modules(path):
        if not family.name.startswith("_"):
            importlib.import_module(f"{package}.{family.name}")


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


@functools.cache
def result_type(name: str) -> type:
    """The outputs of ``ascend_moe::name`` as a named tuple whose fields are the schema's return names (``-> (Tensor
    recv_x, ...)``), so kernels build and callers read an op's many outputs by NAME, named once in the schema.
    Unnamed returns are ``result0``, ``result1``, ..."""
    schema = getattr(torch.ops.ascend_moe, name).default._schema
    fields = [r.name or f"result{i}" for i, r in enumerate(schema.returns)]
    return collections.namedtuple(f"{name}_outputs", fields)


def results(name: str, output) -> tuple:
    """``output`` (a tuple of ``ascend_moe::name``'s outputs) readable by name: ``results("ep_dispatch",
    out).recv_x``."""
    return result_type(name)(*output)


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


# What a compiled graph holding our ops bakes in: the schemas (outputs, dtypes), the fakes (shapes, strides) with the
# checks they run (guards and runtime asserts), the backward formulas (traced into AOTAutograd's backward graph) and
# compiler passes. Inductor's and AOTAutograd's
# caches treat every OpOverload as cacheable and key on the graph alone, so a new version of any of these would be
# served a stale compiled graph from an earlier one (seen: an op whose outputs were reordered kept the old order).
_GRAPH_SOURCES = ("fakes", "checks", "autograd", "inductor_lowerings")


def compile_cache_tag() -> str:
    """``ascend_moe-<hash>`` of every schema of the namespace and the sources graphs bake in (see above)."""
    import hashlib
    from pathlib import Path

    digest = hashlib.sha256()
    for name in op_names():
        for overload in getattr(torch.ops.ascend_moe, name).overloads():
            digest.update(str(getattr(getattr(torch.ops.ascend_moe, name), overload)._schema).encode())
    package = Path(__file__).resolve().parent
    for folder in _GRAPH_SOURCES:
        for path in sorted((package / folder).glob("*.py")):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return f"{NAMESPACE}-{digest.hexdigest()[:16]}"


def tag_compile_caches() -> None:
    """Add ``compile_cache_tag()`` to ``torch.compiler.config.cache_key_tag`` (kept beside a user's own tag), so
    compile caches written under other schemas, fakes or formulas are never reused."""
    tag = compile_cache_tag()
    current = torch.compiler.config.cache_key_tag
    kept = [t for t in current.split("|") if t and not t.startswith(f"{NAMESPACE}-")]
    torch.compiler.config.cache_key_tag = "|".join([*kept, tag])


def run_without_autocast() -> None:
    """Every op runs with autocast off, on its inputs as given: each op's contract fixes the dtypes it computes in
    (the FP32 accumulation of a GEMM, the FP8 codes of a quantized operand), and a kernel's inner torch calls
    would otherwise be recast under ``torch.autocast`` (a composed kernel then mixes BF16 and FP32 operands and
    fails, or silently computes in BF16). The modules cast what they feed the ops (``nn``'s docs)."""
    for name in op_names():
        packet = getattr(torch.ops.ascend_moe, name)
        for overload in packet.overloads():
            op = getattr(packet, overload)
            for key in _AUTOCAST_KEYS:
                _exclude_autocast(op, name if overload == "default" else f"{name}.{overload}", key)


def _exclude_autocast(op: torch._ops.OpOverload, name: str, key: str) -> None:
    dispatch_key = getattr(torch._C.DispatchKey, key)

    def run(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(dispatch_key)):
            return op(*args, **kwargs)

    # The Python dispatcher's entry (tracing: Dynamo, AOTAutograd, export) and the C++ dispatcher's, as
    # torch.library.register_autocast registers both.
    if not op.has_kernel_for_dispatch_key(dispatch_key):
        op.py_impl(dispatch_key)(run)
    _PORTABLE.impl(name, lambda _keys, *args, **kwargs: run(*args, **kwargs), key, with_keyset=True)
