"""Compiler passes for the ascend_moe ops: post-grad rewrites that fuse a chain of our ops into the op that
computes the chain in one kernel, on every device (Inductor on CPU and CUDA; ``npugraph_ex`` / TorchAir on Ascend
through ``npugraph_ex_passes``). Opt-in:

>>> from torch_ascend_moe import inductor_lowerings
>>> with inductor_lowerings.enabled():
...     compiled = torch.compile(lambda x: x + 1)

or ``inductor_lowerings.enable()`` for the process, or ``torch.compile(model, backend="ascend_moe")`` (Inductor with
the passes on for that model only). The passes run after Inductor's own post-grad passes and before a user's
``post_grad_custom_post_pass``, which keeps working; the FX graph cache keys on our sources. Each rewrite is one
module here, named after what it fuses; ``MATCHES`` counts the rewrites applied in this process.

``enable()`` / ``enabled()`` also switch on one substitution at trace time, before any graph exists: transformers'
``eager`` experts (a per-expert loop Dynamo cannot put in one graph) are traced as a grouped implementation of the
same experts (``torch_ascend_moe.hf.eager_experts_forward``). The backend name alone cannot do that (a backend
sees graphs only after Dynamo has traced them).
"""

from __future__ import annotations

import collections
import contextlib

import torch
from torch._inductor import config

BACKEND = "ascend_moe"
MATCHES: collections.Counter = collections.Counter()  # rewrites applied in this process, by rewrite name
# Read by transformers' "eager" experts implementation while Dynamo traces it (torch_ascend_moe.hf): the per-expert
# loop becomes our grouped ops. A plain module global, so Dynamo guards on it and recompiles when it changes.
SUBSTITUTE_EAGER_EXPERTS = False


def _passes(user=None, allowed=None):
    # The pattern matcher imports much of Inductor: only when a compile asks for the passes.
    from torch_ascend_moe.inductor_lowerings._pass import AscendMoEPasses

    return AscendMoEPasses(user, allowed)


def _ours(p) -> bool:
    return type(p).__name__ == "AscendMoEPasses" and type(p).__module__ == f"{__name__}._pass"


def enable() -> None:
    """Install the passes for every later ``torch.compile`` with Inductor in this process, and the eager-experts
    substitution for every later trace (idempotent)."""
    global SUBSTITUTE_EAGER_EXPERTS
    SUBSTITUTE_EAGER_EXPERTS = True
    current = config.post_grad_custom_post_pass
    if not _ours(current):
        config.post_grad_custom_post_pass = _passes(current)


def disable() -> None:
    """Remove the passes, restoring the post-grad pass that was installed before ``enable()``."""
    global SUBSTITUTE_EAGER_EXPERTS
    SUBSTITUTE_EAGER_EXPERTS = False
    current = config.post_grad_custom_post_pass
    if _ours(current):
        config.post_grad_custom_post_pass = current.user


def is_enabled() -> bool:
    return _ours(config.post_grad_custom_post_pass)


@contextlib.contextmanager
def enabled():
    """The passes on inside the block (for the compiles that happen in it), as they were after it."""
    was = is_enabled()
    enable()
    try:
        yield
    finally:
        if not was:
            disable()


def backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """The ``"ascend_moe"`` torch.compile backend: Inductor with the passes on for this graph only (registered as a
    ``torch_dynamo_backends`` entry point, so the name works without importing this module first). The passes go in
    as ``compile_fx``'s config patch, which it also applies to the backward graph: AOTAutograd compiles that one
    lazily, at the first backward, after this function has returned."""
    from torch._inductor.compile_fx import compile_fx

    current = config.post_grad_custom_post_pass
    passes = current if _ours(current) else _passes(current)
    patches = {**(kwargs.pop("config_patches", None) or {}), "post_grad_custom_post_pass": passes}
    return compile_fx(gm, example_inputs, config_patches=patches, **kwargs)


def npugraph_ex_passes(compiler_config, *, ge_mode: bool | None = None) -> None:
    """Put the same rewrites into a TorchAir ``CompilerConfig`` or an ``npugraph_ex`` options object (their post-grad
    custom post pass, a function ``(gm, example_inputs, config)``), chaining the one it had. In TorchAir's GE mode
    (``mode`` other than ``"npugraph_ex"`` / ``"reduce-overhead"``, or ``ge_mode=True``) a rewrite is only applied
    where its fused op has a GE converter (GE has no eager fallback)."""
    from torch_ascend_moe._registry import NPU_GE_CONVERTERS
    from torch_ascend_moe.backends import npu

    npu.register()  # the family modules declare their GE converters (idempotent; registered on Ascend already)
    current = compiler_config.post_grad_custom_post_pass
    user = getattr(current, "value", current)  # TorchAir wraps it in a CallableValue
    if ge_mode is None:
        mode = getattr(getattr(compiler_config, "mode", None), "value", "npugraph_ex")
        ge_mode = mode not in ("npugraph_ex", "reduce-overhead")
    ours = _passes(allowed=(lambda name: name in NPU_GE_CONVERTERS) if ge_mode else None)

    def passes(gm, example_inputs, cfg):
        ours(gm.graph)
        gm.recompile()
        if user is not None:
            return user(gm, example_inputs, cfg)
        return None

    compiler_config.post_grad_custom_post_pass = passes


__all__ = ["BACKEND", "MATCHES", "backend", "disable", "enable", "enabled", "is_enabled", "npugraph_ex_passes"]
