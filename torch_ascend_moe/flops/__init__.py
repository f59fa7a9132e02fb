"""FLOP formulas (``torch.utils.flop_counter``) of the GEMM-like ops, one module per family
(``torch_ascend_moe._registry.flop_formula``)."""

from torch_ascend_moe._registry import import_families

import_families(__name__, __path__)
