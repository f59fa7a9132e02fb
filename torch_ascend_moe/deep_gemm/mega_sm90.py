"""DeepGEMM's SM90 FP8 Mega MoE (the ``nv_dev`` branch, not on main; specs/upstream_2609.md §5.2) on the ``mega_moe``
op's block-scaled mode:

- ``get_symm_buffer_for_sm90_mega_moe(group, num_experts, num_max_tokens_per_rank, num_topk, hidden,
  intermediate_hidden, use_fp8_dispatch=True, activation='swiglu')`` -> ``SM90SymmBuffer`` (``T_max`` rounded up to
  128): ``x`` E4M3 ``[T_max, H]``, ``x_sf`` FP32 ``[T_max, H/128]`` (K-major, not UE8M0), ``topk_idx`` int64,
  ``topk_weights`` FP32, and the activation pools' scales ``l1_acts_sf`` (FP32 per 128) / ``l2_acts_sf`` (per 64);
  FP8 dispatch only;
- ``transform_weights_for_mega_moe_sm90(l1_weights, l2_weights)``: ``(W, SF)`` pairs, W1 E4M3 ``[E_r, 2I, H]`` with
  its gate/up rows interleaved in chunks of 8, the FP32 128x128-block scales (``[E_r, 2I/128, H/128]``,
  ``[E_r, H/128, I/128]``, the DeepEP / V4-Flash-FP8 checkpoint layout) untouched;
- ``fp8_mega_moe(y, l1_weights, l2_weights, sym_buffer, cumulative_local_expert_recv_stats=None,
  recipe=(128, 128, 128), activation='swiglu', activation_clamp=None, fast_math=True)``.

The math is the op's (``backends/portable/mega_moe.py``): x and the weights dequantized per block, L1 in FP32,
``silu(min(gate, c)) · clamp(up, -c, c) · w``, requantized per 1x64 with FP32 ``max(amax, 1e-4) / 448``, L2 to BF16
per (token, expert), one BF16 rounding of the sum. Upstream's kernel limits (``H % 256``, ``I / 64 <= 64``, SM90) are
not ours: any H and I that are multiples of 128 run. Like ``SymmBuffer``, the buffer is this process's memory and
the pools are scratch of upstream's shapes (the op keeps its intermediates).
"""

from __future__ import annotations

import types

import torch
import torch.distributed as dist

from torch_ascend_moe import checks as ck
from torch_ascend_moe.deep_gemm.mega import _interleave, _untransform_l1
from torch_ascend_moe.ops.mega_moe import mega_moe

_TOKEN_ALIGNMENT = 128
_BLOCK = 128
_ACT_GRAN = 64


