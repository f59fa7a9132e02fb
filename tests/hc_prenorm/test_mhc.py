"""DeepSeek's mHC pipeline (``torch_ascend_moe.ops.mhc``) against the spec's formulas (§8) written out element by
element in FP64, and TileKernels' compat layers (``tile_kernels.modeling.mhc``): the fused pre step and the
multilayer recompute bit for bit their compositions, the residual-gradient accumulation protocol against plain
autograd, upstream's inference path without the norm weight; fp64 gradcheck of the whole pre/post step."""

from __future__ import annotations

import pytest
import torch

import torch_ascend_moe.tile_kernels as tile_kernels
from torch_ascend_moe.ops import mhc
from torch_ascend_moe.quant import round_to_tf32

ops = tile_kernels.modeling.mhc.ops


def _inputs(tokens: int = 6, m: int = 4, h: int = 64, seed: int = 0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    m3 = m * (m + 2)
    residual = torch.randn(1, tokens, m, h, generator=g).to(dtype)
    fn = torch.randn(m3, m * h, generator=g) * 0.05
    scale = torch.randn(3, generator=g) * 0.5 + 1
    base = torch.randn(m3, generator=g) * 0.3
    normw = torch.rand(m * h, generator=g) + 0.5
    return residual, fn, scale, base, normw


def _spec_pre(residual, fn, scale, base, normw, eps, post_mult, pre_eps, sk_eps, repeat):
    """The spec's pre step token by token in FP64 (fn ⊙ normw rounded to TF32, as the kernels read it)."""
    m = residual.shape[-2]
    w = round_to_tf32(fn * normw if normw is not None else fn).double()
    tokens = residual.reshape(-1, m * residual.shape[-1]).double()
    outs = []
    for r in tokens:
        mix = (w @ r) / torch.sqrt((r * r).sum() / r.numel() + eps)
        s = torch.cat([scale[0].repeat(m), scale[1].repeat(m), scale[2].repeat(m * m)]).double()
        y = mix * s + base.double()
        pre = 1 / (1 + torch.exp(-y[:m])) + pre_eps
        post = 1 / (1 + torch.exp(-y[m : 2 * m])) * post_mult
        c = torch.softmax(y[2 * m :].view(m, m), -1) + sk_eps
        c = c / (c.sum(0, keepdim=True) + sk_eps)
        for _ in range(repeat - 1):
            c = c / (c.sum(1, keepdim=True) + sk_eps)
            c = c / (c.sum(0, keepdim=True) + sk_eps)
        layer_input = (r.view(m, -1) * pre[:, None]).sum(0)
        outs.append((layer_input, post, c))
    return outs


@pytest.mark.parametrize("with_normw", [False, True])
def test_pre_step_matches_the_spec(with_normw):
    residual, fn, scale, base, normw = _inputs()
    normw = normw if with_normw else None
    layer_input, post, comb = mhc.mhc_pre(residual, fn, scale, base, norm_weight=normw, post_mult_value=2.0,
                                          sinkhorn_repeat=10)  # fmt: skip
    for t, (li, p, c) in enumerate(_spec_pre(residual, fn, scale, base, normw, 1e-6, 2.0, 1e-6, 1e-6, 10)):
        torch.testing.assert_close(post[0, t, :, 0].double(), p, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(comb[0, t].double(), c, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(layer_input[0, t].double(), li, rtol=1e-2, atol=1e-2)  # a BF16 result
    assert layer_input.dtype == torch.bfloat16


def test_post_and_head_match_the_spec():
    g = torch.Generator().manual_seed(1)
    residual = torch.randn(2, 5, 4, 32, generator=g).bfloat16()
    x = torch.randn(2, 5, 32, generator=g).bfloat16()
    post, comb = torch.rand(2, 5, 4, 1, generator=g), torch.rand(2, 5, 4, 4, generator=g)
    out = mhc.mhc_post(x, residual, post, comb)
    want = torch.zeros(2, 5, 4, 32, dtype=torch.float64)
    for n in range(4):
        want[:, :, n] = x.double() * post[:, :, n].double()
        for k in range(4):
            want[:, :, n] += comb[:, :, k, n, None].double() * residual[:, :, k].double()
    torch.testing.assert_close(out.double(), want.bfloat16().double(), rtol=0, atol=0.02)
    mix = torch.randn(2, 5, 4, generator=g)
    scale, base = torch.tensor([0.7]), torch.randn(4, generator=g)
    torch.testing.assert_close(mhc.mhc_head_compute_mix(mix, scale, base, 1e-6), torch.sigmoid(mix * 0.7 + base) + 1e-6)


def test_sinkhorn_is_nearly_doubly_stochastic():
    p = mhc.sinkhorn_normalize(torch.randn(7, 4, 4, generator=torch.Generator().manual_seed(0)), repeat=50)
    torch.testing.assert_close(p.sum(-2), torch.ones(7, 4), atol=1e-4, rtol=0)
    torch.testing.assert_close(p.sum(-1), torch.ones(7, 4), atol=1e-3, rtol=0)
    assert (p > 0).all()


def test_big_fuse_and_recompute_are_their_compositions():
    residual, fn, scale, base, _ = _inputs(tokens=9, seed=2)
    post, comb, layer_input = ops.mhc_pre_big_fuse(residual, fn, scale, base, 1e-6, 1e-6, 1e-6, 1.0, 10)
    mixes = ops.mhc_pre_norm_fn(residual, fn, None, 1e-6, fuse_grad_acc=False)
    pre_r, post_r, comb_r = ops.mhc_pre_split_mixes(mixes, scale, base, 4, 1.0, 1e-6)
    assert torch.equal(post, post_r) and torch.equal(comb, ops.sinkhorn_normalize(comb_r, 10, 1e-6))
    assert torch.equal(layer_input, ops.mhc_pre_apply_mix(residual, pre_r))
    g = torch.Generator().manual_seed(3)
    pres = [torch.rand(1, 9, 4, 1, generator=g) for _ in range(3)]
    outs = [torch.randn(1, 9, 64, generator=g).bfloat16() for _ in range(2)]
    posts = [torch.rand(1, 9, 4, 1, generator=g) for _ in range(2)]
    combs = [torch.rand(1, 9, 4, 4, generator=g) for _ in range(2)]
    inputs, streams = (
        [torch.empty(1, 9, 64).bfloat16() for _ in range(3)],
        [torch.empty_like(residual) for _ in range(2)],
    )
    ops.mhc_multilayer_recompute(residual, pres, outs, posts, combs, inputs, streams)
    r = residual
    for i in range(3):
        assert torch.equal(inputs[i], mhc.mhc_pre_apply_mix(r, pres[i]))
        if i < 2:
            r = mhc.mhc_post(outs[i], r, posts[i], combs[i])
            assert torch.equal(streams[i], r)


def test_gradient_accumulation_protocol():
    """The compat layers' storage protocol (post -> apply_mix -> norm_fn add into one residual gradient) gives
    the gradients plain autograd gives through the compositions."""
    residual, fn, scale, base, normw = _inputs(tokens=5, seed=4)
    g = torch.Generator().manual_seed(5)
    layer = torch.randn(64, 64, generator=g) * 0.1
    d_out = torch.randn(1, 5, 4, 64, generator=g).bfloat16()

    def run(pre_fn, split, sinkhorn, apply, post_fn, fused):
        r = residual.clone().requires_grad_()
        f, w = fn.clone().requires_grad_(), normw.clone().requires_grad_()
        mixes = pre_fn(r, f, w, 1e-6, **({"fuse_grad_acc": True} if fused else {}))
        pre, post, comb = split(mixes, scale, base, 4, 2.0, 1e-6)
        comb = sinkhorn(comb, 10, 1e-6)
        x = apply(r, pre)
        y = (x.float() @ layer).bfloat16()
        out = post_fn(y, r, post, comb)
        torch.autograd.backward(out, d_out)
        return r.grad, f.grad, w.grad

    plain = run(mhc.mhc_pre_norm_fn, mhc.mhc_pre_split_mixes, mhc.sinkhorn_normalize, mhc.mhc_pre_apply_mix,
                mhc.mhc_post, fused=False)  # fmt: skip
    compat = run(ops.mhc_pre_norm_fn, ops.mhc_pre_split_mixes, ops.sinkhorn_normalize, ops.mhc_pre_apply_mix,
                 ops.mhc_post, fused=True)  # fmt: skip
    for a, b in zip(compat, plain):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)


def test_upstream_inference_path_skips_the_norm_weight():
    residual, fn, scale, base, normw = _inputs(seed=6)
    with torch.no_grad():
        no_grad, _ = tile_kernels.modeling.mhc.mhc_pre(residual, fn, scale, base, norm_weight=normw)
        ours, _, _ = mhc.mhc_pre(residual, fn, scale, base, norm_weight=normw)
        without, _, _ = mhc.mhc_pre(residual, fn, scale, base)
    assert torch.equal(no_grad, without) and not torch.equal(ours, without)
    with_grad, _ = tile_kernels.modeling.mhc.mhc_pre(residual, fn.requires_grad_(), scale, base, norm_weight=normw)
    assert torch.equal(with_grad, ours)


def test_gradcheck_pre_and_post():
    residual, fn, scale, base, normw = _inputs(tokens=2, m=2, h=32, seed=7, dtype=torch.float64)
    args = [t.double().requires_grad_() for t in (residual, fn, scale, base, normw)]
    x = torch.randn(1, 2, 32, dtype=torch.float64, requires_grad=True)

    def step(r, f, s, b, w, x):
        layer_input, post, comb = mhc.mhc_pre(r, f, s, b, norm_weight=w, post_mult_value=2.0, sinkhorn_repeat=3)
        return mhc.mhc_post(layer_input * x, r, post, comb)

    assert torch.autograd.gradcheck(step, (*args, x))
