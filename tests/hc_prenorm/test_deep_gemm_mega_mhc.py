"""DeepGEMM 2.8's ``mega_mhc`` on our compat package (specs/upstream_2609.md §3), against a reference written from
upstream's ``mhc_reference`` step by step in plain torch (FP32, TF32 off): every output within upstream's
``calc_diff < 5e-5`` (the FP8 data cast back ``< 2e-4``, its scales bitwise the cast of the BF16 output), shifted and
normal modes, the three scale layouts (TMA column-major, row-major, Mega MoE's shared rows), repeats bitwise,
duplicated rows bitwise equal, ``T = 0`` a no-op, upstream's refusals."""

from __future__ import annotations

import pytest
import torch

import torch_ascend_moe.deep_gemm as deep_gemm
from torch_ascend_moe.deep_gemm.mega_mhc import shared_sf_rows
from torch_ascend_moe.quant import per_token_cast_to_fp8
from torch_ascend_moe.testing import calc_diff


def _inputs(t, h, seed, shifted):
    g = torch.Generator().manual_seed(seed)
    mix = lambda *s: torch.rand(*s, generator=g)  # noqa: E731
    return dict(
        x=torch.randn(t, h, generator=g).bfloat16(),
        residual=torch.randn(t, 4, h, generator=g).bfloat16(),
        shifted_prev_mix=mix(t, 4, 1) if shifted else None,
        post_mix=mix(t, 4, 1) * 2,
        comb_res_mix=mix(t, 4, 4) / 2,
        fn=torch.randn(24, 4 * h, generator=g) * (4 * h) ** -0.5,
        mix_scales=torch.tensor([0.8, 1.1, 0.9]),
        mix_bases=torch.randn(24, generator=g) * 0.1,
        rmsnorm_weight=(1 + 0.1 * torch.randn(h, generator=g)).bfloat16(),
    )


def _reference(inp, shifted, eps=(1e-6, 1e-6, 2.0, 1e-6, 10, 1e-6, 1.0)):
    hc_norm_eps, hc_pre_eps, post_scale, sk_eps, iters, rms_eps, rms_scale = eps
    x, r = inp["x"].float(), inp["residual"].float()
    n = (x[:, None, :] * inp["post_mix"] + torch.einsum("tij,tih->tjh", inp["comb_res_mix"], r)).bfloat16()
    flat = n.float().flatten(1)
    m = flat @ inp["fn"].t()
    m = m * torch.rsqrt(flat.square().sum(-1, keepdim=True) / flat.shape[1] + hc_norm_eps)
    s = inp["mix_scales"]
    m = m * torch.cat([s[0].repeat(4), s[1].repeat(4), s[2].repeat(16)]) + inp["mix_bases"]
    pre = torch.sigmoid(m[:, :4]) + hc_pre_eps
    post = torch.sigmoid(m[:, 4:8]) * post_scale
    p = m[:, 8:].view(-1, 4, 4).softmax(-1) + sk_eps
    p = p / (p.sum(-2, keepdim=True) + sk_eps)
    for _ in range(iters - 1):
        p = p / (p.sum(-1, keepdim=True) + sk_eps)
        p = p / (p.sum(-2, keepdim=True) + sk_eps)
    mix = inp["shifted_prev_mix"][..., 0] if shifted else pre
    u = (n.float() * mix[..., None]).sum(1).bfloat16().float()
    y = u * torch.rsqrt(u.square().mean(-1, keepdim=True) + rms_eps) * inp["rmsnorm_weight"].float() * rms_scale
    return n, pre[..., None], post[..., None], p, y.bfloat16()


