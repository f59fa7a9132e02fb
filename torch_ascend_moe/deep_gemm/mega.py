"""DeepGEMM's MegaMoE API (specs/deepgemm_api.md §10.2) on the ``mega_moe`` op.

Differences from upstream, on purpose: ``SymmBuffer`` is ordinary memory plus the process group (no
symmetric memory or ring buffer: the op moves tokens with ``ep_dispatch`` / ``ep_combine`` over
``torch.distributed``); ``fast_math`` is accepted and ignored (the math is exact: ``silu(g) = g / (1 + exp(-g))``
in FP32); the buffer's views keep their contents after a call (upstream's kernel consumes them: refill them
before every call either way).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from torch_ascend_moe import _checks as ck
from torch_ascend_moe.ops.mega_moe import mega_moe
from torch_ascend_moe.quant import scales_to_float

_TOKEN_ALIGNMENT = 384  # lcm of the kernel's candidate block sizes {8, 16, 32, 64, 96, 128, 192}
_CHUNK = 8  # transform_weights_for_mega_moe interleaves gate and up rows in chunks of 8


def get_token_alignment_for_mega_moe() -> int:
    return _TOKEN_ALIGNMENT


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
        num_ring_tokens: int = 0,
        mma_type: str = "fp8xfp4",
        activation: str = "swiglu",
    ) -> None:
        api = "SymmBuffer"
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
        t = num_max_tokens_per_rank
        self.x = torch.zeros(t, hidden, dtype=torch.float8_e4m3fn if fp8 else torch.bfloat16)
        self.x_sf = torch.zeros(t, hidden // 128, dtype=torch.int32) if fp8 else None
        self.topk_idx = torch.full((t, num_topk), -1, dtype=torch.int64)
        self.topk_weights = torch.zeros(t, num_topk, dtype=torch.float32)

    def destroy(self) -> None:
        self.x = self.x_sf = self.topk_idx = self.topk_weights = None


def get_symm_buffer_for_mega_moe(
    group,
    num_experts: int,
    num_max_tokens_per_rank: int,
    num_topk: int,
    hidden: int,
    intermediate_hidden: int,
    use_fp8_dispatch: bool | None = None,
    mma_type: str = "fp8xfp4",
    activation: str = "swiglu",
) -> SymmBuffer:
    """A ``SymmBuffer`` with ``num_max_tokens_per_rank`` rounded up to ``get_token_alignment_for_mega_moe()``."""
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
    return SymmBuffer(group, num_experts, t, num_topk, hidden, intermediate_hidden, 0, mma_type, activation)


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


def _run(y, l1, l1_sf, l2, l2_sf, buf: SymmBuffer, stats, activation, activation_clamp):
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
    cumulative_local_expert_recv_stats: torch.Tensor | None = None,
    recipe: tuple = (1, 1, 32),
    activation: str = "swiglu",
    activation_clamp: float | None = None,
    fast_math: bool = True,
) -> None:
    """``y [T, H]`` BF16 <- MegaMoE of the buffer's first T tokens; weights from ``transform_weights_for_mega_moe``
    (FP4 int8 with packed UE8M0 scales)."""
    ck.check_arg(tuple(recipe) == (1, 1, 32), "fp8_fp4_mega_moe", "recipe", "value", "(1, 1, 32)", tuple(recipe))
    (w1, s1), (w2, s2) = l1_weights, l2_weights
    l1 = _untransform_l1(w1).view(torch.uint8)
    l1_sf = scales_to_float(_untransform_sf(s1, interleaved=True).contiguous())
    l2_sf = scales_to_float(_untransform_sf(s2, interleaved=False).contiguous())
    _run(
        y,
        l1,
        l1_sf,
        w2.view(torch.uint8),
        l2_sf,
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
) -> None:
    """BF16 MegaMoE with weights from ``transform_weights_for_mega_moe``."""
    _run(
        y,
        _untransform_l1(l1_weights),
        None,
        l2_weights,
        None,
        sym_buffer,
        cumulative_local_expert_recv_stats,
        activation,
        activation_clamp,
    )
