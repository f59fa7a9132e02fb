"""``deep_gemm.utils``: upstream's ``math`` and ``layout`` helpers (star-exported here and at the top level)
plus ``init_dist`` and ``uneven_all_gather`` from ``utils.dist``."""

from torch_ascend_moe.deep_gemm.utils import math  # noqa: I001  (math first: deep_gemm.layout imports it)
from torch_ascend_moe.deep_gemm.utils import layout
from torch_ascend_moe.deep_gemm.utils.dist import init_dist, uneven_all_gather
from torch_ascend_moe.deep_gemm.utils.layout import *  # noqa: F403  (upstream's star export)
from torch_ascend_moe.deep_gemm.utils.math import *  # noqa: F403  (upstream's star export)

__all__ = math.__all__ + layout.__all__ + ["init_dist", "uneven_all_gather"]
