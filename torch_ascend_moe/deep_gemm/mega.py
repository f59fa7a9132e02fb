"""DeepGEMM's MegaMoE API (specs/deepgemm_api.md §10.2) on the ``mega_moe`` op.

Differences from upstream, on purpose: ``SymmBuffer`` has upstream's attributes (one int8 ``buffer``
carved into ``x``, ``x_sf``, ``topk_idx``, ``topk_weights``, 2.8's ``shared_l1_acts`` (= ``x``),
``shared_l1_acts_sf``, ``shared_l2_acts(_sf)``, ``l1_acts(_sf)``, ``l2_acts(_sf)``; ``handle``)
but is ordinary memory of this process (no symmetric memory: the op moves tokens with ``ep_dispatch`` /
``ep_combine`` over ``torch.distributed``, so ``handle.buffer_ptrs`` names only the local buffer and the
activation pools are never written); ``fast_math`` is accepted and ignored (the math is exact:
``silu(g) = g / (1 + exp(-g))`` in FP32); the buffer's views keep their contents after a call
(upstream's kernel consumes them: refill them before every call either way).

Fused shared experts (DeepGEMM-Ascend): ``SymmBuffer(..., num_shared_experts=S)`` (S <= 2, Ascend's seventh
argument; upstream's ``num_ring_tokens`` is keyword-only here) and ``shared_l1_weights`` / ``shared_l2_weights``
= ``(FP8 [2·S·I, H], scales)`` / ``(FP8 [H, S·I], scales)`` in ``fp8_fp4_mega_moe`` (Ascend's positions), BF16
tensors in ``bf16_mega_moe`` (keyword arguments after upstream's). The S shared experts are one SwiGLU MLP of
intermediate S·I (gate rows, then up), DeepSeek's convention. They are taken in their plain row-major layout:
Ascend's transform re-orders FP8 shared weights into its NZ (fractal) hardware layout, which nothing here reads.
Scales: FP32 1x32, or packed UE8M0 (int32: 4 per element, int16: 2).
"""

from __future__ import annotations

import types

import torch
import torch.distributed as dist

from torch_ascend_moe import checks as ck
from torch_ascend_moe.ops.mega_moe import mega_moe
from torch_ascend_moe.quant import scales_to_float

_TOKEN_ALIGNMENT = 384  # lcm of the kernel's candidate block sizes {8, 16, 32, 64, 96, 128, 192}
_CHUNK = 8  # transform_weights_for_mega_moe interleaves gate and up rows in chunks of 8
# DeepGEMM 2.8's BLOCK_M by expected tokens per expert (``heuristics/mega_moe.hpp``): the first bound that holds.
_BLOCK_M_BY_LOAD = ((8.5, 16), (16.5, 32), (32.5, 64), (64.5, 96), (96.5, 128), (float("inf"), 192))
_MMA_TYPES = ("fp8xfp4", "fp8xfp8", "bf16xbf16")


def get_token_alignment_for_mega_moe() -> int:
    return _TOKEN_ALIGNMENT


def get_block_m_for_mega_moe(
    num_ranks: int, num_experts: int, num_max_tokens_per_rank: int, num_tokens: int, num_topk: int, mma_type: str
) -> int:
    """DeepGEMM 2.8's BLOCK_M for a call of ``num_tokens`` tokens per rank: by the expected tokens per expert
    ``num_tokens · num_ranks · num_topk / num_experts`` (FP32, as upstream), 16 up to 8.5, 32 up to 16.5, 64 up
    to 32.5, 96 up to 64.5, 128 up to 96.5, else 192. Callers lay out the shared experts' input scales with it
    (``mega_mhc(shared_sf_block_m=)``, ``SymmBuffer.shared_l1_acts_sf``). Our kernels do not tile by it: the value
    only has to agree between the writer of those scales and the buffer, which it does."""
    api = "deep_gemm.get_block_m_for_mega_moe"
    ck.check_int_arg(api, "num_ranks", num_ranks, 1)
    ck.check_int_arg(api, "num_experts", num_experts, 1)
    ck.check_int_arg(api, "num_max_tokens_per_rank", num_max_tokens_per_rank, 0)
    ck.check_int_arg(api, "num_tokens", num_tokens, 0)
    ck.check_int_arg(api, "num_topk", num_topk, 1)
    ck.check_arg(mma_type in _MMA_TYPES, api, "mma_type", "value", " or ".join(map(repr, _MMA_TYPES)), repr(mma_type))
    load = float(torch.tensor(num_tokens * num_ranks * num_topk, dtype=torch.float32) / num_experts)
    return next(block_m for bound, block_m in _BLOCK_M_BY_LOAD if load <= bound)


