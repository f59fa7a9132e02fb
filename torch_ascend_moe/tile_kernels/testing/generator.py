"""``tile_kernels.testing.generator``: upstream's test-input generators (``TK_FULL_TEST=1`` adds its extra cases)
and the Ascend era's (by test level, ``TK_TEST_LEVEL``), where upstream's tests allocate (``config.get_device``)."""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Iterable

import torch

from torch_ascend_moe.tile_kernels.config import get_device, get_device_num_sms
from torch_ascend_moe.tile_kernels.utils import align


def _full() -> bool:
    return os.getenv("TK_FULL_TEST") in ("1", "true", "True")


def get_test_level() -> int:
    """The Ascend era's test level (``TK_TEST_LEVEL``: 0 core, 1 default, 2 full)."""
    level = int(os.getenv("TK_TEST_LEVEL", "1"))
    if level not in (0, 1, 2):
        raise ValueError(f"TK_TEST_LEVEL must be 0, 1 or 2, got {level}")
    return level


def is_precompile() -> bool:
    """The Ascend era's kernel-precompilation run (``TK_PRECOMPILE=1``): one small case per test."""
    return os.getenv("TK_PRECOMPILE", "0") == "1"


def _ascend_era(args: tuple, kwargs: dict, keywords: tuple[str, ...]) -> bool:
    """Whether a generator call is the Ascend era's (a test level first) rather than v1's: it names one of the
    Ascend era's keywords, passes two positional arguments, one beside ``alignment=`` (v1's first positional is the
    alignment), or one level (0, 1 or 2) alone."""
    if any(k in kwargs for k in keywords) or len(args) == 2 or (len(args) == 1 and "alignment" in kwargs):
        return True
    return len(args) == 1 and not kwargs and not isinstance(args[0], bool) and args[0] in (0, 1, 2)


def generate_num_tokens(*args, **kwargs) -> list[int]:
    """v1's ``(alignment=1, is_benchmark=False)`` or the Ascend era's ``(level, alignment=1, backward_only=False)``
    (see ``_ascend_era``; a lone 1 or 2 is read as a level)."""
    if _ascend_era(args, kwargs, ("level", "backward_only")):
        return _num_tokens_by_level(*args, **kwargs)
    return _num_tokens(*args, **kwargs)


def _num_tokens(alignment: int = 1, is_benchmark: bool = False) -> list[int]:
    tokens = [4001, 8001]
    return [align(t, alignment) for t in ([0] + tokens if _full() and not is_benchmark else tokens)]


def _num_tokens_by_level(level: int, alignment: int = 1, backward_only: bool = False) -> list[int]:
    if is_precompile():
        return [align(128, alignment)]
    tokens = [8001] if level == 0 and backward_only else [512, 8001]
    return [align(t, alignment) for t in ([0, 1] + tokens if level >= 2 else tokens)]


def generate_hidden_sizes(align: int = 64) -> list[int]:  # noqa: A002  (upstream's parameter name)
    return [h for h in (576, 2048, 2560, 3072, 4096, 6144, 7168) if h % align == 0]


def generate_num_sms(level: int | None = None) -> list[int]:
    """v1's ``()`` (``TK_FULL_TEST`` adds 1) or the Ascend era's ``(level)``: the device's count and fewer; never
    below 1 (here the CPU count stands for the device's)."""
    n = get_device_num_sms()
    if level is None:
        base = sorted({max(n - 20, 1), n})
        return [1] + base if _full() else base
    sms = [n]
    if level >= 1:
        sms = [max(n - 19, 1)] + sms
    if level >= 2:
        sms = [1] + sms
    return list(dict.fromkeys(sms))


def generate_moe_params(level: int | bool = False, is_benchmark: bool | None = None) -> Iterable[dict]:
    """v1's ``(is_benchmark=False)`` (positional or by keyword) or the Ascend era's ``(level)`` (an int that is not
    a bool)."""
    if is_benchmark is not None or isinstance(level, bool):
        benchmark = level if is_benchmark is None else is_benchmark
        yield from _moe_params(full=_full(), with_empty=_full() and not benchmark)
        return
    if level == 0:
        yield {"num_send_tokens": 4001, "num_topk": 6, "num_experts": 32, "num_ep_ranks": 8}
        yield {"num_send_tokens": 4001, "num_topk": 8, "num_experts": 4, "num_ep_ranks": 64}
        return
    if level >= 2:
        yield {"num_send_tokens": 0, "num_topk": 1, "num_experts": 1, "num_ep_ranks": 1}
        yield {"num_send_tokens": 1, "num_topk": 8, "num_experts": 256, "num_ep_ranks": 8}
    yield from _moe_params(full=level >= 2, with_empty=False)


def _moe_params(full: bool, with_empty: bool) -> Iterable[dict]:
    if with_empty:
        yield {"num_send_tokens": 0, "num_topk": 1, "num_experts": 1, "num_ep_ranks": 1}
    for num_topk in (2, 6, 8, 9) + ((1, 7) if full else ()):
        for num_experts in (72, 256) + ((288, 384) if full else ()):
            for num_ep_ranks in (8, 64) + ((1, 72, 256) if full else ()):
                if num_experts % num_ep_ranks == 0:
                    yield {"num_send_tokens": 4001, "num_topk": num_topk, "num_experts": num_experts // num_ep_ranks,
                           "num_ep_ranks": num_ep_ranks}  # fmt: skip


