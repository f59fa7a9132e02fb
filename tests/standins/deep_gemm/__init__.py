"""CPU stand-in for ``deep_gemm``: behaves like the real DeepGEMM library at its Python API boundary, on CPU tensors,
so code that *calls* DeepGEMM can be tested without a GPU/NPU. Tests put ``tests/standins`` on ``sys.path`` and
``import deep_gemm``; ``deep_gemm._standin.configure(flavor=..., arch=...)`` picks the library imitated.

Flavors
-------
* ``"cuda"`` (default, ``arch=9`` SM90 or ``arch=10`` SM100): DeepGEMM ``__version__ = '2.6.1'``, read from the
  upstream snapshot deepseek-ai/DeepGEMM @ 54e2261 (``csrc/apis/{gemm,layout,runtime}.hpp``, ``csrc/utils/*.hpp``,
  ``csrc/jit_kernels/impls/*.hpp`` entry functions, ``csrc/jit_kernels/heuristics/{config,runtime,sm90}.hpp``,
  ``csrc/jit_kernels/impls/runtime_utils.hpp``, the device asserts in ``deep_gemm/include/deep_gemm/impls/
  {smxx_layout,sm90_fp8_gemm_1d2d}.cuh`` and ``scheduler/gemm.cuh``, and ``deep_gemm/{__init__,utils/layout,
  testing/*}.py``).
* ``"ascend"``: DeepGEMM-Ascend ``__version__ = '0.1.0'``, read from the official deepseek-ai/DeepGEMM-Ascend
  ``csrc/apis/gemm.hpp`` @ 787919d and, for every other file, the public fork Afloat16/DeepGEMM-Ascend @ 8491bbb
  (``csrc/utils/layout.hpp``, ``csrc/apis/{layout,einsum,runtime,epilogue_class}.hpp``,
  ``csrc/jit_kernels/{transform_sf,epilogue_class,fp8_gemm,fp8_dequant_gemm,gemm_config,heuristics}.hpp``,
  ``csrc/jit/jit.hpp``, ``deep_gemm/include/deep_gemm/{transform_sf,scheduler}.hpp``, ``deep_gemm/__init__.py``);
  the psum padding convention (``ensure_zero_padding``) from fhgffy/DeepGEMM-Ascend ``tests/test_m_grouped_padding.py``
  and ``shared/specs/deepgemm_api.md`` §16.

Attributes follow the flavor (module ``__getattr__``): names only one library exports are absent in the other (so
``hasattr`` detection works), e.g. the masked GEMMs raise ``AttributeError("... is not implemented in this backend")``
on "ascend", and ``aclnn_*``, ``fp8_bmm``, ``bf16_bmm``, ``set_npu_arch``, ``epilogue`` ... exist only there.
Exported names the stand-in does not model (cuBLASLt, ``fp8_gemm_nt_skip_head_mid``, ACLNN, locality) exist and raise
``NotImplementedError``. The CUDA Mega MoE (``SymmBuffer``, ``get_symm_buffer_for_mega_moe``,
``transform_weights_for_mega_moe``, ``fp8_fp4_mega_moe``, ``bf16_mega_moe``: SM100 only, collective on a gloo group or
a one-rank group) lives in ``_cuda_mega.py``; the Ascend one (``deep_gemm.mega`` with ``BLOCK_N``, ``SymmBuffer``,
``transform_weights_for_mega_moe``, ``fp8_fp4_mega_moe``: FP4 routed and fused FP8 shared experts, read from the fork
Afloat16/DeepGEMM-Ascend @ 8491bbb) in ``_ascend_mega.py``. The MQA-logits family
(``fp8_fp4_mqa_logits``, ``get_paged_mqa_logits_metadata``, ``fp8_fp4_paged_mqa_logits``, the CUDA legacy
``fp8_mqa_logits`` / ``fp8_paged_mqa_logits``), ``tf32_hc_prenorm_gemm``, ``einsum`` and ``fp8_einsum`` live in
``_cuda_extra.py`` / ``_ascend_extra.py`` (shared numerics and the bit-exact schedule-metadata replays in
``_mqa.py``); their docstrings state the conventions for what the kernels leave unspecified (NaN there, ``-inf``
where ``clean_logits`` cleans).

Semantics
---------
* Host checks: every ``DG_HOST_ASSERT`` / ``DJ_HOST_ASSERT`` / ``DJ_PANIC`` on the modelled paths raises
  ``RuntimeError("DeepGEMM stand-in: Assertion error (<file>[:<line>]): <condition>")`` in upstream's order (see
  ``_cuda.py`` / ``_ascend.py``), plus the CUDA driver's TMA-descriptor requirements (16-byte aligned base address and
  outer strides) that upstream surfaces as "CUDA driver error". pybind11 argument-conversion failures raise
  ``TypeError``.
* ``deep_gemm._standin.Panic`` (a ``RuntimeError``): the real library would trap on the device, "panic", or silently
  compute garbage: FP32 scale factors with a sign/mantissa bit on the UE8M0 paths (SM100, Ascend), layouts whose
  entries run past their range or mix groups inside one BLOCK_M tile, ``masked_m`` outside ``[0, M]``, SM90 1D2D
  with ``N % 8 != 0``, scale tensors a kernel would misread, FP4 x FP4 MN-major on Ascend, ...
* Math: operands and scale factors are decoded exactly (E4M3, packed E2M1, UE8M0 from the *transformed* scale
  tensors the kernel would read), ``d = cast(c + A_deq @ B_deq^T)`` in float64 (Ascend: ``cast(alpha * A_deq @ B_deq^T
  + d)`` when ``c is d``) written into ``d`` in place through its strides.
* Padding rows (the stand-in's convention, see ``_m_grouped_write``): m-grouped id-layout ``-1`` rows are written 0;
  psum gap rows ``[end_g, align(end_g, alignment))`` are written 0 when ``ensure_zero_padding`` is honoured (SM100,
  Ascend) and left untouched otherwise (SM90 ignores the flag); masked rows ``>= masked_m[g]`` are untouched. The
  real kernels store whole BLOCK_M tiles, so on hardware those rows may also hold ``A_pad @ B_g`` values: code must
  not rely on them unless A's padding rows are zero.
* Call log: ``deep_gemm._standin.CALLS`` (``reset()`` clears it).
"""