def _shared_sf_rows(tokens: int) -> int:
    """Rows of the shared experts' scale layout for any BLOCK_M: ``ceil(T/B)·align(B, 128)``, largest at B = 16."""
    return max(-(-tokens // b) * -(-b // 128) * 128 for _, b in _BLOCK_M_BY_LOAD)


class SymmBuffer:
    """The per-call input views (``x``, ``x_sf``, ``topk_idx``, ``topk_weights``, first ``T`` rows used) and
    the group. ``x`` is FP8 with ``x_sf`` int32 ``[T_max, H/128]`` (four UE8M0 scales of 32 channels each)
    for ``mma_type='fp8xfp4'``, BF16 without scales for ``'bf16xbf16'``."""

    def __init__(
        self,
        group,
        num_experts: int,
        num_max_tokens_per_rank: int,
        num_topk: int,
        hidden: int,
        intermediate_hidden: int,
        num_shared_experts: int = 0,
        mma_type: str = "fp8xfp4",
        activation: str = "swiglu",
        base: SymmBuffer | None = None,
        *,
        num_ring_tokens: int = 0,
    ) -> None:
        api = "SymmBuffer"
        ck.check_arg(0 <= num_shared_experts <= 2, api, "num_shared_experts", "value", "0, 1 or 2", num_shared_experts)
        ranks = dist.get_world_size(group) if group is not None and dist.is_initialized() else 1
        ck.check_arg(
            num_experts % ranks == 0, api, "num_experts", "value", f"a multiple of the {ranks} ranks", num_experts
        )
        ck.check_arg(activation == "swiglu", api, "activation", "value", "'swiglu'", repr(activation))
        ck.check_arg(
            mma_type in ("fp8xfp4", "bf16xbf16"), api, "mma_type", "value", "'fp8xfp4' or 'bf16xbf16'", repr(mma_type)
        )
        fp8 = mma_type == "fp8xfp4"
        if fp8:
            ck.check_arg(hidden % 128 == 0, api, "hidden", "value", "a multiple of 128 for fp8xfp4", hidden)
            ck.check_arg(
                intermediate_hidden % 128 == 0,
                api,
                "intermediate_hidden",
                "value",
                "a multiple of 128",
                intermediate_hidden,
            )
        self.group, self.ranks, self.mma_type = group, ranks, mma_type
        self.num_experts, self.num_max_tokens_per_rank, self.num_topk = num_experts, num_max_tokens_per_rank, num_topk
        self.hidden, self.intermediate_hidden, self.num_ring_tokens = hidden, intermediate_hidden, num_ring_tokens
        self.num_shared_experts = num_shared_experts
        # ``base`` makes upstream carve this buffer out of another's memory; each buffer owns plain tensors here.
        ck.check_arg(
            base is None or isinstance(base, SymmBuffer), api, "base", "type", "None or a SymmBuffer", type(base)
        )
        self._allocate(num_max_tokens_per_rank, num_ring_tokens or num_max_tokens_per_rank * num_topk, fp8)

    def _allocate(self, tokens: int, ring_tokens: int, fp8: bool) -> None:
        """One zeroed int8 ``buffer`` carved into upstream's views (its ``slice_input_buffers``): inputs
        ``x``, ``x_sf`` (K-major), ``topk_idx``, ``topk_weights``, and the per-expert activation pools
        ``l1_acts``/``l2_acts`` (``ring_tokens`` rows) with M-major scales. Only the inputs are read here:
        the op keeps its intermediates to itself, so the pools are scratch of upstream's shapes."""
        act = torch.float8_e4m3fn if fp8 else torch.bfloat16
        sf_rows = -(-ring_tokens // 4) * 4
        hidden, inter = self.hidden, self.intermediate_hidden
        shared_inter = self.num_shared_experts * inter
        shared_rows = _shared_sf_rows(tokens) if self.num_shared_experts else 0
        views = [
            ("x", act, (tokens, hidden)),
            ("x_sf", torch.int32, (tokens, hidden // 128) if fp8 else None),
            ("topk_idx", torch.int64, (tokens, self.num_topk)),
            ("topk_weights", torch.float32, (tokens, self.num_topk)),
            # DeepGEMM 2.8's fused shared experts: their L1 input is ``x`` itself; the scales M-major in
            # ``get_block_m_for_mega_moe``'s block layout (see ``mega_mhc.shared_sf_rows``).
            ("shared_l1_acts_sf", torch.int32, (hidden // 128, shared_rows) if fp8 else None),
            ("shared_l2_acts", act, (tokens if shared_inter else 0, shared_inter)),
            ("shared_l2_acts_sf", torch.int32, (shared_inter // 128, shared_rows) if fp8 else None),
            ("l1_acts", act, (ring_tokens, hidden)),
            ("l1_acts_sf", torch.int32, (hidden // 128, sf_rows) if fp8 else None),
            ("l2_acts", act, (ring_tokens, inter)),
            ("l2_acts_sf", torch.int32, (inter // 128, sf_rows) if fp8 else None),
        ]
        offsets, size = [], 0
        for _, dtype, shape in views:
            offsets.append(size)
            if shape is not None:  # each view starts 16-byte aligned, as upstream's layout::Buffer
                size += -(-shape[0] * shape[1] * dtype.itemsize // 16) * 16
        self.buffer = torch.zeros(size, dtype=torch.int8)
        self.handle = types.SimpleNamespace(buffer_ptrs=[self.buffer.data_ptr()])
        for (name, dtype, shape), offset in zip(views, offsets):
            view = None
            if shape is not None:
                view = self.buffer[offset : offset + shape[0] * shape[1] * dtype.itemsize].view(dtype).view(shape)
            setattr(self, name, view)
        if fp8:  # M-major: [sf_rows, K/128] with strides (1, sf_rows)
            self.l1_acts_sf, self.l2_acts_sf = self.l1_acts_sf.T, self.l2_acts_sf.T
            self.shared_l1_acts_sf, self.shared_l2_acts_sf = self.shared_l1_acts_sf.T, self.shared_l2_acts_sf.T
        self.shared_l1_acts = self.x
        self.topk_idx.fill_(-1)

    def destroy(self) -> None:
        """Release the memory (upstream drops ``handle``, ``buffer``, ``group`` and the input views)."""
        self.handle = self.buffer = self.group = None
        self.x = self.x_sf = self.topk_idx = self.topk_weights = None
        self.shared_l1_acts = self.shared_l1_acts_sf = self.shared_l2_acts = self.shared_l2_acts_sf = None
        self.l1_acts = self.l1_acts_sf = self.l2_acts = self.l2_acts_sf = None


def get_symm_buffer_for_mega_moe(
    group,
    num_experts: int,
    num_max_tokens_per_rank: int,
    num_topk: int,
    hidden: int,
    intermediate_hidden: int,
    num_shared_experts: int = 0,
    use_fp8_dispatch: bool | None = None,
    mma_type: str = "fp8xfp4",
    activation: str = "swiglu",
) -> SymmBuffer:
    """A ``SymmBuffer`` with ``num_max_tokens_per_rank`` rounded up to ``get_token_alignment_for_mega_moe()``.

    DeepGEMM 2.8's seventh argument is ``num_shared_experts`` (an int: the fused shared experts); 2.6.1's was
    ``use_fp8_dispatch`` (a bool or None) followed by ``mma_type`` and ``activation``: a bool or None there is read
    in 2.6.1's order."""
    if num_shared_experts is None or isinstance(num_shared_experts, bool):  # 2.6.1's positional form
        shifted = isinstance(use_fp8_dispatch, str)
        use_fp8_dispatch, num_shared_experts, mma_type, activation = (
            num_shared_experts,
            0,
            use_fp8_dispatch if shifted else mma_type,
            mma_type if shifted and mma_type != "fp8xfp4" else activation,
        )
    if use_fp8_dispatch is not None:
        ck.check_arg(
            use_fp8_dispatch == (mma_type == "fp8xfp4"),
            "get_symm_buffer_for_mega_moe",
            "use_fp8_dispatch",
            "value",
            f"{mma_type == 'fp8xfp4'} (deprecated; must agree with mma_type={mma_type!r})",
            use_fp8_dispatch,
        )
    t = -(-num_max_tokens_per_rank // _TOKEN_ALIGNMENT) * _TOKEN_ALIGNMENT
    return SymmBuffer(
        group,
        num_experts,
        t,
        num_topk,
        hidden,
        intermediate_hidden,
        num_shared_experts,
        mma_type=mma_type,
        activation=activation,
    )


def _interleave(rows: int) -> torch.Tensor:
    """New row j of the transformed L1 <- old row: gate[0:8], up[0:8], gate[8:16], up[8:16], ..."""
    half = rows // 2
    j = torch.arange(rows)
    block, r = j // (2 * _CHUNK), j % (2 * _CHUNK)
    return torch.where(r < _CHUNK, block * _CHUNK + r, half + block * _CHUNK + r - _CHUNK)


def _utccp(rows: int) -> torch.Tensor:
    """New scale row b*4 + a <- old row a*32 + b within every 128-row chunk."""
    j = torch.arange(rows)
    chunk, r = j // 128, j % 128
    b, a = r // 4, r % 4
    return chunk * 128 + a * 32 + b


def _mn_major(sf: torch.Tensor) -> torch.Tensor:
    return sf.mT.contiguous().mT


def transform_weights_for_mega_moe(l1_weights, l2_weights, activation: str = "swiglu"):
    """Upstream's weight layout: L1 rows interleaved gate/up in chunks of 8 (weights and scales); FP4 scales also
    permuted within 128-row chunks (row ``a·32 + b`` -> ``b·4 + a``); L2 keeps its rows (scales permuted)."""
    ck.check_arg(
        activation == "swiglu", "transform_weights_for_mega_moe", "activation", "value", "'swiglu'", activation
    )
    if isinstance(l1_weights, torch.Tensor):
        return l1_weights[:, _interleave(l1_weights.shape[1])].contiguous(), l2_weights
    (w1, s1), (w2, s2) = l1_weights, l2_weights
    order = _interleave(w1.shape[1])
    w1, s1 = w1[:, order].contiguous(), s1[:, order]
    return (w1, _mn_major(s1[:, _utccp(s1.shape[1])])), (w2, _mn_major(s2[:, _utccp(s2.shape[1])]))


def _untransform_l1(w: torch.Tensor) -> torch.Tensor:
    return w[:, torch.argsort(_interleave(w.shape[1]))]


def _untransform_sf(sf: torch.Tensor, interleaved: bool) -> torch.Tensor:
    sf = sf[:, torch.argsort(_utccp(sf.shape[1]))]
    return _untransform_l1(sf) if interleaved else sf


def _shared(api, buf: SymmBuffer, shared_l1, shared_l2, fp8):
    """The shared experts' (l1, l1_sf, l2, l2_sf) for the op, checked against the buffer's expert count."""
    given = shared_l1 is not None or shared_l2 is not None
    ck.check_arg(
        given == (buf.num_shared_experts > 0),
        api,
        "shared_l1_weights",
        "value",
        f"{'weights' if buf.num_shared_experts else 'None'} (sym_buffer.num_shared_experts={buf.num_shared_experts})",
        "weights" if given else None,
    )
    if not given:
        return None, None, None, None
    rows = 2 * buf.num_shared_experts * buf.intermediate_hidden
    out = []
    for name, w in (("shared_l1_weights", shared_l1), ("shared_l2_weights", shared_l2)):
        ck.check_arg(w is not None, api, name, "value", "weights with the other shared experts' weights", None)
        if fp8:
            ck.check_arg(
                isinstance(w, (tuple, list)) and len(w) == 2, api, name, "type", "(FP8 weights, scales)", type(w)
            )
            out += [w[0], scales_to_float(w[1]).contiguous()]
        else:
            out += [w, None]
    ck.check_arg(out[0].shape[0] == rows, api, "shared_l1_weights", "size(0)", f"2·S·I = {rows}", out[0].shape[0])
    return tuple(out)


def _run(y, l1, l1_sf, l2, l2_sf, shared, buf: SymmBuffer, stats, activation, activation_clamp):
    ck.check_arg(activation == "swiglu", "mega_moe", "activation", "value", "'swiglu'", repr(activation))
    t = y.shape[0]
    ck.check_arg(t <= buf.num_max_tokens_per_rank, "mega_moe", "y", "size(0)", f"<= {buf.num_max_tokens_per_rank}", t)
    x_sf = scales_to_float(buf.x_sf[:t]) if buf.x_sf is not None else None
    out, counts = mega_moe(
        buf.x[:t],
        buf.topk_idx[:t],
        buf.topk_weights[:t],
        l1,
        l2,
        x_sf=x_sf,
        l1_sf=l1_sf,
        l2_sf=l2_sf,
        shared_l1_weights=shared[0],
        shared_l1_sf=shared[1],
        shared_l2_weights=shared[2],
        shared_l2_sf=shared[3],
        group=buf.group if buf.ranks > 1 else None,
        activation_clamp=activation_clamp,
    )
    y.copy_(out)
    if stats is not None:
        stats += counts.to(stats.dtype)


def fp8_fp4_mega_moe(
    y: torch.Tensor,
    l1_weights: tuple,
    l2_weights: tuple,
    sym_buffer: SymmBuffer,
    shared_l1_weights: tuple | None = None,
    shared_l2_weights: tuple | None = None,
    cumulative_local_expert_recv_stats: torch.Tensor | None = None,
    recipe: tuple = (1, 1, 32),
    activation: str = "swiglu",
    activation_clamp: float | None = None,
    fast_math: bool = True,
) -> None:
    """``y [T, H]`` BF16 <- MegaMoE of the buffer's first T tokens; weights from ``transform_weights_for_mega_moe``
    (FP4 int8, or E4M3 for DeepGEMM 2.8's fp8xfp8, with packed UE8M0 scales); fused shared experts
    ``(FP8 weights, scales)``."""
    ck.check_arg(tuple(recipe) == (1, 1, 32), "fp8_fp4_mega_moe", "recipe", "value", "(1, 1, 32)", tuple(recipe))
    shared = _shared("fp8_fp4_mega_moe", sym_buffer, shared_l1_weights, shared_l2_weights, fp8=True)
    (w1, s1), (w2, s2) = l1_weights, l2_weights
    # The weights' dtype picks the MMA (DeepGEMM 2.8): E4M3 -> fp8xfp8, packed FP4 (int8) -> fp8xfp4.
    l1 = _untransform_l1(w1)
    l1 = l1 if l1.dtype == torch.float8_e4m3fn else l1.view(torch.uint8)
    l1_sf = scales_to_float(_untransform_sf(s1, interleaved=True).contiguous())
    l2_sf = scales_to_float(_untransform_sf(s2, interleaved=False).contiguous())
    _run(
        y,
        l1,
        l1_sf,
        w2 if w2.dtype == torch.float8_e4m3fn else w2.view(torch.uint8),
        l2_sf,
        shared,
        sym_buffer,
        cumulative_local_expert_recv_stats,
        activation,
        activation_clamp,
    )


def bf16_mega_moe(
    y: torch.Tensor,
    l1_weights: torch.Tensor,
    l2_weights: torch.Tensor,
    sym_buffer: SymmBuffer,
    cumulative_local_expert_recv_stats: torch.Tensor | None = None,
    activation: str = "swiglu",
    activation_clamp: float | None = None,
    fast_math: bool = True,
    shared_l1_weights: torch.Tensor | None = None,
    shared_l2_weights: torch.Tensor | None = None,
) -> None:
    """BF16 MegaMoE with weights from ``transform_weights_for_mega_moe``; fused shared experts as BF16
    ``[2·S·I, H]`` / ``[H, S·I]`` (after upstream's arguments: upstream's BF16 entry has none)."""
    _run(
        y,
        _untransform_l1(l1_weights),
        None,
        l2_weights,
        None,
        _shared("bf16_mega_moe", sym_buffer, shared_l1_weights, shared_l2_weights, fp8=False),
        sym_buffer,
        cumulative_local_expert_recv_stats,
        activation,
        activation_clamp,
    )
