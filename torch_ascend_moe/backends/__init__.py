"""Per-device kernels beyond the C++ CPU ones, declared in each op's chain (``chain``) only where the runtime exists.

``register_available()`` runs at import and stays cheap: it asks whether torch was *built* with CUDA
(no device is initialised) and whether ``torch_npu`` is installed. NPU kernels register only after
``import torch_npu`` succeeds, because "npu" is not a dispatch key before torch_npu renames PrivateUse1.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings

REGISTERED: dict[str, bool] = {"cuda": False, "npu": False}


def register_available() -> dict[str, bool]:
    import torch

    if torch.backends.cuda.is_built() and not REGISTERED["cuda"]:
        from torch_ascend_moe.backends import cuda, upstream

        cuda.register()
        upstream.register()
        REGISTERED["cuda"] = True
    if not REGISTERED["npu"] and ("torch_npu" in sys.modules or importlib.util.find_spec("torch_npu") is not None):
        REGISTERED["npu"] = register_npu()
    return dict(REGISTERED)


def register_all() -> None:
    """Declare every device's kernels, whatever this machine has (``info`` shows every chain; declaring a kernel on
    a device key this torch cannot reach is harmless)."""
    from torch_ascend_moe.backends import cuda, npu, upstream

    cuda.register()
    npu.register()
    upstream.register()


def register_npu() -> bool:
    """Register the NPU kernels if ``import torch_npu`` works (it needs CANN); return whether it did."""
    try:
        import torch_npu  # noqa: F401  (renames PrivateUse1 to "npu")
    except Exception:  # ImportError, or CANN missing: torch_npu raises various errors then.
        return False
    from torch_ascend_moe.backends import npu, upstream

    npu.register()
    upstream.register()
    try:  # TorchAir ships inside torch_npu (a lazy ``torchair`` module); our GE converters need its registry
        npu.register_ge_converters()
    except ImportError:
        pass  # a torch_npu build without TorchAir: eager and npugraph_ex still work
    except Exception as e:  # noqa: BLE001  (TorchAir failing to start must not break eager use)
        warnings.warn(
            f"torch_ascend_moe: TorchAir GE converters not registered ({type(e).__name__}: {e})", stacklevel=2
        )
    return True
