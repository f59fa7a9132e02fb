"""Rewrite: the expert MLP's first grouped GEMM and its SwiGLU epilogue become one ``m_grouped_bf16_gemm_swiglu``
(``m_grouped_fp8_gemm_swiglu`` for a scaled L1: FP8 inference experts):

    h = m_grouped_bf16_gemm(a, b, layout)          # [M, 2I], rounded to a's dtype
        | m_grouped_fp8_gemm(a, sfa, b, sfb, layout)  # or a scaled L1 with a BF16 output
    gate, up = h.chunk(2, dim=-1)                  # aten.split / split_with_sizes
    act = silu(gate) * up                          # gate and up optionally widened to FP32, gate <= c, |up| <= c
    act = act * w[:, None]                         # optional FP32 routing weight per row
    act.to(dtype) | quantize_fp8(act, [1, g])      # optional final cast, or the per-token FP8 requant

(``nn.GroupedExperts``' forward, ``mega_moe``'s pipeline, Hugging Face's experts after the ``grouped_mm`` rewrite.)
The fused kernel never writes the ``[M, 2I]`` L1 output, and on CPU the epilogue runs on cache-resident tiles.

Numerics: the fused op rounds once at the end; where the graph rounded ``silu(gate)`` to BF16 before multiplying (a
BF16 model's eager ``act_fn(gate) * up``), the rewritten graph is the more accurate one, equal to the original within
the op's thresholds. Graphs that compute the epilogue in FP32 (``mega_moe``) get the same numbers up to the order
of the GEMM's FP32 sums.

SiLU is recognised as ``aten.silu``, ``x * sigmoid(x)`` and Inductor's decomposition ``x / (1 + exp(-x))``. Left
alone: an L1 output, gate, up or any step used elsewhere too (the GEMM's output would be needed anyway), other
activations, weights that are not one FP32 value per row, a clamp that differs between gate and up, a cast before the
requant, a requant that is not ``[1, g]`` or packs its scales, and any call the fused op's own checks refuse.

Training graphs save the L1 output for the backward, so nothing fuses there, unless ``enable(recompute_l1=True)``:
then ``tag_for_recompute`` (a joint-graph pass) has the partitioner recompute the chain in the backward.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.utils.checkpoint import CheckpointPolicy

from torch_ascend_moe.checks.grouped import swiglu_fp8_signature, swiglu_signature
from torch_ascend_moe.inductor_lowerings import grouped_mm
from torch_ascend_moe.inductor_lowerings._pass import Plan, accepts, call_args, joint_rewrite, rewrite, val

_ops = torch.ops.ascend_moe
aten, prims = torch.ops.aten, torch.ops.prims
_WIDE = (torch.float32, torch.float64)
_L1 = (_ops.m_grouped_bf16_gemm.default, _ops.m_grouped_fp8_gemm.default)  # the L1 GEMMs a fused op replaces


@dataclass
class _Match:
    """What the walk from the end of the chain back to the GEMM found."""

    h: torch.fx.Node | None = None
    gate_clamp: float | None = None
    up_clamp: float | None = None
    weights: torch.fx.Node | None = None
    nodes: set = field(default_factory=set)  # every node the fused op replaces (each must feed only the chain)
    l1: tuple = _L1  # the GEMMs the chain may start with

    def copy(self) -> _Match:
        return _Match(self.h, self.gate_clamp, self.up_clamp, self.weights, set(self.nodes), self.l1)


def _call(node, *targets) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in targets


def _strip_casts(node, m: _Match):
    """``node`` without the dtype conversions around it (recorded as replaced nodes)."""
    while _call(node, prims.convert_element_type.default, aten._to_copy.default):
        m.nodes.add(node)
        node = node.args[0]
    return node


def _split_sizes_halve(sizes, n) -> bool:
    """``aten.split``'s size (or ``split_with_sizes``' two sizes) cut ``n`` columns into two equal halves."""
    if isinstance(sizes, (list, tuple)):
        sizes = [val(x) if isinstance(x, torch.fx.Node) else x for x in sizes]
    elif isinstance(sizes, torch.fx.Node):  # a symbolic size under dynamic shapes
        sizes = val(sizes)
    if isinstance(sizes, (int, torch.SymInt)):
        return statically_known_true(2 * sizes == n)
    return len(sizes) == 2 and statically_known_true(sizes[0] == sizes[1]) and statically_known_true(2 * sizes[0] == n)


def _half(node, index: int, m: _Match) -> bool:
    """Whether ``node`` is ``getitem(split(h, I, -1), index)`` of an ``m_grouped_bf16_gemm`` with ``N = 2I``; the
    first half found fixes ``h``, the other must come from the same split."""
    if not (_call(node, operator.getitem) and node.args[1] == index):
        return False
    split = node.args[0]
    if not _call(split, aten.split.Tensor, aten.split_with_sizes.default):
        return False
    h, sizes = split.args[0], split.args[1]
    dim = split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)
    if not _call(h, *m.l1) or val(h) is None or dim not in (-1, 1):
        return False
    if not _split_sizes_halve(sizes, val(h).shape[1]) or (m.h is not None and m.h is not h):
        return False
    m.h = h
    m.nodes.update((node, split))
    return True


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _unclamped(node, m: _Match, gate: bool):
    """``node`` without its clamp, the bound recorded: gate ``clamp_max(x, c)`` / ``clamp(x, None, c)``, up
    ``clamp(x, -c, c)``; None for a clamp of another form."""
    if gate and _call(node, aten.clamp_max.default) and _number(node.args[1]):
        m.gate_clamp = float(node.args[1])
    elif not gate and _call(node, aten.clamp_max.default, aten.clamp_min.default) and _number(node.args[1]):
        # Inductor's decomposition of clamp(x, -c, c): clamp_max(clamp_min(x, -c), c) (or the other nesting).
        inner, outer_max = node.args[0], node.target is aten.clamp_max.default
        other = aten.clamp_min.default if outer_max else aten.clamp_max.default
        if not (_call(inner, other) and _number(inner.args[1])):
            return None
        hi, lo = (node.args[1], inner.args[1]) if outer_max else (inner.args[1], node.args[1])
        if lo != -hi:
            return None
        m.up_clamp = float(hi)
        m.nodes.update((node, inner))
        return inner.args[0]
    elif _call(node, aten.clamp.default):
        args = call_args(node)
        lo, hi = args["min"], args["max"]
        if gate and lo is None and _number(hi):
            m.gate_clamp = float(hi)
        elif not gate and _number(lo) and _number(hi) and lo == -hi:
            m.up_clamp = float(hi)
        else:
            return None
    else:
        return node
    m.nodes.add(node)
    return node.args[0]


def _up(node, m: _Match) -> bool:
    node = _unclamped(_strip_casts(node, m), m, gate=False)
    return node is not None and _half(_strip_casts(node, m), 1, m)


def _gate(node, m: _Match) -> bool:
    node = _unclamped(_strip_casts(node, m), m, gate=True)
    return node is not None and _half(_strip_casts(node, m), 0, m)


def _same_value(p, q, m: _Match) -> bool:
    """``p`` and ``q`` are one value: the same node, or the same conversion of one node (Inductor's decomposition
    converts a BF16 ``x`` once for each use in ``x * sigmoid(x)``)."""
    if p is q:
        return True
    if not (_call(p, prims.convert_element_type.default) and _call(q, prims.convert_element_type.default)):
        return False
    if p.args[1] != q.args[1] or p.args[0] is not q.args[0]:
        return False
    m.nodes.add(q)
    return True


def _silu(node, m: _Match) -> bool:
    """``node`` computes ``silu(gate)``: ``aten.silu(x)``, ``x * sigmoid(x)`` or ``x / (1 + exp(-x))``."""
    node = _strip_casts(node, m)
    x = None
    if _call(node, aten.silu.default):
        x = node.args[0]
    elif _call(node, aten.mul.Tensor):
        p, q = node.args
        if _call(p, aten.sigmoid.default):
            p, q = q, p
        if not _call(q, aten.sigmoid.default) or not _same_value(p, q.args[0], m):
            return False
        x = p
        m.nodes.add(q)
    elif _call(node, aten.div.Tensor):
        x, den = node.args
        if not (_call(den, aten.add.Tensor) and den.args[1] == 1 and len(den.args) == 2 and not den.kwargs):
            return False
        e = den.args[0]
        if not (_call(e, aten.exp.default) and _call(e.args[0], aten.neg.default) and e.args[0].args[0] is x):
            return False
        m.nodes.update((den, e, e.args[0]))
    else:
        return False
    m.nodes.add(node)
    return _gate(x, m)


def _product(node, m: _Match) -> bool:
    """``node`` is ``silu(gate) * up`` (either order)."""
    if not _call(node, aten.mul.Tensor) or len(node.args) != 2:
        return False
    m.nodes.add(node)
    p, q = node.args
    for s, u in ((p, q), (q, p)):
        trial = m.copy()
        if _silu(s, trial) and _up(u, trial) and trial.gate_clamp == trial.up_clamp:
            m.__dict__.update(trial.__dict__)
            return True
    return False


def _row_weights(node, rows):
    """The ``[M]`` FP32 tensor ``node`` broadcasts per row (``w.unsqueeze(1)`` or any ``[M, 1]`` FP32 value)."""
    v = val(node)
    if not isinstance(v, torch.Tensor) or v.dtype not in _WIDE or v.dim() != 2:
        return None
    if not (statically_known_true(v.shape[0] == rows) and statically_known_true(v.shape[1] == 1)):
        return None
    return node


def _activation(node, m: _Match) -> bool:
    """``node`` is ``silu(gate) * up``, optionally times per-row weights (either order)."""
    node = _strip_casts(node, m)
    trial = m.copy()
    if _product(node, trial):
        m.__dict__.update(trial.__dict__)
        return True
    if not _call(node, aten.mul.Tensor) or len(node.args) != 2:
        return False
    for act, w in (node.args, node.args[::-1]):
        trial = m.copy()
        trial.nodes.add(node)
        if isinstance(w, torch.fx.Node) and _product(_strip_casts(act, trial), trial):
            if _row_weights(w, val(trial.h).shape[0]) is not None:
                trial.weights = w
                m.__dict__.update(trial.__dict__)
                return True
    return False


def _feeds_only_the_chain(m: _Match, end: torch.fx.Node) -> bool:
    inside = m.nodes | {end}
    return set(m.h.users) <= inside and all(set(n.users) <= inside for n in m.nodes)


def _chain(end: torch.fx.Node, act_node, quant: tuple[int, bool] | None, l1: tuple = _L1):
    """``(match, plan)`` for the chain ending at ``end`` whatever else uses its steps, or None: what the fused op would
    replace (``match.h`` and ``match.nodes``, ``end`` excluded) and the call that would replace it, if the op's
    checks take it. ``l1`` may add the stock grouped GEMMs (``grouped_mm.STOCK``: a joint graph's stock experts, which
    ``grouped_mm`` turns into ours after the partition): their chains have no plan of their own (None)."""
    m = _Match(l1=l1)
    if not _activation(act_node, m) or m.h is None:
        return None
    if quant is not None:  # the requant takes the FP32 epilogue itself: a cast in between would round first
        if _call(act_node, prims.convert_element_type.default) or val(act_node).dtype != torch.float32:
            return None
    m.nodes.discard(end)
    gran, ue8m0 = quant if quant is not None else (0, False)
    out_dtype = None if quant is not None else val(end).dtype
    fp8 = m.h.target is _ops.m_grouped_fp8_gemm.default
    stock = m.h.target in grouped_mm.STOCK
    gemm = grouped_mm.experts_gemm(m.h) if stock else call_args(m.h)
    if gemm is None:
        return None
    # The fused ops' L1 output is rounded to a's dtype (BF16 for the scaled one).
    h_dtype = torch.bfloat16 if fp8 else val(gemm["a"]).dtype
    if gemm["out_dtype"] not in (None, h_dtype) or val(m.h).dtype != h_dtype:
        return None
    compute = torch.float64 if h_dtype == torch.float64 else torch.float32
    if m.weights is not None and val(m.weights).dtype != compute:
        return None
    w_val = None if m.weights is None else val(m.weights).reshape(-1)
    operands = ("a", "sfa", "b", "sfb", "layout") if fp8 else ("a", "b", "layout")
    options = ("psum", "alignment", "recipe_a", "recipe_b") if fp8 else ("psum", "alignment")
    tensors, static = [gemm[k] for k in operands], [gemm[k] for k in options]
    epilogue = (m.gate_clamp, gran, ue8m0, out_dtype)
    op = _ops.m_grouped_fp8_gemm_swiglu.default if fp8 else _ops.m_grouped_bf16_gemm_swiglu.default
    signature = swiglu_fp8_signature if fp8 else swiglu_signature
    fakes = [gemm["fakes"][k] for k in operands] if stock else [val(t) for t in tensors]
    if not accepts(signature, *fakes, *static, w_val, *epilogue):
        return None
    if stock:
        return m, None
    weighted = m.weights is not None

    def fused(*inputs):
        row_weights = inputs[-1].reshape(-1) if weighted else None
        out, sf = op(*inputs[: len(tensors)], *static, row_weights, *epilogue)
        return (out, sf) if quant is not None else out

    return m, Plan(fused, [*tensors, *([m.weights] if weighted else [])], op)


def _plan(end: torch.fx.Node, act_node, quant: tuple[int, bool] | None) -> Plan | None:
    found = _chain(end, act_node, quant)
    return found[1] if found is not None and _feeds_only_the_chain(found[0], end) else None


def _product_end(end: torch.fx.Node):
    return end, None


def _cast_end(end: torch.fx.Node):
    return (end.args[0], None) if _call(end.args[0], aten.mul.Tensor) else None


def _requant_end(end: torch.fx.Node):
    args = call_args(end)
    block = list(args["block"])
    if block[0] != 1 or args["use_packed_ue8m0"]:
        return None
    return args["x"], (block[1], args["use_ue8m0"])


# The calls a chain may end with -> (the node computing the activation, the requant's (g, UE8M0) or None), or None.
_ENDS = {
    aten.mul.Tensor: _product_end,
    prims.convert_element_type.default: _cast_end,
    _ops.quantize_fp8.default: _requant_end,
}


def _planner(read_end):
    def plan(end: torch.fx.Node) -> Plan | None:
        ends = read_end(end)
        return None if ends is None else _plan(end, *ends)

    return plan


plan_product, plan_cast, plan_requant = (rewrite(op, "swiglu_epilogue")(_planner(e)) for op, e in _ENDS.items())


@joint_rewrite("recompute_l1")
def tag_for_recompute(graph: torch.fx.Graph, forward: set) -> int:  # -> how many chains it tagged
    """Training graphs (``enable(recompute_l1=True)``): in the joint graph the backward reads the L1 output and the
    SwiGLU's steps, so the forward must keep them and the rewrite above never applies. Tagging the L1 GEMM and the
    chain's steps ``MUST_RECOMPUTE`` makes the partitioner recompute them in the backward from the L1's operands
    (which the weight gradient keeps anyway); the forward graph is then the plain chain, which the post-grad rewrite
    fuses: no ``[M, 2I]`` output computed or kept, one more L1 GEMM in the backward. A chain whose steps another
    forward computation reads is left alone (the forward needs them anyway)."""
    tagged = 0
    for end in graph.nodes:
        read_end = _ENDS.get(end.target) if end.op == "call_function" else None
        ends = read_end(end) if read_end is not None else None
        found = _chain(end, *ends, l1=(*_L1, *grouped_mm.STOCK)) if ends is not None else None
        if found is None:
            continue
        m = found[0]
        inside = m.nodes | {end}
        outside = {u for n in (m.h, *m.nodes) for u in n.users if u not in inside}
        if end not in forward or outside & forward:
            continue
        chain = (m.h, *m.nodes)
        tagged += any(node.meta.get("recompute") != CheckpointPolicy.MUST_RECOMPUTE for node in chain)
        for node in chain:
            node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
    return tagged
