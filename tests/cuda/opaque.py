"""Triton kernels through an opaque test op, for ``opcheck`` and ``torch.compile`` on CPU: the interpreter must run
outside tracing (``triton_op`` does not compile in interpret mode, specs/npu_triton_facts.md §6), so the kernel
becomes the CPU kernel of ``ascend_moe_test::<op>``, with our op's schema and fake."""

from __future__ import annotations

import functools

import torch

_LIBS: list = []  # the libraries must outlive the test module that defines their ops


@functools.cache
def opaque_op(name: str, kernel):
    """``ascend_moe_test::<name>``: ``ascend_moe::<name>``'s schema, ``kernel`` as its CPU kernel, our op's fake."""
    op = getattr(torch.ops.ascend_moe, name).default
    lib = torch.library.Library("ascend_moe_test", "FRAGMENT")
    lib.define(str(op._schema).split("::", 1)[1])
    lib.impl(name, kernel, "CPU")
    torch.library.register_fake(f"ascend_moe_test::{name}", lambda *args: op(*args), lib=lib)
    _LIBS.append(lib)
    return getattr(torch.ops.ascend_moe_test, name).default


def _bytes(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.uint8) if x.element_size() == 1 else x


def check_opaque(name: str, kernel, samples) -> None:
    """opcheck (bitwise input checks in place of test_schema's allclose, which FP8 lacks), no input mutated or
    aliased, and ``torch.compile(fullgraph=True)`` equal to the kernel, for each sample."""
    test_op = opaque_op(name, kernel)
    for s in samples:
        utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
        torch.library.opcheck(test_op, s.args, test_utils=utils)
        tensors = [x for x in s.args if isinstance(x, torch.Tensor)]
        before = [_bytes(x).clone() for x in tensors]
        outs = test_op(*s.args)
        for x, b in zip(tensors, before):
            assert torch.equal(_bytes(x), b), f"{name}: an input was mutated"
            for out in _outputs(outs):
                assert not torch._C._is_alias_of(out, x), f"{name}: an output aliases an input"
        torch._dynamo.reset()
        compiled = torch.compile(lambda *a: test_op(*a), fullgraph=True, backend="aot_eager")
        got, want = compiled(*s.args), kernel(*s.args)
        for g, w in zip(_outputs(got), _outputs(want), strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape, name
            if g.element_size() == 1:
                assert torch.equal(_bytes(g), _bytes(w)), name
            else:
                assert torch.equal(g.isnan(), w.isnan()) and torch.equal(g.nan_to_num(), w.nan_to_num()), name


def _outputs(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)
