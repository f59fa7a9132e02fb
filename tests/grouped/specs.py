"""Sample inputs, fp64 references, bad inputs and harness specs of the grouped family.

Layouts cover DeepGEMM's cases scaled down: psum with and without alignment gaps, per-row ids with -1
padding rows, empty groups, one group holding every token, and MN-major expert weights. Rows of ``a``
outside every group (and beyond ``masked_m``) hold large values: a kernel that read them as valid rows
would be far off the reference, which is zero there.
"""

from __future__ import annotations

import torch

from tests.fp8_gemm.specs import _FORMATS, quantize
from torch_ascend_moe import quant
from torch_ascend_moe.backends.portable import grouped as portable
from torch_ascend_moe.checks.grouped import K_GROUPED, M_GROUPED, layout_segments
from torch_ascend_moe.quant.reference import dequantized
from torch_ascend_moe.testing.harness import FP8_TENSOR_CORES, BadInput, OpSpec, SampleInput

_POISON = 1e4  # scale of the values placed in rows no group owns


def _int32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def psum_layout(counts: list[int], alignment: int) -> tuple[torch.Tensor, int]:
    """(cumulative ends, total rows) of groups of ``counts`` rows starting at multiples of ``alignment``."""
    ends, end = [], 0
    for count in counts:
        end = -(-end // alignment) * alignment + count
        ends.append(end)
    return _int32(ends), -(-end // alignment) * alignment


def ids_layout(counts: list[int], alignment: int) -> torch.Tensor:
    """Per-row group ids of the same segments, -1 on padding rows (DeepGEMM's m_indices)."""
    ids = []
    for g, count in enumerate(counts):
        ids += [g] * count + [-1] * ((-count) % alignment)
    return _int32(ids)


# (counts per group, alignment, psum, b MN-major)
_M_CASES = [
    ([5, 0, 9, 3], 1, True, False),
    ([5, 0, 9, 3], 8, True, True),
    ([6, 2, 0, 7], 4, False, False),
    ([0, 17, 0], 1, True, False),  # one group holds every token
    ([0, 0], 1, True, False),  # no tokens at all
]
_M_CASES_SMALL = [([2, 0, 3], 1, True, False), ([3, 1], 4, False, True), ([1, 2], 2, True, False)]


def _rows_of(layout, psum, alignment, rows, groups) -> torch.Tensor:
    """Boolean mask of rows some group owns."""
    owned = torch.zeros(rows, dtype=torch.bool)
    for _, begin, end in layout_segments(M_GROUPED, layout, psum, alignment, rows, groups):
        owned[begin:end] = True
    return owned


def m_grouped_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(20)
    n, k = (6, 16) if small else (40, 96)
    samples = []
    for counts, alignment, psum, mn_major in _M_CASES_SMALL if small else _M_CASES:
        layout, rows = psum_layout(counts, alignment) if psum else (ids_layout(counts, alignment), None)
        rows = rows if psum else layout.numel()
        a = torch.randn(rows, k, generator=g)
        owned = _rows_of(layout, psum, alignment, rows, len(counts))
        a[~owned] = _POISON * torch.randn(int((~owned).sum()), k, generator=g)
        b = torch.randn(len(counts), n, k, generator=g)
        if mn_major:
            b = b.transpose(1, 2).contiguous().transpose(1, 2)
        a, b = a.to(dtype).to(device), b.to(dtype).to(device)
        a.requires_grad_(requires_grad)
        b.requires_grad_(requires_grad)
        name = f"{'psum' if psum else 'ids'} counts={counts} align={alignment}{' bT' if mn_major else ''}"
        samples.append(SampleInput((a, b, layout.to(device), psum, alignment, None), name))
    return samples


def m_grouped_reference(a, b, layout, psum, alignment, out_dtype):
    out = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64)
    for grp, begin, end in layout_segments(M_GROUPED, layout, psum, alignment, a.shape[0], b.shape[0]):
        out[begin:end] = a[begin:end].detach().double() @ b[grp].detach().double().T
    return out


def m_grouped_bad_inputs(device) -> list[BadInput]:
    a, b = torch.randn(8, 16), torch.randn(3, 4, 16)
    ok = _int32([2, 5, 8])
    return [
        BadInput((a, b, ok.long(), True, 1, None), r"argument 'layout' dtype: expected torch.int32", "dtype"),
        BadInput((a, b, ok[:2], True, 1, None), r"argument 'layout' size\(0\) \(groups\): expected 3", "psum length"),
        BadInput((a, b, ok, False, 1, None), r"argument 'layout' size\(0\) \(rows\): expected 8", "ids length"),
        BadInput(
            (a, b, _int32([4, 2, 8]), True, 1, None),
            r"layout\[1\] = 2 \(group start 4\)",
            "unsorted psum",
            data_dependent=True,
        ),
        BadInput(
            (a, b, _int32([2, 5, 9]), True, 1, None),
            r"and <= 8 rows, got layout\[2\] = 9",
            "psum > M",
            data_dependent=True,
        ),
        BadInput(
            (a, b, _int32([3, 2, 8]), True, 4, None),
            r"layout\[1\] = 2 \(group start 4\)",
            "aligned start",
            data_dependent=True,
        ),
        BadInput(
            (a, b, _int32([0, 0, 1, 1, 3, 2, -1, -1]), False, 1, None),
            r"group ids in \[-1, 3\).*layout\[4\] = 3",
            "id >= G",
            data_dependent=True,
        ),
        BadInput((a, b[:, :, :8], ok, True, 1, None), r"argument 'b' size\(2\) \(K\): expected 16", "K"),
        BadInput((a, b, ok, True, 0, None), r"argument 'alignment' value", "alignment"),
        BadInput((a.int(), b, ok, True, 1, None), r"argument 'a' dtype", "a dtype"),
    ]


# (G, M_max, masked_m)
_MASKED_CASES = [(3, 7, [7, 0, 3]), (2, 5, [1, 5]), (4, 1, [0, 0, 1, 0])]
_MASKED_CASES_SMALL = [(2, 3, [3, 1]), (3, 2, [0, 2, 1])]


def masked_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(21)
    n, k = (5, 8) if small else (24, 64)
    samples = []
    for groups, m_max, masked in _MASKED_CASES_SMALL if small else _MASKED_CASES:
        a = torch.randn(groups, m_max, k, generator=g)
        for grp, m in enumerate(masked):
            a[grp, m:] *= _POISON
        b = torch.randn(groups, n, k, generator=g)
        a, b = (
            a.to(dtype).to(device).requires_grad_(requires_grad),
            b.to(dtype).to(device).requires_grad_(requires_grad),
        )
        samples.append(SampleInput((a, b, _int32(masked).to(device), None), f"G{groups} M_max{m_max} masked={masked}"))
    return samples


def masked_reference(a, b, masked_m, out_dtype):
    out = torch.zeros(a.shape[0], a.shape[1], b.shape[1], dtype=torch.float64)
    for grp, m in enumerate(masked_m.tolist()):
        out[grp, :m] = a[grp, :m].detach().double() @ b[grp].detach().double().T
    return out


def masked_bad_inputs(device) -> list[BadInput]:
    a, b, m = torch.randn(2, 4, 8), torch.randn(2, 3, 8), _int32([4, 1])
    return [
        BadInput(
            (a, b, _int32([5, 1]), None),
            r"argument 'masked_m' values: expected in \[0, M_max=4\], got masked_m\[0\] = 5",
            "m > M_max",
            data_dependent=True,
        ),
        BadInput((a, b, m.long(), None), r"argument 'masked_m' dtype: expected torch.int32", "dtype"),
        BadInput((a, b[:1], m, None), r"argument 'b' size\(0\) \(groups\): expected 2", "groups"),
        BadInput((a, b, m[:1], None), r"argument 'masked_m' size\(0\) \(groups\): expected 2", "masked_m length"),
        BadInput((a[0], b, m, None), r"argument 'a' rank: expected 3-D", "rank"),
    ]


# (counts per group, alignment, psum, with c)
_K_CASES = [
    ([6, 0, 11, 3], 1, True, True),
    ([6, 2, 0, 7], 4, True, False),
    ([4, 3, 0, 5], 2, False, True),
    ([0, 0], 1, True, True),
]
_K_CASES_SMALL = [([2, 0, 3], 1, True, True), ([3, 1], 2, False, False), ([1, 2], 4, True, False)]


def k_grouped_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(22)
    m, n = (4, 5) if small else (24, 40)
    samples = []
    for counts, alignment, psum, with_c in _K_CASES_SMALL if small else _K_CASES:
        layout, rows = psum_layout(counts, alignment) if psum else (ids_layout(counts, alignment), None)
        rows = rows if psum else layout.numel()
        owned = _rows_of(layout, psum, alignment, rows, len(counts))
        a, b = torch.randn(rows, m, generator=g), torch.randn(rows, n, generator=g)
        a[~owned] *= _POISON
        b[~owned] *= _POISON
        c = (
            torch.randn(len(counts), m, n, generator=g).to(dtype).to(device).requires_grad_(requires_grad)
            if with_c
            else None
        )
        a, b = (
            a.to(dtype).to(device).requires_grad_(requires_grad),
            b.to(dtype).to(device).requires_grad_(requires_grad),
        )
        name = f"{'psum' if psum else 'ids'} counts={counts} align={alignment}{' +c' if with_c else ''}"
        samples.append(SampleInput((a, b, layout.to(device), len(counts), psum, alignment, c, None), name))
    return samples


def k_grouped_reference(a, b, layout, num_groups, psum, alignment, c, out_dtype):
    out = torch.zeros(num_groups, a.shape[1], b.shape[1], dtype=torch.float64)
    if c is not None:
        out += c.detach().double()
    for grp, begin, end in layout_segments(K_GROUPED, layout, psum, alignment, a.shape[0], num_groups):
        out[grp] += a[begin:end].detach().double().T @ b[begin:end].detach().double()
    return out


def k_grouped_bad_inputs(device) -> list[BadInput]:
    a, b, ok = torch.randn(8, 4), torch.randn(8, 5), _int32([2, 5, 8])
    return [
        BadInput((a, b, ok, 2, True, 1, None, None), r"argument 'layout' size\(0\) \(groups\): expected 2", "G"),
        BadInput((a, b[:7], ok, 3, True, 1, None, None), r"argument 'b' size\(0\) \(S\): expected 8", "S"),
        BadInput(
            (a, b, _int32([2, 1, 8]), 3, True, 1, None, None),
            r"layout\[1\] = 1 \(group start 2\)",
            "unsorted",
            data_dependent=True,
        ),
        BadInput((a, b, ok, 3, True, 1, torch.zeros(3, 4, 4), None), r"argument 'c' shape: expected \[3, 4, 5\]", "c"),
        BadInput((a, b, ok, -1, True, 1, None, None), r"argument 'num_groups' value", "num_groups"),
    ]


def _quantize_experts(w: torch.Tensor, fmt) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    parts = [quantize(w[e], fmt) for e in range(w.shape[0])]
    return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts]), parts[0][2]


