"""``mega_moe``: DeepGEMM's fused MegaMoE (specs/deepgemm_api.md §10.1) as the unfused pipeline of our own ops.

On the GPU one kernel overlaps the steps; here (and on any device) they run one after another, so the op equals
that pipeline (how upstream tests its kernel); steps 3-5 are one ``m_grouped_bf16_gemm_swiglu`` (BF16 mode) or
``m_grouped_fp8_gemm_swiglu`` (FP8 x FP4), whose column tiles MKL may sum in another FP32 order than the whole GEMM
(equal on the tests' shapes, a last bit at most elsewhere):

1. dispatch: ``ep_dispatch`` (x rows and their 1x32 scales, ids, weights) when expert-parallel, else local;
2. ``moe_permute`` the (token, slot) pairs into expert order (FP8 rows travel as raw bytes);
3. L1: ``h = bf16(x̂ @ W1_e^T)`` (FP8 x FP4: 1x32 UE8M0 scales);
4. ``gate = h[:I]``, ``up = h[I:]``; clamp ``gate <= c``, ``-c <= up <= c``; ``act = silu(gate) * up * w`` (FP32);
5. ``act_q = bf16(act)``, or FP8 with per-32 UE8M0 scales (amax floored at 1e-4, scale rounded up to 2^k);
6. L2: ``y_k = bf16(act_q @ W2_e^T)``;
7. combine: ``moe_unpermute`` (FP32 sum of the token's rows in slot order, one rounding), or, when
   expert-parallel, ``ep_combine`` of each rank's FP32 partial sum (one rounding at the end; the FP32 sum is
   grouped by rank, so EP and one process agree to the last bit except where that order moves a rounding).

On CPU a single-process BF16 call that records no autograd runs steps 2-7 as one C++ call (``_one_call``: the
same kernels and bits, no Python between them, and the L1 tasks gather x's rows themselves, so the expert-ordered
copy of x is never written).

SM90's block-scaled FP8 mode (DeepGEMM nv_dev's ``fp8_mega_moe``: ``x_sf [T, H/128]``, 128x128-block weight
scales; specs/upstream_2609.md §5.2) differs in steps 3-6: L1 ``h = x̂ @ Ŵ1_e^T`` kept in FP32, the same epilogue,
the activation requantized per 1x64 with FP32 scales ``max(amax, 1e-4) / 448`` (not powers of two), and L2 over
those 64-wide K blocks (each 128x128 weight scale serving both halves of its block).

Fused shared experts (DeepGEMM-Ascend's ``shared_l1_weights`` / ``shared_l2_weights``): the same steps 3-6 for
every token at its home rank with dense GEMMs and weight 1 (FP8 x FP8 with 1x32 UE8M0 scales in FP8 mode); the
result is the first term of the combine's FP32 sum (``ep_combine``'s bias when expert-parallel).

The second output counts the (token, slot) pairs each local expert received (DeepEP's
``cumulative_local_expert_recv_stats`` increment; add it to your running total).
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

from torch_ascend_moe import _C
from torch_ascend_moe._registry import _plain_call, portable_kernel
from torch_ascend_moe.checks.mega_moe import BLOCK, BLOCK_ACT_GRAN, OP, check_topk_values, kind_of, mega_moe_signature
from torch_ascend_moe.distributed import capture
from torch_ascend_moe.distributed.groups import group_size, resolve_group
from torch_ascend_moe.ops.fp8_gemm import fp8_gemm
from torch_ascend_moe.ops.gemm import bf16_gemm
from torch_ascend_moe.ops.grouped import (
    m_grouped_bf16_gemm,
    m_grouped_bf16_gemm_swiglu,
    m_grouped_fp8_gemm,
    m_grouped_fp8_gemm_swiglu,
)
from torch_ascend_moe.ops.moe_routing import moe_permute, moe_unpermute
from torch_ascend_moe.ops.quant import quantize_fp8
from torch_ascend_moe.quant import per_token_cast_to_fp8

GRAN = 32  # the FP8 x FP4 recipe's K granularity (1 x 32 UE8M0 scales for x, W1, W2 and the activations)


def _permute_rows(x, idx, experts):
    """moe_permute of any 1- or 2-byte dtype: FP8 rows go through as pairs of bytes (bit copies)."""
    if x.dtype == torch.float8_e4m3fn:
        b = x.view(torch.int8)
        # Pairs of bytes need a unit last stride and even offsets: other layouts (column-major, a column slice) are
        # copied row-major first.
        if b.stride(-1) != 1 or b.storage_offset() % 2 or any(s % 2 for s in b.stride()[:-1]):
            b = b.clone(memory_format=torch.contiguous_format)
        permuted, row_map, offs = moe_permute(b.view(torch.float16), idx, experts)
        return permuted.view(torch.float8_e4m3fn), row_map, offs
    return moe_permute(x, idx, experts)


# FP32 elements per row block of the SwiGLU steps outside autograd: each block's few FP32 temporaries (256 KiB each)
# stay in cache and come back from the allocator's free lists, where whole [N, I] ones are fresh pages every step.
_ACT_BLOCK_ELEMENTS = 1 << 16


def _row_blocks(rows: int, inter: int):
    """``(begin, end)`` row ranges of about ``_ACT_BLOCK_ELEMENTS`` FP32 values of an ``[rows, inter]`` activation,
    each starting at a multiple of 64 elements: ATen's vector loops then give every element the lane it has in one
    whole-tensor call (their scalar tails round ``exp`` differently), so the blocks' values are the whole call's."""
    step = 64 // math.gcd(max(inter, 1), 64)
    block = max(step, _ACT_BLOCK_ELEMENTS // max(inter, 1) // step * step)
    return [(r, min(r + block, rows)) for r in range(0, rows, block)]


def _clamped(gate, up, activation_clamp):
    """Step 4's clamp on the BF16 halves: ``gate <= c``, ``-c <= up <= c`` (unchanged without a clamp)."""
    if activation_clamp is None:
        return gate, up
    return gate.clamp(max=activation_clamp), up.clamp(-activation_clamp, activation_clamp)


