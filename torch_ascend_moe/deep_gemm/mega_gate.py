"""DeepGEMM 2.8's Mega Gate (specs/upstream_2609.md §2): the router GEMM and the top-k gate in one call, over our
ops ``bf16_gemm`` (FP32 logits ``x @ weight^T``, upstream's test reference) and ``moe_topk_gate`` (TileKernels'
gate, which upstream's test takes as the baseline with the same arguments).

Upstream's rules, enforced so code that runs here runs there: BF16 ``x [T, H]`` and ``weight [E, H]``, contiguous,
``H % 256 == 0``, ``0 < E <= 512`` with ``E % 4 == 0``, ``0 < K <= min(E, 32)``; shared experts only with
``use_shared_as_routed`` (``S`` in {1, 2}, ``K % S == 0``), then ``K + S <= 32``; every gate
score finite, masked rows included (the kernel asserts it before applying ``mask``: SGLang zeroes padded rows).
Weights ``u / (sum u + 1e-20) * routed_scaling_factor`` from the unbiased scores; shared slots weigh exactly 1.

``force_random`` rows: upstream draws K random physical experts with positive weights, all K + S of the row's
slots distinct (its RNG is not known); here K from ``torch.randperm`` on the default CPU generator, avoiding the
row's shared slots' experts, each weighing ``routed_scaling_factor / K``, and ``unmapped_topk_idx`` -1, the shared
slots as on every row.
"""

from __future__ import annotations

import math

import torch

from torch_ascend_moe import checks as ck
from torch_ascend_moe.deep_gemm.runtime import get_num_sms
from torch_ascend_moe.distributed import capture
from torch_ascend_moe.ops.gemm import bf16_gemm
from torch_ascend_moe.ops.moe_gate import moe_topk_gate

API = "deep_gemm.bf16_mega_gate"
SCORING = ("sigmoid", "sqrtsoftplus", "identity")
MAX_TOKENS = 1 << 20  # upstream's kNumMaxTokens


def _check(x, weight, num_topk, use_shared_as_routed, num_shared_experts, routed_scaling_factor, ep_rank, scoring):
    for name, t in (("x", x), ("weight", weight)):
        ck.check_rank(API, name, t, 2, "[T, H]" if name == "x" else "[E, H]")
        ck.check_arg(t.dtype == torch.bfloat16, API, name, "dtype", "torch.bfloat16", t.dtype)
        ck.check_arg(t.is_contiguous(), API, name, "layout", "contiguous", "strided")
    T, H = x.shape
    E = weight.shape[0]
    ck.check_arg(H % 256 == 0, API, "x", "size(1) (H)", "a multiple of 256", H)
    ck.check_dim_size(API, "weight", weight, 1, "H", H, "x.size(1)")
    ck.check_arg(0 < E <= 512 and E % 4 == 0, API, "weight", "size(0) (E)", "a multiple of 4 in (0, 512]", E)
    ck.check_arg(0 < num_topk <= min(E, 32), API, "num_topk", "value", f"in (0, min(E, 32)={min(E, 32)}]", num_topk)
    ck.check_arg(T <= MAX_TOKENS, API, "x", "size(0) (T)", "at most 2^20", T)
    ck.check_arg(ep_rank >= 0, API, "ep_rank", "value", "a non-negative integer", ep_rank)
    ck.check_arg(
        math.isfinite(routed_scaling_factor), API, "routed_scaling_factor", "value", "finite", routed_scaling_factor
    )
    ck.check_arg(scoring in SCORING, API, "scoring_func", "value", "'sigmoid', 'sqrtsoftplus' or 'identity'", scoring)
    shared = 0
    if use_shared_as_routed:
        shared = num_shared_experts
        ck.check_arg(shared in (1, 2), API, "num_shared_experts", "value", "1 or 2 (use_shared_as_routed)", shared)
        ck.check_arg(
            num_topk % shared == 0, API, "num_topk", "value", f"a multiple of num_shared_experts={shared}", num_topk
        )
    ck.check_arg(num_topk + shared <= 32, API, "num_topk", "value", "num_topk + shared slots <= 32", num_topk + shared)
    return T, E, shared