# (counts per group, alignment, psum, format index of tests.fp8_gemm.specs._FORMATS)
_M_FP8_CASES = [([5, 0, 9, 3], 1, True, 0), ([6, 2, 0, 7], 4, False, 1), ([3, 4, 2], 8, True, 2), ([0, 6], 1, True, 3)]
_M_FP8_CASES_SMALL = [([2, 0, 3], 1, True, 0), ([1, 2], 2, False, 2)]


def m_grouped_fp8_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(23)
    n, k = (8, 128) if small else (40, 256)
    samples = []
    for counts, alignment, psum, fmt_index in _M_FP8_CASES_SMALL if small else _M_FP8_CASES:
        name, fa, fb = _FORMATS[fmt_index]
        layout, rows = psum_layout(counts, alignment) if psum else (ids_layout(counts, alignment), None)
        rows = rows if psum else layout.numel()
        x = torch.randn(rows, k, generator=g)
        x[~_rows_of(layout, psum, alignment, rows, len(counts))] *= _POISON
        a, sfa, recipe_a = quantize(x, fa)
        b, sfb, recipe_b = _quantize_experts(torch.randn(len(counts), n, k, generator=g), fb)
        args = tuple(t.to(device) for t in (a, sfa, b, sfb, layout))
        label = f"{'psum' if psum else 'ids'} counts={counts} align={alignment} {name}"
        samples.append(SampleInput((*args, psum, alignment, recipe_a, recipe_b, dtype), label))
    return samples


