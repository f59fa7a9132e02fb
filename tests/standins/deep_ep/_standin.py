"""Control surface of the CPU stand-in for ``deep_ep`` (see the package docstring for sources).

This module is *not* part of DeepEP's API. It holds:

* ``configure(num_sms=20, ll_shuffle_seed=0, num_device_sms=132, strict_handle=True)``: a fresh "library load":
  ``Buffer.num_sms`` goes back to ``num_sms`` (upstream's class default is 20), the low-latency receive order is
  shuffled with ``ll_shuffle_seed`` (``None``: no shuffle, i.e. segments in source-rank order and rows in token
  order), ``num_device_sms`` is the SM count of the imitated GPU (H800: 132; it sizes the low-latency kernels' warp
  groups, whose host/device checks depend on it), ``strict_handle`` turns on the one check the real library does not
  make (``StrictHandleError``, below);
* the V2 (``ElasticBuffer``) knobs of ``configure``: ``elastic_shuffle_seed=0`` (the arrival order of a V2 dispatch
  inside each source group, a seeded shuffle of the senders' buffer-slot assignment; ``None``: source token order),
  ``platform="cuda"`` (``"ascend"``: behave as the DeepEP-Ascend V2 port, see ``_elastic``), ``nvlink_gbs=191.2464``
  / ``rdma_gbs=50.0`` (what upstream's ``get_nvlink_gbs`` / ``get_rdma_gbs`` would read from ``nvidia-smi`` /
  ``ibstat``: H800, 8 NVLink links x 26.562 GB/s x 0.9, and a 400 Gb/s NIC), ``num_nvlink_ranks=None`` (the NVLink
  domain size; ``None``: every rank of the group is an NVLink peer, i.e. one node);
* ``CALLS`` / ``reset()``: the call log. Every public ``deep_ep`` function/method appends
  ``(name, {arg_name: description})`` *before* any check runs; a tensor is described as
  ``(dtype, tuple(shape), tuple(stride), data_ptr)``, tuples/lists element-wise, anything else as-is;
* ``Panic``: raised where the real library would *not* raise but trap on the device (``EP_DEVICE_ASSERT``, a timeout
  ``trap()``), hang, or silently compute garbage (inconsistent handles, out-of-bounds rows, ranks that disagree on a
  shape). It subclasses ``RuntimeError``; tests that want to prove a call never reaches the library assert ``Panic``;
* ``StrictHandleError(Panic)``: a combine whose handle's ``recv_src_idx`` disagrees with the rows ``send_head`` picks.
  Upstream's intranode combine ships ``recv_src_idx`` with every row but its receiver never reads it
  (``csrc/kernels/legacy/intranode.cu:824`` sends it, the receiver loop at :914-1038 ignores it), so the real library
  returns the ``send_head``-routed sum; the stand-in refuses such a handle instead (``strict_handle=False``: imitate
  upstream exactly);
* the helpers that raise the host-check errors: ``RuntimeError("DeepEP stand-in: Assertion exception
  (<file>:<line>): <condition>")``, mirroring upstream's ``EPException`` text
  (``deep_ep/include/deep_ep/common/exception.cuh``: ``"<name> exception (file:line): cond"``); the Python-level
  ``assert`` statements of ``deep_ep/buffers/legacy.py`` raise ``AssertionError`` with upstream's message (or, where
  upstream has none, ``"DeepEP stand-in: <file>:<line>: assert <condition>"``).
"""

from __future__ import annotations

import functools
import inspect
import struct

import torch

__all__ = ["CALLS", "AscendUnsupported", "Panic", "StrictHandleError", "configure", "reset"]

PREFIX = "DeepEP stand-in: "

#: The call log (see module docstring).
CALLS: list = []


class Panic(RuntimeError):
    """The real kernel would not raise here: it would trap on the device, hang until its timeout, or compute
    garbage."""


class AscendUnsupported(NotImplementedError):
    """``configure(platform="ascend")``: a V2 feature the DeepEP-Ascend V2 port does not support (the words are the
    stand-in's: the port's source could not be read, only its capability table; see ``_elastic``). A
    ``NotImplementedError``, hence a ``RuntimeError``."""


