"""Ascend adapters of the quant family (torch_npu 2.13), where a torch_npu op computes exactly our op.

``quantize_fp8`` with ``block = [1, c]`` (``c`` a multiple of 32, at most 1024) and ``use_ue8m0``, on Ascend 950
(SoC >= 260): ``npu_dynamic_mx_quant(dst_type=float8_e4m3fn, block_size=c, scale_alg=1, max_low_bound=1e-4)``.
Its scale_alg 1 ("cuBLAS" algorithm, docs of the MX quant ops) is DeepGEMM's UE8M0 recipe step for step:
``S = fp32(max(amax, max_low_bound) / 448)``, the exponent rounded up to a power of two, ``R = 1 / S_ue8m0``,
``y = e4m3(x * R)``, a short last group zero-padded; our ``max(amax, 1e-4) / 448`` is the same with
``max_low_bound = 1e-4``. Its scales (uint8 E8M0 codes ``[M, ceil(G/2), 2]``, the group count padded to even)
are turned into ours: FP32 ``2^(code-127)`` ``[M, G]``, or four codes per int32 (a ragged count padded with
code 127 = 1.0, as ours). FP32 input only with ``c == 32`` and ``N >= 32`` (the docs' limits). Not verified:
blocks holding NaN/Inf (ours gives code 255 / 254; the docs do not say what the op writes).

``quantize_blocks(x, "e4m3", [1, c], round_sf=True, sf=None, amax_clamp)`` (TileKernels' power-of-two scales), under
the same conditions: the same call with ``max_low_bound = amax_clamp`` (1e-4 by default). TileKernels' rule is the
same steps for finite values: ``sf = max(amax, floor) / 448`` rounded up to a power of two (its bit trick, adding
the mantissa's all-ones), multiplier ``1 / sf``, codes ``e4m3(x * (1 / sf))`` (the clamp to 448 never binds: the
product is at most ``amax / sf <= 448``). Scales come back as FP32 powers of two. Blocks holding NaN/inf are
rewritten on the device by TileKernels' rule (its bit trick makes their scale 0 or inf and their multiplier 0),
whatever the MX op writes there.

Stays portable, and why:

* ``quantize_fp8`` with FP32 (non power-of-two) scales, 1x128 or 128x128: ``npu_dynamic_block_quant`` is
  documented (2.13) for int8 output only (``dst_type=1``), ``row_block_size=1``, ``col_block_size=128``, on
  A2/A3, with no formula for its scale or rounding (is ``x / scale`` or ``x * (1 / scale)``, is
  ``min_scale`` applied to the amax or the scale?); FP8 output exists only in its meta. Nothing to map exactly.
* ``quantize_fp8`` with column or 2-D blocks and UE8M0 (``[g, 1]``, ``[128, 128]``): the MX op groups along one
  axis; on a non-last axis its scales come interleaved two rows at a time, and 2-D blocks do not exist.
* ``quantize_fp8`` on A2/A3: no FP8 (the MX ops are Ascend 950 only).
* ``quantize_fp4``: E2M1 rounding differs. Ours is DeepGEMM's (ties toward the smaller magnitude: 0.75 -> 0.5,
  2.5 -> 2); the op's ``round_mode`` offers ``rint`` (ties to even: 0.75 -> 1), ``round`` (ties away) and
  ``floor`` (truncation). Its FP4 scales are OCP's ``floor(log2 amax) - 2`` (scale_alg 0) or a mantissa-bit rule
  (scale_alg 2), not our ``ceil(log2(amax / 6))``; scale_alg 1 is FP8 only.
* ``quantize_blocks`` (TileKernels' cast rules) other than its E4M3 ``round_sf`` case in ``[1, c]`` blocks (mapped,
  above): without ``round_sf`` its multiplier is ``448 / amax``, which no documented scale_alg states; given scales
  (``sf``) are not powers of two; its E2M1 ties to even like ``round_mode="rint"``, but the op's FP4 scales are
  OCP's, not ``ceil(log2(amax / 6))``; E5M6 is no CANN format.
* ``dequantize``: one multiply per element, rounded once, which the portable kernel already runs on ACLNN
  kernels; ``npu_anti_mx_quant`` takes only MX (1x32 E8M0) scales in the op's own layout, none of our FP32 /
  packed / arbitrary-block scales, and would add a layout conversion to an op with no rounding to share.

GE graph mode (TorchAir): ``quantize_fp8``'s converter builds the same call (``DynamicMxQuant`` through torch_npu's
converter) and the same scale conversion from GE ops (the E8M0 codes bitcast to uint8, sliced to ``G`` groups;
FP32 scales as ``code << 23`` bitcast, 255 -> NaN; packed as four codes bitcast to one int32); a call the MX op
does not compute exactly has no graph.

Every adapter validates first (``checks/quant.py``), as the portable kernels do, so bad inputs raise our errors.
"""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import npu_ge_converter
from torch_ascend_moe.backends.chain import first_refusal, kernel, stays_portable
from torch_ascend_moe.backends.npu import ge_graph, has_op
from torch_ascend_moe.checks.quant import BLOCK_FORMATS, QUANTIZE_FP8, quantize_blocks_signature, quantize_signature
from torch_ascend_moe.quant.encodings import FP8_MAX
from torch_ascend_moe.quant.reference import AMAX_FLOOR