def m_grouped_fp8_reference(a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, out_dtype):
    a_deq = dequantized(a, sfa, recipe_a).double()
    out = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float64)
    for grp, begin, end in layout_segments(M_GROUPED, layout, psum, alignment, a.shape[0], b.shape[0]):
        out[begin:end] = a_deq[begin:end] @ dequantized(b[grp], sfb[grp], recipe_b).double().T
    return out


def m_grouped_fp8_bad_inputs(device) -> list[BadInput]:
    g = torch.Generator().manual_seed(24)
    a, sfa, ra = quantize(torch.randn(8, 256, generator=g), _FORMATS[0][1])
    b, sfb, rb = _quantize_experts(torch.randn(3, 16, 256, generator=g), _FORMATS[0][2])
    ok = _int32([2, 5, 8])
    return [
        BadInput(
            (a, sfa, b, sfb, ok, True, 1, [128, 128], rb, None),
            r"argument 'recipe_a' value: expected \[1, gran_k\]",
            "row scales",
        ),
        BadInput(
            (a, sfa, b, sfb[:, :, :1], ok, True, 1, ra, rb, None), r"argument 'sfb' shape: expected \[3, 1, 2\]", "sfb"
        ),
        BadInput((a, sfa, b[0], sfb[0], ok, True, 1, ra, rb, None), r"argument 'b' rank: expected 3-D", "b rank"),
        BadInput(
            (a, sfa, b, sfb, ok[:2], True, 1, ra, rb, None),
            r"argument 'layout' size\(0\) \(groups\): expected 3",
            "layout",
        ),
        BadInput(
            (a, sfa, b, sfb, _int32([5, 2, 8]), True, 1, ra, rb, None),
            r"layout\[1\] = 2 \(group start 5\)",
            "unsorted",
            data_dependent=True,
        ),
        BadInput((a, sfa, b, sfb, ok, True, 1, ra, rb, torch.float16), r"argument 'out_dtype' value", "out_dtype"),
    ]


# (G, M_max, masked_m, format index)
_MASKED_FP8_CASES = [(3, 7, [7, 0, 3], 0), (2, 5, [1, 5], 2), (2, 4, [4, 2], 3)]
_MASKED_FP8_CASES_SMALL = [(2, 3, [3, 1], 0), (2, 2, [0, 2], 1)]


def masked_fp8_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(25)
    n, k = (8, 128) if small else (24, 256)
    samples = []
    for groups, m_max, masked, fmt_index in _MASKED_FP8_CASES_SMALL if small else _MASKED_FP8_CASES:
        name, fa, fb = _FORMATS[fmt_index]
        x = torch.randn(groups, m_max, k, generator=g)
        for grp, m in enumerate(masked):
            x[grp, m:] *= _POISON
        a, sfa, recipe_a = _quantize_experts(x, fa)
        b, sfb, recipe_b = _quantize_experts(torch.randn(groups, n, k, generator=g), fb)
        args = tuple(t.to(device) for t in (a, sfa, b, sfb, _int32(masked)))
        samples.append(
            SampleInput((*args, recipe_a, recipe_b, dtype), f"G{groups} M_max{m_max} masked={masked} {name}")
        )
    return samples


def masked_fp8_reference(a, sfa, b, sfb, masked_m, recipe_a, recipe_b, out_dtype):
    out = torch.zeros(a.shape[0], a.shape[1], b.shape[1], dtype=torch.float64)
    for grp, m in enumerate(masked_m.tolist()):
        a_deq = dequantized(a[grp], sfa[grp], recipe_a).double()
        out[grp, :m] = a_deq[:m] @ dequantized(b[grp], sfb[grp], recipe_b).double().T
    return out


def masked_fp8_bad_inputs(device) -> list[BadInput]:
    g = torch.Generator().manual_seed(26)
    a, sfa, ra = _quantize_experts(torch.randn(2, 4, 128, generator=g), _FORMATS[0][1])
    b, sfb, rb = _quantize_experts(torch.randn(2, 8, 128, generator=g), _FORMATS[0][2])
    return [
        BadInput(
            (a, sfa, b, sfb, _int32([5, 1]), ra, rb, None),
            r"argument 'masked_m' values: expected in \[0, M_max=4\]",
            "m > M_max",
            data_dependent=True,
        ),
        BadInput(
            (a, sfa, b[:1], sfb[:1], _int32([4, 1]), ra, rb, None),
            r"argument 'b' size\(0\) \(groups\): expected 2",
            "G",
        ),
        BadInput((a, sfa, b, sfb, _int32([4]), ra, rb, None), r"argument 'masked_m' size\(0\)", "masked_m"),
    ]


# (counts per group, alignment, psum, block, use_ue8m0)
_LINEAR_FP8_CASES = [
    ([5, 0, 9, 3], 1, True, 128, False),
    ([6, 2, 0, 7], 4, False, 32, True),
    ([0, 11], 8, True, 64, False),
]
_LINEAR_FP8_CASES_SMALL = [([2, 0, 3], 1, True, 128, False), ([1, 2], 2, False, 32, True)]


