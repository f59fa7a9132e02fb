"""``GroupedExperts``: E gated-MLP experts (SwiGLU by default) with stacked weights, run as grouped GEMMs over
permuted tokens."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from torch_ascend_moe.ops.grouped import m_grouped_bf16_gemm, m_grouped_bf16_gemm_swiglu, m_grouped_fp8_linear
from torch_ascend_moe.ops.moe_routing import moe_permute, moe_unpermute

# The gate activations named by string (Hugging Face's ``hidden_act`` names); any other callable may be passed.
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
}


def resolve_activation(activation: str | Callable, module: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """``activation`` as a callable: a name of ``ACTIVATIONS`` or a callable (e.g. an HF ``ACT2FN`` module)."""
    if callable(activation):
        return activation
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"{module}: argument 'activation': expected a callable or one of {sorted(ACTIVATIONS)}, got {activation!r}"
        )
    return ACTIVATIONS[activation]


class GroupedExperts(nn.Module):
    """``num_experts`` gated experts ``down(act(gate(x)) * up(x))`` evaluated for routed tokens (``activation``:
    SiLU by default, i.e. SwiGLU; a name of ``ACTIVATIONS`` or any elementwise callable).

    Weights are stacked per expert: ``gate_up_proj [E, 2*I, H]`` (gate rows first, then up; the layout
    of Hugging Face's fused Mixtral/Qwen-MoE experts transposed to ``[out, in]`` like ``nn.Linear``) and
    ``down_proj [E, H, I]``. ``forward(x [T, H], topk_idx [T, k], topk_weights [T, k])`` permutes tokens
    into expert order (``moe_permute``), runs two grouped GEMMs over the psum layout, and combines with
    the routing weights (``moe_unpermute``); ``topk_idx`` ``-1`` entries (tokens routed elsewhere) are
    skipped. Every step is an ascend_moe op, so it trains through autograd and compiles to one graph for
    all routings of the same shapes.

    ``fp8=True`` runs both expert GEMMs in FP8 with DeepSeek-V3's recipe (``m_grouped_fp8_linear``: tokens
    1 x ``block`` per token, weights ``block`` x ``block``; the parameters stay BF16/FP32 masters and train
    through straight-through gradients, dgrad in FP8 unless ``fp8_backward=False``); ragged ``hidden_size`` /
    ``intermediate_size`` are zero-padded to multiples of ``block`` inside ``m_grouped_fp8_linear`` (exact).

    >>> experts = GroupedExperts(4, 64, 32)
    >>> x, idx = torch.randn(5, 64), torch.tensor([[0, 1], [2, 3], [1, -1], [0, 0], [3, 2]])
    >>> experts(x, idx, torch.rand(5, 2)).shape
    torch.Size([5, 64])
    """

    def __init__(
        self,
        num_experts: int,
        hidden_size: int,
        intermediate_size: int,
        *,
        alignment: int = 1,
        fp8: bool = False,
        block: int = 128,
        use_ue8m0: bool = False,
        fp8_backward: bool = True,
        activation: str | Callable = "silu",
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.act_fn = resolve_activation(activation, "GroupedExperts")
        if num_experts <= 0 or hidden_size <= 0 or intermediate_size <= 0:
            raise ValueError(
                "GroupedExperts: arguments 'num_experts', 'hidden_size', 'intermediate_size': expected positive "
                f"integers, got {num_experts}, {hidden_size}, {intermediate_size}"
            )
        if fp8 and block <= 0:
            raise ValueError(
                f"GroupedExperts: argument 'block': expected a positive integer with fp8=True, got {block}"
            )
        self.fp8, self.block, self.use_ue8m0, self.fp8_backward = fp8, block, use_ue8m0, fp8_backward
        factory = {"device": device, "dtype": dtype}
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size
        self.alignment = alignment
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size, **factory))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size, **factory))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # nn.Linear's default init, expert by expert.
        for weight in (self.gate_up_proj, self.down_proj):
            bound = 1 / math.sqrt(weight.shape[-1])
            nn.init.uniform_(weight, -bound, bound)

    def forward(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        permuted, row_map, offs = moe_permute(x, topk_idx, self.num_experts, alignment=self.alignment)
        return moe_unpermute(self.expanded(permuted, offs, self.alignment), row_map, topk_weights)

    def expanded(self, x: torch.Tensor, psum: torch.Tensor, alignment: int = 1) -> torch.Tensor:
        """The experts on rows already in expert order (``ep_expand``'s layout: expert ``e``'s rows from
        ``align(psum[e - 1], alignment)`` to ``psum[e]``): ``[M, H] -> [M, H]``, unweighted; rows outside
        every block are not computed (padding)."""
        if self._fused_swiglu(x):
            # Inference: the L1 GEMM and SwiGLU in one op (no [M, 2I] L1 output; one rounding after silu * up).
            act, _ = m_grouped_bf16_gemm_swiglu(x, self.gate_up_proj, psum, alignment=alignment)
        else:
            gate, up = self._grouped(x, self.gate_up_proj, psum, alignment).chunk(2, dim=-1)
            act = self.act_fn(gate) * up
        return self._grouped(act, self.down_proj, psum, alignment)

    def _fused_swiglu(self, x: torch.Tensor) -> bool:
        """Whether the fused L1 + SwiGLU op serves this call: BF16 experts with SiLU, and no gradient to keep (in
        training the unfused steps keep the L1 output for the backward, which the fused op would recompute)."""
        if self.fp8 or self.act_fn is not F.silu:
            return False
        return not torch.is_grad_enabled() or not (x.requires_grad or self.gate_up_proj.requires_grad)

    def _grouped(self, x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor, alignment=None) -> torch.Tensor:
        alignment = self.alignment if alignment is None else alignment
        if not self.fp8:
            return m_grouped_bf16_gemm(x, weight, offs, alignment=alignment)
        return m_grouped_fp8_linear(
            x,
            weight,
            offs,
            alignment=alignment,
            block=self.block,
            use_ue8m0=self.use_ue8m0,
            fp8_backward=self.fp8_backward,
        )

    def extra_repr(self) -> str:
        return (
            f"num_experts={self.num_experts}, hidden_size={self.hidden_size}, "
            f"intermediate_size={self.intermediate_size}, alignment={self.alignment}"
            + (f", fp8=True, block={self.block}, use_ue8m0={self.use_ue8m0}" if self.fp8 else "")
        )