ASCEND950 = 260  # get_soc_version() from here on is Ascend 950 (the metas' _ASCEND950_SOC_VERSION)
NPU_FLOAT8_E4M3FN = 292  # torch_npu's dtype enum, as the MX quant docs list it
_UE8M0_ONE = 127  # code of 1.0: what a ragged packed word is padded with
_MX_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def soc_version() -> int:
    """torch_npu's SoC number (Ascend 950 is >= 260); the tests replace this function."""
    from torch_npu.npu._backends import get_soc_version

    return get_soc_version()


def mx_fp8_refusal(x: torch.Tensor, block, use_ue8m0: bool) -> str | None:
    """Why ``npu_dynamic_mx_quant`` does not compute a ``quantize_fp8`` call exactly, or None when it does."""
    m, n = x.shape
    cols = block[1]
    if not use_ue8m0:
        return "FP32 scales (the MX cast's scales are UE8M0 powers of two)"
    if block[0] != 1 or cols % 32 or cols > 1024:
        return f"blocks {list(block)}: the MX cast takes 1 x (a multiple of 32 up to 1024)"
    if m == 0 or n == 0:
        return "an empty tensor: nothing to cast"
    if x.dtype not in _MX_DTYPES or (x.dtype == torch.float32 and (cols != 32 or n < 32)):
        return f"{x.dtype} input with blocks of {cols} (FP32 only in 32-wide blocks of a row of 32 or more)"
    if soc_version() < ASCEND950:
        return "not an Ascend 950 (no FP8 before it)"
    return None


def mx_fp8_block(x: torch.Tensor, block, use_ue8m0: bool) -> int | None:
    """The MX group size for a ``quantize_fp8`` call ``npu_dynamic_mx_quant`` computes exactly, else None."""
    return None if mx_fp8_refusal(x, block, use_ue8m0) else block[1]


def _takes_fp8(x, block, use_ue8m0, use_packed_ue8m0):
    quantize_signature(QUANTIZE_FP8, x, block, use_ue8m0, use_packed_ue8m0, fp4=False)
    return first_refusal(mx_fp8_refusal(x, block, use_ue8m0))


def _takes_blocks(x, fmt, block, round_sf, sf, amax_clamp):
    quantize_blocks_signature(x, fmt, block, round_sf, sf, amax_clamp)
    mapped = fmt == "e4m3" and round_sf and sf is None
    why = None if mapped else "only e4m3 with round_sf and no given sf maps to the MX cast"
    return first_refusal(why or mx_fp8_refusal(x, block, True))


def mx_scales_to_ours(codes: torch.Tensor, groups: int, packed: bool) -> torch.Tensor:
    """uint8 E8M0 codes ``[M, ceil(G/2), 2]`` -> FP32 ``[M, G]`` powers of two (code 255 -> NaN), or int32
    ``[M, ceil(G/4)]`` with four codes per word, little end first, a ragged count padded with 1.0."""
    codes = codes.flatten(1)[:, :groups]
    if packed:
        pad = (-groups) % 4
        codes = torch.cat([codes, codes.new_full((codes.shape[0], pad), _UE8M0_ONE)], 1) if pad else codes
        return codes.contiguous().view(torch.int32)
    powers = (codes.to(torch.int32) << 23).view(torch.float32)
    return torch.where(codes == 255, float("nan"), powers).contiguous()


def _mx_quant(call, x, group: int, floor: float = AMAX_FLOOR):
    """``npu_dynamic_mx_quant`` through ``call`` (the op, or torch_npu's GE converter of it) with DeepGEMM's UE8M0
    recipe (scale_alg 1, amax floored at ``floor``, 1e-4 by default), E4M3 out, ``group``-wide row blocks."""
    return call(
        x,
        axis=-1,
        round_mode="rint",
        dst_type=NPU_FLOAT8_E4M3FN,
        block_size=group,
        scale_alg=1,
        max_low_bound=floor,
    )


