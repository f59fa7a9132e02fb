"""TileKernels' kernels (deepseek-ai/TileKernels, TileLang, CUDA SM90/SM100; package ``tile_kernels``) as the first
entry of our ops' CUDA chains, one module per family here (``quant``, ``swiglu``, ``norm``, ``rope``), each mapping
the subset of calls on which an upstream function computes our op (specs/tilekernels_deepselect.md §2-§10).

Releases read: 36d9e45 (2026-04-23, the first release, a full snapshot: the casts and the fused SwiGLU kernels with
v1's ``pos_to_token_topk`` arguments) and, file by file, later ones: ``quant/norm_forward_kernel.py`` /
``norm_forward_cuda.py`` @ cd8f86c and ``transform/rope_kernel.py`` / ``rope_cuda.py`` @ 446345f. An install is told
apart by what it has (``quant.norm_forward``, ``transform.apply_rotary``, the SwiGLU kernels' parameter names); a
kernel refuses, with the reason, what the installed release lacks.

What the kernels take (every other call stays on the chain's next kernel, with the reason ``explain`` gives):

* ``quantize_blocks``: ``quant.per_token_cast`` (``[1, c]``, c in 16/32/64/128), ``per_block_cast`` (``[32, 32]``,
  ``[128, 128]``), ``per_channel_cast`` (``[128, 1]``, E4M3), and the ``_with_precomputed_sf`` forms for a given
  ``sf``: BF16/FP32 rows of a multiple of 64 columns, E4M3 or E2M1, the default amax floor (``quant.py``);
* ``swiglu_forward`` with an E4M3 output: 36d9e45's ``swiglu_forward_and_per_token_cast``, our per-row weights as
  a ``[N, 1]`` weight table, the psum layout as ``pos_to_expert`` (``swiglu.py``);
* ``swiglu_backward`` of an E4M3 ``x``: 36d9e45's ``swiglu_backward_and_per_token_cast`` (BF16 ``grad_out``);
* ``rms_norm``: ``quant.norm_forward``; ``rms_norm_quant`` (BF16, ``round_sf``): ``norm_forward_and_per_token_cast``
  (``norm.py``; the kernel's row sums: within the op's tolerance, not bitwise);
* ``rotary_embedding``: ``transform.apply_rotary`` on a copy (``rope.py``; fused multiply-adds: within tolerance).

Not mapped, and why: ``moe_topk_gate`` (``top2_sum_gate``'s kernel ranks with "low-precision operations": upstream's
test regenerates inputs until neighbouring scores differ by 2e-6, and its slot order is unspecified, so it is not our
exact selection); ``rms_norm_backward`` (``norm_backward``'s official source is not readable, only a fork's); the
later releases' psum-layout SwiGLU kernels (likewise); E5M6 casts (first release only); the mHC, Engram,
routing-layout and transpose kernels (not mapped yet).

What every kernel here shares:

* our op validates first (its ``takes`` runs the op's signature checks), so TileKernels never sees a call we refuse;
  fake and meta tensors never reach it (our fakes serve compile and export);
* our outputs are ours: allocated by upstream where its layout is our fake's (row-major FP32 scales, contiguous
  codes), otherwise by us; rows a layout leaves out (which upstream leaves unspecified) are written on the device;
* non-finite values: a TileKernels cast takes a block's amax with CUDA's ``fmaxf`` (a NaN loses) and, with
  ``round_sf``, turns an infinite amax into a -inf multiplier; our op (TileKernels' own PyTorch reference) gives such
  a block a NaN, 0 or infinite scale and ``x · 0`` codes. So the kernels that cast (``quantize_blocks``,
  ``swiglu_forward``, ``swiglu_backward`` with its cast, ``rms_norm_quant``) take a call only when the values they
  cast are finite: their ``takes`` reads the inputs' largest magnitude (one reduction and a host read, as our ops'
  layout checks) and bounds what the fused arithmetic can reach; a call that could meet a NaN or an infinity stays
  on the chain's next kernel, and while a device graph is captured (no host read) every such call does;
* TileLang compiles each kernel on its first call (JIT, seconds, per shape-independent configuration):
  ``torch_ascend_moe.warmup`` runs a model's calls once before a CUDA-graph capture (inside which only ``rms_norm``
  and ``rotary_embedding`` take the library, see above).

Verified without a GPU against a stand-in package written from upstream's sources (``tests/standins/tile_kernels``,
``tests/upstream/test_tile_kernels_backend.py``).
"""

from __future__ import annotations

import importlib
import math

import torch

from torch_ascend_moe.backends.upstream import Library
from torch_ascend_moe.distributed import capture
from torch_ascend_moe.distributed.capture import has_data

FIRST_RELEASE = "36d9e45"
ARCHS = (9, 10)


def _accept(module) -> str | None:
    quant = getattr(module, "quant", None)
    if quant is None or not hasattr(quant, "per_token_cast"):
        return "tile_kernels has no quant.per_token_cast: not TileKernels"
    if torch.cuda.is_available():
        major = torch.cuda.get_device_capability()[0]
        if major not in ARCHS:
            return f"TileKernels' kernels are for SM90 and SM100 (its README); this GPU is SM{major}x"
    return None


TILE_KERNELS = Library("tile_kernels", accept=_accept)


def function(path: str):
    """The installed library's ``path`` (``"transform.apply_rotary"``), or None where this release has none (its
    module imported if the package does not import it)."""
    package, (*modules, name) = TILE_KERNELS.module(), path.split(".")
    try:
        module = importlib.import_module(".".join([package.__name__, *modules])) if modules else package
    except ImportError:
        return None
    return getattr(module, name, None)


def missing(path: str, since: str) -> str | None:
    """Why a kernel cannot run on the installed release (it lacks ``path``), or None."""
    if function(path) is not None:
        return None
    return f"this tile_kernels has no {path} (added after {since})"


def real_refusal(*tensors) -> str | None:
    if all(t is None or has_data(t) for t in tensors):
        return None
    return "fake or meta tensors (the library runs on data; our fake serves tracing)"


def capture_refusal(t: torch.Tensor) -> str | None:
    """The cast kernels' answer while a device graph is captured (see the module docstring: non-finite values)."""
    if capture.host_readable(t):
        return None
    return (
        "a device graph is being captured: TileKernels' casts treat NaN/inf blocks differently from our op, and "
        "telling whether a call had any is a host read"
    )


def magnitude(*tensors) -> float:
    """The largest ``|value|`` over ``tensors`` (NaN if any is NaN): one host read."""
    parts = [t.detach().abs().amax().float() for t in tensors if t is not None and t.numel()]
    return float(torch.stack(parts).amax()) if parts else 0.0


def finite_refusal(bound: float, limit: float, what: str) -> str | None:
    """Why a cast kernel refuses values whose bound is not finite or above ``limit`` (see the module docstring), or
    None."""
    if math.isfinite(bound) and bound <= limit:
        return None
    return (
        f"{what} not finite or too large to stay finite (a host read): TileKernels' casts treat NaN/inf blocks "
        "differently from our op"
    )


def register() -> None:
    """Import the family modules (each declares its kernels)."""
    from torch_ascend_moe._registry import import_families

    import_families(__name__, __path__)


register()
