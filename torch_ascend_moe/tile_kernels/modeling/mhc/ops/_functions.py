"""The autograd layers behind ``tile_kernels.modeling.mhc.ops``: ``torch_ascend_moe.ops.mhc``'s compositions computed
without a graph in the forward and differentiated by recomputation in the backward (so an ``out`` buffer can be
filled, as upstream's), plus upstream's gradient-accumulation protocol on the residual's storage:

- ``mhc_post``'s backward puts the residual's gradient on ``residual.untyped_storage().grad_from_mhc_post`` (and
  returns it);
- ``mhc_pre_apply_mix``'s backward adds its residual gradient into that tensor when it exists (and returns None);
- ``mhc_pre_norm_fn`` with ``fuse_grad_acc`` adds its gradient into it, removes it and returns None.
"""

from __future__ import annotations

import functools

import torch

from torch_ascend_moe.ops import mhc

ATTR = "grad_from_mhc_post"


class _Recompute(torch.autograd.Function):
    """``fn(*tensors)`` without a graph; its backward recomputes ``fn`` and differentiates it. ``hooks``:
    ``{index: (before, after)}`` optional callbacks shaping the gradient of a tensor input."""

    @staticmethod
    def forward(ctx, fn, out, hooks, *tensors):
        with torch.no_grad():
            result = fn(*tensors)
        ctx.fn, ctx.hooks = fn, hooks or {}
        ctx.save_for_backward(*tensors)
        if out is not None:
            out.copy_(result)
            result = out
        return result

    @staticmethod
    def backward(ctx, *grads):
        tensors = ctx.saved_tensors
        wanted = [i for i, t in enumerate(tensors) if ctx.needs_input_grad[3 + i]]
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_(i in wanted) for i, t in enumerate(tensors)]
            outputs = ctx.fn(*leaves)
            outputs = outputs if isinstance(outputs, tuple) else (outputs,)
            pairs = [(o, g) for o, g in zip(outputs, grads) if g is not None and o.requires_grad]
            got = torch.autograd.grad(
                [o for o, _ in pairs], [leaves[i] for i in wanted], [g for _, g in pairs], allow_unused=True
            ) if pairs else [None] * len(wanted)  # fmt: skip
        result = [None] * len(tensors)
        for i, g in zip(wanted, got):
            if g is None:
                g = torch.zeros_like(tensors[i])
            hook = ctx.hooks.get(i)
            result[i] = hook(tensors[i], g) if hook else g
        return (None, None, None, *result)


def _apply(fn, out, hooks, *tensors):
    return _Recompute.apply(fn, out, hooks, *tensors)


def expand_to_mhc(hidden: torch.Tensor, mhc_mult: int, out: torch.Tensor | None = None) -> torch.Tensor:
    assert hidden.is_contiguous()
    return _apply(functools.partial(mhc.expand_to_mhc, mhc_mult=mhc_mult), out, None, hidden)


def sinkhorn_normalize(x: torch.Tensor, repeat: int = 10, eps: float = 1e-6) -> torch.Tensor:
    return _apply(functools.partial(mhc.sinkhorn_normalize, repeat=repeat, eps=eps), None, None, x)


def mhc_head_compute_mix(input_mix, mhc_scale, mhc_base, mhc_pre_eps: float) -> torch.Tensor:
    assert input_mix.ndim == 3

    def fn(mix, scale, base):
        return mhc.mhc_head_compute_mix(mix, scale, base, mhc_pre_eps)

    return _apply(fn, None, None, input_mix, mhc_scale, mhc_base)


def mhc_pre_split_mixes(input_mixes, mhc_scale, mhc_base, mhc_mult: int, mhc_post_mult_value: float,
                        mhc_pre_eps: float):  # fmt: skip
    assert input_mixes.ndim == 3

    def fn(mixes, scale, base):
        return mhc.mhc_pre_split_mixes(mixes, scale, base, mhc_mult, mhc_post_mult_value, mhc_pre_eps)

    return _apply(fn, None, None, input_mixes, mhc_scale, mhc_base)


def _accumulate_into_storage(remove: bool):
    """A residual gradient added into the tensor the post step left on the residual's storage (None returned)."""

    def hook(x: torch.Tensor, grad: torch.Tensor):
        storage = x.untyped_storage()
        target = getattr(storage, ATTR, None)
        if target is None:
            return grad
        view = target.view_as(x)
        view.add_(grad.to(view.dtype))
        if remove:
            delattr(storage, ATTR)
        return None

    return hook


