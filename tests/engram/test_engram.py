"""DeepSeek's Engram (``torch_ascend_moe.ops.engram``, ``tile_kernels.engram`` / ``modeling.engram``) against the
spec's formulas (§9): the n-gram hash by Python integers, the gate in FP64; the kernel API's backward and weight
reduction against autograd, ``main_grad`` accumulation, fp64 gradcheck of the gate."""

from __future__ import annotations

import pytest
import torch

import torch_ascend_moe.tile_kernels as tile_kernels
from torch_ascend_moe.ops import engram
from torch_ascend_moe.testing import calc_diff


def test_hash_matches_python_integers():
    g = torch.Generator().manual_seed(0)
    tokens, n, layers, tables = 9, 3, 2, 4
    ids = torch.randint(0, 2**31 - 1, (tokens, n), generator=g, dtype=torch.int32)
    mult = torch.randint(1, 2**40, (layers, n), generator=g, dtype=torch.int64)
    vocab = torch.randint(1000, 100000, (layers, n - 1, tables), generator=g, dtype=torch.int32)
    offsets = tile_kernels.torch.engram.make_offsets(vocab)
    got = tile_kernels.engram.engram_hash(ids, mult, vocab, offsets)
    assert got.dtype == torch.int32 and got.shape == (layers, tokens, (n - 1) * tables)
    for layer in range(layers):
        flat = vocab[layer].flatten().tolist()
        assert offsets[layer].tolist() == [sum(flat[:j]) for j in range(len(flat))]
        for t in range(tokens):
            h = int(ids[t, 0]) * int(mult[layer, 0])
            want = []
            for i in range(1, n):
                h ^= int(ids[t, i]) * int(mult[layer, i])
                h = (h + 2**63) % 2**64 - 2**63  # int64 wrap-around, as the kernels' products
                want += [
                    h % int(vs) + int(offsets[layer, (i - 1) * tables + j]) for j, vs in enumerate(vocab[layer, i - 1])
                ]
            assert got[layer, t].tolist() == want


def _gate_inputs(seed: int, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    x, k = torch.randn(7, 4, 64, generator=g).to(dtype), torch.randn(7, 4, 64, generator=g).to(dtype)
    v = torch.randn(7, 64, generator=g).to(dtype)
    wh, we = torch.randn(4, 64, generator=g).to(dtype), torch.randn(4, 64, generator=g).to(dtype)
    return x, k, v, wh, we


def test_gate_matches_the_spec():
    x, k, v, wh, we = _gate_inputs(1)
    fused = tile_kernels.engram.fused_weight(wh, we)
    out, raw, gate, rstd_x, rstd_k = tile_kernels.engram.engram_gate_fwd(x, k, v, fused, 1e-6, 1e-3)
    x64, k64, v64 = x.double(), k.double(), v.double()
    w64 = wh.double() * we.double()
    rx = 1 / torch.sqrt((x64**2).mean(-1) + 1e-6)
    rk = 1 / torch.sqrt((k64**2).mean(-1) + 1e-6)
    r = (x64 * k64 * w64).sum(-1)
    d = r * rx * rk / 8.0
    want_gate = torch.sigmoid(torch.sign(d) * torch.sqrt(torch.clamp(d.abs(), min=1e-3)))
    for got, want in ((raw, r), (rstd_x, rx), (rstd_k, rk), (gate, want_gate)):
        assert calc_diff(got.double(), want) < 1e-12
    assert calc_diff(out.double(), x64 + want_gate[..., None] * v64[:, None]) < 1e-5 and out.dtype == torch.bfloat16


def test_kernel_backward_and_weight_reduction_match_autograd():
    x, k, v, wh, we = _gate_inputs(2)
    xr, kr, vr = (t.clone().requires_grad_() for t in (x, k, v))
    whr, wer = wh.float().requires_grad_(), we.float().requires_grad_()
    out, raw, gate, rstd_x, rstd_k = tile_kernels.torch.engram.engram_gate_ref(xr, kr, vr, whr, wer, 1e-6, 1e-20, True)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).bfloat16()
    out.backward(grad)
    fused = tile_kernels.engram.fused_weight(wh, we)
    gx, gk, gv, partial = tile_kernels.engram.engram_gate_bwd(grad, x, k, v, fused, raw, gate, rstd_x, rstd_k, 1e-6)
    for got, want in ((gx, xr.grad), (gk, kr.grad), (gv, vr.grad)):
        assert got.dtype == want.dtype and calc_diff(got, want) < 1e-8
    gwh, gwe = torch.ones(4, 64), torch.zeros(4, 64)
    tile_kernels.engram.grad_w_reduce(partial, wh, we, gwh, gwe)
    assert calc_diff(gwh - 1, whr.grad) < 1e-8 and calc_diff(gwe, wer.grad) < 1e-8
    # The autograd layer: returned gradients, or accumulated into main_grad buffers.
    xs, ks, vs = (t.clone().requires_grad_() for t in (x, k, v))
    whp, wep = wh.clone().requires_grad_(), we.clone().requires_grad_()
    tile_kernels.modeling.engram.engram_gate(xs, ks, vs, whp, wep, 1e-6, 1e-20).backward(grad)
    # A BF16 parameter receives its FP32 gradient rounded to BF16 (autograd casts it to the input's dtype).
    assert calc_diff(xs.grad, xr.grad) < 1e-8 and calc_diff(whp.grad.float(), whr.grad) < 1e-5
    wep.grad = None
    wep.main_grad = torch.zeros(4, 64)
    tile_kernels.modeling.engram.engram_gate(x, k, v, wh, wep, 1e-6, 1e-20).backward(grad)
    assert wep.grad is None and calc_diff(wep.main_grad, wer.grad) < 1e-8


