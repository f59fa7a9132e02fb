"""``deep_gemm.testing`` of the stand-in.

* ``calc_diff(x, y)``: upstream ``deep_gemm/testing/numeric.py`` (``1 - 2 * sum(x * y) / sum(x * x + y * y)`` in
  float64, 0.0 when both are all-zero). Available in both flavors as a convenience (the Ascend fork's
  ``deep_gemm.testing`` only re-exports its msprof bench helpers).
* ``get_arch_major()``: upstream ``deep_gemm/testing/utils.py`` returns the CUDA device's major compute capability;
  here the configured arch (9 or 10). "cuda" flavor only (DeepGEMM-Ascend has no such function).
"""

import torch

from .. import _standin


@_standin.public("calc_diff")
def calc_diff(x: torch.Tensor, y: torch.Tensor):
    x, y = x.double(), y.double()
    denominator = (x * x + y * y).sum()
    if denominator == 0:  # both all-zero
        return 0.0
    sim = 2 * (x * y).sum() / denominator
    return 1 - sim


@_standin.public("get_arch_major")
def _get_arch_major() -> int:
    return _standin.STATE.arch


def __getattr__(name):
    if name == "get_arch_major":
        if _standin.STATE.flavor == "cuda":
            return _get_arch_major
        raise AttributeError(
            "module 'deep_gemm.testing' has no attribute 'get_arch_major' (stand-in flavor "
            "'ascend': DeepGEMM-Ascend's testing module does not define it)"
        )
    raise AttributeError(f"module 'deep_gemm.testing' has no attribute '{name}'")
