"""torch_ascend_moe: DeepSeek's MoE kernels as first-class PyTorch operators (``torch.ops.ascend_moe.*``).

Importing the package registers every op (schemas and CPU kernels from the ``_C`` extension), its fake,
autograd formula and FLOP formula, plus CUDA/NPU kernels where those runtimes are installed. It probes no
device and compiles nothing, so ``torch.export.load`` and AOTInductor packages work right after it.
"""

import torch

from torch_ascend_moe import (  # noqa: F401  (fakes, backward and FLOP formulas)
    _C,  # noqa: F401  (loads the schemas and CPU kernels)
    _registry,
    autograd,
    backends,
    fakes,
    flops,
)
from torch_ascend_moe import ops as _ops
from torch_ascend_moe.backends import portable  # noqa: F401  (registers the device-generic kernels)
from torch_ascend_moe.backends.chain import warmup
from torch_ascend_moe.ops import *  # noqa: E402, F403  (every op's typed wrapper)

__version__ = "0.1.0"
NAMESPACE = _registry.NAMESPACE

backends.register_available()
_registry.run_without_autocast()
_registry.tag_compile_caches()

from torch_ascend_moe import _hf_hook  # noqa: E402

# experts_implementation="ascend_moe" whatever the import order with transformers, without importing it here.
_hf_hook.install()

__all__ = ["NAMESPACE", "torch", "warmup", *_ops.__all__]