def m_grouped_fp8_linear_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(27)
    n, k = (8, 128) if small else (40, 256)
    samples = []
    for i, (counts, alignment, psum, block, ue8m0) in enumerate(
        _LINEAR_FP8_CASES_SMALL if small else _LINEAR_FP8_CASES
    ):
        layout, rows = psum_layout(counts, alignment) if psum else (ids_layout(counts, alignment), None)
        rows = rows if psum else layout.numel()
        x = torch.randn(rows, k, generator=g)
        x[~_rows_of(layout, psum, alignment, rows, len(counts))] *= _POISON
        w = torch.randn(len(counts), n, k, generator=g) / k**0.5
        x, w = (t.to(dtype).to(device).requires_grad_(requires_grad) for t in (x, w))
        label = (
            f"{'psum' if psum else 'ids'} counts={counts} align={alignment} block={block}{' ue8m0' if ue8m0 else ''}"
        )
        samples.append(SampleInput((x, w, layout.to(device), psum, alignment, block, ue8m0, i % 2 == 0), label))
    return samples


def m_grouped_fp8_linear_reference(x, weight, layout, psum, alignment, block, use_ue8m0, fp8_backward):
    from torch_ascend_moe.quant import block_cast_to_fp8

    xq, xs = block_cast_to_fp8(x.detach(), (1, block), use_ue8m0)
    x_deq = dequantized(xq, xs, (1, block)).double()
    out = torch.zeros(x.shape[0], weight.shape[1], dtype=torch.float64)
    for grp, begin, end in layout_segments(M_GROUPED, layout, psum, alignment, x.shape[0], weight.shape[0]):
        wq, ws = block_cast_to_fp8(weight[grp].detach(), (block, block), use_ue8m0)
        out[begin:end] = x_deq[begin:end] @ dequantized(wq, ws, (block, block)).double().T
    return out


def m_grouped_fp8_linear_bad_inputs(device) -> list[BadInput]:
    x, w, ok = torch.randn(8, 256), torch.randn(3, 16, 256), _int32([2, 5, 8])
    return [
        BadInput(
            (x.double(), w, ok, True, 1, 128, False, True),
            r"argument 'x' dtype: expected torch.bfloat16 or torch.float32",
            "x",
        ),
        BadInput(
            (x, w.bfloat16(), ok, True, 1, 128, False, True),
            r"argument 'weight' dtype: expected torch.float32 \(same as 'x'\)",
            "w",
        ),
        BadInput(
            (x, w, ok, True, 1, 96, False, True),
            r"argument 'x' size\(1\) \(K\): expected a multiple of block=96",
            "block",
        ),
        BadInput(
            (x, w[:, :, :128], ok, True, 1, 128, False, True), r"argument 'weight' size\(2\) \(K\): expected 256", "K"
        ),
        BadInput(
            (x, w, _int32([2, 9, 8]), True, 1, 128, False, True),
            r"and <= 8 rows, got layout\[1\] = 9",
            "psum > M",
            data_dependent=True,
        ),
    ]


# (counts per group, alignment, psum, gran_k, expert weight format (tests.fp8_gemm.specs.quantize), use_ue8m0,
#  out_dtype FP32 instead of x's)
_QUANT_FP8_CASES = [
    ([5, 0, 9, 3], 1, True, 128, ("fp8-block", 128, 128, False), False, False),
    ([6, 2, 0, 7], 4, False, 128, ("fp8-token", 1, 128, True), True, True),
    ([3, 4, 2], 8, True, 32, ("fp4", 1, 32, True), True, False),
    ([0, 6], 1, True, 64, ("fp8-block", 128, 128, False), False, True),
    ([0, 0], 1, True, 128, ("fp8-block", 128, 128, False), False, False),  # no tokens at all
]
_QUANT_FP8_CASES_SMALL = [
    ([2, 0, 3], 1, True, 128, ("fp8-block", 128, 128, False), False, False),
    ([1, 2], 2, False, 32, ("fp4", 1, 32, True), True, True),
]


def m_grouped_fp8_quant_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(28)
    n, k = (8, 128) if small else (40, 256)
    samples = []
    for counts, alignment, psum, gran_k, fmt, ue8m0, fp32_out in _QUANT_FP8_CASES_SMALL if small else _QUANT_FP8_CASES:
        layout, rows = psum_layout(counts, alignment) if psum else (ids_layout(counts, alignment), None)
        rows = rows if psum else layout.numel()
        x = torch.randn(rows, k, generator=g)
        x[~_rows_of(layout, psum, alignment, rows, len(counts))] *= _POISON
        b, sfb, recipe_b = _quantize_experts(torch.randn(len(counts), n, k, generator=g), fmt)
        x = x.to(dtype).to(device).requires_grad_(requires_grad)
        out_dtype = torch.float32 if fp32_out else None
        label = (
            f"{'psum' if psum else 'ids'} counts={counts} align={alignment} gran_k={gran_k} {fmt[0]}"
            f"{' ue8m0' if ue8m0 else ''}{' ->fp32' if fp32_out else ''}"
        )
        args = (x, b.to(device), sfb.to(device), layout.to(device), psum, alignment, gran_k, recipe_b, ue8m0, out_dtype)
        samples.append(SampleInput(args, label))
    return samples


def m_grouped_fp8_quant_reference(x, b, sfb, layout, psum, alignment, gran_k, recipe_b, use_ue8m0, out_dtype):
    q, sf = quant.block_cast_to_fp8(x.detach(), (1, gran_k), use_ue8m0)
    x_deq = dequantized(q, sf, (1, gran_k)).double()
    out = torch.zeros(x.shape[0], b.shape[1], dtype=torch.float64)
    for grp, begin, end in layout_segments(M_GROUPED, layout, psum, alignment, x.shape[0], b.shape[0]):
        out[begin:end] = x_deq[begin:end] @ dequantized(b[grp], sfb[grp], recipe_b).double().T
    return out


