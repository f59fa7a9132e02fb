"""Backward formulas of the ascend_moe ops, one module per family (``torch.library.register_autograd``)."""

from torch_ascend_moe.autograd import gemm  # noqa: F401
