"""Device-generic kernels written with torch ops, one module per family.

Each module registers its kernels by name, once, under ``CompositeExplicitAutograd``
(``torch_ascend_moe._registry.portable_kernel``): they serve CUDA, Ascend and any other device, and CPU where a
family has no C++ kernel. They run on CPU too (called directly), which is how CI checks them against the C++
kernels and the fp64 references.
"""

from torch_ascend_moe._registry import import_families

import_families(__name__, __path__)
