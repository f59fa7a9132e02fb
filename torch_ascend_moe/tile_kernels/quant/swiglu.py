"""TileKernels' fused SwiGLU kernels over the ``swiglu_forward`` / ``swiglu_backward`` ops, in both of its APIs:

- v1 (deepseek-ai/TileKernels): ``pos_to_token_topk`` maps rows to ``topk_weights [T, k]``, ``swiglu_clamp_value``,
  3 clamp counters, ``pos_to_expert`` (its -1 rows are unspecified upstream; computed here), the backward takes an
  E4M3 QuantTensor, the weight map both ways, and returns ``(out, (dx_fp8, dx_sf), dx, dweight [T, k])``;
- the Ascend era: the psum layout (``psum_num_tokens_per_expert``, the token alignment of ``config``), one weight
  per row ``[N]`` times ``routed_scaling_factor``, ``clamp_value``, 4 counters, FP32/BF16 outputs, ``do_recompute``.

A call is read as the Ascend era when it names an Ascend-only keyword, passes 1-D weights, a string third argument
to the backward, or a layout without weights; as v1 otherwise (the two agree wherever both read a call alike).
Padding rows of the psum layout are written as zeros (upstream leaves them unspecified or computes them).
"""

from __future__ import annotations

import torch

from torch_ascend_moe.ops.swiglu import swiglu_backward as _backward
from torch_ascend_moe.ops.swiglu import swiglu_forward as _forward
from torch_ascend_moe.tile_kernels.config import get_token_alignment

# Defined before this module is imported (see __init__).
from torch_ascend_moe.tile_kernels.quant import _cast, _layout

__all__ = [
    "swiglu_backward",
    "swiglu_backward_and_per_token_cast",
    "swiglu_forward",
    "swiglu_forward_and_per_channel_cast_and_transpose",
    "swiglu_forward_and_per_token_cast",
    "weights_per_row",
]

FP8 = torch.float8_e4m3fn
_V1_ONLY = {"pos_to_token_topk", "swiglu_clamp_value", "pos_to_expert", "sf_clamp_min", "token_topk_to_pos"}
_ASCEND_ONLY = {"psum_num_tokens_per_expert", "routed_scaling_factor", "clamp_value", "do_recompute", "alignment"}


def ascend_era(kwargs: dict, weights, layout=None) -> bool:
    """Whether a call uses the Ascend-era API (see the module docstring)."""
    if _V1_ONLY & kwargs.keys():
        return False
    if _ASCEND_ONLY & kwargs.keys():
        return True
    if isinstance(weights, torch.Tensor):
        return weights.dim() == 1
    return layout is not None


def weights_per_row(pos_to_token_topk: torch.Tensor | None, topk_weights: torch.Tensor | None):
    """v1's ``topk_weights [T, k]`` read through ``pos_to_token_topk`` as one weight per expanded row (0 where -1)."""
    if pos_to_token_topk is None:
        return None
    assert topk_weights is not None and topk_weights.dim() == 2
    p = pos_to_token_topk.long()
    return torch.where(p >= 0, topk_weights.reshape(-1)[p.clamp(min=0)], 0).float()


def _add_counts(clamped_count, counts, n: int) -> None:
    if clamped_count is not None:
        clamped_count += counts[:n].to(clamped_count)


def bind(names: tuple, defaults: dict, args: tuple, kwargs: dict) -> dict:
    """A call's arguments by name (positional ones in ``names``' order), rejecting extra or unknown ones."""
    values = dict(defaults)
    assert len(args) <= len(names), f"too many positional arguments ({len(args)})"
    values.update(zip(names, args))
    unknown = set(kwargs) - set(names)
    assert not unknown, f"unexpected keyword arguments {sorted(unknown)}"
    values.update(kwargs)
    return values


_LAYOUT_FLAGS = ("use_tma_aligned_col_major_sf", "round_sf", "use_packed_ue8m0")
_V1_FORWARD = ("pos_to_token_topk", "topk_weights", "pos_to_expert", *_LAYOUT_FLAGS, "swiglu_clamp_value",
               "clamped_count", "sf_clamp_min")  # fmt: skip