def _swiglu_block(gate, up, row_w, activation_clamp):
    """``silu(gate) * up (* row_w)`` in FP32 for BF16 ``gate``, ``up`` (clamped first): the products in place on
    one fresh buffer (BF16 -> FP32 is exact, and a product's bits do not depend on which operand holds it)."""
    gate, up = _clamped(gate, up, activation_clamp)
    act = F.silu(gate.float(), inplace=True).mul_(up)
    return act if row_w is None else act.mul_(row_w.unsqueeze(1))


def _activation(h, row_w, activation_clamp, fp8):
    """Steps 4-5 on L1's BF16 output ``h [N, 2I]``: ``(act_q, act_sf or None)`` ready for L2."""
    gate, up = h.chunk(2, dim=-1)
    if torch.is_grad_enabled() and (h.requires_grad or (row_w is not None and row_w.requires_grad)):
        gate, up = _clamped(gate, up, activation_clamp)
        act = F.silu(gate.float()) * up.float()
        if row_w is not None:
            act = act * row_w.unsqueeze(1)
        if fp8:
            return per_token_cast_to_fp8(act, use_ue8m0=True, gran_k=GRAN)
        return act.bfloat16(), None
    if fp8:  # per-row scales: the whole FP32 activation at once (the FP8 mode's quantizer reads it whole)
        return per_token_cast_to_fp8(_swiglu_block(gate, up, row_w, activation_clamp), use_ue8m0=True, gran_k=GRAN)
    if _native(h, row_w):
        return _C._kept_swiglu(h, row_w, activation_clamp, _ACT_BLOCK_ELEMENTS), None
    out = torch.empty_like(gate)
    for r0, r1 in _row_blocks(*gate.shape):
        w = None if row_w is None else row_w[r0:r1]
        out[r0:r1].copy_(_swiglu_block(gate[r0:r1], up[r0:r1], w, activation_clamp))
    return out, None


def _native(h, *others) -> bool:
    """Whether the C++ loops (csrc/ops/mega_moe_cpu.cpp: the same bits, one pass per row block) serve a BF16
    SwiGLU step (or its backward) on ``h`` and ``others``: plain eager CPU tensors (no tracing, mode, transform or
    subclass that must see the ATen ops)."""
    return h.device.type == "cpu" and h.dtype == torch.bfloat16 and _plain_call([h, *others])


def _bf16_activation(h, row_w, activation_clamp):
    """``_activation`` in BF16 mode, values bit for bit; where autograd records it, ``_KeptActivation`` keeps only
    ``h`` and ``row_w`` instead of four FP32 ``[N, I]`` intermediates."""
    if torch.is_grad_enabled() and (h.requires_grad or (row_w is not None and row_w.requires_grad)):
        return _KeptActivation.apply(h, row_w, activation_clamp), None
    return _activation(h, row_w, activation_clamp, False)


