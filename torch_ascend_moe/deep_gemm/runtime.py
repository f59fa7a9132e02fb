"""DeepGEMM's runtime configuration (specs/deepgemm_api.md §13).

Upstream these tune JIT kernel selection (SM count, tensor-core utilisation, PDL, baked dimensions,
block sizes). None changes numerics; our kernels take their parallelism from PyTorch, so the values are
validated, stored and returned, and otherwise have no effect. ``use_deterministic_algorithms`` is
DeepGEMM-Ascend's switch: every kernel here is deterministic, so both settings compute the same result.
"""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck

_state: dict[str, object] = {
    "num_sms": 0,
    "tc_util": 0,
    "pdl": False,
    "ignore_compile_dims": False,
    "block_size_multiple_of": (1, 1),
    "deterministic": False,
}


def _device_sms() -> int:
    """Streaming multiprocessors of the current CUDA device, else the CPU threads PyTorch uses."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return torch.get_num_threads()


def set_num_sms(num_sms: int) -> None:
    """Cap the SMs kernels may use (0 = all): upstream's rule, ``0 <= num_sms <= the GPU's SMs``
    (``device_runtime.hpp``). Without a GPU there is no SM count to bound it by: any value ``>= 0`` is kept (serving
    code sizes it for the GPU it expects, e.g. SGLang's 132), and returned by ``get_num_sms``."""
    n = int(num_sms)
    limit = _device_sms() if torch.cuda.is_available() else None
    if n < 0 or (limit is not None and n > limit):
        expected = f"0..{limit}" if limit is not None else ">= 0"
        raise ValueError(ck.message("deep_gemm.set_num_sms", "num_sms", "value", expected, num_sms))
    _state["num_sms"] = n


def get_num_sms() -> int:
    return int(_state["num_sms"]) or _device_sms()


def set_tc_util(tc_util: int) -> None:
    """Assumed tensor-core utilisation in percent (0..100) for upstream's heuristics."""
    if not 0 <= int(tc_util) <= 100:
        raise ValueError(ck.message("deep_gemm.set_tc_util", "tc_util", "value", "0..100", tc_util))
    _state["tc_util"] = int(tc_util)


def get_tc_util() -> int:
    return int(_state["tc_util"]) or 100


def set_pdl(enable: bool) -> None:
    _state["pdl"] = bool(enable)


def get_pdl() -> bool:
    return bool(_state["pdl"])


def set_ignore_compile_dims(value: bool) -> None:
    _state["ignore_compile_dims"] = bool(value)


def set_block_size_multiple_of(value: int | tuple[int, int]) -> None:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or any(int(v) < 1 for v in pair):
        raise ValueError(
            f"deep_gemm.set_block_size_multiple_of: argument 'value': expected a positive int or pair, got {value!r}"
        )
    _state["block_size_multiple_of"] = (int(pair[0]), int(pair[1]))


def use_deterministic_algorithms(enabled: bool) -> None:
    _state["deterministic"] = bool(enabled)


def get_deterministic_algorithms() -> bool:
    return bool(_state["deterministic"])


def set_mk_alignment_for_contiguous_layout(alignment: int) -> None:
    """Row alignment of groups in contiguous (psum) layouts; also the k-grouped K alignment (default 128)."""
    if not isinstance(alignment, int) or alignment <= 0:
        raise ValueError(
            f"set_mk_alignment_for_contiguous_layout: argument 'alignment': expected a positive int, got {alignment!r}"
        )
    _state["mk_alignment"] = alignment


def get_mk_alignment_for_contiguous_layout() -> int:
    return int(_state.get("mk_alignment", 128))


LEGACY_MK_ALIGNMENT = 128  # upstream's kLegacyMKAlignmentForContiguousLayout


def _arch_major() -> int:
    """The CUDA compute-capability major (0 without a GPU), as upstream's ``device_runtime->get_arch_major()``."""
    return torch.cuda.get_device_capability()[0] if torch.cuda.is_available() else 0


def get_theoretical_mk_alignment_for_contiguous_layout(expected_m: int | None = None) -> int:
    """Upstream's rule (``heuristics/runtime.hpp``): off SM100 (SM90, or no GPU) the legacy 128; on SM100 its
    smallest block (from 224 down in steps of 32) still covering ``expected_m`` rows."""
    if _arch_major() != 10:
        return LEGACY_MK_ALIGNMENT
    block = 224
    while expected_m is not None and block > 32 and block - 32 >= expected_m:
        block -= 32
    return block


# Upstream's older names for the same setting (the m- and k-grouped alignments are one value).
get_m_alignment_for_contiguous_layout = get_k_alignment_for_contiguous_layout = get_mk_alignment_for_contiguous_layout
