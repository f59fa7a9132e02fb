"""What the families' TorchAir GE converters share (``_registry.npu_ge_converter``): TorchAir's ``ge`` API, looked
up at conversion time (TorchAir exists only with torch_npu), and the few graph idioms every converter needs
(int64 constants, a dimension as a tensor, a row mask applied as zeros, a final cast).

GE mode has no fallback: a converter builds the graph once, for every later call, and cannot hand a case to the
portable kernel as the eager adapters do. A case the graph cannot compute exactly raises ``unsupported`` while the
graph is built, naming the op and the reason, instead of building a graph that rounds differently.
"""

from __future__ import annotations

import torch


def api():
    """TorchAir's ``ge`` ops (``ge.GroupedMatmul``, ``ge.Cast``, ...)."""
    from torchair._ge_concrete_graph import ge_apis

    return ge_apis


def dtypes():
    """TorchAir's GE ``DataType`` enum."""
    from torchair.ge._ge_graph import DataType

    return DataType


def ge_dtype(dtype: torch.dtype) -> int:
    from torchair.ge._ge_graph import torch_type_to_ge_type

    return torch_type_to_ge_type(dtype)


def torch_dtype(t) -> torch.dtype:
    """The torch dtype of a converter's input tensor or of ``meta_outputs`` (both carry our fake's value)."""
    return (t.meta if hasattr(t, "meta") else t._meta).dtype


def typed(t, dtype: torch.dtype):
    """``t`` marked with ``dtype``: TorchAir types a node's outputs only after its converter returns, and the
    torch_npu converters called inside ours branch on their inputs' dtypes."""
    t.set_torch_dtype(dtype)
    return t


def is_ascend950() -> bool:
    """TorchAir's own test for Ascend 950 ("arch35"), which its converters branch on."""
    from torchair._utils.check_platform import is_arch35

    return is_arch35()


def unsupported(op: str, why: str) -> NotImplementedError:
    return NotImplementedError(
        f"ascend_moe::{op}: no GE graph for this call ({why}); run it eagerly or compile with the npugraph_ex backend"
    )


def with_meta(t, meta: torch.Tensor):
    """``t`` given the fake tensor ``meta`` (dtype and sizes) it stands for: what TorchAir sets on a node's outputs
    after its converter, needed earlier by the torch_npu converters ours call (they read ``symsize``)."""
    t.set_meta(meta)
    return t


def i64(value):
    """An int64 constant (a scalar or a list)."""
    return api().Const(value, dtypes().DT_INT64)


def dim(x, axis: int, *, scalar: bool = False):
    """``x.shape[axis]`` as an int64 tensor (``[1]``, or a scalar), read from the graph so dynamic sizes work."""
    ge = api()
    shape = ge.Shape(x, dtype=dtypes().DT_INT64)
    return ge.GatherV2(shape, i64(axis) if scalar else i64([axis]), i64(0))


def arange(limit):
    """``[0, limit)`` as int64; ``limit`` an int or an int64 scalar tensor."""
    ge = api()
    return ge.Range(i64(0), limit if not isinstance(limit, int) else i64(limit), i64(1))


def zero_rows(y, keep, axis: int):
    """``y`` with the entries where ``keep`` (bool, ``y``'s shape without ``axis``) is false set to 0: a select,
    so inf/NaN computed in dropped rows cannot leak."""
    ge = api()
    out = ge.SelectV2(ge.Unsqueeze(keep, axes=[axis]), y, ge.ZerosLike(y))
    return typed(out, y._torch_dtype) if y._torch_dtype is not None else out


def cast(x, dtype: torch.dtype):
    """``x`` as ``dtype`` (no node when it already is)."""
    if x.dtype == ge_dtype(dtype):
        return x
    return typed(api().Cast(x, dst_type=ge_dtype(dtype)), dtype)


def npu_converter(name: str):
    """torch_npu's own converter of ``npu::<name>`` (what TorchAir runs for ``torch.ops.npu.<name>``): calling it
    keeps its dtype rules, attribute encodings and platform checks instead of a copy of them."""
    return getattr(torch.ops.npu, name).default._ge_converter