class SM90SymmBuffer:
    """The SM90 Mega MoE's buffer views (module docstring) and its group."""

    def __init__(
        self,
        group,
        num_experts: int,
        num_max_tokens_per_rank: int,
        num_topk: int,
        hidden: int,
        intermediate_hidden: int,
        use_fp8_dispatch: bool = True,
        activation: str = "swiglu",
    ) -> None:
        api = "SM90SymmBuffer"
        ck.check_arg(
            use_fp8_dispatch is True, api, "use_fp8_dispatch", "value", "True (FP8 dispatch only)", use_fp8_dispatch
        )
        ck.check_arg(activation == "swiglu", api, "activation", "value", "'swiglu'", repr(activation))
        ranks = dist.get_world_size(group) if group is not None and dist.is_initialized() else 1
        ck.check_arg(
            num_experts % ranks == 0, api, "num_experts", "value", f"a multiple of the {ranks} ranks", num_experts
        )
        ck.check_arg(hidden % _BLOCK == 0, api, "hidden", "value", "a multiple of 128", hidden)
        ck.check_arg(
            intermediate_hidden % _BLOCK == 0, api, "intermediate_hidden", "value", "a multiple of 128",
            intermediate_hidden,
        )  # fmt: skip
        self.group, self.ranks = group, ranks
        self.num_experts, self.num_max_tokens_per_rank, self.num_topk = num_experts, num_max_tokens_per_rank, num_topk
        self.hidden, self.intermediate_hidden = hidden, intermediate_hidden
        tokens, ring = num_max_tokens_per_rank, num_max_tokens_per_rank * ranks * min(num_topk, num_experts // ranks)
        self.x = torch.zeros(tokens, hidden, dtype=torch.float8_e4m3fn)
        self.x_sf = torch.zeros(tokens, hidden // _BLOCK, dtype=torch.float32)
        self.topk_idx = torch.full((tokens, num_topk), -1, dtype=torch.int64)
        self.topk_weights = torch.zeros(tokens, num_topk, dtype=torch.float32)
        self.l1_acts = torch.zeros(ring, hidden, dtype=torch.float8_e4m3fn)
        self.l1_acts_sf = torch.zeros(ring, hidden // _BLOCK, dtype=torch.float32)
        self.l2_acts = torch.zeros(ring, intermediate_hidden, dtype=torch.float8_e4m3fn)
        self.l2_acts_sf = torch.zeros(ring, intermediate_hidden // _ACT_GRAN, dtype=torch.float32)
        self.handle = types.SimpleNamespace(buffer_ptrs=[self.x.data_ptr()])

    def destroy(self) -> None:
        self.handle = self.group = None
        self.x = self.x_sf = self.topk_idx = self.topk_weights = None
        self.l1_acts = self.l1_acts_sf = self.l2_acts = self.l2_acts_sf = None


def get_symm_buffer_for_sm90_mega_moe(
    group,
    num_experts: int,
    num_max_tokens_per_rank: int,
    num_topk: int,
    hidden: int,
    intermediate_hidden: int,
    use_fp8_dispatch: bool = True,
    activation: str = "swiglu",
) -> SM90SymmBuffer:
    """An ``SM90SymmBuffer`` with ``num_max_tokens_per_rank`` rounded up to 128."""
    tokens = -(-num_max_tokens_per_rank // _TOKEN_ALIGNMENT) * _TOKEN_ALIGNMENT
    return SM90SymmBuffer(
        group, num_experts, tokens, num_topk, hidden, intermediate_hidden, use_fp8_dispatch, activation
    )


def _pair(api: str, name: str, w) -> tuple[torch.Tensor, torch.Tensor]:
    ck.check_arg(
        isinstance(w, (tuple, list)) and len(w) == 2, api, name, "type", "(E4M3 weights, FP32 scales)", type(w)
    )
    return w[0], w[1]


def transform_weights_for_mega_moe_sm90(l1_weights, l2_weights):
    """W1's gate/up rows interleaved in chunks of 8 (gate[0:8], up[0:8], gate[8:16], ...); scales and W2 as given."""
    api = "transform_weights_for_mega_moe_sm90"
    (w1, s1), pair2 = _pair(api, "l1_weights", l1_weights), _pair(api, "l2_weights", l2_weights)
    ck.check_arg(w1.dim() == 3, api, "l1_weights", "rank", "3-D [E, 2I, H]", w1.dim())
    return (w1[:, _interleave(w1.shape[1])].contiguous(), s1), tuple(pair2)


def fp8_mega_moe(
    y: torch.Tensor,
    l1_weights: tuple,
    l2_weights: tuple,
    sym_buffer: SM90SymmBuffer,
    cumulative_local_expert_recv_stats: torch.Tensor | None = None,
    recipe: tuple = (128, 128, 128),
    activation: str = "swiglu",
    activation_clamp: float | None = None,
    fast_math: bool = True,
) -> None:
    """``y [T, H]`` BF16 <- the SM90 Mega MoE of the buffer's first T tokens, weights from
    ``transform_weights_for_mega_moe_sm90`` (``fast_math`` accepted and ignored: the math is exact)."""
    api = "fp8_mega_moe"
    ck.check_arg(tuple(recipe) == (128, 128, 128), api, "recipe", "value", "(128, 128, 128)", tuple(recipe))
    ck.check_arg(activation == "swiglu", api, "activation", "value", "'swiglu'", repr(activation))
    ck.check_arg(
        isinstance(sym_buffer, SM90SymmBuffer), api, "sym_buffer", "type", "an SM90SymmBuffer", type(sym_buffer)
    )
    (w1, s1), (w2, s2) = _pair(api, "l1_weights", l1_weights), _pair(api, "l2_weights", l2_weights)
    t = y.shape[0]
    buf = sym_buffer
    ck.check_arg(t <= buf.num_max_tokens_per_rank, api, "y", "size(0)", f"<= {buf.num_max_tokens_per_rank}", t)
    out, counts = mega_moe(
        buf.x[:t], buf.topk_idx[:t], buf.topk_weights[:t], _untransform_l1(w1), w2,
        x_sf=buf.x_sf[:t], l1_sf=s1, l2_sf=s2, group=buf.group if buf.ranks > 1 else None,
        activation_clamp=activation_clamp,
    )  # fmt: skip
    y.copy_(out)
    if cumulative_local_expert_recv_stats is not None:
        cumulative_local_expert_recv_stats += counts.to(cumulative_local_expert_recv_stats.dtype)


__all__ = [
    "SM90SymmBuffer",
    "fp8_mega_moe",
    "get_symm_buffer_for_sm90_mega_moe",
    "transform_weights_for_mega_moe_sm90",
]