from __future__ import annotations

from . import _ascend, _ascend_extra, _ascend_mega, _cuda, _cuda_extra, _cuda_mega, _cuda_sparse, _standin, testing  # noqa: F401

_cuda.EXPORTS.update(_cuda_extra.EXPORTS)
_cuda.EXPORTS.update(_cuda_mega.EXPORTS)
_ascend.EXPORTS.update(_ascend_extra.EXPORTS)
_ascend.EXPORTS.update(_ascend_mega.EXPORTS)

_CUDA_28 = {**_cuda.EXPORTS, **_cuda_sparse.EXPORTS}  # DeepGEMM 2.8.0: 2.6.1's API plus the sparse indexer


def _exports():
    if _standin.STATE.flavor == "ascend":
        return _ascend.EXPORTS
    return _CUDA_28 if _standin.STATE.version == "2.8.0" else _cuda.EXPORTS


def __getattr__(name):
    if name == "__version__":
        return _standin.STATE.version
    if name == "__all__":  # ``from deep_gemm import *`` follows the flavor too
        return sorted(_exports())
    table = _exports()
    if name in table:
        return table[name]
    if _standin.STATE.flavor == "ascend" and name in _ascend.ABSENT:
        raise AttributeError(
            f"module 'deep_gemm' has no attribute '{name}': {name} {_ascend.ABSENT[name]} (stand-in flavor 'ascend')"
        )
    other = _ascend.EXPORTS if _standin.STATE.flavor == "cuda" else _CUDA_28
    if name in other:
        raise AttributeError(
            f"module 'deep_gemm' has no attribute '{name}' (stand-in flavor "
            f"'{_standin.STATE.flavor}': this library does not export it)"
        )
    raise AttributeError(f"module 'deep_gemm' has no attribute '{name}'")


def __dir__():
    return sorted(set(globals()) | set(_exports()) | {"__version__"})
