"""The machinery every rewrite of this package shares: one ``PatternMatcherPass`` the rewrite modules register
into (each by its family's op, at its first use), the ``CustomGraphPass`` that applies it after Inductor's own
post-grad passes and then a user's pass, and the helpers a rewrite needs to read a node's arguments.

A rewrite matches calls of one op (``CallFunctionVarArgs``: the arguments are read through the op's schema, so
defaults left out of the graph and arguments given by name match alike), checks the producers of its inputs in
``plan``, and replaces the call by ``Match.replace_by_example`` (the replacement traced on the matched nodes' fake
values); nodes nobody uses any more are removed afterwards.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import operator
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
from torch._inductor.pattern_matcher import CallFunctionVarArgs, Match, PatternMatcherPass, register_graph_pattern
from torch.fx.operator_schemas import normalize_function

from torch_ascend_moe.backends import cpu_gemm
from torch_ascend_moe.inductor_lowerings import MATCHES

PASS = PatternMatcherPass(pass_name="ascend_moe")


@dataclass(frozen=True)
class Plan:
    """A rewrite's decision for one matched call: ``replacement(*inputs)`` (traced on the inputs' fake values)
    replaces the call; ``inputs`` are graph nodes; ``op`` is the fused op it calls (a compiler may not take it)."""

    replacement: Callable
    inputs: list
    op: torch._ops.OpOverload


# Which fused ops the running pass may introduce (None: every one); set by AscendMoEPasses while it runs.
_ALLOWED: contextvars.ContextVar[Callable[[str], bool] | None] = contextvars.ContextVar("allowed", default=None)


def call_args(node: torch.fx.Node) -> dict:
    """``node``'s arguments by schema name, defaults filled in (a graph leaves out arguments equal to them)."""
    return normalize_function(node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True).kwargs


def output_of(node, op, index: int) -> torch.fx.Node | None:
    """The node of ``op`` whose output ``index`` is ``node`` (``getitem(op(...), index)``), else None."""
    if isinstance(node, torch.fx.Node) and node.target is operator.getitem and node.args[1] == index:
        producer = node.args[0]
        if isinstance(producer, torch.fx.Node) and producer.target is op:
            return producer
    return None


def only_used_by(nodes, user: torch.fx.Node) -> bool:
    """Whether ``user`` is the only consumer of every node in ``nodes`` (else the producer would run twice)."""
    return all(set(n.users) == {user} for n in nodes)


def val(node):
    """The fake value Inductor keeps for ``node`` (None for constants)."""
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def accepts(signature: Callable, *args) -> bool:
    """Whether the fused op's own checks (its meta ``signature``) accept ``args`` (fake values): a rewrite must never
    turn a graph that runs into one that raises."""
    try:
        signature(*args)
    except (ValueError, TypeError, RuntimeError, NotImplementedError):
        return False
    return True


def rewrite(op, name: str):
    """Register ``plan(node) -> Plan | None`` as the rewrite ``name`` of calls to ``op``.

    >>> @rewrite(torch.ops.ascend_moe.fp8_gemm.default, "quant_gemm")  # doctest: +SKIP
    ... def plan(node): ...
    """

    def register(plan: Callable[[torch.fx.Node], Plan | None]):
        def applies(match: Match) -> bool:
            decision, allowed = plan(match.output_node()), _ALLOWED.get()
            return decision is not None and (allowed is None or allowed(decision.op._opname))

        def apply(match: Match, *args, **kwargs) -> None:
            node = match.output_node()
            decision, feeding = plan(node), list(node.all_input_nodes)
            match.replace_by_example(decision.replacement, decision.inputs)
            _erase_orphans(feeding)
            MATCHES[name] += 1

        register_graph_pattern(CallFunctionVarArgs(op), extra_check=applies, pass_dict=PASS)(apply)
        return plan

    return register


_JOINT: dict[str, Callable[[torch.fx.Graph, set], int]] = {}  # joint-graph passes, by rewrite name


def joint_rewrite(name: str):
    """Register ``tag(graph, forward) -> count`` as the joint-graph part of the rewrite ``name``: it runs on the joint
    forward + backward graph before AOTAutograd partitions it (``forward`` is the set of nodes the forward outputs
    need) and may only annotate nodes (``node.meta["recompute"]``), never change what the graph computes."""

    def register(tag: Callable[[torch.fx.Graph, set], int]):
        _JOINT[name] = tag
        return tag

    return register


