"""``FP8Linear``: ``nn.Linear`` computing in FP8 with DeepSeek-V3's recipe, and the in-place converter."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from torch_ascend_moe.ops.fp8_linear import fp8_linear


class FP8Linear(nn.Linear):
    """``nn.Linear`` whose GEMMs run in FP8 E4M3 (``torch.ops.ascend_moe.fp8_linear``).

    Parameters and ``state_dict`` keys are ``nn.Linear``'s (BF16/FP32 master weights, so checkpoints move
    freely between the two). Forward casts activations per token in ``1 x block`` groups and the weight
    in ``block x block`` blocks; backward runs the dgrad and wgrad GEMMs in FP8 on requantized gradients
    (``fp8_backward=True``) or in the parameters' precision. ``use_ue8m0`` rounds every scale up to a
    power of two (the UE8M0 scales of SM100 / Ascend kernels). ``in_features`` must be a multiple of
    ``block``; inputs may have any leading dims, in BF16 or FP32 matching the weight.

    >>> layer = FP8Linear(256, 64)
    >>> layer(torch.randn(2, 3, 256)).shape
    torch.Size([2, 3, 64])
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device=None,
        dtype=None,
        *,
        block: int = 128,
        use_ue8m0: bool = False,
        fp8_backward: bool = True,
    ) -> None:
        if block <= 0 or in_features % block:
            raise ValueError(
                f"FP8Linear: argument 'in_features': expected a multiple of block={block}, got {in_features}"
            )
        super().__init__(in_features, out_features, bias, device, dtype)
        self.block, self.use_ue8m0, self.fp8_backward = block, use_ue8m0, fp8_backward

    @classmethod
    def from_linear(cls, linear: nn.Linear, **options) -> FP8Linear:
        """An FP8Linear sharing ``linear``'s parameters (no copy, so optimizers keep working on them)."""
        module = cls(linear.in_features, linear.out_features, linear.bias is not None, device="meta", **options)
        module.weight = linear.weight
        module.bias = linear.bias
        return module.train(linear.training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        y = fp8_linear(
            x.reshape(-1, x.shape[-1]),
            self.weight,
            self.bias,
            block=self.block,
            use_ue8m0=self.use_ue8m0,
            fp8_backward=self.fp8_backward,
        )
        return y.view(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, block={self.block}, use_ue8m0={self.use_ue8m0}, fp8_backward={self.fp8_backward}"
        )


def convert_to_fp8_linear(
    model: nn.Module, filter_fn: Callable[[str, nn.Linear], bool] | None = None, **options
) -> nn.Module:
    """Swap every ``nn.Linear`` of ``model`` (in place) for an ``FP8Linear`` sharing its parameters.

    ``filter_fn(fully_qualified_name, module)`` picks the layers; by default every ``nn.Linear`` whose
    ``in_features`` is a multiple of the block (others cannot be cast in whole blocks and stay as they are).
    ``options`` go to ``FP8Linear`` (``block``, ``use_ue8m0``, ``fp8_backward``). Returns ``model``.
    """
    if type(model) is nn.Linear:
        raise ValueError(
            "convert_to_fp8_linear: argument 'model': expected a module containing nn.Linear layers (a bare "
            "nn.Linear cannot be swapped in place; use FP8Linear.from_linear), got nn.Linear"
        )
    block = options.get("block", 128)
    if filter_fn is None:

        def filter_fn(name: str, module: nn.Linear) -> bool:
            return module.in_features % block == 0

    swaps = [
        (name, module)
        for name, module in model.named_modules()
        if type(module) is nn.Linear and filter_fn(name, module)
    ]
    for name, module in swaps:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, FP8Linear.from_linear(module, **options))
    return model
