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

Training graphs keep the experts' L1 output for the backward, so its SwiGLU epilogue cannot fuse there;
``enable(recompute_l1=True)`` (or the backend's ``options={"recompute_l1": True}``) adds a joint-graph pass that has
AOTAutograd's partitioner recompute the L1 GEMM and its SwiGLU in the backward instead, and the forward fuses.

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


def _joint(recompute_l1: bool | None, current):
    """The joint-graph pass to install over ``current`` for ``recompute_l1`` (ours chaining the user's, the user's
    alone, or ``current`` unchanged for None)."""
    ours = _ours(current, "AscendMoEJointPasses")
    if recompute_l1 and not ours:
        from torch_ascend_moe.inductor_lowerings._pass import AscendMoEJointPasses

        return AscendMoEJointPasses(current)
    if recompute_l1 is False and ours:
        return current.user
    return current


def _ours(p, kind: str = "AscendMoEPasses") -> bool:
    return type(p).__name__ == kind and type(p).__module__ == f"{__name__}._pass"


def enable(recompute_l1: bool = False) -> None:
    """Install the passes for every later ``torch.compile`` with Inductor in this process, and the eager-experts
    substitution for every later trace (idempotent).

    ``recompute_l1=True`` also fuses the experts' L1 GEMM and SwiGLU in training graphs, by recomputing the L1 GEMM
    in the backward (a joint-graph pass tags it for AOTAutograd's partitioner): the forward neither computes nor
    keeps the ``[M, 2I]`` L1 output, and the backward runs one more grouped GEMM. A memory-for-time trade, off by
    default; ``enable()`` without it turns it off again."""
    global SUBSTITUTE_EAGER_EXPERTS
    SUBSTITUTE_EAGER_EXPERTS = True
    from torch_ascend_moe.inductor_lowerings.scaled_mm import register_fakes

    register_fakes()  # trace time, like the substitution: torch ops that have no Meta kernel of their own
    current = config.post_grad_custom_post_pass
    if not _ours(current):
        config.post_grad_custom_post_pass = _passes(current)
    config.joint_custom_post_pass = _joint(recompute_l1, config.joint_custom_post_pass)


def disable() -> None:
    """Remove the passes, restoring the post-grad (and joint-graph) passes installed before ``enable()``."""
    global SUBSTITUTE_EAGER_EXPERTS
    SUBSTITUTE_EAGER_EXPERTS = False
    current = config.post_grad_custom_post_pass
    if _ours(current):
        config.post_grad_custom_post_pass = current.user
    config.joint_custom_post_pass = _joint(False, config.joint_custom_post_pass)


def is_enabled() -> bool:
    return _ours(config.post_grad_custom_post_pass)


def recomputes_l1() -> bool:
    """Whether ``enable(recompute_l1=True)`` is in force."""
    return _ours(config.joint_custom_post_pass, "AscendMoEJointPasses")


@contextlib.contextmanager
def enabled(recompute_l1: bool = False):
    """The passes on inside the block (for the compiles that happen in it), as they were after it."""
    was, joint = is_enabled(), config.joint_custom_post_pass
    enable(recompute_l1)
    try:
        yield
    finally:
        if not was:
            disable()
        config.joint_custom_post_pass = joint


def backend(
    gm: torch.fx.GraphModule, example_inputs, *, mode: str | None = None, options: dict | None = None, **kwargs
):
    """The ``"ascend_moe"`` torch.compile backend: Inductor with the passes on for this graph only (registered as a
    ``torch_dynamo_backends`` entry point, so the name works without importing this module first). The passes go in
    as ``compile_fx``'s config patch, which it also applies to the backward graph: AOTAutograd compiles that one
    lazily, at the first backward, after this function has returned.

    ``torch.compile``'s ``mode`` and ``options`` mean what they mean for Inductor, and ``options={"recompute_l1":
    True}`` is ``enable(recompute_l1=True)`` for this model only (``False``: off for it whatever ``enable`` said)."""
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx

    options = dict(options or {})
    recompute_l1 = options.pop("recompute_l1", None)
    current = config.post_grad_custom_post_pass
    passes = current if _ours(current) else _passes(current)
    patches = {**list_mode_options(mode or "default"), **options, **(kwargs.pop("config_patches", None) or {})}
    patches["post_grad_custom_post_pass"] = passes
    patches["joint_custom_post_pass"] = _joint(recompute_l1, config.joint_custom_post_pass)
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


__all__ = [
    "BACKEND",
    "MATCHES",
    "backend",
    "disable",
    "enable",
    "enabled",
    "is_enabled",
    "npugraph_ex_passes",
    "recomputes_l1",
]
