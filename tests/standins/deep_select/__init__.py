"""A CPU stand-in for DeepSelect (deepseek-ai/DeepSelect @ 0cae3b1: ``deep_select/interface.py``, ``csrc/api.cpp``;
README @ c799e83), for testing ``torch_ascend_moe.backends.upstream.deep_select`` without a GPU or an NPU.

The package has one pybind extension per platform, ``deep_select_cuda`` and ``deep_select_npu``; a real install has
one of them. ``_standin.configure(flavor="cuda" | "npu")`` chooses which one imports (the other raises ImportError, as
a missing extension does). Each has upstream's ``topk(input, topk, begin, end, sorted_value, sorted_index,
output_value, output_index, output_idx_offset, idx_oob_fill_value, value_oob_fill_value, return_value,
abort_when_nan_found)`` and ``get_alignment_requirement()``, runs ``api.cpp``'s host checks with their words
(``RuntimeError``), raises ``_standin.Panic`` where the real kernel would read past the allocation (rows not covering
the last row's 128-byte tile on CUDA), and computes a valid top-k with ties broken at random (the real kernels'
order among equal values is arbitrary), NaN rows as each build marks them.

Not imitated: the interface's Python ``topk`` (our backend calls the extension), performance, device traps (an
``abort_when_nan_found=True`` NaN raises ``Panic``).
"""

from . import _standin  # noqa: F401
