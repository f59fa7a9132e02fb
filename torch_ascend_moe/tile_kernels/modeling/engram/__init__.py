"""``tile_kernels.modeling.engram``: ``engram_gate`` / ``EngramGateFn`` (the autograd layer over the Engram kernels;
weights with a ``main_grad`` buffer get their gradients accumulated there, as upstream's)."""

from torch_ascend_moe.tile_kernels.modeling.engram.engram_gate import EngramGateFn, engram_gate

__all__ = ["EngramGateFn", "engram_gate"]