class _KeptActivation(torch.autograd.Function):
    """Steps 4-5 (BF16) for a recorded pipeline: the forward is ``_activation``'s, the backward recomputes the FP32
    intermediates from ``h`` and applies, op for op, the formulas autograd would have recorded for ``_activation``
    (ToCopy, Mul with the broadcast weight summed back, Mul, SiLU, ToCopy, Clamp, Split), so the gradients are the
    same bits; what the tape keeps is ``h`` (BF16) rather than ``gate``, ``silu(gate)``, ``up`` and their product in
    FP32."""

    @staticmethod
    def forward(ctx, h, row_w, activation_clamp):
        ctx.save_for_backward(h, row_w)
        ctx.clamp = activation_clamp
        return _activation(h, row_w, activation_clamp, False)[0]

    @staticmethod
    def backward(ctx, grad_act):
        h, row_w = ctx.saved_tensors
        need_w = row_w is not None and ctx.needs_input_grad[1]
        if _native(h, row_w, grad_act):
            grad_h, grad_w = _C._kept_swiglu_backward(h, row_w, ctx.clamp, grad_act, need_w, _ACT_BLOCK_ELEMENTS)
            return grad_h, grad_w, None
        out = torch.empty_like(h)
        grad_w = torch.empty_like(row_w) if need_w else None
        gate_h, up_h = h.chunk(2, dim=-1)
        grad_gate, grad_up = out.chunk(2, dim=-1)
        # Row blocks (``_row_blocks``: the whole tensors' values, a row's sum in the same order) with small
        # temporaries, the two halves rounded straight into the result: no [N, I] FP32 buffer at all.
        for r0, r1 in _row_blocks(*gate_h.shape):
            w = None if row_w is None else row_w[r0:r1]
            gw = _kept_backward_block(
                gate_h[r0:r1], up_h[r0:r1], w, ctx.clamp, grad_act[r0:r1], grad_gate[r0:r1], grad_up[r0:r1], need_w
            )
            if need_w:
                grad_w[r0:r1] = gw
        return out, grad_w, None


def _kept_backward_block(gate_h, up_h, row_w, c, grad_act, grad_gate, grad_up, need_w):
    """``_KeptActivation``'s backward on a row block: autograd's formulas for ``_activation`` (ToCopy, Mul with the
    broadcast weight summed back, Mul, SiLU, ToCopy, Clamp, Split), each product formed in place where its operand
    is not needed again (the same bits: BF16 -> FP32 is exact and FP32 products commute); writes the block's
    ``grad_gate`` and ``grad_up``, returns its rows' routing-weight gradient when ``need_w``."""
    gate, up = _clamped(gate_h, up_h, c)
    gate_f, up_f = gate.float(), up.float()
    silu = F.silu(gate_f)
    grad = grad_act.float()
    grad_w = None
    if row_w is not None:
        if need_w:
            grad_w = (silu * up_f).mul_(grad).sum(1)
        grad.mul_(row_w.unsqueeze(1))
    grad_gate.copy_(torch.ops.aten.silu_backward(up_f.mul_(grad), gate_f))
    grad_up.copy_(silu.mul_(grad))
    if c is not None:
        # Zero wherever autograd's clamp_backward does: outside the kept range, NaN included.
        grad_gate.masked_fill_((gate_h <= c).logical_not_(), 0)
        grad_up.masked_fill_((up_h >= -c).logical_and_(up_h <= c).logical_not_(), 0)
    return grad_w


