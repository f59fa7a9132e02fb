"""Under ``torch.autocast`` every op computes as without it, on its inputs as given
(``_registry.run_without_autocast``): a kernel's inner torch calls were recast (the composed sparse-attention
kernels then mixed BF16 and FP32 operands and failed). Eager, backward and compiled, on ops whose kernels are C++
and composed."""

from __future__ import annotations

import pytest
import torch

from torch_ascend_moe._registry import op_names
from torch_ascend_moe.ops.gemm import bf16_gemm
from torch_ascend_moe.ops.mqa_logits import mqa_logits
from torch_ascend_moe.ops.sparse_mla import sparse_mla_prefill


def _cases():
    g = torch.Generator().manual_seed(0)
    t, h, d = 6, 2, 32
    q, kv = torch.randn(t, h, d, generator=g), torch.randn(t, 1, d, generator=g)
    idx = torch.stack([torch.arange(t).clamp(max=i) for i in range(t)]).int()[:, None, :]
    ks, ke = torch.zeros(t, dtype=torch.int32), torch.arange(1, t + 1, dtype=torch.int32)
    a, b = torch.randn(5, 64, generator=g), torch.randn(7, 64, generator=g)
    return {
        "sparse_mla_prefill": (lambda q, kv: sparse_mla_prefill(q, kv, idx, 0.2, 16)[0], (q, kv)),
        "mqa_logits": (lambda q, k: mqa_logits(q.bfloat16(), k.bfloat16(), torch.ones(t, h), ks, ke), (q, kv[:, 0])),
        "bf16_gemm": (lambda a, b: bf16_gemm(a.bfloat16(), b.bfloat16(), out_dtype=torch.float32), (a, b)),
    }


@pytest.mark.parametrize("name", sorted(_cases()))
def test_ops_ignore_autocast(name):
    fn, inputs = _cases()[name]
    inputs = [x.requires_grad_() for x in inputs]
    want = fn(*inputs)
    want_grads = torch.autograd.grad(want.float().sum(), inputs, allow_unused=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = fn(*inputs)
        got_grads = torch.autograd.grad(got.float().sum(), inputs, allow_unused=True)
        compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(*inputs)
    assert got.dtype == want.dtype and torch.equal(got, want)
    assert torch.equal(compiled, want)
    for g, w in zip(got_grads, want_grads):
        assert (g is None and w is None) or torch.equal(g, w)


def test_every_op_has_its_autocast_kernels():
    for name in op_names():
        op = getattr(torch.ops.ascend_moe, name).default
        for key in ("AutocastCPU", "AutocastCUDA"):
            assert op.has_kernel_for_dispatch_key(getattr(torch._C.DispatchKey, key)), (name, key)