def m_grouped_fp8_quant_bad_inputs(device) -> list[BadInput]:
    g = torch.Generator().manual_seed(29)
    x = torch.randn(8, 256, generator=g, dtype=torch.bfloat16)
    b, sfb, rb = _quantize_experts(torch.randn(3, 16, 256, generator=g), ("fp8-block", 128, 128, False))
    ok = _int32([2, 5, 8])

    def bad(match, name, data_dependent=False, **change):
        args = dict(
            x=x, b=b, sfb=sfb, layout=ok, psum=True, alignment=1, gran_k=128, recipe_b=rb, ue8m0=False, out_dtype=None
        )
        args.update(change)
        return BadInput(tuple(args.values()), match, name, data_dependent=data_dependent)

    return [
        bad(r"argument 'x' dtype: expected torch.bfloat16 or torch.float32, got torch.float16", "x", x=x.half()),
        bad(r"argument 'x' rank: expected 2-D", "x rank", x=x.unsqueeze(0)),
        bad(r"argument 'x' size\(1\) \(K\): expected a multiple of gran_k=96", "gran_k", gran_k=96),
        bad(r"argument 'gran_k' value: expected a positive integer", "gran_k 0", gran_k=0),
        bad(r"argument 'b' rank: expected 3-D", "b rank", b=b[0], sfb=sfb[0]),
        bad(r"argument 'sfb' shape: expected \[3, 1, 2\]", "sfb", sfb=sfb[:, :, :1]),
        bad(r"argument 'b' K: expected 128 \(x's K\)", "b K", x=x[:, :128]),
        bad(r"argument 'layout' size\(0\) \(groups\): expected 3", "layout", layout=ok[:2]),
        bad(r"argument 'alignment' value: expected a positive integer", "alignment", alignment=0),
        bad(r"layout\[1\] = 2 \(group start 5\)", "unsorted", True, layout=_int32([5, 2, 8])),
        bad(r"argument 'out_dtype' value: expected torch.bfloat16 or torch.float32", "out_dtype", out_dtype=torch.half),
    ]


def k_grouped_quantize(x: torch.Tensor, layout: torch.Tensor, alignment: int, gran_k: int, use_ue8m0: bool):
    """FP8 data and per-channel scales of a k-grouped operand: each group's rows cast in gran_k x 1 blocks."""
    data = torch.full(x.shape, 448.0).to(torch.float8_e4m3fn)  # gap rows: values no group may read
    scales = []
    for _, begin, end in layout_segments(K_GROUPED, layout, True, alignment, x.shape[0], layout.numel()):
        if end > begin:
            q, sf = quant.block_cast_to_fp8(x[begin:end], (gran_k, 1), use_ue8m0)
            data[begin:end] = q
            scales.append(sf)
    return data, torch.cat(scales) if scales else torch.empty(0, x.shape[1])


# (counts per group, alignment, gran_k, use_ue8m0, with c)
_K_FP8_CASES = [
    ([200, 0, 77, 130], 32, 128, False, True),
    ([64, 33, 0, 96], 32, 32, True, False),
    ([0, 0], 1, 128, False, True),
]
_K_FP8_CASES_SMALL = [([40, 0, 17], 8, 32, False, True), ([33, 5], 1, 32, True, False)]


def k_grouped_fp8_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(28)
    m, n = (4, 6) if small else (24, 40)
    samples = []
    for counts, alignment, gran_k, ue8m0, with_c in _K_FP8_CASES_SMALL if small else _K_FP8_CASES:
        layout, rows = psum_layout(counts, alignment)
        a, sfa = k_grouped_quantize(torch.randn(rows, m, generator=g), layout, alignment, gran_k, ue8m0)
        b, sfb = k_grouped_quantize(torch.randn(rows, n, generator=g), layout, alignment, gran_k, ue8m0)
        c = (10 * torch.randn(len(counts), m, n, generator=g)).to(dtype) if with_c else None
        args = tuple(t.to(device) for t in (a, sfa, b, sfb, layout))
        c = None if c is None else c.to(device).requires_grad_(requires_grad)
        label = f"counts={counts} align={alignment} gran_k={gran_k}{' ue8m0' if ue8m0 else ''}{' +c' if with_c else ''}"
        samples.append(SampleInput((*args, len(counts), alignment, gran_k, c, dtype), label))
    return samples


