"""``bench dsa``: its cases run, and the decode case's two sides attend over the same K and V (the FP8 cache's
records, their block table and the dense baseline's folded heads and causal mask agree)."""

from __future__ import annotations

import pytest
import torch

from torch_ascend_moe.bench import dsa
from torch_ascend_moe.testing import calc_diff


def test_cases_match_the_issue():
    names = [c.name for c in dsa.cases()]
    assert sum("decode" in n and " s4096 " in n and "top-2048" in n for n in names) == 2  # s_q 1 and 2
    assert sum("decode" in n and " s16384 " in n and "top-2048" in n for n in names) == 2
    assert all("h128" in n for n in names if "decode" in n)  # V3.2's decode heads
    assert all(c.memory for c in dsa.cases())


@pytest.mark.parametrize("case", dsa.cases(quick=True), ids=lambda c: c.name.split(" (")[0])
def test_quick_cases_run(case):
    ours, baseline = case.setup()
    got, want = ours(), baseline()
    assert got.shape == want.shape and got.dtype == want.dtype == torch.bfloat16
    assert got.isfinite().all() and want.isfinite().all()


def test_v32_records_bytes():
    g = torch.Generator().manual_seed(1)
    values = torch.randn(5, 576, generator=g) * torch.tensor([1e-6, 1e-2, 1.0, 30.0, 1e3])[:, None]
    records, held = dsa.v32_records(values)
    assert records.shape == (5, 656) and records.dtype == torch.uint8
    codes = records[:, :512].view(torch.float8_e4m3fn).double().view(5, 4, 128)
    scales = records[:, 512:528].contiguous().view(torch.float32).double()  # [5, 4]
    assert torch.equal(scales, torch.exp2(torch.log2(scales).round()))  # powers of two
    assert (codes.abs().amax(dim=-1) <= 448).all()
    nope = (codes * scales[..., None]).view(5, 512)
    rope = records[:, 528:].contiguous().view(torch.bfloat16)
    assert torch.equal(rope, values[:, 512:].bfloat16())
    assert torch.equal(held.double(), torch.cat([nope, rope.double()], dim=1))  # what the records hold, exactly
    tile = values[:, :512].abs().view(5, 4, 128).amax(dim=-1).clamp(min=1e-4 * 448).repeat_interleave(128, dim=1)
    assert ((nope - values[:, :512].double()).abs() <= tile.double() / 16).all()  # E4M3: 3 mantissa bits


@pytest.mark.parametrize("s_q", [1, 2])
def test_decode_sides_agree_over_every_record(s_q):
    """Each query token selects every position up to itself: the sparse op over the paged records equals dense SDPA
    over the same values (with s_q 2 only the first token can select all it sees: topk s - 1)."""
    s = 128
    ours, dense = dsa._decode(3, s, s_q, 8, s - s_q + 1).setup()
    got, want = ours(), dense()
    assert calc_diff(got[:, 0], want[:, 0]) < 1e-7
    if s_q == 2:  # the second token's selection misses one of the s it sees: the comparison would notice
        assert calc_diff(got[:, 1], want[:, 1]) > 1e-5