def mhc_pre_apply_mix(x: torch.Tensor, mix: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    assert mix.shape[-1] == 1
    return _apply(mhc.mhc_pre_apply_mix, out, {0: _accumulate_into_storage(remove=False)}, x, mix)


def _merged(fn: torch.Tensor, norm_weight: torch.Tensor | None):
    return fn if norm_weight is None else fn * norm_weight


def mhc_pre_norm_fn(residual, mhc_fn, mhc_norm_weight, mhc_norm_eps: float, fuse_grad_acc: bool = True,
                    n_splits: int = 16) -> torch.Tensor:  # fmt: skip
    """``n_splits`` is accepted (upstream's split-K option; one pass here). With ``fuse_grad_acc`` the residual's
    gradient goes into ``residual.untyped_storage().grad_from_mhc_post`` (which must exist then, as upstream)."""
    assert residual.dtype == torch.bfloat16
    assert mhc_fn.dtype == torch.float32
    assert residual.shape[-1] * residual.shape[-2] == mhc_fn.shape[1]

    def fn(r, f, *w):
        return mhc.mhc_pre_norm_fn(r, f, w[0] if w else None, mhc_norm_eps)

    def must_accumulate(x: torch.Tensor, grad: torch.Tensor):
        storage = x.untyped_storage()
        assert hasattr(storage, ATTR), "fuse_grad_acc needs residual.untyped_storage().grad_from_mhc_post"
        return _accumulate_into_storage(remove=True)(x, grad)

    hooks = {0: must_accumulate} if fuse_grad_acc else None
    weights = () if mhc_norm_weight is None else (mhc_norm_weight,)
    return _apply(fn, None, hooks, residual, mhc_fn, *weights)


def mhc_post_fwd(x, residual, post_layer_mix, comb_res_mix, out=None) -> torch.Tensor:
    _check_post(x, residual, post_layer_mix, comb_res_mix)
    with torch.no_grad():
        result = mhc.mhc_post(x, residual, post_layer_mix, comb_res_mix)
    return result if out is None else out.copy_(result)


def mhc_post_bwd(x, residual, post_layer_mix, comb_res_mix, d_o, fuse_grad_acc: bool = True):
    """``(d_x, d_residual, d_post_layer_mix, d_comb_res_mix)``; with ``fuse_grad_acc`` ``d_residual`` is also left
    on the residual's storage for the pre steps to accumulate into."""
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (x, residual, post_layer_mix, comb_res_mix)]
        grads = torch.autograd.grad(mhc.mhc_post(*leaves), leaves, d_o)
    d_x, d_residual, d_post, d_comb = grads
    if fuse_grad_acc:
        setattr(residual.untyped_storage(), ATTR, d_residual)
    return d_x, d_residual, d_post, d_comb


def _check_post(x, residual, post_layer_mix, comb_res_mix) -> None:
    num_seqs, num_tokens, m, hidden = residual.shape
    assert x.dtype == torch.bfloat16, f"{x.dtype=}"
    assert residual.dtype == torch.bfloat16, f"{residual.dtype=}"
    assert post_layer_mix.dtype == torch.float32, f"{post_layer_mix.dtype=}"
    assert comb_res_mix.dtype == torch.float32, f"{comb_res_mix.dtype=}"
    assert x.shape == (num_seqs, num_tokens, hidden), f"{x.shape=}"
    assert post_layer_mix.shape == (num_seqs, num_tokens, m, 1), f"{post_layer_mix.shape=}"
    assert comb_res_mix.shape == (num_seqs, num_tokens, m, m), f"{comb_res_mix.shape=}"


class _Post(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, post_layer_mix, comb_res_mix, out):
        result = mhc_post_fwd(x, residual, post_layer_mix, comb_res_mix, out)
        ctx.save_for_backward(x, residual, post_layer_mix, comb_res_mix)
        return result

    @staticmethod
    def backward(ctx, d_o):
        return *mhc_post_bwd(*ctx.saved_tensors, d_o), None


def mhc_post(x, residual, post_layer_mix, comb_res_mix, out=None) -> torch.Tensor:
    return _Post.apply(x, residual, post_layer_mix, comb_res_mix, out)


def mhc_pre_big_fuse(residual, fn, mhc_scale, mhc_base, rms_eps: float, mhc_pre_eps: float, mhc_sinkhorn_eps: float,
                     mhc_post_mult_value: float, sinkhorn_repeat: int, n_splits: int = 16):  # fmt: skip
    """``(post [..., m, 1], comb [..., m, m], layer_input [..., H])``: the whole pre step without a norm weight (as
    upstream's), bit for bit its composition."""
    assert residual.dtype == torch.bfloat16
    assert fn.dtype == mhc_scale.dtype == mhc_base.dtype == torch.float32
    m, hidden = residual.shape[-2:]
    assert fn.shape == (m * (m + 2), m * hidden) and mhc_scale.shape == (3,) and mhc_base.shape == (m * (m + 2),)
    with torch.no_grad():
        layer_input, post, comb = mhc.mhc_pre(
            residual, fn, mhc_scale, mhc_base, norm_eps=rms_eps, post_mult_value=mhc_post_mult_value,
            pre_eps=mhc_pre_eps, sinkhorn_eps=mhc_sinkhorn_eps, sinkhorn_repeat=sinkhorn_repeat,
        )  # fmt: skip
    return post, comb, layer_input


def mhc_multilayer_recompute(initial_residual, pre_mix_list, layer_output_list, post_mix_list, comb_mix_list,
                             layer_input_list, residual_list) -> None:  # fmt: skip
    """Recompute every layer's input (``layer_input_list[i] = apply_mix(residual_i, pre_i)``) and the streams after
    it (``residual_list[i] = post(out_i, residual_i, post_i, comb_i)``) into the caller's tensors."""
    num_layers, num_post = len(pre_mix_list), len(layer_output_list)
    assert num_layers == len(layer_input_list)
    assert num_post == len(post_mix_list) == len(comb_mix_list) == len(residual_list)
    assert num_post in (num_layers - 1, num_layers), (
        f"post count ({num_post}) must be num_layers-1 or num_layers (num_layers={num_layers})"
    )
    assert num_layers > 0
    residual = initial_residual
    with torch.no_grad():
        for i in range(num_layers):
            layer_input_list[i].copy_(mhc.mhc_pre_apply_mix(residual, pre_mix_list[i]))
            if i < num_post:
                residual = residual_list[i].copy_(
                    mhc.mhc_post(layer_output_list[i], residual, post_mix_list[i], comb_mix_list[i])
                )
