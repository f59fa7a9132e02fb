"""Sample inputs, reference, bad inputs and the harness spec of ``rotary_embedding``.

Shapes follow TileKernels' RoPE use: 3-D token-major queries with positions (int32 and int64) and an offset, 4-D
batches without positions, rot 64 and 128 (small: 8), NeoX and GPT-J pairings, the inverse rotation. The reference
rotates pair by pair in FP64 from the cache's values (§10.5).
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.portable import rope as portable
from torch_ascend_moe.testing.harness import BadInput, OpSpec, SampleInput

# (shape, rows in the cache, positions dtype or None, offset, interleaved, conjugate)
_CASES = [
    ([19, 4, 64], 64, torch.int64, 3, False, False),
    ([2, 7, 3, 128], 16, None, 5, True, False),
    ([11, 2, 64], 32, torch.int32, 0, True, True),
    ([0, 2, 64], 4, torch.int64, 0, False, False),
]
_CASES_SMALL = [([5, 2, 8], 9, torch.int64, 1, False, True), ([2, 3, 1, 8], 6, None, 2, True, False)]


def samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(21)
    out = []
    for shape, rows, pos_dtype, offset, interleaved, conjugate in _CASES_SMALL if small else _CASES:
        rot = shape[-1]
        x = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
        angle = torch.rand(rows, rot // 2, generator=g, dtype=torch.float64) * 6.3
        cache = torch.cat([angle.cos(), angle.sin()], 1).to(torch.float64 if dtype == torch.float64 else torch.float32)
        positions = None
        if pos_dtype is not None:
            positions = torch.randint(0, rows - offset, shape[:-2], generator=g).to(pos_dtype)
        args = (
            x.to(device).requires_grad_(requires_grad), cache.to(device),
            None if positions is None else positions.to(device), offset, interleaved, conjugate,
        )  # fmt: skip
        out.append(SampleInput(args, f"{shape} rows{rows} pos{pos_dtype} off{offset} il{interleaved} cj{conjugate}"))
    return out


def reference(x, cos_sin_cache, positions, seqlen_offset, interleaved, conjugate):
    x = x.detach().cpu().double()
    cache = cos_sin_cache.detach().cpu().double()
    rot = x.shape[-1]
    out = torch.empty_like(x)
    flat, rows = x.reshape(-1, x.shape[-2], rot), []
    if positions is not None:
        rows = (positions.cpu().long().flatten() + seqlen_offset).tolist()
    else:
        seq = x.shape[-3]
        rows = [seqlen_offset + (t % seq) for t in range(flat.shape[0])]
    result = out.view(-1, x.shape[-2], rot)
    for t, row in enumerate(rows):
        cos, sin = cache[row, : rot // 2], cache[row, rot // 2 :]
        if conjugate:
            sin = -sin
        for i in range(rot // 2):
            a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + rot // 2)
            x1, x2 = flat[t, :, a], flat[t, :, b]
            result[t, :, a] = x1 * cos[i] - x2 * sin[i]
            result[t, :, b] = x1 * sin[i] + x2 * cos[i]
    return out


def bad_inputs(device) -> list[BadInput]:
    x = torch.randn(6, 2, 8)
    cache = torch.randn(10, 8)
    pos = torch.arange(6)
    return [
        BadInput((x[0], cache, None, 0, False, False), r"rotary_embedding: argument 'x' rank: expected 3-D", "rank"),
        BadInput((x, cache[:, :6], None, 0, False, False), r"argument 'x' size\(2\) \(rot\): expected 6", "rot"),
        BadInput((x, cache.double(), None, 0, False, False), r"argument 'cos_sin_cache' dtype: expected torch.float32",
                 "cache dtype"),
        BadInput((x, cache[:, :7], None, 0, False, False), r"argument 'cos_sin_cache' size\(1\): expected an even",
                 "odd rot"),
        BadInput((x, cache, pos[:4], 0, False, False), r"argument 'positions' shape: expected \[6\]", "pos shape"),
        BadInput((x, cache, pos.float(), 0, False, False), r"argument 'positions' dtype: expected torch.int32 or",
                 "pos dtype"),
        BadInput((x, cache, None, 5, False, False), r"argument 'cos_sin_cache' size\(0\): expected at least "
                 r"seqlen_offset \+ tokens = 11, got 10", "short cache"),
        BadInput((x, cache, None, -1, False, False), r"argument 'seqlen_offset' value: expected a non-negative", "off"),
        BadInput((x, cache, pos + 5, 0, False, False), r"argument 'positions' values: expected positions \+ "
                 r"seqlen_offset in \[0, 10\), got \[5, 10\]", "pos values", data_dependent=True),
    ]  # fmt: skip


SPECS = [
    OpSpec(
        "rotary_embedding",
        samples,
        reference,
        bad_inputs,
        portable.rotary_embedding,
    )
]
