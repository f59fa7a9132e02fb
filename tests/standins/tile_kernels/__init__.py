"""A CPU stand-in for DeepSeek's TileKernels (package ``tile_kernels``, CUDA), for testing
``torch_ascend_moe.backends.upstream.tile_kernels`` without a GPU. Written from upstream's sources, not from this
project's code:

* ``configure(version="36d9e45")`` (default): the first release, deepseek-ai/TileKernels @ 36d9e45 (a full snapshot):
  ``quant/{per_token_cast,per_block_cast,per_channel_cast,per_channel_cast_fused,swiglu_forward_and_per_token_cast,
  swiglu_backward_and_per_token_cast}_kernel.py``, ``quant/common.py``, ``config.py``, the references
  ``torch/{cast,swiglu}.py`` and the tests ``tests/quant/test_{per_token_cast,per_block_cast,per_channel_cast,
  swiglu_forward_and_per_token_cast,swiglu_backward_and_per_token_cast}.py``.
* ``configure(version="cd8f86c")``: a later release as far as its files could be read one by one (no snapshot):
  ``quant/norm_forward_kernel.py`` / ``norm_forward_cuda.py`` @ cd8f86c, ``transform/rope_kernel.py`` /
  ``rope_cuda.py`` @ 446345f; ``per_token_cast``'s later asserts and the psum-layout SwiGLU signatures from the public
  fork Butterfingrz/TileKernels @ 828cc15 / 66258df (the official later files are not readable).

``configure(arch=9 | 10)``: SM90 or SM100 (the casts' vector width, the SM count). What each function computes:
upstream's references where its tests find them bitwise equal to the kernels, and the kernels' own behaviour where
it differs (``_ref``'s docstring: the NaN-losing amax and the -inf multiplier of an infinite amax with ``round_sf``;
rows a layout leaves out hold garbage). Outputs are allocated on the inputs' device (upstream: ``'cuda'``).

Modules: ``quant`` (casts, fused SwiGLU, and on the later release the RMSNorm kernels), ``transform`` (later release),
``config``; ``_standin`` is the control surface (call log, ``Panic``); ``_ref`` the math.
"""

from tile_kernels import _later, _standin, config, quant, transform  # noqa: F401

_standin.MODULES.update(_later=_later, quant=quant, transform=transform)
_standin.configure()
