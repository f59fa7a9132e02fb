"""The stand-in's ``deep_select_npu`` extension (see the package docstring); importable only when configured."""

from . import _standin

if _standin.FLAVOR[0] != "npu":
    raise ImportError("deep_select stand-in: the npu extension is not built here (configure(flavor='npu'))")


def get_alignment_requirement():
    return _standin.ALIGNMENT["npu"]


def topk(*args):
    return _standin.topk("npu", *args)
