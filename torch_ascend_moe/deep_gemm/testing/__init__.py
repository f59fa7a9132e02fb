"""``deep_gemm.testing``: the utilities DeepGEMM's own tests use (specs/deepgemm_api.md §14.1), in
upstream's submodules ``bench``, ``numeric`` and ``utils``, star-exported here as upstream (which makes
``testing.bench`` the function, as there)."""

from torch_ascend_moe.deep_gemm.testing import numeric, utils  # noqa: I001  (upstream's order)
from torch_ascend_moe.deep_gemm.testing.bench import bench, bench_kineto, empty_suppress, suppress_stdout_stderr
from torch_ascend_moe.deep_gemm.testing.numeric import assert_bitwise_equal, calc_diff, count_bytes
from torch_ascend_moe.deep_gemm.testing.utils import get_arch_major, ignore_env, test_filter

__all__ = [
    "assert_bitwise_equal",
    "bench",
    "bench_kineto",
    "calc_diff",
    "count_bytes",
    "empty_suppress",
    "get_arch_major",
    "ignore_env",
    "numeric",
    "suppress_stdout_stderr",
    "test_filter",
    "utils",
]
