"""Outputs are allocated uninitialised and only the rows no kernel writes are zeroed (issue 21's zero-fills): those
rows must still read 0 when the allocator hands back memory full of NaN (small blocks: malloc reuses a freed
chunk of the same size, so a freed NaN tensor is what the op's output is made of)."""

from __future__ import annotations

import torch

import torch_ascend_moe as tam


def _poisoned(fn, nbytes: int):
    """fn() right after freeing NaN-filled blocks of nbytes (several, so one is likely reused)."""
    junk = [torch.full((nbytes // 4,), float("nan")) for _ in range(4)]
    del junk
    return fn()


def test_m_grouped_rows_outside_every_group_are_zero():
    a, b = torch.randn(40, 16), torch.randn(3, 24, 16)
    psum = torch.tensor([5, 21, 24], dtype=torch.int32)  # aligned starts 0, 8, 24: rows 5-7, 21-39 unowned
    for _ in range(5):
        out = _poisoned(lambda: tam.m_grouped_bf16_gemm(a, b, psum, psum=True, alignment=8), 40 * 24 * 4)
        owned = torch.zeros(40, dtype=torch.bool)
        owned[0:5] = owned[8:21] = True
        assert torch.equal(out[~owned], torch.zeros_like(out[~owned]))
        assert torch.allclose(out[8:21], a[8:21] @ b[1].T, atol=1e-5)


def test_masked_rows_past_masked_m_are_zero():
    a, b = torch.randn(3, 10, 16), torch.randn(3, 8, 16)
    masked_m = torch.tensor([0, 4, 10], dtype=torch.int32)
    for _ in range(5):
        out = _poisoned(lambda: tam.m_grouped_bf16_gemm_masked(a, b, masked_m), 3 * 10 * 8 * 4)
        assert torch.equal(out[0], torch.zeros(10, 8)) and torch.equal(out[1, 4:], torch.zeros(6, 8))
        assert torch.allclose(out[2], a[2] @ b[2].T, atol=1e-5)


def test_k_grouped_groups_without_rows_are_zero_and_split_groups_sum():
    a, b = torch.randn(30, 6).bfloat16(), torch.randn(30, 5).bfloat16()
    ids = torch.tensor([0] * 7 + [-1] * 3 + [2] * 10 + [0] * 10, dtype=torch.int32)  # group 0 in two runs, 1 empty
    for _ in range(5):
        out = _poisoned(lambda: tam.k_grouped_bf16_gemm(a, b, ids, 3, psum=False, out_dtype=torch.float32), 3 * 30 * 4)
        assert torch.equal(out[1], torch.zeros(6, 5))
        for g in (0, 2):
            rows = ids == g
            want = a[rows].double().T @ b[rows].double()
            assert torch.allclose(out[g].double(), want, atol=1e-5)


def test_moe_permute_padding_rows_are_zero():
    x = torch.randn(9, 12)
    idx = torch.tensor([[0, 2], [2, -1], [0, 1], [2, 0], [1, 2], [0, 2], [2, 1], [0, -1], [2, 2]])
    for _ in range(5):
        out, row_map, offs = _poisoned(lambda: tam.moe_permute(x, idx, 4, alignment=8), (16 + 3 * 7) * 12 * 4)
        filled = torch.zeros(out.shape[0], dtype=torch.bool)
        filled[row_map[row_map >= 0].long()] = True
        assert torch.equal(out[~filled], torch.zeros_like(out[~filled]))