class StrictHandleError(Panic):
    """A handle the real library would use without noticing that it is inconsistent (see module docstring)."""


class _State:
    def __init__(self):
        self.load()

    def load(
        self,
        num_sms=20,
        ll_shuffle_seed=0,
        num_device_sms=132,
        strict_handle=True,
        elastic_shuffle_seed=0,
        platform="cuda",
        nvlink_gbs=191.2464,
        rdma_gbs=50.0,
        num_nvlink_ranks=None,
    ):
        self.num_sms = num_sms
        self.ll_shuffle_seed = ll_shuffle_seed
        self.num_device_sms = num_device_sms
        self.strict_handle = strict_handle
        self.elastic_shuffle_seed = elastic_shuffle_seed
        self.platform = platform
        self.nvlink_gbs = nvlink_gbs
        self.rdma_gbs = rdma_gbs
        self.num_nvlink_ranks = num_nvlink_ranks


STATE = _State()
# Set by the package: the ``Buffer`` class whose ``num_sms`` a library load resets.
_BUFFER_CLASSES: list = []


def configure(
    num_sms: int = 20,
    ll_shuffle_seed: int | None = 0,
    num_device_sms: int = 132,
    strict_handle=True,
    elastic_shuffle_seed: int | None = 0,
    platform: str = "cuda",
    nvlink_gbs: float = 191.2464,
    rdma_gbs: float = 50.0,
    num_nvlink_ranks: int | None = None,
):
    """A fresh library load (see module docstring). The call log is kept (``reset()`` clears it)."""
    if not isinstance(num_sms, int) or num_sms < 0 or num_sms % 2:
        raise ValueError(f"{PREFIX}configure: num_sms must be an even non-negative int, got {num_sms!r}")
    if ll_shuffle_seed is not None and not isinstance(ll_shuffle_seed, int):
        raise ValueError(f"{PREFIX}configure: ll_shuffle_seed must be an int or None, got {ll_shuffle_seed!r}")
    if not isinstance(num_device_sms, int) or num_device_sms < 2:
        raise ValueError(f"{PREFIX}configure: num_device_sms must be an int >= 2, got {num_device_sms!r}")
    if elastic_shuffle_seed is not None and not isinstance(elastic_shuffle_seed, int):
        raise ValueError(
            f"{PREFIX}configure: elastic_shuffle_seed must be an int or None, got {elastic_shuffle_seed!r}"
        )
    if platform not in ("cuda", "ascend"):
        raise ValueError(f"{PREFIX}configure: platform must be 'cuda' or 'ascend', got {platform!r}")
    if num_nvlink_ranks is not None and (not isinstance(num_nvlink_ranks, int) or num_nvlink_ranks < 1):
        raise ValueError(f"{PREFIX}configure: num_nvlink_ranks must be an int >= 1 or None, got {num_nvlink_ranks!r}")
    STATE.load(
        num_sms,
        ll_shuffle_seed,
        num_device_sms,
        bool(strict_handle),
        elastic_shuffle_seed,
        platform,
        float(nvlink_gbs),
        float(rdma_gbs),
        num_nvlink_ranks,
    )
    for cls in _BUFFER_CLASSES:
        cls.num_sms = num_sms


def reset() -> None:
    """Clear the call log."""
    CALLS.clear()


# ---------------------------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------------------------

BUFFER_HPP = "csrc/legacy/buffer.hpp"
CONFIG_HPP = "csrc/legacy/config.hpp"
INTRANODE_CU = "csrc/kernels/legacy/intranode.cu"
INTERNODE_LL_CU = "csrc/kernels/legacy/internode_ll.cu"
LAUNCH_CUH = "csrc/kernels/legacy/launch.cuh"
LEGACY_PY = "deep_ep/buffers/legacy.py"
ELASTIC_HPP = "csrc/elastic/buffer.hpp"
ELASTIC_UTILS_HPP = "csrc/elastic/utils.hpp"
ELASTIC_PY = "deep_ep/buffers/elastic.py"
LAYOUT_CUH = "deep_ep/include/deep_ep/common/layout.cuh"
NCCL_CU = "csrc/kernels/backend/nccl.cu"
ELASTIC_DISPATCH_HPP = "csrc/kernels/elastic/dispatch.hpp"


