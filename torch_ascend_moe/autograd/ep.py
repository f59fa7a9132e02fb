"""Backward of the ep family (specs/deepep_api.md §5.3): dispatch's backward is combine, combine's is a
cached dispatch, both along the same handle.

Dispatch copies each token to the ranks it selected, so the gradient of ``x`` sums the gradients of its
copies (``ep_combine`` without bias). The received weights are the token's weights masked to the local
slots; their gradient is masked the same way before it is combined, which makes it the exact adjoint
whatever the caller does at non-local slots (DeepEP V1 needs zero gradients there). Combine sums copies,
so its gradient is a copy back along the routes (``ep_dispatch_cached``), and each bias gets ``grad_out``.
FP8 rows carry no gradient. The layout op has integer outputs only.
"""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import arguments, autograd, gradients, needs_grad, results
from torch_ascend_moe.backends.portable.ep.low_latency import ll_row_sources

_combine = torch.ops.ascend_moe.ep_combine.default
_cached = torch.ops.ascend_moe.ep_dispatch_cached.default


def _dispatch_setup(ctx, inputs, output):
    args = arguments("ep_dispatch", inputs)
    ctx.group_name, ctx.timeout_s = args.group_name, args.timeout_s
    ctx.num_tokens, ctx.hidden, ctx.x_dtype = args.x.shape[0], args.x.shape[1], args.x.dtype
    ctx.w_dtype = args.topk_weights.dtype if args.topk_weights is not None else None
    out = results("ep_dispatch", output)
    # Differentiable: recv_x and recv_topk_weights; the rest are scales, ids, counts and the handle.
    ctx.mark_non_differentiable(*(v for k, v in out._asdict().items() if k not in ("recv_x", "recv_topk_weights")))
    ctx.save_for_backward(
        out.recv_topk_idx, out.send_src, out.send_counts, out.recv_counts, out.recv_gather, out.backend_state
    )


def _dispatch_backward(ctx, grad_x, grad_scales, grad_idx, grad_w, *unused):
    recv_topk_idx, send_src, send_counts, recv_counts, recv_gather, state = ctx.saved_tensors
    need_x = needs_grad(ctx, "ep_dispatch", "x") and ctx.x_dtype != torch.float8_e4m3fn
    need_w = needs_grad(ctx, "ep_dispatch", "topk_weights") and ctx.w_dtype is not None
    if not (need_x or need_w):
        return gradients("ep_dispatch")
    n, device = recv_gather.shape[0], recv_gather.device
    width = ctx.hidden if need_x else 0
    gx = grad_x if need_x and grad_x is not None else torch.zeros(n, width, dtype=ctx.x_dtype, device=device)
    gw = None
    if need_w:
        gw = grad_w if grad_w is not None else torch.zeros(recv_topk_idx.shape, dtype=ctx.w_dtype, device=device)
        gw = torch.where(recv_topk_idx >= 0, gw, 0).to(ctx.w_dtype)  # the forward zeroed non-local slots
    dx, dw = _combine(
        gx,
        gw,
        None,
        None,
        send_src,
        send_counts,
        recv_counts,
        recv_gather,
        ctx.num_tokens,
        ctx.group_name,
        ctx.timeout_s,
        None,
        state,
    )
    return gradients("ep_dispatch", x=dx if need_x else None, topk_weights=dw if need_w else None)


def _cached_setup(ctx, inputs, output):
    args = arguments("ep_dispatch_cached", inputs)
    ctx.group_name, ctx.timeout_s = args.group_name, args.timeout_s
    ctx.num_tokens, ctx.x_dtype = args.x.shape[0], args.x.dtype
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(args.send_src, args.send_counts, args.recv_counts, args.recv_gather, args.backend_state)


def _cached_backward(ctx, grad_x, grad_scales):
    send_src, send_counts, recv_counts, recv_gather, state = ctx.saved_tensors
    if not needs_grad(ctx, "ep_dispatch_cached", "x") or grad_x is None or ctx.x_dtype == torch.float8_e4m3fn:
        return gradients("ep_dispatch_cached")
    dx, _ = _combine(
        grad_x,
        None,
        None,
        None,
        send_src,
        send_counts,
        recv_counts,
        recv_gather,
        ctx.num_tokens,
        ctx.group_name,
        ctx.timeout_s,
        None,
        state,
    )
    return gradients("ep_dispatch_cached", x=dx)


