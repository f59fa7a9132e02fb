"""``tile_kernels.quant.types``: ``QuantTensor``, a ``(data, sf)`` pair."""

from __future__ import annotations

import torch

QuantTensor = tuple[torch.Tensor, torch.Tensor]
