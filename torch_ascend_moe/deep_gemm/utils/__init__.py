"""``deep_gemm.utils``: the helpers upstream star-exports at the top level."""

from torch_ascend_moe.deep_gemm.utils import math
from torch_ascend_moe.deep_gemm.utils.math import *  # noqa: F403  (upstream's star export)

__all__ = list(math.__all__)
