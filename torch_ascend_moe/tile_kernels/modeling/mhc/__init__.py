"""``tile_kernels.modeling.mhc``: ``expand_from_embedding``, ``mhc_pre``, ``mhc_head`` and the ``ops`` they are
made of (``torch_ascend_moe.ops.mhc``'s compositions with upstream's signatures and gradient-accumulation
protocol)."""

from torch_ascend_moe.tile_kernels.modeling.mhc import ops
from torch_ascend_moe.tile_kernels.modeling.mhc.functional import expand_from_embedding, mhc_head, mhc_pre

__all__ = ["expand_from_embedding", "mhc_head", "mhc_pre", "ops"]
