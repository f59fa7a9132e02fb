"""DeepGEMM 2.8's Mega mHC (specs/upstream_2609.md §3): one hyper-connection step between two layers, the post step
of the previous layer (new residual streams), the pre step of the next (mixes, Sinkhorn) and its RMSNorm input, with
an optional FP8 cast, written into the caller's buffers. Over our mHC pipeline (``ops/mhc.py``: ``mhc_post``,
``mhc_pre_split_mixes``, ``sinkhorn_normalize``, ``mhc_pre_apply_mix``), the projection as an FP32 GEMM (upstream's
reference runs it with TF32 off, unlike TileKernels' pre-norm GEMM) and ``per_token_cast_to_fp8``.

Per token, with routes ``i, j`` in 0..3: ``N = bf16(x·post_mix[j] + Σ_i comb_res_mix[i, j]·residual[i])`` (the new
residual); ``m = flatten(N)·fn^T · rsqrt(Σ N² / 4H + hc_norm_eps)`` scaled by ``mix_scales`` (4, 4, 16 entries) plus
``mix_bases``; ``new_prev_mix = sigmoid(m[:4]) + hc_pre_eps``, ``new_post_mix = sigmoid(m[4:8])·hc_post_scale``,
``new_comb_res_mix`` = Sinkhorn of ``m[8:]``; the layer input ``u = bf16(Σ_j N[j]·mix[j])`` with the carried
``shifted_prev_mix`` (shifted mode) or the new pre mix; ``y = bf16(u·rsqrt(mean u² + rmsnorm_eps)·weight·scale)``;
FP8: ``per_token_cast_to_fp8(y, UE8M0, 32, packed)`` of the rounded BF16 ``y``, its int32 scales ``[T, H/128]`` into
``y_gemm_sf`` (any strides), ``y_routed_sf`` (row-major), and/or ``y_shared_sf`` (Mega MoE's shared-expert rows:
token ``t`` at ``(t//B)·align(B,128) + (t%B)//128·128 + (t%B)%32·4 + ((t%B)%128)//32``, ``B = shared_sf_block_m``).
"""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck
from torch_ascend_moe.ops.gemm import bf16_gemm
from torch_ascend_moe.ops.mhc import mhc_post, mhc_pre_apply_mix, mhc_pre_split_mixes, sinkhorn_normalize
from torch_ascend_moe.quant import per_token_cast_to_fp8

API = "deep_gemm.mega_mhc"
_ROUTES = 4
_MIXES = _ROUTES * (_ROUTES + 2)
_MAX_TOKENS = 1 << 20


def _check_tensor(name: str, t, shape: list, dtype: torch.dtype) -> None:
    ck.check_arg(t is not None, API, name, "value", "a tensor", None)
    ck.check_arg(t.dtype == dtype, API, name, "dtype", dtype, t.dtype)
    ck.check_arg(list(t.shape) == shape, API, name, "shape", ck.shape_str(shape), lambda: ck.shape_str(t.shape))