def generate_samples(level: int, **dimensions) -> Iterable[dict]:
    """The Ascend era's parameter sampling: every combination at level 2; below, as many samples as the longest
    dimension, sample i taking each dimension's value i (cycling)."""
    keys, values = list(dimensions), [list(v) for v in dimensions.values()]
    if level >= 2:
        for combo in itertools.product(*values):
            yield dict(zip(keys, combo))
        return
    for i in range(max((len(v) for v in values), default=0)):
        yield {k: v[i % len(v)] for k, v in zip(keys, values)}


def generate_cast_config(level: int, fmt: str) -> list[tuple[bool, bool, bool]]:
    """``(use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)`` layouts to test a cast to ``fmt`` in."""
    if fmt in ("fp32", "bf16"):
        return [(False, False, False)]
    configs = [(True, True, True)]
    return [(False, True, False), (False, False, False)] + configs if level >= 1 else configs


def generate_psum_layout(params: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """``(row mask [rows], psum [experts])`` of a random psum layout (the Ascend era's): top-k routing of
    ``num_send_tokens * num_ep_ranks`` tokens over every rank's experts, this rank's counts aligned to
    ``alignment``; ``psum`` holds each expert's start plus its count (its block's first padding row)."""
    tokens, experts = params["num_send_tokens"], params["num_experts"]
    topk, ranks, alignment = params["num_topk"], params["num_ep_ranks"], params["alignment"]
    dev = get_device()
    if is_precompile():
        mask = torch.zeros(alignment, dtype=torch.bool, device=dev)
        mask[0] = True
        psum = torch.full((experts,), alignment, dtype=torch.int32, device=dev)
        psum[0] = 1
        return mask, psum
    if tokens == 0:
        return torch.empty(0, dtype=torch.bool, device=dev), torch.zeros(experts, dtype=torch.int32, device=dev)
    scores = torch.rand((tokens * ranks, experts * ranks), dtype=torch.bfloat16, device=dev)
    idx = torch.topk(scores, k=topk, dim=-1, sorted=False).indices
    counts = torch.bincount(idx[idx < experts], minlength=experts)
    aligned = (counts + alignment - 1) // alignment * alignment
    ends = torch.cumsum(aligned, dim=0, dtype=torch.int32)
    starts = ends - aligned
    rows = torch.arange(int(ends[-1]), device=dev)
    block = torch.searchsorted(ends.long(), rows, right=True)
    mask = rows < starts.long()[block.clamp(max=experts - 1)] + counts[block.clamp(max=experts - 1)]
    return mask, (starts + counts).to(torch.int32)


def generate_topk_idx(params: dict) -> torch.Tensor:
    """Top-k of random scores over every rank's experts, other ranks' experts set to -1, all -1 rows dropped."""
    tokens, experts, topk, ranks = (params[k] for k in ("num_send_tokens", "num_experts", "num_topk", "num_ep_ranks"))
    if tokens == 0:
        return torch.empty((0, topk), dtype=torch.int64, device=get_device())
    scores = torch.rand((tokens * ranks, experts * ranks), dtype=torch.bfloat16, device=get_device())
    idx = torch.topk(scores, k=topk, dim=-1, sorted=False).indices
    idx = torch.where(idx >= experts, -1, idx)
    return idx[~(idx < 0).all(dim=1)].contiguous()


def generate_rand_float(shape: tuple[int, ...]) -> torch.Tensor:
    """FP32 normal values scaled by one random power of two in ``[2^-110, 2^126]`` (non-finite draws redrawn), clamped
    to an eighth of FP32's largest value."""
    scale = float(2 ** random.randint(-110, 126))
    x = torch.randn(shape, dtype=torch.float32, device=get_device()) * scale
    bad = ~torch.isfinite(x)
    if bad.any():
        x[bad] = torch.randn(int(bad.sum()), dtype=torch.float32, device=get_device())
    limit = torch.finfo(torch.float32).max / 8
    return torch.clamp(x, -limit, limit)


# E5M6 (1 sign, 5 exponent, 6 mantissa bits, bias 15): min subnormal, max subnormal, min normal.
_E5M6_SPECIAL_VALUES = (2.0**-20, 2.0**-14 * 63 / 64, 2.0**-14)


def generate_e5m6_inputs(num_tokens: int, hidden: int, dtype: torch.dtype) -> Iterable[tuple[torch.Tensor, bool]]:
    """``(x, is_special)``: one random tensor, then one per E5M6 special value (its last column 65024, the max)."""
    yield torch.randn((num_tokens, hidden), dtype=dtype, device=get_device()), False
    for value in _E5M6_SPECIAL_VALUES:
        x = torch.full((num_tokens, hidden), value, dtype=dtype, device=get_device())
        x[:, -1] = 65024.0
        yield x, True
