"""CPU stand-in for FlashMLA before its G3 release (deepseek-ai/FlashMLA @ 9241ae3, G2: ``__version__ = '1.0.0'``, the
pybind extension ``flash_mla.cuda`` behind ``flash_mla/flash_mla_interface.py``): ``flash_mla_sparse_fwd`` with
upstream's signature, its ``csrc/api/sparse_fwd.h`` checks and words, the kernels' top-k-block asserts as ``Panic``
and ``tests/ref.py``'s math in float64 (with upstream's documented NaN caveat past ``topk_length``). It registers no
``torch.ops.flash_mla`` ops (that is the G3 release). Decode and the dense kernels are not modelled
(``NotImplementedError``). ``_standin.configure(arch=9 | 10)`` picks the GPU imitated; tests make our backend see the
same SM major."""

from __future__ import annotations

from . import _standin, cuda  # noqa: F401
from .flash_mla_interface import (
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_mla_sparse_fwd,
    flash_mla_with_kvcache,
    get_mla_metadata,
)

__version__ = "1.0.0"

__all__ = [
    "get_mla_metadata",
    "flash_mla_with_kvcache",
    "flash_attn_varlen_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_mla_sparse_fwd",
]