def shared_sf_rows(tokens: int, block_m: int, device=None) -> torch.Tensor:
    """Row of each token in Mega MoE's shared-expert scale layout (module docstring)."""
    t = torch.arange(tokens, device=device)
    aligned = -(-block_m // 128) * 128
    local = t % block_m
    return (t // block_m) * aligned + local // 128 * 128 + local % 32 * 4 + (local % 128) // 32


def mega_mhc(
    x: torch.Tensor,
    residual: torch.Tensor,
    shifted_prev_mix: torch.Tensor | None,
    post_mix: torch.Tensor,
    comb_res_mix: torch.Tensor,
    fn: torch.Tensor,
    mix_scales: torch.Tensor,
    mix_bases: torch.Tensor,
    hc_mult: int,
    hc_norm_eps: float,
    hc_pre_eps: float,
    hc_post_scale: float,
    sinkhorn_eps: float,
    num_sinkhorn_iters: int,
    rmsnorm_weight: torch.Tensor,
    rmsnorm_eps: float,
    rmsnorm_scale: float,
    new_residual: torch.Tensor,
    new_prev_mix: torch.Tensor | None,
    new_post_mix: torch.Tensor,
    new_comb_res_mix: torch.Tensor,
    y_bf16: torch.Tensor | None = None,
    y_fp8: torch.Tensor | None = None,
    y_gemm_sf: torch.Tensor | None = None,
    y_routed_sf: torch.Tensor | None = None,
    y_shared_sf: torch.Tensor | None = None,
    shared_sf_block_m: int = 0,
) -> None:
    """Writes ``new_residual``, ``new_post_mix``, ``new_comb_res_mix``, ``new_prev_mix`` (shifted mode), ``y_bf16``
    and/or ``y_fp8`` with its scales (module docstring); returns None as upstream."""
    ck.check_arg(hc_mult == _ROUTES, API, "hc_mult", "value", _ROUTES, hc_mult)
    ck.check_rank(API, "x", x, 2, "[T, H]")
    T, H = x.shape
    ck.check_arg(H % 1024 == 0, API, "x", "size(1) (H)", "a multiple of 1024", H)
    ck.check_arg(T <= _MAX_TOKENS, API, "x", "size(0) (T)", "at most 2^20", T)
    ck.check_int_arg(API, "num_sinkhorn_iters", num_sinkhorn_iters, 1)
    f32, bf16 = torch.float32, torch.bfloat16
    _check_tensor("x", x, [T, H], bf16)
    _check_tensor("residual", residual, [T, _ROUTES, H], bf16)
    _check_tensor("post_mix", post_mix, [T, _ROUTES, 1], f32)
    _check_tensor("comb_res_mix", comb_res_mix, [T, _ROUTES, _ROUTES], f32)
    _check_tensor("fn", fn, [_MIXES, _ROUTES * H], f32)
    _check_tensor("mix_scales", mix_scales, [3], f32)
    _check_tensor("mix_bases", mix_bases, [_MIXES], f32)
    _check_tensor("rmsnorm_weight", rmsnorm_weight, [H], bf16)
    _check_tensor("new_residual", new_residual, [T, _ROUTES, H], bf16)
    _check_tensor("new_post_mix", new_post_mix, [T, _ROUTES, 1], f32)
    _check_tensor("new_comb_res_mix", new_comb_res_mix, [T, _ROUTES, _ROUTES], f32)
    shifted = shifted_prev_mix is not None
    ck.check_arg(
        shifted == (new_prev_mix is not None),
        API,
        "new_prev_mix",
        "value",
        "given together with shifted_prev_mix (both or neither)",
        "a tensor" if new_prev_mix is not None else None,
    )
    if shifted:
        _check_tensor("shifted_prev_mix", shifted_prev_mix, [T, _ROUTES, 1], f32)
        _check_tensor("new_prev_mix", new_prev_mix, [T, _ROUTES, 1], f32)
    ck.check_arg(y_bf16 is not None or y_fp8 is not None, API, "y_bf16", "value", "y_bf16 and/or y_fp8 given", None)
    if y_bf16 is not None:
        _check_tensor("y_bf16", y_bf16, [T, H], bf16)
    if y_fp8 is not None:
        _check_tensor("y_fp8", y_fp8, [T, H], torch.float8_e4m3fn)
        one_way = (y_gemm_sf is not None) != (y_routed_sf is not None and y_shared_sf is not None)
        ck.check_arg(
            one_way and (y_gemm_sf is None or (y_routed_sf is None and y_shared_sf is None)),
            API,
            "y_gemm_sf",
            "value",
            "y_gemm_sf alone, or y_routed_sf and y_shared_sf together, with y_fp8",
            "another combination",
        )
        for name, t in (("y_gemm_sf", y_gemm_sf), ("y_routed_sf", y_routed_sf)):
            if t is not None:
                _check_tensor(name, t, [T, H // 128], torch.int32)
        if y_shared_sf is not None:
            ck.check_arg(shared_sf_block_m > 0, API, "shared_sf_block_m", "value", "> 0 with y_shared_sf", 0)
            rows = -(-T // shared_sf_block_m) * (-(-shared_sf_block_m // 128) * 128)
            # Upstream's test passes a [T, H/128] view with strides (1, rows) of a longer storage and the kernel
            # writes rows past T through it: the view's strides and storage must hold ``rows`` rows.
            s0, s1 = y_shared_sf.stride() if y_shared_sf.dim() == 2 else (0, 0)
            room = y_shared_sf.untyped_storage().nbytes() // 4 - y_shared_sf.storage_offset()
            ok = (
                y_shared_sf.dtype == torch.int32
                and y_shared_sf.dim() == 2
                and y_shared_sf.shape[1] == H // 128
                and s0 == 1
                and s1 >= rows
                and room >= (H // 128 - 1) * s1 + rows
            )
            ck.check_arg(
                ok,
                API,
                "y_shared_sf",
                "layout",
                f"int32 [T, {H // 128}] with strides (1, >= {rows}) over storage for {rows} rows (Mega MoE's "
                "shared-expert scale rows)",
                lambda: f"{y_shared_sf.dtype} {ck.shape_str(y_shared_sf.shape)} strides {tuple(y_shared_sf.stride())}",
            )
    if T == 0:
        return None
    n = mhc_post(x, residual, post_mix, comb_res_mix)  # [T, 4, H] BF16, rounded once
    flat = n.float().flatten(1)
    # Upstream's reference: flatten(N) @ fn^T in FP32 (TF32 off), scaled by rsqrt(mean of N^2 + eps).
    mixes = (
        bf16_gemm(flat, fn, out_dtype=f32) * (flat.square().sum(-1, keepdim=True) / (_ROUTES * H) + hc_norm_eps).rsqrt()
    )
    pre, post, comb = mhc_pre_split_mixes(mixes, mix_scales, mix_bases, _ROUTES, hc_post_scale, hc_pre_eps)
    comb = sinkhorn_normalize(comb, num_sinkhorn_iters, sinkhorn_eps)
    u = mhc_pre_apply_mix(n, shifted_prev_mix if shifted else pre).float()  # BF16-rounded, in FP32
    y = (u * (u.square().mean(-1, keepdim=True) + rmsnorm_eps).rsqrt() * (rmsnorm_weight.float() * rmsnorm_scale)).to(
        bf16
    )
    new_residual.copy_(n)
    new_post_mix.copy_(post)
    new_comb_res_mix.copy_(comb)
    if shifted:
        new_prev_mix.copy_(pre)
    if y_bf16 is not None:
        y_bf16.copy_(y)
    if y_fp8 is not None:
        data, sf = per_token_cast_to_fp8(y, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
        y_fp8.copy_(data)
        if y_gemm_sf is not None:
            y_gemm_sf.copy_(sf)
        if y_routed_sf is not None:
            y_routed_sf.copy_(sf)
        if y_shared_sf is not None:
            rows = -(-T // shared_sf_block_m) * (-(-shared_sf_block_m // 128) * 128)
            full = y_shared_sf.as_strided((rows, H // 128), y_shared_sf.stride())
            full[shared_sf_rows(T, shared_sf_block_m, sf.device)] = sf
    return None