def _check_finite(logits: torch.Tensor) -> None:
    """Upstream's kernel asserts every GEMM score is finite before it applies the mask (a host read here, skipped
    while a graph is captured)."""
    if not capture.host_readable(logits) or logits.numel() == 0:
        return
    bad = ~torch.isfinite(logits).all(dim=1)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise ValueError(
            ck.message(
                API,
                "x",
                "values",
                "finite gate scores x @ weight^T on every row, masked rows included (zero padded rows first)",
                f"a non-finite score in row {row}",
            )
        )


def _physical(idx, to_physical_map, logical_count, ep_rank: int, logical: int) -> torch.Tensor:
    """Each logical slot's replica ``to_physical_map[l, (ep_rank + t * 23333) % logical_count[l]]`` for token ``t``
    (TileKernels' rule; ``moe_topk_gate`` has it too, tied to its EP-rank bookkeeping, which Mega Gate has not)."""
    for name, t, rank in (("to_physical_map", to_physical_map, 2), ("logical_count", logical_count, 1)):
        ok = t is not None and t.dtype == torch.int32 and t.dim() == rank
        what = f"an int32 {rank}-D tensor (to_physical_map and logical_count go together)"
        ck.check_arg(ok, API, name, "value", what, "None" if t is None else lambda t=t: f"{t.dtype} {t.dim()}-D")
    ck.check_dim_size(API, "to_physical_map", to_physical_map, 0, "E + S", logical, "experts + shared slots")
    ck.check_dim_size(API, "logical_count", logical_count, 0, "E + S", logical, "experts + shared slots")
    if capture.host_readable(logical_count):
        count = logical_count.tolist()
        ok = all(1 <= c <= to_physical_map.shape[1] for c in count)
        ck.check_arg(ok, API, "logical_count", "values", f"in [1, {to_physical_map.shape[1]}]", count)
    valid = idx >= 0
    lg = idx.clamp(min=0)
    token = torch.arange(idx.shape[0], device=idx.device)[:, None]
    replica = (ep_rank + token * 23333) % logical_count.long()[lg]
    return torch.where(valid, to_physical_map.long()[lg, replica], idx)


def _force_random(idx, weights, unmapped, rows, num_topk, num_physical, scale):
    """K random physical experts on the ``rows`` tokens' routed slots, distinct from each other and from the row's
    shared slots' physical experts (upstream's test requires all K + S distinct; module docstring)."""
    where = rows.nonzero().flatten().tolist()
    if not where:
        return idx, weights, unmapped
    idx, weights, unmapped = idx.clone(), weights.clone(), unmapped.clone()
    for t in where:
        taken = torch.tensor(idx[t, num_topk:].tolist(), dtype=torch.long)
        perm = torch.randperm(num_physical)
        free = perm[~torch.isin(perm, taken)][:num_topk]
        idx[t, :num_topk] = free.to(idx.device, idx.dtype)
    weights[where, :num_topk] = scale / num_topk
    unmapped[where] = -1
    return idx, weights, unmapped


