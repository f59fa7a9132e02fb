"""The stand-in's ``deep_select_cuda`` extension (see the package docstring); importable only when configured."""

from . import _standin

if _standin.FLAVOR[0] != "cuda":
    raise ImportError("deep_select stand-in: the cuda extension is not built here (configure(flavor='cuda'))")


def get_alignment_requirement():
    return _standin.ALIGNMENT["cuda"]


def topk(*args):
    return _standin.topk("cuda", *args)
