"""``tile_kernels.testing.generator``: upstream's test-input generators (``TK_FULL_TEST=1`` adds its extra cases),
on CUDA when there is one, else on the CPU."""

from __future__ import annotations

import os
import random
from collections.abc import Iterable

import torch

from torch_ascend_moe.tile_kernels.config import get_device_num_sms
from torch_ascend_moe.tile_kernels.utils import align


def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _full() -> bool:
    return os.getenv("TK_FULL_TEST") in ("1", "true", "True")


def generate_num_tokens(alignment: int = 1, is_benchmark: bool = False) -> list[int]:
    tokens = [4001, 8001]
    return [align(t, alignment) for t in ([0] + tokens if _full() and not is_benchmark else tokens)]


def generate_hidden_sizes(align: int = 64) -> list[int]:  # noqa: A002  (upstream's parameter name)
    return [h for h in (576, 2048, 2560, 3072, 4096, 6144, 7168) if h % align == 0]


def generate_num_sms() -> list[int]:
    n = get_device_num_sms()
    base = sorted({max(n - 20, 1), n})
    return [1] + base if _full() else base


def generate_moe_params(is_benchmark: bool = False) -> Iterable[dict]:
    full = _full()
    if full and not is_benchmark:
        yield {"num_send_tokens": 0, "num_topk": 1, "num_experts": 1, "num_ep_ranks": 1}
    for num_topk in (2, 6, 8, 9) + ((1, 7) if full else ()):
        for num_experts in (72, 256) + ((288, 384) if full else ()):
            for num_ep_ranks in (8, 64) + ((1, 72, 256) if full else ()):
                if num_experts % num_ep_ranks == 0:
                    yield {"num_send_tokens": 4001, "num_topk": num_topk, "num_experts": num_experts // num_ep_ranks,
                           "num_ep_ranks": num_ep_ranks}  # fmt: skip


def generate_topk_idx(params: dict) -> torch.Tensor:
    """Top-k of random scores over every rank's experts, other ranks' experts set to -1, all -1 rows dropped."""
    tokens, experts, topk, ranks = (params[k] for k in ("num_send_tokens", "num_experts", "num_topk", "num_ep_ranks"))
    if tokens == 0:
        return torch.empty((0, topk), dtype=torch.int64, device=device())
    scores = torch.rand((tokens * ranks, experts * ranks), dtype=torch.bfloat16, device=device())
    idx = torch.topk(scores, k=topk, dim=-1, sorted=False).indices
    idx = torch.where(idx >= experts, -1, idx)
    return idx[~(idx < 0).all(dim=1)].contiguous()


def generate_rand_float(shape: tuple[int, ...]) -> torch.Tensor:
    """FP32 normal values scaled by one random power of two in ``[2^-110, 2^126]`` (non-finite draws redrawn), clamped
    to an eighth of FP32's largest value."""
    scale = float(2 ** random.randint(-110, 126))
    x = torch.randn(shape, dtype=torch.float32, device=device()) * scale
    bad = ~torch.isfinite(x)
    if bad.any():
        x[bad] = torch.randn(int(bad.sum()), dtype=torch.float32, device=device())
    limit = torch.finfo(torch.float32).max / 8
    return torch.clamp(x, -limit, limit)


# E5M6 (1 sign, 5 exponent, 6 mantissa bits, bias 15): min subnormal, max subnormal, min normal.
_E5M6_SPECIAL_VALUES = (2.0**-20, 2.0**-14 * 63 / 64, 2.0**-14)


def generate_e5m6_inputs(num_tokens: int, hidden: int, dtype: torch.dtype) -> Iterable[tuple[torch.Tensor, bool]]:
    """``(x, is_special)``: one random tensor, then one per E5M6 special value (its last column 65024, the max)."""
    yield torch.randn((num_tokens, hidden), dtype=dtype, device=device()), False
    for value in _E5M6_SPECIAL_VALUES:
        x = torch.full((num_tokens, hidden), value, dtype=dtype, device=device())
        x[:, -1] = 65024.0
        yield x, True
