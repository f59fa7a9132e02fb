"""A CPU evaluator of the GE graphs our TorchAir converters build (``npu_wheel.ge_graph``): each Ascend IR op they
use, computed with torch from its ``REG_OP`` definition (the docstrings of TorchAir's
``auto_generated_ge_raw_ops.py`` / ``dynamic_output_ops.py``), ``GroupedMatmul`` through our CPU reference of
torch_npu's ``npu_grouped_matmul`` (tests/npu/grouped_refs.py). Our reading of the IR, not Ascend's graph engine:
it checks that a converter wires the right values into the right inputs, attributes and dtypes.

An op type not listed here raises, so a converter that starts using a new IR op cannot pass unchecked.
"""

from __future__ import annotations

import functools
import re
import sys

import torch


def _proto_to_torch(proto_dtype: int) -> torch.dtype:
    g = sys.modules["torchair.ge._ge_graph"]
    return g.ge_type_to_torch_type(g._ge_proto_dtype_to_ge_dtype(proto_dtype))


def _ge_to_torch(ge_dtype: int) -> torch.dtype:
    return sys.modules["torchair.ge._ge_graph"].ge_type_to_torch_type(ge_dtype)


def _const(op) -> torch.Tensor:
    t = op.attr["value"].t
    dtype = _proto_to_torch(t.desc.dtype)
    flat = torch.frombuffer(bytearray(t.data), dtype=dtype) if t.data else torch.empty(0, dtype=dtype)
    return flat.reshape(list(t.desc.shape.dim)).clone()


def _inputs(op, env):
    """Op inputs by name (``x``, or ``x0, x1, ...`` gathered into a list for dynamic inputs); an unfed optional
    input is None."""
    named: dict[str, object] = {}
    data = [i for i in op.input if not i.endswith(":-1")]  # control edges carry no value
    for ref, desc in zip(data, op.input_desc):
        value = env[ref] if ref else None
        name = desc.name
        stem = name.rstrip("0123456789")
        if stem != name and stem in DYNAMIC.get(op.type, ()):
            named.setdefault(stem, []).append(value)
        else:
            named[name] = value
    return named


@functools.cache
def _ir_defaults(op_type: str) -> dict[str, object]:
    """The ``.ATTR(name, Type, default)`` defaults of an IR op's ``REG_OP`` text: TorchAir leaves an optional
    attribute equal to its default out of the graph (``compat_ir``), so the evaluator reads it from here."""
    raw = sys.modules["torchair._ge_concrete_graph.auto_generated_ge_raw_ops"]
    doc = getattr(raw, op_type, None).__doc__ or ""
    out: dict[str, object] = {}
    for name, kind, value in re.findall(r"\.ATTR\((\w+), (\w+), ([^)]*)\)", doc):
        if kind == "Int":
            dtypes = sys.modules["torchair.ge._ge_graph"].DataType  # an Int default may name a DataType
            out[name] = int(value) if value.lstrip("-").isdigit() else getattr(dtypes, value)
        elif kind == "Float":
            out[name] = float(value)
        elif kind == "Bool":
            out[name] = value == "true"
        elif kind == "String":
            out[name] = value.strip('"').encode()
    return out


def _attr(op, name):
    if name not in op.attr:
        return _ir_defaults(op.type)[name]
    a = op.attr[name]
    kind = a.WhichOneof("value")
    if kind == "list":
        return list(a.list.i) or list(a.list.f) or list(a.list.b)
    return getattr(a, kind) if kind else None


DYNAMIC = {
    "GroupedMatmul": ("x", "weight", "bias", "scale", "offset", "antiquant_scale", "antiquant_offset"),
    "ConcatV2": ("x",),
}