_ASCEND_FORWARD = ("psum_num_tokens_per_expert", "topk_weights", "routed_scaling_factor", *_LAYOUT_FLAGS,
                   "clamp_value", "clamped_count")  # fmt: skip
_FALSE = {"use_tma_aligned_col_major_sf": False, "round_sf": False, "use_packed_ue8m0": False}


def swiglu_forward_and_per_token_cast(x: torch.Tensor, fmt: str, num_per_channels, *args, **kwargs):
    """``(out, sf)``: SwiGLU of ``x [N, 2H]`` (weighted, clamped) cast per token to E4M3 in blocks of
    ``num_per_channels`` (v1: 128 or H; Ascend era: 128 or 32), the scales in the requested layout; the Ascend era's
    ``fmt='bf16'/'fp32'`` (``num_per_channels=None``) returns the unquantized output alone."""
    weights = args[1] if len(args) > 1 else kwargs.get("topk_weights")
    layout = args[0] if args else kwargs.get("psum_num_tokens_per_expert", kwargs.get("pos_to_token_topk"))
    # The sixth argument is v1's pos_to_expert (a tensor) or the Ascend era's routed_scaling_factor (a number).
    scale_given = len(args) > 2 and args[2] is not None and not isinstance(args[2], torch.Tensor)
    if scale_given or ascend_era(kwargs, weights, layout):
        a = bind(_ASCEND_FORWARD, {**_FALSE}, args, kwargs)
        return _forward_ascend(x, fmt, num_per_channels, a)
    a = bind(_V1_FORWARD, {**_FALSE}, args, kwargs)
    assert x.dim() == 2 and x.is_contiguous()
    hidden = x.shape[1] // 2
    if a.get("pos_to_expert") is not None:
        assert a["pos_to_expert"].dim() == 1 and a["pos_to_expert"].shape[0] == x.shape[0]
    clamp, count = a.get("swiglu_clamp_value"), a.get("clamped_count")
    if count is not None:
        assert clamp is not None and count.dim() == 1 and count.shape[0] == 3
    assert hidden % 128 == 0
    assert num_per_channels == 128 or num_per_channels == hidden
    col_major = a["use_tma_aligned_col_major_sf"]
    assert num_per_channels == 128 or not col_major
    assert fmt == "e4m3"
    weights = weights_per_row(a.get("pos_to_token_topk"), a.get("topk_weights"))
    out, sf, counts = _forward(
        x, weights, clamp_value=clamp, out_dtype=FP8, num_per_channels=num_per_channels, round_sf=a["round_sf"],
        sf_clamp_min=a.get("sf_clamp_min"),
    )  # fmt: skip
    _add_counts(count, counts, 3)
    return out, _layout(sf, col_major, a["use_packed_ue8m0"])


_ASCEND_FORMATS = (("e4m3", 128), ("e4m3", 32), ("bf16", None), ("fp32", None))


def _forward_ascend(x, fmt, num_per_channels, a):
    assert x.dim() == 2 and x.is_contiguous()
    assert x.shape[1] % 2 == 0
    psum, weights, scale = a.get("psum_num_tokens_per_expert"), a.get("topk_weights"), a.get("routed_scaling_factor")
    clamp, count = a.get("clamp_value"), a.get("clamped_count")
    if psum is not None:
        assert psum.dim() == 1
    if count is not None:
        assert clamp is not None and count.dim() == 1 and count.shape[0] == 4
    if scale is not None:
        assert weights is not None, "routed_scaling_factor requires topk_weights"
    assert (fmt, num_per_channels) in _ASCEND_FORMATS
    out_dtype = {"e4m3": FP8, "bf16": torch.bfloat16, "fp32": torch.float32}[fmt]
    out, sf, counts = _forward(
        x, weights, psum, alignment=get_token_alignment(), routed_scaling_factor=scale, clamp_value=clamp,
        out_dtype=out_dtype, num_per_channels=num_per_channels or 128, round_sf=a["round_sf"],
    )  # fmt: skip
    _add_counts(count, counts, 4)
    if fmt != "e4m3":
        return out
    return out, _layout(sf, a["use_tma_aligned_col_major_sf"], a["use_packed_ue8m0"])