@kernel(
    device="npu",
    library="torch_npu",
    calls="npu_dynamic_mx_quant",
    available=has_op("npu_dynamic_mx_quant"),
    takes=_takes_fp8,
)
def quantize_fp8(x, block, use_ue8m0, use_packed_ue8m0):
    group = block[1]
    y, codes = _mx_quant(torch.ops.npu.npu_dynamic_mx_quant, x, group)
    groups = -(-x.shape[1] // group)
    return y.contiguous(), mx_scales_to_ours(codes, groups, use_packed_ue8m0)


@kernel(
    device="npu",
    library="torch_npu",
    calls="npu_dynamic_mx_quant",
    available=has_op("npu_dynamic_mx_quant"),
    takes=_takes_blocks,
)
def quantize_blocks(x, fmt, block, round_sf, sf, amax_clamp):
    group = block[1]
    floor = BLOCK_FORMATS["e4m3"][1] if amax_clamp is None else amax_clamp
    y, codes = _mx_quant(torch.ops.npu.npu_dynamic_mx_quant, x, group, floor)
    scales = mx_scales_to_ours(codes, -(-x.shape[1] // group), False)
    return _nonfinite_blocks_as_tilekernels(x, y.contiguous(), scales, group)


def _nonfinite_blocks_as_tilekernels(x: torch.Tensor, y: torch.Tensor, sf: torch.Tensor, group: int):
    """Blocks holding NaN/inf rewritten by TileKernels' rule (on the device, whatever the MX op wrote there): its bit
    trick turns a NaN amax into a 0 scale and an infinite one into an infinite scale, both into the multiplier 0, so
    the codes are ``e4m3(x * 0)`` (signed zeros, NaN where x is not finite)."""
    m, n = x.shape
    groups = sf.shape[1]
    pad = groups * group - n
    xf = x.float()
    nan_block = torch.nn.functional.pad(xf.isnan(), (0, pad)).view(m, groups, group).any(-1)
    bad_block = torch.nn.functional.pad(~xf.isfinite(), (0, pad)).view(m, groups, group).any(-1)
    sf = torch.where(nan_block, 0.0, torch.where(bad_block, float("inf"), sf))
    bad = bad_block.repeat_interleave(group, 1)[:, :n]
    zeroed = (xf * 0.0).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    codes = torch.where(bad, zeroed.view(torch.uint8), y.view(torch.uint8))
    return codes.view(torch.float8_e4m3fn), sf


@npu_ge_converter("quantize_fp8", ir="DynamicMxQuant")
def quantize_fp8_ge(x, block, use_ue8m0, use_packed_ue8m0, meta_outputs=None):
    group = mx_fp8_block(x.meta, block, use_ue8m0)
    if group is None:
        raise ge_graph.unsupported("quantize_fp8", "only 1 x c UE8M0 blocks on Ascend 950 map to DynamicMxQuant")
    ge, dt = ge_graph.api(), ge_graph.dtypes()
    y, codes = _mx_quant(ge_graph.npu_converter("npu_dynamic_mx_quant"), x, group)
    groups = -(-x.symsize[1] // group)
    codes = ge.Reshape(ge.Bitcast(codes, type=dt.DT_UINT8), ge_graph.i64([-1, groups + groups % 2]))
    codes = ge.SliceD(codes, offsets=[0, 0], size=[-1, groups])
    if use_packed_ue8m0:
        pad = (-groups) % 4
        if pad:
            ones = ge.Fill(
                ge.ConcatV2([ge_graph.dim(x, 0), ge_graph.i64([pad])], 0, N=2), ge.Const(_UE8M0_ONE, dt.DT_UINT8)
            )
            codes = ge.ConcatV2([codes, ones], 1, N=2)
        scales = ge.Bitcast(ge.Reshape(codes, ge_graph.i64([-1, (groups + pad) // 4, 4])), type=dt.DT_INT32)
    else:
        powers = ge.LeftShift(ge.Cast(codes, dst_type=dt.DT_INT32), ge.Const(23, dt.DT_INT32))
        nan = ge.Const(float("nan"), dt.DT_FLOAT)
        scales = ge.SelectV2(ge.Equal(codes, ge.Const(255, dt.DT_UINT8)), nan, ge.Bitcast(powers, type=dt.DT_FLOAT))
    return y, scales


stays_portable(
    "quantize_fp4",
    device="npu",
    why="CANN's E2M1 casts round ties to even; DeepGEMM's cast rounds ties toward the smaller magnitude",
)
stays_portable(
    "dequantize",
    device="npu",
    why="one multiply per element rounded once, which the portable kernel already runs on ACLNN",
)
