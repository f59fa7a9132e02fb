"""Rewrite: a combine followed by ``+ residual`` (or ``+ shared_experts(x)``) takes the addend as the combine's own
bias: ``moe_unpermute(y, row_map, w) + r`` becomes ``moe_unpermute(y, row_map, w, bias=r)`` and
``ep_combine(...)[0] + r`` becomes ``ep_combine(..., bias_0=r)`` (``bias_1`` when ``bias_0`` is taken). One FP32 sum
from the addend over the token's rows and one rounding instead of a rounded combine, a second pass over ``[T, H]``
and a second rounding: the rewritten graph is at least as accurate, equal to the unrewritten one within the ops'
thresholds (bit for bit it is not: the rounding points differ). Where the addend is a GEMM's output (``nn.MoE``'s
shared experts end in their down projection), Inductor's own post-grad patterns, which run first, already make the
add that GEMM's ``addmm`` bias: one rounding too, and nothing left for this rewrite.

Left alone: an addend that broadcasts or has another dtype than the combine's output (the add would promote or
broadcast), ``add`` with ``alpha``, a combine whose output (or, for ``ep_combine``, any output) is used elsewhere too,
a combine whose bias slots are all taken.
"""

from __future__ import annotations

import operator

import torch

from torch_ascend_moe.inductor_lowerings._pass import Plan, call_args, only_used_by, output_of, rewrite, val

_ops = torch.ops.ascend_moe


def _addend(add: torch.fx.Node, combined: torch.fx.Node):
    """The other operand of ``add`` when it is a same-shape, same-dtype tensor (no promotion or broadcast)."""
    args = call_args(add)
    if args.get("alpha", 1) != 1:
        return None
    other = args["other"] if args["input"] is combined else args["input"]
    if other is combined:  # combined + combined: no addend to fold
        return None
    out, r = val(combined), val(other)
    if not isinstance(r, torch.Tensor) or r.shape != out.shape or r.dtype != out.dtype or val(add).dtype != out.dtype:
        return None
    return other


def _combine_of(add: torch.fx.Node):
    """(``moe_unpermute`` node or ``getitem(ep_combine, 0)``, which) among ``add``'s operands."""
    for operand in add.args[:2]:
        if isinstance(operand, torch.fx.Node) and operand.target is _ops.moe_unpermute.default:
            return operand, "unpermute"
        if output_of(operand, _ops.ep_combine.default, 0) is not None:
            return operand, "ep_combine"
    return None, None


@rewrite(torch.ops.aten.add.Tensor, "combine_residual")
def plan(add: torch.fx.Node) -> Plan | None:
    combined, kind = _combine_of(add)
    if combined is None or not only_used_by([combined], add):
        return None
    r = _addend(add, combined)
    if r is None:
        return None
    if kind == "unpermute":
        args = call_args(combined)
        if args["bias"] is not None:
            return None
        w = args["topk_weights"]

        def unpermute(y, row_map, r, *w):
            return _ops.moe_unpermute.default(y, row_map, w[0] if w else None, r)

        inputs = [args["y"], args["row_map"], r, *([w] if w is not None else [])]
        return Plan(unpermute, inputs, _ops.moe_unpermute.default)
    combine = combined.args[0]
    if set(combine.users) != {combined}:  # the combined weights (output 1) are used too: the combine would run twice
        return None
    args = call_args(combine)
    slot = "bias_0" if args["bias_0"] is None else "bias_1" if args["bias_1"] is None else None
    if slot is None:
        return None
    tensors = [k for k, v in args.items() if isinstance(v, torch.fx.Node)]
    constants = {k: v for k, v in args.items() if not isinstance(v, torch.fx.Node)}

    def ep_combine(*nodes):
        given = dict(zip(tensors, nodes[:-1]))
        return operator.getitem(_ops.ep_combine.default(**{**constants, **given, slot: nodes[-1]}), 0)

    return Plan(ep_combine, [args[k] for k in tensors] + [r], _ops.ep_combine.default)
