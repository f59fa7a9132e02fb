"""TileKernels' runtime configuration: the SM count its persistent kernels split work over. Kept and validated;
nothing here depends on it (upstream's tests require results independent of it, which ours are by construction)."""

from __future__ import annotations

import importlib
import os

# By its canonical name, so every copy of this module shares the settings (see _state).
_state = importlib.import_module("torch_ascend_moe.tile_kernels._state")


def get_device_num_sms() -> int:
    """The device's multiprocessor count (CUDA), else the CPU count."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return os.cpu_count() or 1


def set_num_sms(num_sms: int) -> None:
    assert 0 < num_sms <= get_device_num_sms(), f"num_sms must be in (0, {get_device_num_sms()}], got {num_sms}"
    _state.NUM_SMS[:] = [num_sms]


def get_num_sms() -> int:
    return _state.NUM_SMS[0] if _state.NUM_SMS else get_device_num_sms()


def set_token_alignment(alignment: int) -> None:
    assert alignment > 0, f"alignment must be positive, got {alignment}"
    _state.TOKEN_ALIGNMENT[:] = [alignment]


def get_token_alignment() -> int:
    return _state.TOKEN_ALIGNMENT[0]


def is_ascend() -> bool:
    """Whether an Ascend NPU runtime is loaded (torch_npu imported): upstream tests for /dev/davinci_manager."""
    import torch

    return hasattr(torch, "npu") and torch.npu.is_available()


def get_device() -> str:
    """Where upstream's tests allocate: the NPU on Ascend, else CUDA, else (here, not upstream) the CPU."""
    import torch

    if is_ascend():
        return "npu"
    return "cuda" if torch.cuda.is_available() else "cpu"


# The Ascend era's settings (Butterfingrz/TileKernels config.py): kept and validated; no result depends on them.
def set_pdl(enabled: bool) -> None:
    _state.PDL[:] = [bool(enabled)]


def get_pdl() -> bool:
    return _state.PDL[0]


def use_deterministic_algorithms(enabled: bool = True) -> None:
    _state.DETERMINISTIC[:] = [bool(enabled)]


def get_deterministic_algorithms() -> bool:
    return _state.DETERMINISTIC[0]


def get_num_ai_cores() -> int:
    return get_num_sms()


def get_num_cube_cores() -> int:
    return get_num_sms()


def get_num_vec_cores() -> int:
    return 2 * get_num_sms()  # two vector cores per AI core on Ascend


def reset_runtime_config() -> None:
    """Every setting back to its default (the SM count, token alignment, PDL, determinism)."""
    _state.NUM_SMS.clear()
    _state.TOKEN_ALIGNMENT[:] = [128]
    _state.PDL[:] = [False]
    _state.DETERMINISTIC[:] = [False]


def get_max_smem_per_sm() -> int:
    """The CUDA device's shared memory per multiprocessor; 0 without CUDA (no kernel here depends on it)."""
    import torch

    if not torch.cuda.is_available():
        return 0
    return torch.cuda.get_device_properties(torch.cuda.current_device()).shared_memory_per_multiprocessor
