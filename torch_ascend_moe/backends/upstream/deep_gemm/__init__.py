"""DeepGEMM's kernels as the first entry of the GEMM families' chains: DeepGEMM on CUDA (2.6.x / 2.8.x: SM90 and
SM100) and DeepGEMM-Ascend on Ascend 950 (0.1.0). Both install a module named ``deep_gemm``; a build is told apart by
its attributes (the Ascend one has ``aclnn_bf16_gemm_nt``, ``fp8_bmm``, ``set_npu_arch`` and ``__version__``
"0.x"). One module per family here (``fp8_gemm``, ``gemm``, ``grouped``), each declaring a kernel per device.

What every kernel here shares (specs/accel_speed.md §D, specs/deepgemm_api.md §2-§6, §16):

* our op validates first (its ``takes`` runs the op's signature checks), so DeepGEMM never sees a call we refuse;
  our layout value checks run in the kernel body before the call, as in our own kernels (skipped while a graph is
  captured: the layout is then clamped on the device so no read leaves the tensors);
* our op allocates the output and passes it as upstream's ``d``; a ``c`` is copied into ``d`` by upstream (CUDA) or
  by us, then passed as ``c is d`` (Ascend: its only accumulation form);
* scales: UE8M0 (``float8_e8m0fnu``) tensors are widened to FP32 on the device (exact) and cast back to UE8M0 by
  the library; FP32 scales go only where the library keeps them FP32 (SM90). Where it would reduce them to their
  exponent (SM100) or "panic" (Ascend: "23-bit mantissa must be 0") FP32 scales are refused: telling a power of two
  from another FP32 value is a host read;
* rows our op defines as zero (psum gaps, masked rows, rows no group owns) are zeroed after the call on the device
  (the kernels store whole tiles there);
* TMA needs 16-byte aligned bases and row strides: calls whose tensors do not have them are refused (no copy is
  made behind the caller's back);
* fake and meta tensors never reach the library (our fakes serve compile and export; the chain runs only on real
  tensors).

Both DeepGEMMs compile each kernel on its first call (JIT): ``torch_ascend_moe.warmup`` runs a model's calls once
before a CUDA-graph or aclgraph capture.
"""

from __future__ import annotations

import importlib

import torch

from torch_ascend_moe.backends.chain import on_refresh
from torch_ascend_moe.backends.upstream import Library
from torch_ascend_moe.distributed.capture import has_data

_ASCEND_MARKS = ("aclnn_bf16_gemm_nt", "set_npu_arch")


def _is_ascend(module) -> bool:
    return any(hasattr(module, mark) for mark in _ASCEND_MARKS) or str(getattr(module, "__version__", "")).startswith(
        "0."
    )


def _cuda_build(module) -> str | None:
    if _is_ascend(module):
        return f"deep_gemm {getattr(module, '__version__', '?')} is DeepGEMM-Ascend, not the CUDA build"
    if not (hasattr(module, "fp8_fp4_gemm_nt") or hasattr(module, "fp8_gemm_nt")):
        return "deep_gemm has no fp8_gemm_nt: a DeepGEMM older than 2.x"
    return None


def _ascend_build(module) -> str | None:
    return None if _is_ascend(module) else "deep_gemm is DeepGEMM (CUDA), not DeepGEMM-Ascend"


CUDA = Library("deep_gemm", accept=_cuda_build)
ASCEND = Library("deep_gemm", accept=_ascend_build)
SM90, SM100 = 9, 10

_ARCH: list[int] = []


@on_refresh
def _forget_arch() -> None:
    _ARCH.clear()


def cuda_arch() -> int:
    """The SM major DeepGEMM builds its kernels for: the library's own answer (``deep_gemm.testing.get_arch_major``:
    the current device's), asked once per process."""
    if not _ARCH:
        _ARCH.append(int(importlib.import_module("deep_gemm.testing").get_arch_major()))
    return _ARCH[0]


def cuda_refusal() -> str | None:
    """Why DeepGEMM (CUDA) has no kernels for this GPU, or None."""
    arch = cuda_arch()
    return None if arch in (SM90, SM100) else f"DeepGEMM's kernels are for SM90 and SM100; this GPU is SM{arch}x"


def real_refusal(*tensors) -> str | None:
    """Fake or meta tensors have no data to hand a library (our fakes serve tracing)."""
    if all(t is None or has_data(t) for t in tensors):
        return None
    return "fake or meta tensors (the library runs on data; our fake serves tracing)"


def tma_refusal(**tensors) -> str | None:
    """Why a tensor cannot be a TMA operand (16-byte aligned base; every stride but the unit one a multiple of 16
    bytes), or None."""
    for name, t in tensors.items():
        if t is None or t.numel() == 0:
            continue
        if t.data_ptr() % 16:
            return f"{name} does not start 16-byte aligned (TMA)"
        for size, stride in zip(t.shape, t.stride()):
            if stride != 1 and size > 1 and (stride * t.element_size()) % 16:
                return f"{name}'s stride {stride} is not a multiple of 16 bytes (TMA)"
    return None


def scales_as_fp32(sf: torch.Tensor) -> torch.Tensor:
    """Scales as the library takes them: FP32 (UE8M0 widened exactly, on the device)."""
    return sf if sf.dtype == torch.float32 else sf.float()


def scale_refusal(sfa, sfb, library_keeps_fp32: bool) -> str | None:
    """FP32 scales reach only a library that keeps them FP32 (see the module docstring)."""
    if library_keeps_fp32 or (sfa.dtype == torch.float8_e8m0fnu and sfb.dtype == torch.float8_e8m0fnu):
        return None
    return "FP32 scales: the library casts them to UE8M0, exact only for powers of two (a host read to check)"


def accumulator(shape, dtype: torch.dtype, c: torch.Tensor | None, device) -> torch.Tensor:
    """Our output as upstream's ``d``: row-major, holding ``c`` when there is one (passed again as ``c``: in-place
    accumulation, the one form both libraries take), else uninitialized."""
    if c is None:
        return torch.empty(shape, dtype=dtype, device=device)
    return c.to(dtype=dtype, memory_format=torch.contiguous_format, copy=True)


def alpha_epilogue(library, alpha: float):
    """DeepGEMM-Ascend's ``epilogue.Alpha(alpha)`` for the GEMMs that take their alpha only that way (bmm), or None
    for 1."""
    if alpha == 1.0:
        return None
    epilogue = getattr(library, "epilogue", None) or importlib.import_module(f"{library.__name__}.epilogue")
    return epilogue.Alpha(alpha)


def as_library_fp4(t: torch.Tensor) -> torch.Tensor:
    """Packed FP4 as DeepGEMM's ``kPackedFP4`` (int8, two E2M1 codes per byte, low nibble first: our uint8's bytes)."""
    return t.view(torch.int8) if t.dtype == torch.uint8 else t


def register() -> None:
    """Import the family modules (each declares its kernels)."""
    from torch_ascend_moe._registry import import_families

    import_families(__name__, __path__)


register()