def _block_experts(permuted, sf_rows, offs, row_w, l1, l1_sf, l2, l2_sf, activation_clamp):
    """Steps 3-6 of the SM90 block-scaled mode (module docstring): ``y [P, H]`` BF16 rows in expert order."""
    block = (BLOCK, BLOCK)
    h = m_grouped_fp8_gemm(
        permuted, sf_rows, l1, l1_sf, offs, recipe_a=(1, BLOCK), recipe_b=block, out_dtype=torch.float32
    )
    gate, up = h.chunk(2, dim=-1)
    if activation_clamp is not None:
        gate = gate.clamp(max=activation_clamp)
        up = up.clamp(-activation_clamp, activation_clamp)
    act, act_sf = quantize_fp8(F.silu(gate) * up * row_w.unsqueeze(1), (1, BLOCK_ACT_GRAN), use_ue8m0=False)
    halves = l2_sf.repeat_interleave(BLOCK // BLOCK_ACT_GRAN, dim=-1)  # [E, H/128, I/64]: one scale per 128x64
    recipe_b = (BLOCK, BLOCK_ACT_GRAN)
    return m_grouped_fp8_gemm(
        act, act_sf, l2, halves, offs, recipe_a=(1, BLOCK_ACT_GRAN), recipe_b=recipe_b, out_dtype=torch.bfloat16
    )


def _row_weights(weights, idx, row_map, n_rows, experts):
    """Each permuted row's routing weight, FP32 ``[n_rows]`` (rows of unrouted pairs and padding get 0). Without
    autograd: ``moe_permute`` of the ``[N*K, 1]`` weights by the ``[N*K, 1]`` ids, which visits the pairs in the
    order the rows were permuted, so each weight lands on its pair's row (one C++ call; after the GEMMs of a
    decode-sized call the small ATen ops that scatter it cost ~10 us each). A recorded call scatters through
    ``row_map`` (``index_copy``, whose backward gathers: the gradient bits of every earlier release)."""
    if not (torch.is_grad_enabled() and weights.requires_grad):
        return moe_permute(weights.reshape(-1, 1), idx.reshape(-1, 1), experts)[0].view(-1)
    spare = torch.where(row_map >= 0, row_map.long(), n_rows).view(-1)
    row_w = torch.zeros(n_rows + 1, dtype=torch.float32, device=weights.device)
    return row_w.index_copy(0, spare, weights.reshape(-1))[:n_rows]


@dataclasses.dataclass
class ExpertTape:
    """What a recorded BF16 call keeps for a backward that forms the routed experts' weight gradients itself
    (autograd/mega_moe.py: into buffers reused step after step). ``l1``/``l2``: whose gradient is wanted (those
    weights come without ``requires_grad``, so autograd forms neither); ``local_experts`` fills in the expert layout
    ``offs``, L1's input ``permuted`` and output ``h``, L2's input ``act`` and output ``y``, with ``h`` (``y``) in the
    graph whenever L1's (L2's) gradient is wanted, so the backward can ask for the gradient that reaches it."""

    l1: bool
    l2: bool
    offs: torch.Tensor | None = None
    permuted: torch.Tensor | None = None
    h: torch.Tensor | None = None
    act: torch.Tensor | None = None
    y: torch.Tensor | None = None


def _in_graph(t: torch.Tensor, wanted: bool) -> torch.Tensor:
    """``t`` made a leaf that requires grad when ``wanted`` and nothing it came from does (e.g. a frozen x's L1
    output), so a gradient reaching it is still formed (no other gradient is computed for it)."""
    return t.requires_grad_() if wanted and not t.requires_grad else t


def local_experts(x, x_sf, idx, weights, l1, l1_sf, l2, l2_sf, activation_clamp, keep_l1=False, tape=None):
    """Steps 2-6 for the experts held here: ``x [N, H]`` rows, ``idx [N, K]`` local expert ids (-1 skipped),
    ``weights [N, K]``. Returns ``(y [P, H] BF16 rows in expert order, row_map [N, K], per-expert pair counts
    int32 [E_local])``. ``keep_l1`` (BF16 mode, recorded for a backward): the L1 GEMM and the SwiGLU as separate
    steps, so the tape keeps the L1 output instead of the fused op's backward recomputing it (the same values:
    the fused op's tiles accumulate as the whole GEMM does, tests/mega_moe); ``tape``: an ``ExpertTape`` to fill
    (with ``keep_l1``)."""
    fp8 = x.dtype == torch.float8_e4m3fn
    block = kind_of(x, x_sf, l1) == "fp8_block"
    experts = l1.shape[0]
    if fp8 and l1.dtype != torch.float8_e4m3fn:  # upstream passes packed FP4 as int8; the grouped GEMM reads uint8
        # The grouped GEMMs read packed FP4 K-major: other layouts of the same bytes are copied so first.
        l1, l2 = (w.view(torch.uint8) if w.stride(-1) == 1 else w.view(torch.uint8).contiguous() for w in (l1, l2))
    permuted, row_map, offs = _permute_rows(x, idx, experts)
    n_rows = permuted.shape[0]
    row_w = _row_weights(weights.float(), idx, row_map, n_rows, experts)
    counts = torch.diff(offs, prepend=offs.new_zeros(1)).int()
    if block:
        sf_rows, _, _ = moe_permute(x_sf, idx, experts)
        return _block_experts(permuted, sf_rows, offs, row_w, l1, l1_sf, l2, l2_sf, activation_clamp), row_map, counts
    # Steps 3-5 in one op: the same values without the [N, 2I] L1 output.
    if fp8:
        sf_rows, _, _ = moe_permute(x_sf, idx, experts)
        act, act_sf = m_grouped_fp8_gemm_swiglu(
            permuted, sf_rows, l1, l1_sf, offs, recipe_a=(1, GRAN), recipe_b=(1, GRAN), row_weights=row_w,
            activation_clamp=activation_clamp, quant_gran_k=GRAN, use_ue8m0=True,
        )  # fmt: skip
    elif keep_l1:
        h = m_grouped_bf16_gemm(permuted, l1, offs, out_dtype=torch.bfloat16)
        if tape is not None:
            h = _in_graph(h, tape.l1)
        act, act_sf = _bf16_activation(h, row_w, activation_clamp)
    else:
        act, act_sf = m_grouped_bf16_gemm_swiglu(
            permuted, l1, offs, row_weights=row_w, activation_clamp=activation_clamp, out_dtype=torch.bfloat16
        )
    if fp8:
        y = m_grouped_fp8_gemm(
            act, act_sf, l2, l2_sf, offs, recipe_a=(1, GRAN), recipe_b=(1, GRAN), out_dtype=torch.bfloat16
        )
    else:
        y = m_grouped_bf16_gemm(act, l2, offs, out_dtype=torch.bfloat16)
    if tape is not None and keep_l1 and not fp8:
        y = _in_graph(y, tape.l2)
        tape.offs, tape.permuted, tape.h, tape.act, tape.y = offs, permuted, h, act, y
    return y, row_map, counts


def shared_experts(x, x_sf, l1, l1_sf, l2, l2_sf, activation_clamp):
    """The fused shared experts at the token's home rank: the same steps with dense GEMMs and weight 1 (FP8 x FP8
    with 1x32 UE8M0 scales in FP8 mode). ``[T, H]`` BF16."""
    fp8 = x.dtype == torch.float8_e4m3fn
    if fp8:
        h = fp8_gemm(x, x_sf, l1, l1_sf, recipe_a=(1, GRAN), recipe_b=(1, GRAN), out_dtype=torch.bfloat16)
    else:
        h = bf16_gemm(x, l1, out_dtype=torch.bfloat16)
    act, act_sf = _activation(h, None, activation_clamp, True) if fp8 else _bf16_activation(h, None, activation_clamp)
    if fp8:
        return fp8_gemm(act, act_sf, l2, l2_sf, recipe_a=(1, GRAN), recipe_b=(1, GRAN), out_dtype=torch.bfloat16)
    return bf16_gemm(act, l2, out_dtype=torch.bfloat16)


def _combine_local(y_rows, row_map, shared):
    """Step 7 in one process: each token's rows summed in FP32 from zero, one rounding; the shared experts' row,
    when present, is the first term (as the bias of ``ep_combine`` is when expert-parallel). ``moe_unpermute``
    starts its sum from its bias instead of adding it to zero, so the bias is ``shared + 0`` (exact: only a -0.0
    becomes +0.0, as the sum's first step makes it; a NaN's payload differs, but the rounding writes every NaN as
    one code), not a copy of the rows with one more slot."""
    return moe_unpermute(y_rows, row_map, bias=_combine_bias(shared))


def _combine_bias(shared):
    """The shared experts' row as the combine's bias, ``shared + 0`` (``_combine_local``), or None."""
    if shared is None:
        return None
    return shared + 0.0 if shared.requires_grad else shared.add_(0.0)


@portable_kernel
def mega_moe(args):
    return validated_pipeline(args)


# mega_moe_signature's verdicts by the call's dtypes, shapes and other arguments (all it reads): bounded, as a
# process sees few distinct calls of a layer.
_CHECKED: dict[tuple, tuple[int, int]] = {}
_CHECKED_MAX = 256
_TENSOR_ARGS = (
    "x", "x_sf", "topk_idx", "topk_weights", "l1_weights", "l1_sf", "l2_weights", "l2_sf",
    "shared_l1_weights", "shared_l1_sf", "shared_l2_weights", "shared_l2_sf",
)  # fmt: skip


def _checked_signature(a, ranks: int) -> tuple[int, int]:
    """``mega_moe_signature``, remembered: its checks read only each tensor's dtype and shape, the clamp, the
    timeout and the group's size, and a model calls a layer with the same ones step after step. Run after the
    previous call's GEMMs have emptied the caches, the checks' Python took ~50 us of a ~5 ms decode call."""
    shapes = tuple(None if t is None else (t.dtype, t.shape) for t in (getattr(a, n) for n in _TENSOR_ARGS))
    key = (ranks, a.activation_clamp, a.timeout_s, shapes)
    verdict = _CHECKED.get(key)
    if verdict is None:
        verdict = mega_moe_signature(a, ranks)  # raises on a bad call: nothing is remembered for it
        if len(_CHECKED) < _CHECKED_MAX:
            _CHECKED[key] = verdict
    return verdict


def validated_pipeline(a, keep_l1=False, tape=None):
    """The op's checks, then ``pipeline``: the kernel, and the eager training forward (autograd/mega_moe.py)."""
    num_experts, _ = _checked_signature(a, group_size(OP, a.group_name))
    one_call = _one_call(a, keep_l1)
    # (A call taken by _C._mega_moe_bf16_local checks the ids in its own first pass.)
    if a.group_name is None and a.topk_idx.numel() and capture.host_readable(a.topk_idx) and not one_call:
        check_topk_values(a.topk_idx, num_experts)
    return pipeline(a, keep_l1, one_call, tape)


def _one_call(a, keep_l1) -> bool:
    """Whether steps 2-7 run as one C++ call (csrc/ops/mega_moe_cpu.cpp's ``mega_moe_bf16_local``: the pipeline's
    own kernels, the same bits, without the Python between them and without the expert-ordered copy of x): a
    single-process BF16 call on plain eager CPU tensors that records no autograd."""
    if keep_l1 or a.group_name is not None or a.x.dtype != torch.bfloat16 or a.x.device.type != "cpu":
        return False
    tensors = [a.x, a.topk_idx, a.topk_weights, a.l1_weights, a.l2_weights]
    tensors += [t for t in (a.shared_l1_weights, a.shared_l2_weights) if t is not None]
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return False
    return capture.host_readable(a.topk_idx) and _plain_call(tensors)


def _local_in_one_call(a):
    """``shared_experts``, ``local_experts`` and ``_combine_local`` as one C++ call (``_one_call``); an expert id out
    of range raises the op's error."""
    out = _C._mega_moe_bf16_local(
        a.x, a.topk_idx, a.topk_weights, a.l1_weights, a.l2_weights, a.activation_clamp,
        a.shared_l1_weights, a.shared_l2_weights, _ACT_BLOCK_ELEMENTS,
    )  # fmt: skip
    if out is None:
        check_topk_values(a.topk_idx, a.l1_weights.shape[0])
    return out


def pipeline(a, keep_l1=False, one_call=None, tape=None):
    """The unfused pipeline (no value checks: the backward reruns it under tracing); ``keep_l1``, ``tape``: as
    ``local_experts``' (a call recorded for a backward); ``one_call``: ``_one_call``'s answer where the caller has
    it."""
    if a.group_name is None and (_one_call(a, keep_l1) if one_call is None else one_call):
        return _local_in_one_call(a)
    shared = None
    if a.shared_l1_weights is not None:
        shared = shared_experts(
            a.x, a.x_sf, a.shared_l1_weights, a.shared_l1_sf, a.shared_l2_weights, a.shared_l2_sf, a.activation_clamp
        )
    expert_args = (a.l1_weights, a.l1_sf, a.l2_weights, a.l2_sf, a.activation_clamp, keep_l1, tape)
    if a.group_name is None:
        y_rows, row_map, counts = local_experts(a.x, a.x_sf, a.topk_idx, a.topk_weights, *expert_args)
        return _combine_local(y_rows, row_map, shared), counts
    from torch_ascend_moe.ops.ep import ep_combine, ep_dispatch

    experts = a.l1_weights.shape[0] * resolve_group(OP, a.group_name).size()
    sent = ep_dispatch(
        a.x, a.topk_idx, a.topk_weights, num_experts=experts, group=a.group_name, x_scales=a.x_sf, timeout_s=a.timeout_s
    )
    y_rows, row_map, counts = local_experts(
        sent.recv_x, sent.recv_x_scales, sent.recv_topk_idx, sent.recv_topk_weights, *expert_args
    )
    # Each received token's local slots summed here in FP32 and the ranks' FP32 partials (after the shared experts'
    # row) summed at home: one rounding to BF16, as the kernel's combine; only the FP32 sum's order differs from
    # one process (grouped by rank). FP32 partials cost at most twice BF16 ones on the way back.
    partial = moe_unpermute(y_rows.float(), row_map)
    bias = None if shared is None else shared.float()
    y, _ = ep_combine(partial, sent.handle, bias=bias, timeout_s=a.timeout_s)
    return y.bfloat16(), counts