def _combine_setup(ctx, inputs, output):
    args = arguments("ep_combine", inputs)
    ctx.group_name, ctx.timeout_s = args.group_name, args.timeout_s
    ctx.has_bias = (args.bias_0 is not None, args.bias_1 is not None)
    ctx.save_for_backward(args.send_src, args.send_counts, args.recv_counts, args.recv_gather, args.backend_state)


def _combine_backward(ctx, grad_out, grad_w):
    send_src, send_counts, recv_counts, recv_gather, state = ctx.saved_tensors
    handle = (send_src, send_counts, recv_counts, recv_gather, ctx.group_name, ctx.timeout_s, state)
    dx = dw = None
    if needs_grad(ctx, "ep_combine", "x") and grad_out is not None:
        dx, _ = _cached(grad_out, None, *handle)
    if needs_grad(ctx, "ep_combine", "topk_weights") and grad_w is not None:
        dw, _ = _cached(grad_w, None, *handle)
    biases = [
        grad_out if has and needs_grad(ctx, "ep_combine", f"bias_{i}") else None for i, has in enumerate(ctx.has_bias)
    ]
    return gradients("ep_combine", x=dx, topk_weights=dw, bias_0=biases[0], bias_1=biases[1])


def _layout_setup(ctx, inputs, output):
    ctx.mark_non_differentiable(*output)


def _layout_backward(ctx, *grads):
    return gradients("ep_dispatch_layout")


def _expand_setup(ctx, inputs, output):
    args = arguments("ep_expand", inputs)
    ctx.x_dtype = args.x.dtype
    ctx.w_dtype = args.topk_weights.dtype if args.topk_weights is not None else None
    out = results("ep_expand", output)
    ctx.mark_non_differentiable(out.expanded_x_scales, out.expand_rows, out.psum, out.counts)
    ctx.save_for_backward(out.expand_rows)


def _expand_backward(ctx, grad_x, grad_scales, grad_w, *unused):
    """The adjoint of a gather: each row's gradient sums its slots' expanded rows (FP32, slot order, one
    rounding: the local reduction of V2's expanded combine); each weight gets its expanded row's gradient."""
    from torch_ascend_moe.ops.ep import ep_reduce_slots

    (expand_rows,) = ctx.saved_tensors
    dx = dw = None
    if needs_grad(ctx, "ep_expand", "x") and grad_x is not None and ctx.x_dtype != torch.float8_e4m3fn:
        dx = ep_reduce_slots(grad_x, expand_rows)
    if needs_grad(ctx, "ep_expand", "topk_weights") and grad_w is not None and ctx.w_dtype is not None:
        dw = torch.cat([grad_w, grad_w.new_zeros(1)])[expand_rows].to(ctx.w_dtype)  # -1 reads the zero row
    return gradients("ep_expand", x=dx, topk_weights=dw)


autograd("ep_dispatch", _dispatch_backward, _dispatch_setup)
autograd("ep_dispatch_cached", _cached_backward, _cached_setup)
autograd("ep_combine", _combine_backward, _combine_setup)
autograd("ep_dispatch_layout", _layout_backward, _layout_setup)
autograd("ep_expand", _expand_backward, _expand_setup)


# ---- low-latency mode (DeepEP's are inference-only; these are differentiable) ----
#
# Dispatch copies x[t] to each of its experts' rows, so grad_x[t] sums the rows' gradients: a low-latency
# combine with unit weights. Combine computes sum_k w[t, k] * y_k(t): grad y_k(t) = w[t, k] * grad_out[t] is a
# low-latency dispatch of grad_out weighted per slot (``slot_weights``), landing in the forward's row order;
# grad w[t, k] = <grad_out[t], y_k(t)>, with y_k(t) fetched by one combine per slot with one-hot weights.
# FP8 dispatches and ``slot_weights`` carry no gradient.

_ll_dispatch = torch.ops.ascend_moe.ep_low_latency_dispatch.default
_ll_combine = torch.ops.ascend_moe.ep_low_latency_combine.default


