"""CPU references of the torch_npu ops the grouped adapters call: our reading of torch_npu 2.13's docs
(``npu_wheel.load().docs(...)``, ``_op_plugin_docs.py``) and Meta kernel, not Ascend's kernel.

``npu_grouped_matmul``, the forms the adapters use (single x, single weight, single y: ``split_item`` 2/3):

* ``group_type=0`` (M axis): ``x [M, K]``, ``weight [E, K, N]`` (row-major or the transposed view), group ``g``
  = rows ``[cum[g-1], cum[g])``: ``y[rows] = x[rows] @ weight[g]``; ``y [M, N]``. The docs require the last
  cumulative value (or the sum of counts) to equal ``M``.
* ``group_type=2`` (K axis, the weight-gradient form): ``x [M, K]`` (a transposed view in practice),
  ``weight [K, N]``, group ``g`` = columns of x / rows of weight ``[cum[g-1], cum[g])``:
  ``y[g] = x[:, cols] @ weight[cols]``; ``y [E, M, N]`` (E = len(group_list)), an empty group gives zeros.
* ``group_list_type`` 0: non-decreasing cumulative ends; 1: non-negative per-group counts (length != 1).
  ``group_list`` is int64.
* FP32 accumulation, one rounding to ``output_dtype`` (ScalarType number or None = x's dtype; fp16, bf16, fp32
  or int32 per the Meta kernel).

* MX (Ascend 950; ``scale_dtype = per_token_scale_dtype = float8_e8m0fnu``, torch_npu's enum 293), group_type 0:
  FP8 E4M3 ``x [M, K]`` and row-major ``weight [E, K, N]``, ``per_token_scale [M, ceil(K/64), 2]`` and ``scale
  [E, ceil(K/64), N, 2]`` uint8 E8M0 codes, pairs of consecutive 32-wide K blocks (torchao-npu's layout, from
  ``npu_dynamic_mx_quant`` / ``npu_dynamic_mx_quant_with_dual_axis``): ``y = sum_k deq(x)[m, k] deq(w)[g, k, n]``
  with ``deq(v) = v * 2^(code - 127)``, in FP32. Shapes other than these raise (they pin our reading).

Other quantization arguments, biases, activations and the other split modes are not modelled: a call with them
raises ``NotImplementedError`` here (the adapters never make one).
"""

from __future__ import annotations

import torch

from torch_ascend_moe.testing import npu_wheel

# ScalarType numbers of the output dtypes npu_grouped_matmul's Meta kernel accepts.
_SCALAR_TYPES = {3: torch.int32, 5: torch.float16, 6: torch.float32, 15: torch.bfloat16}


def _dtype(output_dtype, x: torch.Tensor) -> torch.dtype:
    if output_dtype is None:
        return x.dtype
    if isinstance(output_dtype, torch.dtype):
        return output_dtype
    if output_dtype not in _SCALAR_TYPES:
        raise RuntimeError(f"npu_grouped_matmul: output_dtype {output_dtype} is not supported")
    return _SCALAR_TYPES[output_dtype]


def _ends(group_list: torch.Tensor, group_list_type: int, total: int, axis: str) -> list[int]:
    if group_list is None or group_list.dtype != torch.int64 or group_list.dim() != 1:
        raise RuntimeError("npu_grouped_matmul: group_list must be a 1-D int64 tensor")
    values = group_list.tolist()
    if group_list_type == 0:
        if any(v < 0 for v in values) or any(b < a for a, b in zip(values, values[1:])):
            raise RuntimeError(f"npu_grouped_matmul: cumsum group_list must be non-negative, non-decreasing: {values}")
        ends = values
    elif group_list_type == 1:
        if len(values) == 1 or any(v < 0 for v in values):
            raise RuntimeError(f"npu_grouped_matmul: counts group_list must be non-negative, length != 1: {values}")
        ends = torch.tensor(values, dtype=torch.int64).cumsum(0).tolist()
    else:
        raise RuntimeError(f"npu_grouped_matmul: group_list_type {group_list_type} is not 0 or 1")
    if ends and ends[-1] != total:
        raise RuntimeError(f"npu_grouped_matmul: group_list must end at {axis}={total}, got {ends[-1]}")
    return ends


_E8M0 = 293  # torch_npu's float8_e8m0fnu enum


