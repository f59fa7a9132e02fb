"""DeepSeek's own kernels as the first entry of our ops' chains, one module per library named after it:
``deep_gemm`` (DeepGEMM on CUDA, DeepGEMM-Ascend on Ascend: one module name, told apart by version and
attributes), ``deep_ep`` (DeepEP's V1 ``Buffer`` on CUDA: normal and low-latency modes), ``flash_mla`` (FlashMLA's G3
release on SM100 and Ascend), ``deep_select`` (DeepSelect's CUDA and Ascend extensions) and ``tile_kernels``
(TileKernels on CUDA: a package with one module per family, the casts, fused SwiGLU, RMSNorm and RoPE).

The libraries are pybind modules with out-parameters (DeepGEMM, DeepSelect), Python kernel functions that allocate
their outputs or rotate in place, which we run on a copy (TileKernels), Python objects holding communication
buffers (DeepEP) or their own dispatcher ops (FlashMLA): our op
stays the dispatcher-visible unit with our schema, fake, autograd and compiler passes; inside its device kernel the
chain (``backends.chain``) picks the library's function where it is installed and takes the call (our validation
first, so it never sees a call we would refuse, nor one it would "panic" on), allocates the output and passes it as
upstream's ``d``. A library is looked for once per process, on the first call that could use it (``Library``);
``chain.refresh()`` looks again.

Verified without the hardware against stand-in packages written from upstream's sources (``tests/standins``,
``tests/upstream``); docs/verification.md says what ran where.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType

from torch_ascend_moe.backends.chain import TAKEN, Verdict, on_refresh, refuse


class Library:
    """One upstream library: imported on first need (a trial import, as vLLM's ``has_deep_gemm`` does: a broken
    native dependency counts as missing), then ``accept(module)`` says whether it is the build this backend
    speaks to (None) or why not (a reason). ``chain.refresh()`` forgets the answer.

    >>> DEEP_GEMM = Library("deep_gemm", accept=lambda m: None if hasattr(m, "fp8_gemm_nt") else "too old")
    """

    def __init__(self, module: str, accept: Callable[[ModuleType], str | None] | None = None) -> None:
        self.name = module
        self.accept = accept
        self._found: tuple[ModuleType | None, Verdict] | None = None
        on_refresh(self.forget)

    def forget(self) -> None:
        self._found = None

    def _look(self) -> tuple[ModuleType | None, Verdict]:
        try:
            module = importlib.import_module(self.name)
        except Exception as e:  # noqa: BLE001  (ImportError, or a native library failing to load)
            return None, refuse(f"{self.name} is not installed or does not import ({type(e).__name__}: {e})")
        if getattr(module, "__name__", "").startswith("torch_ascend_moe"):
            return None, refuse(f"'{self.name}' is torch_ascend_moe's own compat package, not the library")
        why = self.accept(module) if self.accept is not None else None
        return (module, TAKEN) if why is None else (None, refuse(why))

    def available(self) -> Verdict:
        if self._found is None:
            self._found = self._look()
        return self._found[1]

    def module(self) -> ModuleType:
        """The library (only after ``available()`` said yes)."""
        if self._found is None:
            self._found = self._look()
        module, verdict = self._found
        if module is None:
            raise RuntimeError(f"torch_ascend_moe: {self.name} is not available: {verdict.reason}")
        return module


def register() -> None:
    """Import every library module of this package (each declares its kernels in the chains of its devices)."""
    from torch_ascend_moe._registry import import_families

    import_families(__name__, __path__)
