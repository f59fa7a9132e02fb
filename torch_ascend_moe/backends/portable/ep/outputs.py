"""What an ep op returns where the call has nothing to return: placeholders that keep every output a tensor (a
custom op's outputs are tensors) without looking differentiable."""

from __future__ import annotations

import torch

from torch_ascend_moe.checks.ep import ABSENT


def absent(like: torch.Tensor, n: int) -> torch.Tensor:
    return like.new_empty(n, 0, dtype=ABSENT)


def no_backend_state(device) -> torch.Tensor:
    """The ``backend_state`` of a transport that keeps none (ours: the handle's tensors say everything): empty
    int32. Our cached dispatch and combine ignore a state handed back."""
    return torch.empty(0, dtype=torch.int32, device=device)