def _ll_dispatch_setup(ctx, inputs, output):
    args = arguments("ep_low_latency_dispatch", inputs)
    ctx.use_fp8, ctx.t_max = args.use_fp8, args.num_max_dispatch_tokens_per_rank
    ctx.group_name, ctx.timeout_s = args.group_name, args.timeout_s
    out = results("ep_low_latency_dispatch", output)
    ctx.mark_non_differentiable(*(v for k, v in out._asdict().items() if k != "recv_x"))
    ctx.save_for_backward(args.topk_idx, out.src_info, out.layout_range, out.backend_state)


def _ll_dispatch_backward(ctx, grad_x, *unused):
    topk_idx, src_info, layout_range, state = ctx.saved_tensors
    if not needs_grad(ctx, "ep_low_latency_dispatch", "x") or ctx.use_fp8 or grad_x is None:
        return gradients("ep_low_latency_dispatch")
    ones = torch.ones(topk_idx.shape, dtype=torch.float32, device=grad_x.device)
    dx = _ll_combine(grad_x, topk_idx, ones, src_info, layout_range, ctx.t_max, ctx.group_name, ctx.timeout_s, state)
    return gradients("ep_low_latency_dispatch", x=dx)


def _into_layout(rows, rows_src, rows_range, src_info, layout_range, t_max: int) -> torch.Tensor:
    """``rows`` (a low-latency layout described by ``rows_src`` / ``rows_range``) moved into the layout of
    ``src_info`` / ``layout_range``: each (source rank, token) row of an expert to where the forward had it, zero
    elsewhere. The backward's fresh dispatch need not order rows as the forward's did (DeepEP's kernels place them in
    arrival order); no host read."""
    local, n, h = rows.shape
    spare = torch.iinfo(torch.int64).max

    def keys(src, ranges):
        source, inside = ll_row_sources(ranges, n)
        ok = inside & (src >= 0)
        return torch.where(ok, source * t_max + src.long(), spare), ok

    wanted, ok = keys(src_info, layout_range)
    have, _ = keys(rows_src, rows_range)
    sorted_have, order = torch.sort(have, dim=1)
    at = order.gather(1, torch.searchsorted(sorted_have, wanted).clamp(max=n - 1))
    moved = rows.gather(1, at.unsqueeze(-1).expand(local, n, h))
    return torch.where(ok.unsqueeze(-1), moved, 0)


def _ll_combine_setup(ctx, inputs, output):
    args = arguments("ep_low_latency_combine", inputs)
    ctx.t_max, ctx.group_name, ctx.timeout_s = args.num_max_dispatch_tokens_per_rank, args.group_name, args.timeout_s
    ctx.num_experts = args.x.shape[0] * args.layout_range.shape[1]
    ctx.has_state = args.backend_state is not None
    saved = (args.x, args.topk_idx, args.topk_weights, args.src_info, args.layout_range)
    ctx.save_for_backward(*saved, *((args.backend_state,) if ctx.has_state else ()))


def _ll_combine_backward(ctx, grad_out):
    x, topk_idx, topk_weights, src_info, layout_range, *maybe_state = ctx.saved_tensors
    state = maybe_state[0] if ctx.has_state else None
    dx = dw = None
    if needs_grad(ctx, "ep_low_latency_combine", "x"):
        back = _ll_dispatch(
            grad_out.to(x.dtype),
            topk_idx,
            ctx.t_max,
            ctx.num_experts,
            ctx.group_name,
            False,
            False,
            False,
            topk_weights,
            ctx.timeout_s,
        )
        dx = _into_layout(back[0], back[3], back[4], src_info, layout_range, ctx.t_max)
    if needs_grad(ctx, "ep_low_latency_combine", "topk_weights"):
        columns = []
        for k in range(topk_idx.shape[1]):
            one_hot = torch.zeros_like(topk_weights)
            one_hot[:, k] = 1
            y_k = _ll_combine(
                x, topk_idx, one_hot, src_info, layout_range, ctx.t_max, ctx.group_name, ctx.timeout_s, state
            )
            columns.append((grad_out.to(y_k.dtype) * y_k).sum(-1))
        dw = torch.stack(columns, dim=1).to(topk_weights.dtype) if columns else torch.zeros_like(topk_weights)
    return gradients("ep_low_latency_combine", x=dx, topk_weights=dw)


autograd("ep_low_latency_dispatch", _ll_dispatch_backward, _ll_dispatch_setup)
autograd("ep_low_latency_combine", _ll_combine_backward, _ll_combine_setup)