def _grouped_matmul(op, i):
    empty = lambda ts: None if not ts or all(t is None or t.numel() == 0 for t in ts) else ts  # noqa: E731
    scale, per_token = empty(i.get("scale")), i.get("per_token_scale")
    # MX (Ascend 950): E8M0 scales on both operands, modelled by the reference as torch_npu's call with
    # scale_dtype = per_token_scale_dtype = float8_e8m0fnu.
    mx = scale is not None and per_token is not None and scale[0].dtype == per_token.dtype == torch.float8_e8m0fnu
    for unused in ("bias", "offset", "antiquant_scale", "antiquant_offset", *(() if mx else ("scale",))):
        if empty(i.get(unused)) is not None:
            raise NotImplementedError(f"GroupedMatmul: input {unused} is not modelled")
    if (per_token is not None and not mx) or _attr(op, "act_type") or _attr(op, "transpose_x"):
        raise NotImplementedError("GroupedMatmul: per_token_scale / act_type / transpose_x are not modelled")
    weight = i["weight"]
    if _attr(op, "transpose_weight"):
        weight = [w.transpose(-1, -2) for w in weight]
    # IR attr dtype: -1 = x's dtype, 0 fp16, 1 bf16, 2 int32, 3 fp32 (torch_npu's convert_ydtype_in_a8)
    out = {-1: None, 0: 5, 1: 15, 2: 3, 3: 6}[_attr(op, "dtype")]
    mx_args = {}
    if mx:
        mx_args = {
            "scale": [scale[0].view(torch.uint8)],
            "per_token_scale": [per_token.view(torch.uint8)],
            "scale_dtype": 293,
            "per_token_scale_dtype": 293,
        }
    return torch.ops.npu.npu_grouped_matmul(
        i["x"],
        weight,
        group_list=i["group_list"],
        split_item=_attr(op, "split_item"),
        group_type=_attr(op, "group_type"),
        group_list_type=_attr(op, "group_list_type"),
        output_dtype=out,
        **mx_args,
    )


def _sort(op, i):
    values, indices = torch.sort(
        i["x"], dim=_attr(op, "axis"), descending=bool(_attr(op, "descending")), stable=bool(_attr(op, "stable"))
    )
    return [values, indices.to(torch.int32)]