def _mx_values(codes: torch.Tensor, blocks: int) -> torch.Tensor:
    """FP32 ``2^(code - 127)`` of pairs ``[..., ceil(B/2), 2]`` flattened to B per-block scales (code 0: 2^-127)."""
    flat = codes.flatten(-2)[..., :blocks].to(torch.int32)
    return torch.where(flat == 0, 2.0**-127, torch.pow(2.0, (flat - 127).float()))


def _mx_dequantized(x, w, scale, per_token_scale, group_type):
    if group_type != 0 or x.dtype != torch.float8_e4m3fn or w.dtype != torch.float8_e4m3fn or w.dim() != 3:
        raise NotImplementedError("npu_grouped_matmul reference: MX only for FP8 E4M3 x [M, K], weight [E, K, N]")
    (sw,), (sx,) = scale, per_token_scale
    m, k = x.shape
    e, _, n = w.shape
    pairs = (-(-k // 32) + 1) // 2
    if sx.dtype != torch.uint8 or sx.shape != (m, pairs, 2):
        raise RuntimeError(
            f"npu_grouped_matmul (MX): per_token_scale must be uint8 [{m}, {pairs}, 2], got {list(sx.shape)}"
        )
    if sw.dtype != torch.uint8 or sw.shape != (e, pairs, n, 2):
        raise RuntimeError(f"npu_grouped_matmul (MX): scale must be uint8 [{e}, {pairs}, {n}, 2], got {list(sw.shape)}")
    blocks = -(-k // 32)
    xs = _mx_values(sx, blocks).repeat_interleave(32, 1)[:, :k]  # [M, K]
    ws = _mx_values(sw.permute(0, 2, 1, 3), blocks).repeat_interleave(32, 2)[:, :, :k]  # [E, N, K]
    return x.float() * xs, w.float() * ws.transpose(1, 2)


@npu_wheel.cpu_reference("npu_grouped_matmul")
def npu_grouped_matmul(
    x,
    weight,
    *,
    bias=None,
    scale=None,
    offset=None,
    antiquant_scale=None,
    antiquant_offset=None,
    per_token_scale=None,
    group_list=None,
    activation_input=None,
    activation_quant_scale=None,
    activation_quant_offset=None,
    split_item=0,
    group_type=None,
    group_list_type=0,
    act_type=0,
    tuning_config=None,
    output_dtype=None,
    x_dtype=None,
    weight_dtype=None,
    scale_dtype=None,
    per_token_scale_dtype=None,
):
    mx = scale_dtype == _E8M0 and per_token_scale_dtype == _E8M0
    unmodelled = (bias, offset, antiquant_scale, antiquant_offset, activation_input)
    if not mx:
        unmodelled += (scale, per_token_scale, scale_dtype, per_token_scale_dtype)
    if any(t is not None for t in unmodelled) or act_type or x_dtype is not None or weight_dtype is not None:
        raise NotImplementedError("npu_grouped_matmul reference: quantized/bias/activation forms are not modelled")
    if len(x) != 1 or len(weight) != 1 or split_item not in (2, 3):
        raise NotImplementedError("npu_grouped_matmul reference: only single x / weight / y (split_item 2, 3)")
    (x,), (w,) = x, weight
    if mx:
        x, w = _mx_dequantized(x, w, scale, per_token_scale, group_type)
    if x.dim() != 2:
        raise RuntimeError("npu_grouped_matmul: x must be 2-D")
    dtype = _dtype(output_dtype, x)
    if group_type == 0:
        if w.dim() != 3 or w.shape[1] != x.shape[1] or len(group_list) != w.shape[0]:
            raise RuntimeError("npu_grouped_matmul: group_type 0 takes weight [E, K, N] and E groups")
        y = torch.zeros(x.shape[0], w.shape[2], dtype=torch.float32)
        begin = 0
        for g, end in enumerate(_ends(group_list, group_list_type, x.shape[0], "M")):
            y[begin:end] = x[begin:end].float() @ w[g].float()
            begin = end
        return [y.to(dtype)]
    if group_type == 2:
        if w.dim() != 2 or w.shape[0] != x.shape[1]:
            raise RuntimeError("npu_grouped_matmul: group_type 2 takes x [M, K] and weight [K, N]")
        ends = _ends(group_list, group_list_type, x.shape[1], "K")
        y = torch.zeros(len(ends), x.shape[0], w.shape[1], dtype=torch.float32)
        begin = 0
        for g, end in enumerate(ends):
            y[g] = x[:, begin:end].float() @ w[begin:end].float()
            begin = end
        return [y.to(dtype)]
    raise NotImplementedError(f"npu_grouped_matmul reference: group_type {group_type}")
