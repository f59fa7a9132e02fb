"""Backward formulas of the ascend_moe ops, one module per family (``torch_ascend_moe._registry.autograd``)."""

from torch_ascend_moe._registry import import_families

import_families(__name__, __path__)
