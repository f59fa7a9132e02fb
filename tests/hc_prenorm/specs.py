"""Sample inputs, fp64 reference, bad inputs and the harness spec of ``hc_prenorm_gemm``.

Shapes follow DeepGEMM's test (N = 24 mixing coefficients of 4 streams, odd M) scaled down for a CPU,
with and without splits (including more splits than 64-wide blocks, which leaves empty splits).
``dtype`` is a's dtype; the reference rounds b to TF32 as the op documents (FP64 samples are exact).
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.portable import hc_prenorm as portable
from torch_ascend_moe.checks.hc_prenorm import split_ranges
from torch_ascend_moe.quant import round_to_tf32
from torch_ascend_moe.testing.harness import BadInput, OpSpec, SampleInput

_CASES = [(13, 24, 1024, None), (137, 24, 768, 16), (1, 32, 512, 3), (0, 24, 256, None)]
_CASES_SMALL = [(3, 8, 128, None), (5, 4, 256, 3), (2, 8, 128, 4)]


def samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(40)
    out = []
    for m, n, k, splits in _CASES_SMALL if small else _CASES:
        a = torch.randn(m, k, generator=g).to(dtype).to(device).requires_grad_(requires_grad)
        b_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        b = (torch.randn(n, k, generator=g) / k**0.5).to(b_dtype).to(device).requires_grad_(requires_grad)
        out.append(SampleInput((a, b, splits), f"M{m} N{n} K{k} splits={splits}"))
    return out


def reference(a, b, num_splits):
    a64 = a.detach().double()
    b64 = b.detach().double() if b.dtype == torch.float64 else round_to_tf32(b.detach()).double()
    if num_splits is None:
        return a64 @ b64.T, a64.square().sum(-1)
    d = torch.zeros(num_splits, a.shape[0], b.shape[0], dtype=torch.float64)
    sqr = torch.zeros(num_splits, a.shape[0], dtype=torch.float64)
    for s, (k0, k1) in enumerate(split_ranges(a.shape[1], num_splits)):
        d[s], sqr[s] = a64[:, k0:k1] @ b64[:, k0:k1].T, a64[:, k0:k1].square().sum(-1)
    return d, sqr


def bad_inputs(device) -> list[BadInput]:
    a, b = torch.randn(4, 128, dtype=torch.bfloat16), torch.randn(24, 128)
    return [
        BadInput((a, b.bfloat16(), None), r"argument 'b' dtype: expected torch.float32", "b dtype"),
        BadInput(
            (a.half(), b, None),
            r"argument 'a' dtype: expected torch.bfloat16, torch.float32 or torch.float64",
            "a dtype",
        ),
        BadInput((a[:, :96], b[:, :96], None), r"argument 'a' size\(1\) \(K\): expected a multiple of 64, got 96", "K"),
        BadInput((a, b[:, :64], None), r"argument 'b' size\(1\) \(K\): expected 128", "K mismatch"),
        BadInput((a, b, 0), r"argument 'num_splits' value: expected None or a positive integer, got 0", "splits"),
    ]


SPECS = [OpSpec("hc_prenorm_gemm", samples, reference, bad_inputs, portable.hc_prenorm_gemm)]