def forward_nodes(graph: torch.fx.Graph) -> set:
    """The nodes of a joint graph that its forward outputs need: the ancestors of the outputs that do not depend on
    a tangent (a joint graph returns the forward's outputs and then the gradients), and the output node itself."""
    backward: set = set()
    for node in graph.nodes:
        tangent = node.op == "placeholder" and "tangents" in str(node.target)
        if tangent or any(n in backward for n in node.all_input_nodes):
            backward.add(node)
    output = graph.output_node()
    needed, stack = {output}, [n for n in output.all_input_nodes if n not in backward]
    while stack:
        node = stack.pop()
        if node not in needed:
            needed.add(node)
            stack.extend(node.all_input_nodes)
    return needed


_LATE: list[Callable[[], bool]] = []  # registrations waiting for their op to exist


def late_rewrite(register: Callable[[], bool]) -> Callable[[], bool]:
    """Run ``register()`` at each compile until it returns True: for rewrites of another library's op that exists
    only once that library imported (transformers registers its ops lazily)."""
    _LATE.append(register)
    return register


def _register_late() -> None:
    _LATE[:] = [r for r in _LATE if not r()]


def _erase_orphans(nodes) -> None:
    """Remove the nodes that fed a replaced call and now feed nothing (the producers the fused op computes itself),
    and their own orphaned producers; only ``getitem``, calls of our ops and pure ATen/prims calls (the elementwise
    steps an epilogue fusion absorbs)."""
    stack = list(nodes)
    while stack:
        node = stack.pop()
        ours = isinstance(node.target, torch._ops.OpOverload) and node.target.namespace == "ascend_moe"
        pure = isinstance(node.target, torch._ops.OpOverload) and node.target.namespace in ("aten", "prims")
        pure = pure and not node.is_impure()
        if not node._erased and not node.users and (node.target is operator.getitem or ours or pure):
            stack.extend(node.all_input_nodes)
            node.graph.erase_node(node)


def _rewrite_modules() -> list[Path]:
    """The sources a compiled graph's rewrites depend on: this package's, and the quant reference that
    ``quantize_inline`` traces into the graph."""
    package = Path(__file__).parent
    return sorted(package.glob("*.py")) + sorted((package.parent / "quant").glob("*.py"))


@functools.cache
def register_rewrites() -> None:
    """Import every rewrite module of this package once (each registers itself into ``PASS``); lazily, at the first
    compile with the passes on, so importing torch_ascend_moe costs nothing."""
    for module in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__package__}.{module.name}")


_MAX_ROUNDS = 3  # rewrites feed each other at most two deep (grouped_mm -> swiglu_epilogue)


class AscendMoEPasses(CustomGraphPass):
    """Our rewrites, then ``user`` (the post-grad pass that was installed before ours, if any); ``allowed(name)``
    says which fused ops may be introduced (TorchAir's GE mode: those with a GE converter).

    ``uuid()`` hashes this package's sources (a changed rewrite is a new cache key), the CPU capabilities some rewrites
    decide by (``backends.cpu_gemm``: a cache directory shared between machines must not hand one CPU's choice to
    another) and the user pass's own uuid; a user pass that is a plain function has none, so the FX graph cache is
    bypassed, as it would be without us."""

    def __init__(self, user=None, allowed: Callable[[str], bool] | None = None) -> None:
        self.user, self.allowed = user, allowed

    def __call__(self, graph: torch.fx.Graph) -> None:
        register_rewrites()
        _register_late()
        token = _ALLOWED.set(self.allowed)
        try:
            # Again while something changed: one rewrite can make another's pattern (a stock model's _grouped_mm
            # becomes our grouped GEMM, whose SwiGLU epilogue then fuses); the matcher visits each node once per pass.
            for _ in range(_MAX_ROUNDS):
                if not PASS.apply(graph):
                    break
        finally:
            _ALLOWED.reset(token)
        if self.user is not None:
            self.user(graph)

    def uuid(self):
        return _uuid(self.user)


class AscendMoEJointPasses(CustomGraphPass):
    """The joint-graph parts of our rewrites (``joint_rewrite``), then ``user`` (the joint pass installed before
    ours, if any); ``uuid()`` as ``AscendMoEPasses``'."""

    def __init__(self, user=None) -> None:
        self.user = user

    def __call__(self, graph: torch.fx.Graph) -> None:
        register_rewrites()
        _register_late()
        forward = forward_nodes(graph)
        for name, tag in _JOINT.items():
            MATCHES[name] += tag(graph, forward)
        if self.user is not None:
            self.user(graph)

    def uuid(self):
        return _uuid(self.user)


def _uuid(user):
    ours = (
        get_hash_for_files(tuple(_rewrite_modules())),
        tuple(sorted((str(t), v) for t, v in cpu_gemm.NATIVE.items())),
    )
    if user is None:
        return ours
    theirs = user.uuid() if isinstance(user, CustomGraphPass) else None
    return None if theirs is None else (ours, theirs)
