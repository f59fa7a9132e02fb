"""Values near FP32's maximum in the scaled GEMMs: the result is the contract's, ``deq(A) @ deq(B)^T`` in FP32, on
every kernel path. The few-row streaming kernel sums a K block of deq(A) times B's codes before B's scale; with a
huge deq(A) against a small B scale that sum overflowed where the contract is finite (a 1-row call gave inf, the
same row in a 64-row call 3e38), so such calls take the panel path."""

import pytest
import torch

import torch_ascend_moe  # noqa: F401  (registers the ops)

ops = torch.ops.ascend_moe
K = 256


def _operands(rows: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(rows, K, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    a[:, 1:128] = 0.0
    a[:, 0] = 448.0  # deq(A)[:, 0] = 3e38, the rest of its block 0: one product near the top of FP32's range
    sfa = torch.full((rows, K // 128), 3e38 / 448)
    sfa[:, 1:] = torch.rand(rows, K // 128 - 1, generator=g) * 1e-3
    b = (torch.randn(8, K, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    b[:, 0] = 2.0  # code 2 with scale 0.5: deq(B) = 1, but the unscaled block sum 6e38 overflows
    sfb = torch.full((1, K // 128), 0.5)  # deq(B) small: every product and sum stays finite in FP32
    return a, sfa, b, sfb


def _reference(a, sfa, b, sfb) -> torch.Tensor:
    deq_a = a.float() * sfa.repeat_interleave(128, dim=1)
    deq_b = b.float() * sfb.repeat_interleave(128, dim=1).expand(b.shape[0], -1)
    return deq_a.double() @ deq_b.double().T


@pytest.mark.parametrize("rows", [1, 3, 8, 64])
def test_huge_deq_a_against_a_small_b_scale(rows):
    a, sfa, b, sfb = _operands(rows, seed=rows)
    ref = _reference(a, sfa, b, sfb)
    assert ref.abs().max() < torch.finfo(torch.float32).max
    recipe_a, recipe_b = [1, 128], [128, 128]
    outs = {
        "fp8_gemm": ops.fp8_gemm(a, sfa, b, sfb, None, recipe_a, recipe_b, 1.0, torch.float32),
        "fp8_bmm": ops.fp8_bmm(a[None], sfa[None], b[None], sfb[None], None, recipe_a, recipe_b, 1.0, torch.float32)[0],
        "m_grouped_fp8_gemm": ops.m_grouped_fp8_gemm(
            a,
            sfa,
            b[None],
            sfb[None],
            torch.tensor([rows], dtype=torch.int32),
            True,
            1,
            recipe_a,
            recipe_b,
            torch.float32,
        ),
        "m_grouped_fp8_gemm_masked": ops.m_grouped_fp8_gemm_masked(
            a[None],
            sfa[None],
            b[None],
            sfb[None],
            torch.tensor([rows], dtype=torch.int32),
            recipe_a,
            recipe_b,
            torch.float32,
        )[0],
    }
    for name, out in outs.items():
        assert torch.isfinite(out).all(), f"{name}: {out.flatten()[:4].tolist()}"
        torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=0, msg=name)
    # a row alone gives what it gives among others (the streaming and panel paths agree here)
    single = ops.fp8_gemm(a[:1], sfa[:1], b, sfb, None, recipe_a, recipe_b, 1.0, torch.float32)
    torch.testing.assert_close(single, outs["fp8_gemm"][:1], rtol=1e-6, atol=0)