def swiglu_forward(x: torch.Tensor, fmt: str, psum_num_tokens_per_expert=None, topk_weights=None,
                   routed_scaling_factor=None, clamp_value=None, clamped_count=None) -> torch.Tensor:  # fmt: skip
    """The Ascend era's unquantized fused SwiGLU (``fmt`` ``'fp32'`` or ``'bf16'``)."""
    assert fmt in ("fp32", "bf16"), "swiglu_forward only supports fp32 or bf16 output"
    a = {"psum_num_tokens_per_expert": psum_num_tokens_per_expert, "topk_weights": topk_weights,
         "routed_scaling_factor": routed_scaling_factor, "clamp_value": clamp_value, "clamped_count": clamped_count,
         **_FALSE}  # fmt: skip
    return _forward_ascend(x, fmt, None, a)


def swiglu_backward_and_per_token_cast(x, grad_out: torch.Tensor, *args, **kwargs):
    """The fused backward with the per-token E4M3 cast of the input gradient (see the module docstring for the
    two APIs' arguments and results)."""
    if (args and isinstance(args[0], str)) or "fmt" in kwargs or (_ASCEND_ONLY & kwargs.keys()):
        names = ("fmt", "num_per_channels", "psum_num_tokens_per_expert", "topk_weights", "routed_scaling_factor",
                 *_LAYOUT_FLAGS, "clamp_value", "do_recompute")  # fmt: skip
        return _backward_ascend(x, grad_out, bind(names, {**_FALSE, "do_recompute": False}, args, kwargs))
    names = ("weight", "pos_to_token_topk", "token_topk_to_pos", "num_per_channels", "round_sf", "swiglu_clamp_value")
    a = bind(names, {"round_sf": False}, args, kwargs)
    npc, weight, p2tt, ttp = a["num_per_channels"], a["weight"], a["pos_to_token_topk"], a["token_topk_to_pos"]
    assert npc in (32, 128)
    data, x_sf = x
    assert data.dtype == FP8
    assert data.dim() in (2, 3) and data.is_contiguous()
    assert x_sf.dim() == 2 and x_sf.is_contiguous()
    assert weight.dim() == 2 and weight.is_contiguous()
    assert p2tt.dim() == 1 and ttp.dim() == 2 and ttp.is_contiguous()
    assert data.size(-1) % (2 * npc) == 0
    hidden = data.size(-1) // 2
    data, grad_out = data.view(-1, 2 * hidden), grad_out.view(-1, hidden)
    rows = data.shape[0]
    assert tuple(x_sf.shape) == (rows, 2 * hidden // npc)
    assert tuple(grad_out.shape) == (rows, hidden) and tuple(weight.shape) == tuple(ttp.shape)
    assert tuple(p2tt.shape) == (rows,)
    x_grad, q, sf, w_grad, out = _backward(
        data, grad_out, weights_per_row(p2tt, weight), x_sf=x_sf, clamp_value=a.get("swiglu_clamp_value"),
        num_per_channels=npc, round_sf=a["round_sf"],
    )  # fmt: skip
    return out, (q, sf), x_grad, scatter_weight_grad(w_grad, p2tt, weight)


def scatter_weight_grad(w_grad: torch.Tensor, pos_to_token_topk: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """A per-row weight gradient ``[N]`` back to v1's ``[T, k]`` through ``pos_to_token_topk`` (0 elsewhere)."""
    slots = weight.numel()
    p = pos_to_token_topk.long()
    flat = torch.zeros(slots + 1, dtype=torch.float32, device=w_grad.device)
    flat.scatter_(0, torch.where(p >= 0, p, slots).clamp(max=slots), w_grad.float())
    return flat[:slots].view(weight.shape)


def _backward_ascend(x, grad_out, a):
    fmt, npc = a["fmt"], a.get("num_per_channels")
    assert fmt in ("e4m3", "bf16", "fp32")
    x_sf = None
    if fmt == "e4m3":
        assert npc in (32, 128)
        x, x_sf = x
        assert x.dtype == FP8
        assert x_sf.dim() == 2 and x_sf.is_contiguous()
    else:
        assert x.dtype in (torch.bfloat16, torch.float32)
    assert x.dim() in (2, 3) and x.is_contiguous() and x.size(-1) % 2 == 0
    hidden = x.size(-1) // 2
    assert hidden % 64 == 0
    x, grad_out = x.view(-1, 2 * hidden), grad_out.view(-1, hidden)
    assert grad_out.dtype in (torch.bfloat16, torch.float32) and tuple(grad_out.shape) == (x.shape[0], hidden)
    weights, psum, scale = a.get("topk_weights"), a.get("psum_num_tokens_per_expert"), a.get("routed_scaling_factor")
    if weights is not None:
        assert weights.dim() == 1 and weights.is_contiguous() and weights.dtype == torch.float32
        assert tuple(weights.shape) == (x.shape[0],)
    if psum is not None:
        assert psum.dim() == 1 and psum.dtype == torch.int32 and psum.is_contiguous()
    if scale is not None:
        assert weights is not None, "routed_scaling_factor requires topk_weights"
    out_dtype = torch.bfloat16 if fmt in ("e4m3", "bf16") else torch.float32
    x_grad, q, sf, w_grad, out = _backward(
        x, grad_out, weights, psum, x_sf=x_sf, alignment=get_token_alignment(), routed_scaling_factor=scale,
        clamp_value=a.get("clamp_value"), out_dtype=out_dtype, num_per_channels=npc if fmt == "e4m3" else 0,
        round_sf=a["round_sf"],
    )  # fmt: skip
    result = [x_grad]
    if fmt == "e4m3":
        result.append((q, _layout(sf, a["use_tma_aligned_col_major_sf"], a["use_packed_ue8m0"])))
    if weights is not None:
        result.append(w_grad)
    if a["do_recompute"]:
        result.append(out)
    return tuple(result)


def swiglu_backward(x: torch.Tensor, act_x_grad: torch.Tensor, fmt: str, psum_num_tokens_per_expert=None,
                    topk_weights=None, routed_scaling_factor=None, clamp_value=None,
                    do_recompute: bool = False):  # fmt: skip
    """The Ascend era's unquantized fused backward: ``(x_grad, [weight_grad], [act_out])``."""
    assert fmt in ("bf16", "fp32")
    assert x.dtype in (torch.float32, torch.bfloat16) and x.dtype == act_x_grad.dtype
    a = {"fmt": fmt, "psum_num_tokens_per_expert": psum_num_tokens_per_expert, "topk_weights": topk_weights,
         "routed_scaling_factor": routed_scaling_factor, "clamp_value": clamp_value, "do_recompute": do_recompute,
         **_FALSE}  # fmt: skip
    return _backward_ascend(x, act_x_grad, a)


def swiglu_forward_and_per_channel_cast_and_transpose(x: torch.Tensor, fmt: str, num_per_tokens: int,
                                                      round_sf: bool = False, without_transpose: bool = False,
                                                      swiglu_clamp_value=None):  # fmt: skip
    """v1's SwiGLU of a BF16 ``x [T, 2H]`` rounded to BF16, cast per channel (blocks of ``num_per_tokens`` rows) to
    E4M3: ``(data [H, T] (or [T, H] with without_transpose), sf FP32 [T / num_per_tokens, H])``."""
    assert fmt == "e4m3" and x.dim() == 2 and x.is_contiguous() and x.dtype == torch.bfloat16
    assert x.shape[0] % 128 == 0 and x.shape[1] % 128 == 0 and num_per_tokens in (32, 128)
    act, _, _ = _forward(x, clamp_value=swiglu_clamp_value, out_dtype=torch.bfloat16)
    data, sf = _cast(act, fmt, (num_per_tokens, 1), None, False, round_sf, False)
    return (data if without_transpose else data.T.contiguous()), sf