def bf16_mega_gate(
    x: torch.Tensor,
    weight: torch.Tensor,
    num_topk: int,
    use_shared_as_routed: bool,
    num_shared_experts: int,
    routed_scaling_factor: float,
    ep_rank: int,
    scoring_func: str = "identity",
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    image_bias: torch.Tensor | None = None,
    image_token_mask: torch.Tensor | None = None,
    fix_routing_mask: torch.Tensor | None = None,
    to_physical_map: torch.Tensor | None = None,
    logical_count: torch.Tensor | None = None,
    unmapped_topk_idx: torch.Tensor | None = None,
    force_random: torch.Tensor | None = None,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(topk_idx int64 [T, K + S], topk_weights FP32 [T, K + S])`` of the gate ``x @ weight^T`` (module docstring).
    ``unmapped_topk_idx`` (int64 ``[T, K]``, if given) receives the logical top-K (-1 on masked rows) in place; with
    ``fix_routing_mask`` its rows are read as the routing of those tokens. ``out`` receives the results in place."""
    T, E, shared = _check(
        x, weight, num_topk, use_shared_as_routed, num_shared_experts, routed_scaling_factor, ep_rank, scoring_func
    )
    ck.check_arg(
        fix_routing_mask is None or unmapped_topk_idx is not None,
        API,
        "unmapped_topk_idx",
        "value",
        "a tensor with fix_routing_mask",
        None,
    )
    if unmapped_topk_idx is not None:
        ck.check_arg(
            unmapped_topk_idx.dim() == 2 and unmapped_topk_idx.stride(1) == 1,
            API,
            "unmapped_topk_idx",
            "layout",
            "[T, num_topk] with unit column stride",
            lambda: f"strides {tuple(unmapped_topk_idx.stride())}",
        )
    if out is not None:
        ck.check_arg(
            len(out) == 2 and all(t.is_contiguous() and t.shape == (T, num_topk + shared) for t in out),
            API,
            "out",
            "value",
            f"(int64 [{T}, {num_topk + shared}], FP32 [{T}, {num_topk + shared}]), contiguous",
            lambda: [f"{t.dtype} {ck.shape_str(t.shape)}" for t in out],
        )
    logits = bf16_gemm(x, weight, out_dtype=torch.float32)  # x @ weight^T, FP32
    _check_finite(logits)
    weights, idx, unmapped, _ = moe_topk_gate(
        logits,
        bias,
        num_topk,
        scoring_func=scoring_func,
        routed_scaling_factor=float(routed_scaling_factor),
        mask=mask,
        fix_routing_mask=fix_routing_mask,
        unmapped_topk_idx=unmapped_topk_idx,
        image_bias=image_bias,
        image_token_mask=image_token_mask,
        clamp_denominator=False,  # sum u + 1e-20, upstream's (and the Ascend-era TileKernels') rule
    )
    if shared:  # logical ids E..E+S-1 of weight exactly 1 (moe_topk_gate's own shared slots need a replica map)
        active = (torch.ones(T, dtype=torch.bool, device=idx.device) if mask is None else mask)[:, None]
        slots = torch.arange(E, E + shared, device=idx.device).expand(T, shared)
        idx = torch.cat([idx, torch.where(active, slots, -1)], dim=1)
        weights = torch.cat([weights, active.to(weights.dtype).expand(T, shared)], dim=1)
    if to_physical_map is not None or logical_count is not None:
        idx = _physical(idx, to_physical_map, logical_count, ep_rank, E + shared)
    if force_random is not None:
        ck.check_arg(
            force_random.dtype == torch.bool and force_random.shape == (T,),
            API,
            "force_random",
            "value",
            f"bool [{T}]",
            lambda: f"{force_random.dtype} {ck.shape_str(force_random.shape)}",
        )
        rows = force_random if mask is None else force_random & mask
        physical = int(logical_count.sum()) if logical_count is not None else E
        idx, weights, unmapped = _force_random(
            idx, weights, unmapped, rows, num_topk, physical, float(routed_scaling_factor)
        )
    if unmapped_topk_idx is not None:
        unmapped_topk_idx.copy_(unmapped)
    if out is not None:
        out[0].copy_(idx)
        out[1].copy_(weights)
        return out[0], out[1]
    return idx, weights


def get_bf16_mega_gate_config(num_tokens: int, hidden: int, num_routed_experts: int, num_topk: int) -> dict:
    """Upstream's launch configuration's keys. Our gate has no launch tuning: the values describe what it runs (one
    GEMM over every token and expert, no split K, so it is batch-invariant as upstream is under deterministic
    mode) and ``num_sms`` is ``get_num_sms()``, which is what clients read (vLLM warms each config by it)."""
    api = "deep_gemm.get_bf16_mega_gate_config"
    for name, value in (("num_tokens", num_tokens), ("hidden", hidden), ("num_routed_experts", num_routed_experts)):
        ck.check_int_arg(api, name, value, 0 if name == "num_tokens" else 1)
    ck.check_int_arg(api, "num_topk", num_topk, 1)
    return {
        "block_tokens": max(1, min(num_tokens, 128)),
        "num_mma_ctas": 1,
        "num_split_k": 1,
        "num_expert_groups": 1,
        "num_gate_warpgroups": 1,
        "num_sms": get_num_sms(),
    }