def test_gate_gradcheck():
    x, k, v, wh, we = (t.double().requires_grad_() for t in _gate_inputs(4, torch.float64))
    x, k, v = x[:2, :2, :8], k[:2, :2, :8], v[:2, :8]
    w = (wh[:2, :8] * we[:2, :8]).detach().requires_grad_()
    args = [t.detach().requires_grad_() for t in (x, k, v)] + [w]
    assert torch.autograd.gradcheck(lambda *a: engram.engram_gate(*a, 1e-4, 1e-6)[0], args)


def _hash_args():
    ids = torch.randint(0, 1000, (5, 3), dtype=torch.int32)
    mult = torch.randint(1, 2**20, (2, 3), dtype=torch.int64)
    vocab = torch.randint(10, 100, (2, 2, 4), dtype=torch.int32)
    return ids, mult, vocab, tile_kernels.torch.engram.make_offsets(vocab)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda a: (a[0].float(), *a[1:]), r"argument 'ngram_token_ids' dtype: expected torch.int32 or torch.int64"),
        (lambda a: (a[0], a[1], -a[2], a[3]), r"argument 'vocab_sizes' values: expected table sizes > 0"),
        (
            lambda a: (*a[:3], torch.full_like(a[3], 2**31 - 60)),
            r"argument 'offsets' values: expected offset \+ table size - 1",
        ),
        (lambda a: (*a[:3], a[3] - 10**6), r"argument 'offsets' values: expected >= 0"),
        (lambda a: (a[0], a[1][:, :2], *a[2:]), r"argument 'multipliers' shape: expected \[2, 3\]"),
        (lambda a: (a[0][:, :1], *a[1:]), r"argument 'ngram_token_ids' size\(1\) \(n\): expected at least 2"),
    ],
    ids=["float ids", "negative vocab", "offset wraps int32", "negative offset", "multipliers", "unigram"],
)
def test_hash_bad_input_names_the_argument(change, match):
    with pytest.raises(ValueError, match="engram_hash: " + match):
        engram.engram_hash(*change(_hash_args()))


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(eps=-1e-6), r"argument 'eps' value: expected > 0, got -1e-06"),
        (dict(eps=0.0), r"argument 'eps' value: expected > 0"),
        (dict(clamp_value=float("inf")), r"argument 'clamp_value' value: expected a finite number >= 0"),
        (dict(v=torch.randn(7, 32)), r"argument 'v' shape: expected \[7, 64\]"),
        (dict(weight_fused=torch.randn(4, 64).to("meta")), r"argument 'weight_fused' device"),
    ],
    ids=["negative eps", "zero eps", "inf clamp", "v shape", "meta weight"],
)
def test_gate_bad_input_names_the_argument(change, match):
    g = torch.Generator().manual_seed(1)
    args = dict(
        hidden_states=torch.randn(7, 4, 64, generator=g),
        k=torch.randn(7, 4, 64, generator=g),
        v=torch.randn(7, 64, generator=g),
        weight_fused=torch.randn(4, 64, generator=g),
        clamp_value=1e-6,
        eps=1e-6,
    )
    with pytest.raises(ValueError, match="engram_gate: " + match):
        engram.engram_gate(**{**args, **change})