def _cast_back(data: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    scales = 2.0 ** (packed.contiguous().view(torch.uint8).view(data.shape[0], -1).int() - 127).float()
    return data.float() * scales.repeat_interleave(32, dim=1)


def _call(inp, shifted, t, h, **outs):
    bufs = dict(
        new_residual=torch.empty(t, 4, h, dtype=torch.bfloat16),
        new_prev_mix=torch.empty(t, 4, 1) if shifted else None,
        new_post_mix=torch.empty(t, 4, 1),
        new_comb_res_mix=torch.empty(t, 4, 4),
    )
    deep_gemm.mega_mhc(
        inp["x"], inp["residual"], inp["shifted_prev_mix"], inp["post_mix"], inp["comb_res_mix"], inp["fn"],
        inp["mix_scales"], inp["mix_bases"], 4, 1e-6, 1e-6, 2.0, 1e-6, 10, inp["rmsnorm_weight"], 1e-6, 1.0,
        bufs["new_residual"], bufs["new_prev_mix"], bufs["new_post_mix"], bufs["new_comb_res_mix"], **outs,
    )  # fmt: skip
    return bufs


@pytest.mark.parametrize("shifted", [False, True], ids=["normal", "shifted"])
@pytest.mark.parametrize("t", [1, 65])
def test_matches_upstreams_reference(shifted, t):
    h = 1024
    inp = _inputs(t, h, t + shifted, shifted)
    y = torch.empty(t, h, dtype=torch.bfloat16)
    y8 = torch.empty(t, h, dtype=torch.float8_e4m3fn)
    gemm_sf = torch.empty(h // 128, t, dtype=torch.int32).t()  # column-major, as the TMA layout
    bufs = _call(inp, shifted, t, h, y_bf16=y, y_fp8=y8, y_gemm_sf=gemm_sf)
    n, pre, post, comb, y_ref = _reference(inp, shifted)
    assert calc_diff(bufs["new_residual"], n) < 5e-5
    assert calc_diff(bufs["new_post_mix"], post) < 5e-5 and calc_diff(bufs["new_comb_res_mix"], comb) < 5e-5
    if shifted:
        assert calc_diff(bufs["new_prev_mix"], pre) < 5e-5
    assert calc_diff(y, y_ref) < 5e-5
    data, sf = per_token_cast_to_fp8(y, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)  # of the BF16 y we return
    assert torch.equal(y8.view(torch.uint8), data.view(torch.uint8)) and torch.equal(gemm_sf, sf)
    ref_data, ref_sf = per_token_cast_to_fp8(y_ref, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    assert calc_diff(_cast_back(y8, sf), _cast_back(ref_data, ref_sf)) < 2e-4  # the FP8 outputs, cast back
    again = _call(inp, shifted, t, h, y_bf16=torch.empty_like(y))
    assert torch.equal(again["new_residual"], bufs["new_residual"])


def test_routed_and_shared_scale_layouts_and_fp8_only():
    t, h, block = 300, 2048, 224
    inp = _inputs(t, h, 3, False)
    y8 = torch.empty(t, h, dtype=torch.float8_e4m3fn)
    routed = torch.empty(t, h // 128, dtype=torch.int32)
    rows = -(-t // block) * 256
    storage = torch.zeros(h // 128, rows, dtype=torch.int32).t()  # strides (1, rows)
    # Upstream's test hands the [T, H/128] view of that storage; rows past T are written through it.
    _call(inp, False, t, h, y_fp8=y8, y_routed_sf=routed, y_shared_sf=storage[:t], shared_sf_block_m=block)
    shared = storage
    y = torch.empty(t, h, dtype=torch.bfloat16)
    y8_again = torch.empty_like(y8)
    gemm = torch.empty(t, h // 128, dtype=torch.int32)
    _call(inp, False, t, h, y_bf16=y, y_fp8=y8_again, y_gemm_sf=gemm)
    assert torch.equal(y8.view(torch.uint8), y8_again.view(torch.uint8))  # y_bf16=None gives the same FP8 bits
    assert torch.equal(routed, gemm)
    where = shared_sf_rows(t, block)
    assert torch.equal(shared[where], routed) and len(set(where.tolist())) == t
    assert where[:5].tolist() == [0, 4, 8, 12, 16] and int(where[32]) == 1 and int(where[block]) == 256


def test_duplicated_rows_and_empty():
    h = 1024
    inp = _inputs(2, h, 4, True)
    for k, v in inp.items():
        if v is not None and k not in ("fn", "mix_scales", "mix_bases", "rmsnorm_weight"):
            inp[k] = v[:1].expand(2, *v.shape[1:]).contiguous()
    y = torch.empty(2, h, dtype=torch.bfloat16)
    bufs = _call(inp, True, 2, h, y_bf16=y)
    assert torch.equal(y[0], y[1]) and torch.equal(bufs["new_comb_res_mix"][0], bufs["new_comb_res_mix"][1])
    empty = _inputs(0, h, 5, False)
    _call(empty, False, 0, h, y_bf16=torch.empty(0, h, dtype=torch.bfloat16))


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(h=512), r"argument 'x' size\(1\) \(H\): expected a multiple of 1024, got 512"),
        (dict(no_y=True), r"argument 'y_bf16' value: expected y_bf16 and/or y_fp8 given"),
        (dict(prev_only=True), r"argument 'new_prev_mix' value: expected given together with shifted_prev_mix"),
        (dict(fp8_no_sf=True), r"argument 'y_gemm_sf' value: expected y_gemm_sf alone, or y_routed_sf and y_shared_sf"),
    ],
)
def test_refuses_what_upstream_refuses(change, match):
    h = change.get("h", 1024)
    inp = _inputs(3, h, 6, False)
    outs = {} if change.get("no_y") else {"y_bf16": torch.empty(3, h, dtype=torch.bfloat16)}
    if change.get("fp8_no_sf"):
        outs["y_fp8"] = torch.empty(3, h, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="deep_gemm.mega_mhc: " + match):
        if change.get("prev_only"):
            deep_gemm.mega_mhc(
                inp["x"], inp["residual"], None, inp["post_mix"], inp["comb_res_mix"], inp["fn"], inp["mix_scales"],
                inp["mix_bases"], 4, 1e-6, 1e-6, 2.0, 1e-6, 10, inp["rmsnorm_weight"], 1e-6, 1.0,
                torch.empty(3, 4, h, dtype=torch.bfloat16), torch.empty(3, 4, 1), torch.empty(3, 4, 1),
                torch.empty(3, 4, 4), **outs,
            )  # fmt: skip
        else:
            _call(inp, False, 3, h, **outs)