def _bitcast(op, i):
    """TensorFlow's Bitcast: to a narrower type adds a last dim of the size ratio, to a wider one removes it."""
    x, dtype = i["x"].contiguous(), _ge_to_torch(_attr(op, "type"))
    if x.dtype.itemsize > dtype.itemsize:
        return x.view(dtype).reshape(*x.shape, x.dtype.itemsize // dtype.itemsize)
    return x.view(dtype).reshape(x.shape[:-1]) if x.dtype.itemsize < dtype.itemsize else x.view(dtype)


def _torch_npu_dtype(ge_dtype: int) -> int:
    """torch_npu's dtype enum (NPU_DTYPES) of a GE dtype, as torch_npu's ops take it."""
    from torch_ascend_moe.testing.npu_wheel import NPU_DTYPES

    return NPU_DTYPES[str(_ge_to_torch(ge_dtype)).split(".")[-1]]


def _dynamic_mx_quant(op, i):
    return list(
        torch.ops.npu.npu_dynamic_mx_quant(
            i["x"],
            axis=_attr(op, "axis"),
            round_mode=_attr(op, "round_mode").decode(),
            dst_type=_torch_npu_dtype(_attr(op, "dst_type")),
            # the graph's attribute is "blocksize" (what torch_npu's raw op writes; its REG_OP text says block_size)
            block_size=_attr(op, "blocksize") if "blocksize" in op.attr else _ir_defaults(op.type)["block_size"],
            scale_alg=_attr(op, "scale_alg"),
            dst_type_max=_attr(op, "dst_type_max"),
            max_low_bound=_attr(op, "max_low_bound"),
        )
    )


def _moe_gating_top_k(op, i):
    if i.get("input_ids") is not None:
        raise NotImplementedError("MoeGatingTopK: the hash mode is not modelled")
    names = ("k_group", "group_count", "group_select_mode", "renorm", "norm_type", "out_flag")
    kwargs = {n: _attr(op, n) for n in names}
    kwargs["out_flag"] = bool(kwargs["out_flag"])
    return list(
        torch.ops.npu.npu_moe_gating_top_k(
            i["x"],
            _attr(op, "k"),
            bias=i.get("bias"),
            routed_scaling_factor=_attr(op, "routed_scaling_factor"),
            eps=_attr(op, "eps"),
            **kwargs,
        )
    )


def _quant_batch_matmul_v4(op, i):
    unused = ("bias", "y_scale", "x1_offset", "x2_offset", "y_offset", "x2_table")
    if any(i.get(n) is not None for n in unused) or _attr(op, "transpose_x1") or _attr(op, "transpose_x2"):
        raise NotImplementedError("QuantBatchMatmulV4: only x1, x2, x1_scale, x2_scale and group_size are modelled")
    packed = _attr(op, "group_size")  # (m << 32) + (n << 16) + k, torch_npu's converter's encoding
    sizes = [packed >> 32, (packed >> 16) & 0xFFFF, packed & 0xFFFF]
    out = {v: k for k, v in _SCALAR_TYPES.items()}[_ge_to_torch(_attr(op, "dtype"))]
    return torch.ops.npu.npu_quant_matmul(
        i["x1"], i["x2"], i["x2_scale"], pertoken_scale=i["x1_scale"], output_dtype=out, group_sizes=sizes
    )


_SCALAR_TYPES = {5: torch.float16, 6: torch.float32, 15: torch.bfloat16}


def _moe_init_routing_v3(op, i):
    if i.get("scale") is not None or i.get("offset") is not None:
        raise NotImplementedError("MoeInitRoutingV3: scale / offset are not modelled")
    names = (
        "active_num",
        "expert_capacity",
        "expert_num",
        "drop_pad_mode",
        "expert_tokens_num_type",
        "quant_mode",
        "active_expert_range",
        "row_idx_type",
    )
    kwargs = {n: _attr(op, n) for n in names}
    kwargs["expert_tokens_num_flag"] = bool(_attr(op, "expert_tokens_num_flag"))
    return list(torch.ops.npu.npu_moe_init_routing_v2(i["x"], i["expert_idx"], **kwargs))


def _cumsum(op, i):
    x, axis = i["x"], int(i["axis"])
    out = torch.cumsum(x.flip(axis) if _attr(op, "reverse") else x, axis)
    if _attr(op, "exclusive"):
        out = out - (x.flip(axis) if _attr(op, "reverse") else x)
    return out.flip(axis) if _attr(op, "reverse") else out


def _moe_distribute_dispatch_v2(op, i):
    unused = ("scales", "elastic_info", "performance_info")
    if any(i.get(n) is not None for n in unused):
        raise NotImplementedError("MoeDistributeDispatchV2: scales / elastic_info / performance_info are not modelled")
    names = ("shared_expert_num", "quant_mode", "global_bs", "expert_token_nums_type")
    return list(
        torch.ops.npu.npu_moe_distribute_dispatch_v2.default(
            i["x"],
            i["expert_ids"],
            _attr(op, "group_ep").decode(),
            _attr(op, "ep_world_size"),
            _attr(op, "ep_rank_id"),
            _attr(op, "moe_expert_num"),
            x_active_mask=i.get("x_active_mask"),
            expert_scales=i.get("expert_scales"),
            **{n: _attr(op, n) for n in names},
        )
    )


def _moe_distribute_combine_v2(op, i):
    unused = ("tp_send_counts", "expand_scales", "shared_expert_x", "elastic_info", "ori_x", "performance_info")
    if any(i.get(n) is not None for n in unused):
        raise NotImplementedError(f"MoeDistributeCombineV2: {', '.join(unused)} are not modelled")
    names = ("shared_expert_num", "global_bs", "comm_quant_mode")
    return torch.ops.npu.npu_moe_distribute_combine_v2.default(
        i["expand_x"],
        i["expert_ids"],
        i["assist_info_for_combine"],
        i["ep_send_counts"],
        i["expert_scales"],
        _attr(op, "group_ep").decode(),
        _attr(op, "ep_world_size"),
        _attr(op, "ep_rank_id"),
        _attr(op, "moe_expert_num"),
        x_active_mask=i.get("x_active_mask"),
        **{n: _attr(op, n) for n in names},
    )


def _slice(op, i):
    """TensorFlow's Slice: ``size[d] == -1`` takes the rest of dimension d."""
    offsets, sizes = i["offsets"].reshape(-1).tolist(), i["size"].reshape(-1).tolist()
    return i["x"][tuple(slice(o, None if s == -1 else o + s) for o, s in zip(offsets, sizes))]


def _gather(x, index, axis):
    axis = int(axis)
    return x.index_select(axis, index.reshape(-1).long()).reshape([*x.shape[:axis], *index.shape, *x.shape[axis + 1 :]])


OPS = {
    "Cast": lambda op, i: i["x"].to(_ge_to_torch(_attr(op, "dst_type"))),
    "Shape": lambda op, i: torch.tensor(i["x"].shape, dtype=_ge_to_torch(_attr(op, "dtype"))),
    "GatherV2": lambda op, i: _gather(i["x"], i["indices"], i["axis"]),
    "ConcatV2": lambda op, i: torch.cat(i["x"], int(i["concat_dim"])),
    "SliceD": lambda op, i: i["x"][
        tuple(slice(o, None if s == -1 else o + s) for o, s in zip(_attr(op, "offsets"), _attr(op, "size")))
    ],
    "Bitcast": _bitcast,
    "LeftShift": lambda op, i: torch.bitwise_left_shift(i["x"], i["y"]),
    "Equal": lambda op, i: i["x1"] == i["x2"],
    "DynamicMxQuant": _dynamic_mx_quant,
    "MoeGatingTopK": _moe_gating_top_k,
    "MoeInitRoutingV3": _moe_init_routing_v3,
    "Cumsum": _cumsum,
    "ReduceSum": lambda op, i: i["x"].sum(
        dim=tuple(i["axes"].reshape(-1).tolist()), keepdim=bool(_attr(op, "keep_dims"))
    ),
    "QuantBatchMatmulV4": _quant_batch_matmul_v4,
    "MoeDistributeDispatchV2": _moe_distribute_dispatch_v2,
    "MoeDistributeCombineV2": _moe_distribute_combine_v2,
    "Slice": _slice,
    "InvertPermutation": lambda op, i: torch.argsort(i["x"]).to(i["x"].dtype),
    "BitwiseAnd": lambda op, i: i["x1"] & i["x2"],
    "RightShift": lambda op, i: torch.bitwise_right_shift(i["x"], i["y"]),
    "Round": lambda op, i: torch.round(i["x"]),
    "ReduceAny": lambda op, i: i["x"].any(dim=int(i["axes"].reshape(-1)[0]), keepdim=bool(_attr(op, "keep_dims"))),
    "LogicalNot": lambda op, i: ~i["x"],
    "LogicalAnd": lambda op, i: i["x1"] & i["x2"],
    # TensorFlow's ArgMax: the first index of the maximum
    "ArgMaxV2": lambda op, i: torch.argmax(i["x"], dim=int(i["dimension"])).to(_ge_to_torch(_attr(op, "dtype"))),
    "Squeeze": lambda op, i: i["x"].squeeze(tuple(_attr(op, "axis"))),
    "Unsqueeze": lambda op, i: i["x"].reshape(_unsqueezed_shape(list(i["x"].shape), _attr(op, "axes"))),
    "Reshape": lambda op, i: i["x"].reshape(i["shape"].tolist()),
    "Transpose": lambda op, i: i["x"].permute(i["perm"].tolist()).contiguous(),
    "Range": lambda op, i: torch.arange(
        i["start"].item(), i["limit"].item(), i["delta"].item(), dtype=i["start"].dtype
    ),
    "SearchSorted": lambda op, i: torch.searchsorted(
        i["sorted_sequence"], i["values"], right=bool(_attr(op, "right"))
    ).to(_ge_to_torch(_attr(op, "dtype"))),
    "Sort": _sort,
    "Add": lambda op, i: i["x1"] + i["x2"],
    "Sub": lambda op, i: i["x1"] - i["x2"],
    "Mul": lambda op, i: i["x1"] * i["x2"],
    "Muls": lambda op, i: (i["x"].float() * _attr(op, "value")).to(i["x"].dtype),
    "Adds": lambda op, i: (i["x"].float() + _attr(op, "value")).to(i["x"].dtype),
    "FloorDiv": lambda op, i: torch.div(i["x1"], i["x2"], rounding_mode="floor"),
    "Minimum": lambda op, i: torch.minimum(i["x1"], i["x2"]),
    "Maximum": lambda op, i: torch.maximum(i["x1"], i["x2"]),
    "Less": lambda op, i: i["x1"] < i["x2"],
    "GreaterEqual": lambda op, i: i["x1"] >= i["x2"],
    "Fill": lambda op, i: torch.full(i["dims"].tolist(), i["value"].item(), dtype=i["value"].dtype),
    "ZerosLike": lambda op, i: torch.zeros_like(i["x"]),
    "SelectV2": lambda op, i: torch.where(i["condition"], i["then"], i["else"]),
    "GroupedMatmul": _grouped_matmul,
}


def _unsqueezed_shape(shape, axes):
    for a in sorted(a % (len(shape) + len(axes)) for a in axes):
        shape.insert(a, 1)
    return shape


def evaluate(graph, inputs) -> list[torch.Tensor]:
    """Run ``graph`` (a GE GraphDef) on CPU tensors ``inputs`` (in its Data index order); its outputs."""
    env: dict[str, torch.Tensor] = {}
    for op in graph.op:
        if op.type == "Data":
            env[f"{op.name}:0"] = inputs[_attr(op, "index")]
            continue
        if op.type == "Const":
            env[f"{op.name}:0"] = _const(op)
            continue
        i = _inputs(op, env)
        if op.type == "NetOutput":
            return [env[ref] for ref in op.input if not ref.endswith(":-1")]
        if op.type not in OPS:
            raise NotImplementedError(f"ge_eval: IR op {op.type} has no CPU evaluation")
        out = OPS[op.type](op, i)
        for k, value in enumerate(out if isinstance(out, (list, tuple)) else [out]):
            env[f"{op.name}:{k}"] = value
    raise AssertionError("graph has no NetOutput")


def build(fn, *inputs: torch.Tensor):
    """A GE graph of ``fn`` applied to Data nodes standing for ``inputs`` (fn builds GE ops, e.g. one of our
    converters' helpers), with its outputs as NetOutput: to evaluate a converter's pieces on inputs no traced
    program gives (several ranks' MC2 outputs, say). Call inside ``npu_wheel.torchair().active()``."""
    g = sys.modules["torchair.ge._ge_graph"]
    ge = sys.modules["torchair._ge_concrete_graph.ge_apis"]
    graph = g.GeGraph(name="piece")
    with graph:
        data = []
        for k, t in enumerate(inputs):
            d = g.Data(index=k, dtype=g.torch_type_to_ge_type(t.dtype), shape=list(t.shape), placement="NPU")
            d.set_torch_dtype(t.dtype)
            data.append(d)
        outs = fn(*data)
        ge.NetOutput(list(outs) if isinstance(outs, (list, tuple)) else [outs])
    return graph._proto
