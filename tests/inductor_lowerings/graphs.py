"""Compiling a function and reading the post-grad graph Inductor hands to the custom passes, with or without ours:
the golden tests compare its text, the numerics tests the compiled outputs with and without the rewrites."""

from __future__ import annotations

import contextlib

import torch
from torch._inductor import config
from torch._inductor.custom_graph_pass import CustomGraphPass

from torch_ascend_moe import inductor_lowerings


class Recorder(CustomGraphPass):
    """A user's post-grad pass that keeps the text of each graph it sees (after ours, when ours are on). Its
    ``uuid()`` is None: the FX graph cache is bypassed, so every compile runs the passes."""

    def __init__(self) -> None:
        self.graphs: list[str] = []
        self.outputs: list[list] = []  # each graph's output values (a forward's include what it keeps for backward)

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.graphs.append(graph_text(graph))
        self.outputs.append([n.meta.get("val") for n in graph.output_node().all_input_nodes])

    def uuid(self):
        return None


def _arg(a) -> str:
    if isinstance(a, torch.fx.Node):
        return a.name
    if isinstance(a, (list, tuple)):
        return "[" + ", ".join(_arg(x) for x in a) + "]"
    return repr(a)


def graph_text(graph: torch.fx.Graph) -> str:
    """One line per call: ``name = target(args)``; the op's namespace and overload left out."""
    lines = []
    for n in graph.nodes:
        if n.op == "call_function":
            target = str(n.target).removeprefix("ascend_moe.").removesuffix(".default")
            target = "getitem" if "getitem" in target else target
            args = [_arg(a) for a in n.args] + [f"{k}={_arg(v)}" for k, v in n.kwargs.items()]
            lines.append(f"{n.name} = {target}({', '.join(args)})")
    return "\n".join(lines)


def compiled(fn, *args, passes: bool, dynamic: bool = False):
    """``(outputs, post-grad graph text)`` of ``torch.compile(fn, fullgraph=True)(*args)`` with our passes on or off."""
    torch._dynamo.reset()
    recorder = Recorder()
    with config.patch(post_grad_custom_post_pass=recorder):
        with inductor_lowerings.enabled() if passes else contextlib.nullcontext():
            out = torch.compile(fn, fullgraph=True, dynamic=dynamic)(*args)
    torch._dynamo.reset()
    return out, recorder.graphs[-1]


def compiled_training(fn, *args, passes: bool, recompute_l1: bool = False, dynamic: bool = False):
    """``torch.compile(fn, fullgraph=True)`` run forward and backward (the loss: the sum of the squared outputs) on
    fresh leaves of ``args``' tensors that require grad: ``(outputs, their gradients, recorder)``, the recorder holding
    the forward graph and then the backward graph."""
    torch._dynamo.reset()
    leaves = [a.detach().requires_grad_() if isinstance(a, torch.Tensor) and a.requires_grad else a for a in args]
    recorder = Recorder()
    with config.patch(post_grad_custom_post_pass=recorder):
        with inductor_lowerings.enabled(recompute_l1) if passes else contextlib.nullcontext():
            out = torch.compile(fn, fullgraph=True, dynamic=dynamic)(*leaves)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            sum(o.float().square().sum() for o in outs if o.is_floating_point()).backward()
    torch._dynamo.reset()
    grads = [a.grad for a in leaves if isinstance(a, torch.Tensor) and a.requires_grad]
    return out, grads, recorder


def assert_same(got, want) -> None:
    """Outputs equal bit for bit (NaN where NaN)."""
    got, want = (tuple(x) if isinstance(x, (tuple, list)) else (x,) for x in (got, want))
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g.isnan(), w.isnan()) and torch.equal(g.nan_to_num(), w.nan_to_num())