def k_grouped_fp8_reference(a, sfa, b, sfb, layout, num_groups, alignment, gran_k, c, out_dtype):
    out = torch.zeros(num_groups, a.shape[1], b.shape[1], dtype=torch.float64)
    if c is not None:
        out += c.detach().double()
    row = 0
    for grp, begin, end in layout_segments(K_GROUPED, layout, True, alignment, a.shape[0], num_groups):
        n, blocks = end - begin, -(-(end - begin) // gran_k)

        def deq(x, sf, row=row, begin=begin, end=end, n=n, blocks=blocks):
            return x[begin:end].double() * sf[row : row + blocks].double().repeat_interleave(gran_k, dim=0)[:n]

        out[grp] += deq(a, sfa).T @ deq(b, sfb)
        row += blocks
    return out


def k_grouped_fp8_bad_inputs(device) -> list[BadInput]:
    g = torch.Generator().manual_seed(29)
    layout, rows = psum_layout([40, 20], 8)
    a, sfa = k_grouped_quantize(torch.randn(rows, 4, generator=g), layout, 8, 32, False)
    b, sfb = k_grouped_quantize(torch.randn(rows, 6, generator=g), layout, 8, 32, False)
    return [
        BadInput(
            (a.float(), sfa, b, sfb, layout, 2, 8, 32, None, None),
            r"argument 'a' dtype: expected torch.float8_e4m3fn",
            "dtype",
        ),
        BadInput(
            (a, sfa[:, :2], b, sfb, layout, 2, 8, 32, None, None),
            r"argument 'sfa' size\(1\) \(MN\): expected 4",
            "sfa MN",
        ),
        BadInput(
            (a, sfa, b, sfb, layout, 3, 8, 32, None, None), r"argument 'layout' size\(0\) \(groups\): expected 3", "G"
        ),
        BadInput(
            (a, sfa[:-1], b, sfb, layout, 2, 8, 32, None, None),
            r"argument 'sfa' size\(0\): expected 3 \(sum over groups of ceil\(k_g / gran_k\)\)",
            "scale rows",
            data_dependent=True,
        ),
        BadInput((a, sfa, b, sfb, layout, 2, 8, 32, None, torch.float16), r"argument 'out_dtype' value", "out_dtype"),
    ]


# (counts per group, alignment, psum, b MN-major, row weights, activation clamp, quant_gran_k, use_ue8m0)
_SWIGLU_CASES = [
    ([5, 0, 9, 3], 1, True, False, False, None, 0, False),
    ([5, 0, 9, 3], 8, True, True, True, None, 0, False),
    ([6, 2, 0, 7], 4, False, False, True, 0.75, 0, False),
    ([0, 17, 0], 1, True, False, True, 0.0, 0, False),  # clamp 0: every gate <= 0 and up == 0
    ([0, 0], 1, True, False, False, None, 0, False),
    ([5, 0, 9, 3], 4, True, False, True, 1.5, 16, True),  # FP8 output, power-of-two scales
    ([6, 2, 0, 7], 1, False, True, False, None, 32, False),  # FP8, ragged last scale group (I = 40)
]
_SWIGLU_CASES_SMALL = [
    ([2, 0, 3], 1, True, False, True, None, 0, False),
    ([3, 1], 4, False, True, True, 0.5, 0, False),
    ([1, 2], 2, True, False, False, None, 0, False),
]


def swiglu_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    """FP8-output cases only in BF16 runs: their FP32 reference differs from the kernel's FP32 epilogue in the last
    ulp, which can move a value across an FP8 rounding boundary (one FP8 step is far beyond FP32's threshold)."""
    g = torch.Generator().manual_seed(30)
    inter, k = (3, 16) if small else (20, 96)
    samples = []
    for counts, alignment, psum, mn_major, weighted, clamp, gran, ue8m0 in (
        _SWIGLU_CASES_SMALL if small else _SWIGLU_CASES
    ):
        if gran and dtype != torch.bfloat16:
            continue
        layout, rows = psum_layout(counts, alignment) if psum else (ids_layout(counts, alignment), None)
        rows = rows if psum else layout.numel()
        a = torch.randn(rows, k, generator=g)
        owned = _rows_of(layout, psum, alignment, rows, len(counts))
        a[~owned] = _POISON * torch.randn(int((~owned).sum()), k, generator=g)
        b = torch.randn(len(counts), 2 * inter * (2 if gran else 1), k, generator=g) / k**0.25
        if mn_major:
            b = b.transpose(1, 2).contiguous().transpose(1, 2)
        compute = torch.float64 if dtype == torch.float64 else torch.float32
        w = torch.rand(rows, generator=g, dtype=torch.float64).to(compute) if weighted else None
        grads = requires_grad and not gran  # the FP8 output has no gradient
        a, b = (t.to(dtype).to(device).requires_grad_(grads) for t in (a, b))
        w = None if w is None else w.to(device).requires_grad_(grads)
        name = (
            f"{'psum' if psum else 'ids'} counts={counts} align={alignment}{' bT' if mn_major else ''}"
            f"{' weighted' if weighted else ''}{f' clamp={clamp}' if clamp is not None else ''}"
            f"{f' fp8 gran={gran}' if gran else ''}{' ue8m0' if ue8m0 else ''}"
        )
        samples.append(SampleInput((a, b, layout.to(device), psum, alignment, w, clamp, gran, ue8m0, None), name))
    return samples


def _swiglu_tail(h, row_weights, activation_clamp, quant_gran_k, use_ue8m0):
    """The SwiGLU ops' epilogue in fp64 on the (already rounded) L1 output ``h``."""
    gate, up = h.double().chunk(2, dim=-1)
    if activation_clamp is not None:
        gate, up = gate.clamp(max=activation_clamp), up.clamp(-activation_clamp, activation_clamp)
    act = torch.nn.functional.silu(gate) * up
    if row_weights is not None:
        act = act * row_weights.detach().double().unsqueeze(1)
    if quant_gran_k:
        q, sf = quant.per_token_cast_to_fp8(act, use_ue8m0=use_ue8m0, gran_k=quant_gran_k)
        return q.double(), sf.double()
    return act, torch.zeros(h.shape[0], 0, dtype=torch.float64)


def swiglu_reference(a, b, layout, psum, alignment, row_weights, activation_clamp, quant_gran_k, use_ue8m0, out_dtype):
    """The op's definition in fp64 with its one declared rounding inside: the L1 output ``h`` in ``a``'s dtype."""
    h = m_grouped_reference(a, b, layout, psum, alignment, None).to(a.dtype)
    return _swiglu_tail(h, row_weights, activation_clamp, quant_gran_k, use_ue8m0)


def _epilogue_bad_inputs(bad, w) -> list[BadInput]:
    """The SwiGLU epilogue's arguments, refused alike by both fused ops (``bad`` builds a call with changes; ``w`` is a
    valid ``[8]`` FP32 ``row_weights``)."""
    return [
        bad(r"argument 'row_weights' size\(0\) \(M\): expected 8", "weights length", row_weights=w[:5]),
        bad(r"argument 'row_weights' rank: expected 1-D", "weights rank", row_weights=w[:, None]),
        bad(r"argument 'activation_clamp' value: expected None or >= 0, got -1.0", "clamp", clamp=-1.0),
        bad(r"argument 'activation_clamp' value: expected None or >= 0, got nan", "clamp nan", clamp=float("nan")),
        bad(r"argument 'quant_gran_k' value: expected a non-negative integer, got -32", "gran", gran=-32),
        bad(
            r"argument 'out_dtype' value: expected None or torch.float8_e4m3fn \(quant_gran_k > 0\), "
            r"got torch.bfloat16",
            "fp8 out_dtype",
            gran=32,
            out_dtype=torch.bfloat16,
        ),
        bad(r"argument 'use_ue8m0' value: expected False when quant_gran_k=0", "ue8m0", ue8m0=True),
    ]


def swiglu_bad_inputs(device) -> list[BadInput]:
    a, b, ok, w = torch.randn(8, 16), torch.randn(3, 8, 16), _int32([2, 5, 8]), torch.rand(8)
    args = (a, b, ok, True, 1, None, None, 0, False, None)

    def bad(match, name, data_dependent=False, **changes):
        names = ("a", "b", "layout", "psum", "alignment", "row_weights", "clamp", "gran", "ue8m0", "out_dtype")
        call = tuple(changes.get(n, v) for n, v in zip(names, args))
        return BadInput(call, match, name, data_dependent=data_dependent)

    return [
        bad(
            r"argument 'b' size\(1\) \(2I: gate rows, then up rows\): expected an even number, got 7", "odd", b=b[:, :7]
        ),
        bad(r"argument 'b' rank: expected 3-D \[G, 2I, K\]", "b rank", b=b[0]),
        bad(r"argument 'b' size\(2\) \(K\): expected 16", "K", b=b[:, :, :8]),
        bad(r"argument 'a' dtype", "a dtype", a=a.int()),
        bad(r"argument 'layout' dtype: expected torch.int32", "layout dtype", layout=ok.long()),
        bad(r"layout\[1\] = 2 \(group start 4\)", "unsorted psum", True, layout=_int32([4, 2, 8])),
        bad(r"argument 'alignment' value", "alignment", alignment=0),
        bad(
            r"argument 'row_weights' dtype: expected torch.float32 \(the epilogue's precision for a torch.float32\), "
            r"got torch.bfloat16",
            "weights dtype",
            row_weights=w.bfloat16(),
        ),
        *_epilogue_bad_inputs(bad, w),
        bad(r"argument 'out_dtype' value: expected one of", "out_dtype", out_dtype=torch.int32),
    ]


# (counts, alignment, psum, format index of _FORMATS, I, row weights, clamp, quant_gran_k, use_ue8m0, out_dtype)
_SWIGLU_FP8_CASES = [
    ([5, 0, 20, 3], 1, True, 0, 128, True, None, 0, False, None),  # 1x128 x 128x128, I whole blocks
    ([6, 2, 0, 11], 4, False, 0, 64, False, 0.75, 0, False, torch.float32),  # a 128-row B block spans gate and up
    ([9, 4, 2], 8, True, 2, 40, True, 1.5, 32, True, None),  # MegaMoE's FP8 x FP4 1x32, FP8 out (ragged last group)
    ([0, 12], 1, True, 3, 32, False, None, 16, False, None),  # FP4 x FP4
    ([7, 3], 1, True, 1, 48, True, 0.0, 0, False, None),  # 1x128 x 1x128 UE8M0; clamp 0
    ([0, 0], 1, True, 0, 64, False, None, 0, False, None),
]
_SWIGLU_FP8_CASES_SMALL = [
    ([2, 0, 3], 1, True, 1, 8, True, None, 0, False, None),
    ([3, 1], 4, False, 0, 64, False, 0.5, 0, False, None),
]


def swiglu_fp8_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    """Few-row (streaming) and many-row segments, every operand format, B scale blocks aligned with the gate/up
    halves or straddling them. ``dtype`` is unused: each case names its output dtype."""
    g = torch.Generator().manual_seed(31)
    k = 256
    samples = []
    for counts, alignment, psum, fmt, inter, weighted, clamp, gran, ue8m0, out_dtype in (
        _SWIGLU_FP8_CASES_SMALL if small else _SWIGLU_FP8_CASES
    ):
        name, fa, fb = _FORMATS[fmt]
        layout, rows = psum_layout(counts, alignment) if psum else (ids_layout(counts, alignment), None)
        rows = rows if psum else layout.numel()
        x = torch.randn(rows, k, generator=g)
        x[~_rows_of(layout, psum, alignment, rows, len(counts))] *= _POISON
        a, sfa, recipe_a = quantize(x, fa)
        b, sfb, recipe_b = _quantize_experts(torch.randn(len(counts), 2 * inter, k, generator=g) / 4, fb)
        w = torch.rand(rows, generator=g) if weighted else None
        w = None if w is None else w.to(device).requires_grad_(requires_grad and not gran)
        args = tuple(t.to(device) for t in (a, sfa, b, sfb, layout))
        label = (
            f"{'psum' if psum else 'ids'} counts={counts} align={alignment} {name} I={inter}"
            f"{' weighted' if weighted else ''}{f' clamp={clamp}' if clamp is not None else ''}"
            f"{f' fp8 gran={gran}' if gran else ''}{' ue8m0' if ue8m0 else ''}{f' {out_dtype}' if out_dtype else ''}"
        )
        samples.append(
            SampleInput((*args, psum, alignment, recipe_a, recipe_b, w, clamp, gran, ue8m0, out_dtype), label)
        )
    return samples


def swiglu_fp8_reference(
    a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, row_weights, activation_clamp, quant_gran_k,
    use_ue8m0, out_dtype,
):  # fmt: skip
    """fp64 with the op's roundings: the L1 output in BF16, then the epilogue."""
    h = m_grouped_fp8_reference(a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, None).bfloat16()
    return _swiglu_tail(h, row_weights, activation_clamp, quant_gran_k, use_ue8m0)


def swiglu_fp8_bad_inputs(device) -> list[BadInput]:
    g = torch.Generator().manual_seed(32)
    a, sfa, ra = quantize(torch.randn(8, 256, generator=g), _FORMATS[0][1])
    b, sfb, rb = _quantize_experts(torch.randn(3, 256, 256, generator=g), _FORMATS[0][2])
    w = torch.rand(8)
    args = (a, sfa, b, sfb, _int32([2, 5, 8]), True, 1, ra, rb, None, None, 0, False, None)
    names = ("a", "sfa", "b", "sfb", "layout", "psum", "alignment", "recipe_a", "recipe_b", "row_weights", "clamp")
    names += ("gran", "ue8m0", "out_dtype")

    def bad(match, name, data_dependent=False, **changes):
        call = tuple(changes.get(n, v) for n, v in zip(names, args))
        return BadInput(call, match, name, data_dependent=data_dependent)

    return [
        bad(r"argument 'recipe_a' value: expected \[1, gran_k\]", "row scales", recipe_a=[128, 128]),
        bad(
            r"argument 'b' size\(1\) \(2I: gate rows, then up rows\): expected an even number, got 255",
            "odd",
            b=b[:, :255],
            sfb=sfb[:, :2],
        ),
        bad(r"argument 'a' dtype", "a dtype", a=a.float()),
        bad(r"argument 'layout' size\(0\) \(groups\): expected 3", "layout", layout=_int32([2, 8])),
        bad(r"layout\[1\] = 2 \(group start 5\)", "unsorted", True, layout=_int32([5, 2, 8])),
        bad(
            r"argument 'row_weights' dtype: expected torch.float32 \(the epilogue's precision for a "
            r"torch.float8_e4m3fn\), got torch.bfloat16",
            "weights dtype",
            row_weights=w.bfloat16(),
        ),
        *_epilogue_bad_inputs(bad, w),
        bad(r"argument 'out_dtype' value: expected torch.bfloat16 or torch.float32", "out_dtype", out_dtype=torch.half),
    ]


_FP8_NO_GRADCHECK = "quantized operands carry no gradient (train BF16 experts or cast inside an fp8_linear-style op)"

SPECS = [
    OpSpec(
        "m_grouped_bf16_gemm",
        m_grouped_samples,
        m_grouped_reference,
        m_grouped_bad_inputs,
        portable.m_grouped_bf16_gemm,
    ),
    OpSpec(
        "m_grouped_bf16_gemm_swiglu",
        swiglu_samples,
        swiglu_reference,
        swiglu_bad_inputs,
        portable.m_grouped_bf16_gemm_swiglu,
    ),
    OpSpec(
        "m_grouped_bf16_gemm_masked",
        masked_samples,
        masked_reference,
        masked_bad_inputs,
        portable.m_grouped_bf16_gemm_masked,
    ),
    OpSpec(
        "k_grouped_bf16_gemm",
        k_grouped_samples,
        k_grouped_reference,
        k_grouped_bad_inputs,
        portable.k_grouped_bf16_gemm,
    ),
    OpSpec(
        "m_grouped_fp8_gemm",
        m_grouped_fp8_samples,
        m_grouped_fp8_reference,
        m_grouped_fp8_bad_inputs,
        portable.m_grouped_fp8_gemm,
        gradcheck=_FP8_NO_GRADCHECK,
        device_thresholds=FP8_TENSOR_CORES,
    ),
    OpSpec(
        "m_grouped_fp8_gemm_masked",
        masked_fp8_samples,
        masked_fp8_reference,
        masked_fp8_bad_inputs,
        portable.m_grouped_fp8_gemm_masked,
        gradcheck=_FP8_NO_GRADCHECK,
        device_thresholds=FP8_TENSOR_CORES,
    ),
    OpSpec(
        "m_grouped_fp8_gemm_swiglu",
        swiglu_fp8_samples,
        swiglu_fp8_reference,
        swiglu_fp8_bad_inputs,
        portable.m_grouped_fp8_gemm_swiglu,
        dtypes=(torch.bfloat16,),
        gradcheck="quantized operands carry no gradient; row_weights' (FP32 only) is checked against autograd "
        "through the composition in tests/grouped/test_grouped_swiglu.py",
        device_thresholds=FP8_TENSOR_CORES,
    ),
    OpSpec(
        "m_grouped_fp8_linear",
        m_grouped_fp8_linear_samples,
        m_grouped_fp8_linear_reference,
        m_grouped_fp8_linear_bad_inputs,
        portable.m_grouped_fp8_linear,
        gradcheck="the FP8 casts are piecewise constant; the straight-through gradients are tested in tests/grouped",
        device_thresholds=FP8_TENSOR_CORES,
    ),
    OpSpec(
        "m_grouped_fp8_quant_gemm",
        m_grouped_fp8_quant_samples,
        m_grouped_fp8_quant_reference,
        m_grouped_fp8_quant_bad_inputs,
        portable.m_grouped_fp8_quant_gemm,
        gradcheck="x is cast to FP8 (piecewise constant); its straight-through gradient is tested in "
        "tests/grouped/test_grouped_quant.py",
        device_thresholds=FP8_TENSOR_CORES,
    ),
    OpSpec(
        "k_grouped_fp8_gemm",
        k_grouped_fp8_samples,
        k_grouped_fp8_reference,
        k_grouped_fp8_bad_inputs,
        portable.k_grouped_fp8_gemm,
        gradcheck="only c is differentiable (the identity), and outputs are BF16/FP32, with no float64 path",
        device_thresholds=FP8_TENSOR_CORES,
    ),
]