def fail(where: str, cond: str):
    raise RuntimeError(f"{PREFIX}Assertion exception ({where}): {cond}")


def check(ok, where: str, cond: str) -> None:
    """``EP_HOST_ASSERT(cond)``: ``where`` is ``<upstream file>:<line>``."""
    if not ok:
        fail(where, cond)


def py_assert(ok, message: str | None = None, where: str = "", cond: str = "") -> None:
    """A Python ``assert`` of ``deep_ep/buffers/legacy.py``: upstream's message, or a stand-in one naming it."""
    if not ok:
        raise AssertionError(message if message is not None else f"{PREFIX}{where}: assert {cond}")


def panic(msg: str):
    raise Panic(f"{PREFIX}Panic: {msg}")


def incompatible(name: str, msg: str):
    """pybind11 rejects an argument it cannot convert with a TypeError ("incompatible function arguments")."""
    raise TypeError(f"{PREFIX}{name}(): incompatible function arguments: {msg}")


def data_ptr_check(t: torch.Tensor, dtype: torch.dtype) -> None:
    """``tensor.data_ptr<T>()`` on a tensor of another dtype: c10's ``TORCH_CHECK`` text."""
    if t.dtype != dtype:
        names = {torch.int64: "Long", torch.int32: "Int", torch.float32: "Float", torch.bool: "Bool"}
        found = names.get(t.dtype, str(t.dtype).replace("torch.", ""))
        raise RuntimeError(f"expected scalar type {names[dtype]} but found {found}")


# ---------------------------------------------------------------------------------------------------------------------
# Uninitialized memory: what ``torch::empty`` leaves in rows no kernel writes
# ---------------------------------------------------------------------------------------------------------------------

GARBAGE_INT32 = 0x7F7F7F7F
GARBAGE_INT64 = 0x7F7F7F7F7F7F7F7F


def garbage(shape, dtype, device="cpu") -> torch.Tensor:
    """A tensor standing for uninitialized memory: NaN for floating types (FP8: the byte 0x7f, a NaN), the byte
    pattern 0x7f... for integers. Recognizable, never a plausible value."""
    if dtype.is_floating_point and dtype.itemsize == 1:  # FP8: 0x7f is a NaN in e4m3fn and e5m2
        return torch.full(shape, 0x7F, dtype=torch.uint8, device=device).view(dtype)
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    if dtype == torch.int32:
        return torch.full(shape, GARBAGE_INT32, dtype=dtype, device=device)
    if dtype == torch.int64:
        return torch.full(shape, GARBAGE_INT64, dtype=dtype, device=device)
    if dtype == torch.bool:
        return torch.ones(shape, dtype=dtype, device=device)
    return torch.full(shape, 0x7F, dtype=dtype, device=device)


def fp32(value: float) -> float:
    """Round a Python float to the nearest float32."""
    return struct.unpack("f", struct.pack("f", value))[0]


# ---------------------------------------------------------------------------------------------------------------------
# Call log
# ---------------------------------------------------------------------------------------------------------------------


def describe(value):
    if isinstance(value, torch.Tensor):
        return (value.dtype, tuple(value.shape), tuple(value.stride()), value.data_ptr())
    if isinstance(value, tuple):
        return tuple(describe(v) for v in value)
    if isinstance(value, list):
        return [describe(v) for v in value]
    return value


def logged(name: str):
    """Wrap an API function or method: bind the arguments like Python does (names and defaults), log (``self``
    left out), then run it."""

    def decorate(fn):
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            CALLS.append((name, {k: describe(v) for k, v in bound.arguments.items() if k != "self"}))
            return fn(*bound.args, **bound.kwargs)

        wrapper.__signature__ = sig
        return wrapper

    return decorate


def not_implemented(name: str, why: str):
    raise NotImplementedError(f"{PREFIX}{name} is not modelled: {why}")
