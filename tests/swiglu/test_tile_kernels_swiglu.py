"""torch_ascend_moe.tile_kernels' fused SwiGLU kernels and routing layout on TileKernels' test pattern, against
references written from the spec (not the package's own ``tile_kernels.torch``, which shares the implementation):

- ``get_fused_mapping``: upstream's own consistency checks, plus the layout's block arithmetic, ``force_no_sync``
  and a given ``num_expanded_tokens``; ``expand_to_fused(_with_sf)`` and ``reduce_fused`` against loops over the
  (token, slot) pairs (the reduce's fused multiply-add computed exactly with fractions);
- SwiGLU forward / backward in both APIs (v1's maps, the Ascend era's psum layout) bit for bit: codes, scales in
  every layout, FP32/BF16 outputs, clamp counters; v1's weight gradient within upstream's 1e-4.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch_ascend_moe.tile_kernels as tile_kernels
from tests.quant.specs import quantize_blocks_reference
from tests.quant.test_tile_kernels_casts import _expected_sf
from tests.swiglu.specs import backward_fp32_x_grad, fma_f32, forward_fp32, layout_mask
from torch_ascend_moe.tile_kernels.testing.numeric import assert_equal

moe, quant = tile_kernels.moe, tile_kernels.quant
FP8 = torch.float8_e4m3fn


def _topk_idx(tokens: int, experts: int, topk: int, ranks: int, seed: int) -> torch.Tensor:
    """Upstream's generator: top-k over every rank's experts, non-local ones -1, all -1 rows dropped."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(tokens * ranks, experts * ranks, generator=g)
    idx = scores.topk(topk, dim=-1).indices
    idx = torch.where(idx >= experts, -1, idx)
    return idx[~(idx < 0).all(1)].contiguous()


@pytest.mark.parametrize("alignment", [1, 16, 64])
@pytest.mark.parametrize("experts,topk,ranks", [(9, 6, 8), (4, 2, 64), (32, 8, 8)])
def test_get_fused_mapping(alignment, experts, topk, ranks):
    idx = _topk_idx(40, experts, topk, ranks, seed=alignment + experts)
    t = idx.shape[0]
    p2e, p2t, p2tt, ttp, start, end, counts, counts_list = moe.get_fused_mapping(idx, experts, 0, alignment)
    raw = [int((idx == e).sum()) for e in range(experts)]
    aligned = [-(-c // alignment) * alignment for c in raw]
    assert counts_list == aligned == counts.tolist()
    assert start.tolist() == [sum(aligned[:e]) for e in range(experts)] and end.tolist() == np.cumsum(aligned).tolist()
    assert p2e.shape[0] == sum(aligned) and all(a.dtype == torch.int32 for a in (p2e, p2t, p2tt, ttp, start, end))
    for e in range(experts):  # the block: e's pairs, then padding
        block = p2e[start[e] : end[e]].tolist()
        assert block == [e] * raw[e] + [-1] * (aligned[e] - raw[e])
    for i in range(t):
        for j in range(topk):
            pos = int(ttp[i, j])
            if idx[i, j] < 0:
                assert pos == -1
            else:
                assert (int(p2e[pos]), int(p2t[pos]), int(p2tt[pos])) == (int(idx[i, j]), i, i * topk + j)
    assert torch.equal(p2e < 0, p2t < 0) and torch.equal(p2e < 0, p2tt < 0)
    # Without the host read: upstream's upper bound of rows, tail -1, no list; a given size is kept.
    bound = (t * topk + (alignment - 1) * experts) // alignment * alignment
    p2e2, _, _, ttp2, *_, counts_list2 = moe.get_fused_mapping(idx, experts, 0, alignment, force_no_sync=True)
    assert counts_list2 == [] and p2e2.shape[0] == bound and torch.equal(p2e2[: p2e.shape[0]], p2e)
    assert bool((p2e2[p2e.shape[0] :] == -1).all()) and torch.equal(ttp2, ttp)
    assert moe.get_fused_mapping(idx, experts, bound + 5, alignment)[0].shape[0] == bound + 5


def test_get_fused_mapping_no_sync_path_compiles():
    """With the rows given (upstream's no-sync path) nothing reads a count on the host: it compiles with
    ``fullgraph=True`` and gives eager's mapping."""
    idx = _topk_idx(33, 16, 6, 16, seed=5)
    rows = 33 * 6 + 16 * 64

    def mapping(t):
        return moe.get_fused_mapping(t, 16, rows, 64, force_no_sync=True)[:7]

    torch._dynamo.reset()
    for eager, compiled in zip(mapping(idx), torch.compile(mapping, fullgraph=True)(idx)):
        assert torch.equal(eager, compiled)


def test_expand_and_reduce():
    idx = _topk_idx(30, 8, 4, 8, seed=3)
    p2e, p2t, p2tt, ttp, *_ = moe.get_fused_mapping(idx, 8, 0, 16)
    t, k = idx.shape
    g = torch.Generator().manual_seed(4)
    x = torch.randn(t, 256, generator=g).bfloat16()
    out = moe.expand_to_fused(x, ttp, p2e)
    want = torch.zeros(p2e.shape[0], 256, dtype=torch.bfloat16)
    for pos in range(p2e.shape[0]):
        if p2e[pos] >= 0:
            want[pos] = x[p2t[pos]]
    assert_equal(out, want)
    # With scales: FP32 per-token, and packed UE8M0 int32 with the column-major layout.
    fp8, sf = quant.per_token_cast(x, "e4m3", 128, round_sf=True)
    for scales, col_major in [(sf, False), (sf, True), (quant._layout(sf, True, True).contiguous(), True)]:
        data, out_sf = moe.expand_to_fused_with_sf((fp8, scales), 128, ttp, p2e, col_major)
        codes = torch.where(p2e[:, None] >= 0, fp8.view(torch.uint8)[p2t.clamp(min=0)], 0)
        assert torch.equal(data.view(torch.uint8), codes) and data.dtype == FP8
        assert torch.equal(moe.expand_to_fused(fp8, ttp, p2e).view(torch.uint8), codes)  # FP8 without scales too
        rows = torch.where(p2e[:, None] >= 0, scales[p2t.clamp(min=0)], 0)
        assert torch.equal(out_sf, rows) and (not col_major or out_sf.stride() == (1, -(-p2e.shape[0] // 4) * 4))
    # reduce_fused: slot-order fused multiply-adds from 0 into FP32, then the output scale, one final cast.
    y = torch.randn(p2e.shape[0], 256, generator=g)
    w = torch.rand(t, k, generator=g)
    y_sf = torch.rand(p2e.shape[0], generator=g) + 0.5
    for weights, row_sf, fmt, sf_out in [(w, None, "", None), (None, y_sf, "", None), (w, y_sf, "e4m3", 3.0)]:
        inp = y if row_sf is None else (y, row_sf)
        got = moe.reduce_fused(inp, weights, ttp, fmt, None if sf_out is None else torch.tensor([sf_out]))
        acc = np.zeros((t, 256), dtype=np.float32)
        for i in range(t):
            for j in range(k):
                pos = int(ttp[i, j])
                if pos < 0:
                    continue
                s = np.float32(1.0 if weights is None else float(weights[i, j]))
                if row_sf is not None:
                    s = np.float32(s * np.float32(float(row_sf[pos])))
                acc[i] = [fma_f32(float(v), float(s), float(a)) for v, a in zip(y[pos].tolist(), acc[i].tolist())]
        want = torch.from_numpy(acc) * (1.0 if sf_out is None else sf_out)
        assert_equal(got, want.to(FP8 if fmt else torch.float32))


def _v1_inputs(hidden: int, seed: int, alignment: int = 16):
    idx = _topk_idx(24, 8, 6, 8, seed)
    p2e, p2t, p2tt, ttp, *_ = moe.get_fused_mapping(idx, 8, 0, alignment)
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(idx.shape[0], 6, generator=g)
    x = moe.expand_to_fused(torch.randn(idx.shape[0], 2 * hidden, generator=g).bfloat16() * 2, ttp, p2t)
    row_w = torch.tensor([float(w.view(-1)[p]) if p >= 0 else 0.0 for p in p2tt.tolist()])
    return x, w, p2e, p2t, p2tt, ttp, row_w


@pytest.mark.parametrize("clamp", [None, 10.0, 0.5])
@pytest.mark.parametrize(
    "npc,layout", [(128, (False, True, False)), (128, (True, True, True)), ("hidden", (False, True, False))]
)
@pytest.mark.parametrize("with_weights", [True, False])
def test_v1_forward_and_per_token_cast(clamp, npc, layout, with_weights):
    hidden = 256
    npc = hidden if npc == "hidden" else npc
    col_major, round_sf, packed = layout
    x, w, p2e, _, p2tt, _, row_w = _v1_inputs(hidden, seed=int(npc + (clamp or 0) * 10))
    count = torch.zeros(3, dtype=torch.int64)
    data, sf = quant.swiglu_forward_and_per_token_cast(
        x, "e4m3", npc, p2tt if with_weights else None, w if with_weights else None, p2e, col_major, round_sf, packed,
        clamp, count if clamp is not None else None,
    )  # fmt: skip
    y = forward_fp32(x, row_w if with_weights else None, None, 1, None, clamp)
    ref_data, ref_sf = quantize_blocks_reference(y, "e4m3", [1, npc], round_sf, None, None)
    live = p2e >= 0  # rows upstream leaves unspecified are the padding rows
    assert torch.equal(data[live].view(torch.uint8), ref_data.to(FP8)[live].view(torch.uint8))
    expected_sf = _expected_sf(ref_sf.float(), col_major, packed)
    assert sf.shape == expected_sf.shape and torch.equal(sf, expected_sf)
    if clamp is not None:
        a, b = x.float()[:, :hidden], x.float()[:, hidden:]
        assert count.tolist() == [int((a > clamp).sum()), int((b > clamp).sum()), int((b < -clamp).sum())]


@pytest.mark.parametrize("clamp", [None, 0.5])
@pytest.mark.parametrize("npc", [32, 128])
@pytest.mark.parametrize("round_sf", [False, True])
def test_v1_backward_and_per_token_cast(clamp, npc, round_sf):
    hidden = 256
    x, w, p2e, _, p2tt, ttp, row_w = _v1_inputs(hidden, seed=npc + int(round_sf))
    fp8, x_sf = quant.per_token_cast(x, "e4m3", npc)
    grad = torch.randn(x.shape[0], hidden, generator=torch.Generator().manual_seed(1)).bfloat16()
    out, (dx_fp8, dx_sf), dx, dw = quant.swiglu_backward_and_per_token_cast(
        (fp8, x_sf), grad, w, p2tt, ttp, num_per_channels=npc, round_sf=round_sf, swiglu_clamp_value=clamp
    )
    fp32 = backward_fp32_x_grad(fp8, x_sf, grad, row_w, None, 1, None, clamp)
    ref_q, ref_sf = quantize_blocks_reference(fp32, "e4m3", [1, npc], round_sf, None, None)
    assert_equal(dx, fp32.bfloat16())
    assert torch.equal(dx_fp8.view(torch.uint8), ref_q.to(FP8).view(torch.uint8)) and torch.equal(dx_sf, ref_sf.float())
    xf = fp8.float() * x_sf.repeat_interleave(npc, 1)
    assert_equal(out, forward_fp32(xf, row_w, None, 1, None, clamp).bfloat16())
    # dweight[t, j] = Σ_h grad · silu(a) · b at (t, j)'s row, 0 for unused slots (upstream: 1e-4 tolerance).
    a, b = xf[:, :hidden].double(), xf[:, hidden:].double()
    if clamp is not None:
        a, b = a.clamp(max=clamp), b.clamp(-clamp, clamp)
    per_row = (grad.double() * a * torch.sigmoid(a) * b).sum(1)
    want = torch.zeros_like(w, dtype=torch.float64)
    for i, j in zip(*torch.nonzero(ttp >= 0, as_tuple=True)):
        want[i, j] = per_row[ttp[i, j]]
    torch.testing.assert_close(dw, want.float(), atol=1e-4, rtol=1e-4)


def _psum_inputs(hidden: int, seed: int, alignment: int):
    idx = _topk_idx(24, 6, 4, 8, seed)
    p2e, p2t, _, ttp, start, _, _, counts = moe.get_fused_mapping(idx, 6, 0, alignment)
    raw = torch.tensor([int((idx == e).sum()) for e in range(6)], dtype=torch.int32)
    psum = start + raw  # DeepEP V2 / DeepGEMM: block start + real rows
    g = torch.Generator().manual_seed(seed)
    x = moe.expand_to_fused(torch.randn(idx.shape[0], 2 * hidden, generator=g) * 2, ttp, p2t)
    w = torch.where(p2e >= 0, torch.rand(p2e.shape[0], generator=g), 0)
    return x, w, psum, p2e


@pytest.mark.parametrize("fmt,npc", [("e4m3", 128), ("e4m3", 32), ("bf16", None), ("fp32", None)])
@pytest.mark.parametrize("clamp", [None, 0.5])
def test_ascend_forward(fmt, npc, clamp):
    hidden, alignment = 128, 16
    tile_kernels.config.set_token_alignment(alignment)
    try:
        x, w, psum, p2e = _psum_inputs(hidden, seed=7, alignment=alignment)
        count = torch.zeros(4, dtype=torch.int64)
        result = quant.swiglu_forward_and_per_token_cast(
            x, fmt, npc, psum, w, 2.0, round_sf=True, clamp_value=clamp, clamped_count=count if clamp else None
        )
        if fmt == "e4m3":
            assert quant.swiglu_forward(x, "fp32", psum, w, 2.0, clamp).dtype == torch.float32
    finally:
        tile_kernels.config.set_token_alignment(128)
    live = layout_mask(psum, alignment, x.shape[0])
    assert torch.equal(live, p2e >= 0)
    y = forward_fp32(x, w, psum, alignment, 2.0, clamp)
    if fmt == "e4m3":
        data, sf = result
        ref_data, ref_sf = quantize_blocks_reference(y, "e4m3", [1, npc], True, None, None)
        assert torch.equal(data.view(torch.uint8), ref_data.to(FP8).view(torch.uint8)) and torch.equal(
            sf, ref_sf.float()
        )
    else:
        assert_equal(result, y.to(torch.bfloat16 if fmt == "bf16" else torch.float32))
    if clamp is not None:
        a, b = x[live][:, :hidden], x[live][:, hidden:]
        assert count.tolist() == [int((a > clamp).sum()), int((b > clamp).sum()), int((b < -clamp).sum()),
                                  int(live.sum()) * hidden]  # fmt: skip


@pytest.mark.parametrize("quantized", [True, False])
def test_ascend_backward(quantized):
    hidden, alignment = 128, 8
    tile_kernels.config.set_token_alignment(alignment)
    try:
        x, w, psum, _ = _psum_inputs(hidden, seed=9, alignment=alignment)
        grad = torch.randn(x.shape[0], hidden, generator=torch.Generator().manual_seed(2)).bfloat16()
        grad = torch.where(layout_mask(psum, alignment, x.shape[0])[:, None], grad, 0)  # padding rows are 0 upstream
        if quantized:
            fp8, x_sf = quant.per_token_cast(x, "e4m3", 32)
            dx, (dq, dsf), dw, out = quant.swiglu_backward_and_per_token_cast(
                (fp8, x_sf), grad, "e4m3", 32, psum, w, 1.5, clamp_value=10.0, do_recompute=True
            )
            xin = fp8.float() * x_sf.repeat_interleave(32, 1)
        else:
            xb = x.bfloat16()
            dx, dw, out = quant.swiglu_backward(xb, grad, "bf16", psum, w, 1.5, 10.0, do_recompute=True)
            xin = xb
    finally:
        tile_kernels.config.set_token_alignment(128)
    fp32 = backward_fp32_x_grad(fp8 if quantized else xin, x_sf if quantized else None, grad, w, psum, alignment, 1.5,
                                10.0)  # fmt: skip
    assert_equal(dx, fp32.bfloat16())
    assert_equal(out, forward_fp32(xin, w, psum, alignment, 1.5, 10.0).bfloat16())
    if quantized:
        ref_q, ref_sf = quantize_blocks_reference(fp32, "e4m3", [1, 32], False, None, None)
        assert torch.equal(dq.view(torch.uint8), ref_q.to(FP8).view(torch.uint8)) and torch.equal(dsf, ref_sf.float())
    assert dw.shape == (x.shape[0],) and dw.dtype == torch.float32


def test_reference_api_forms():
    """``tile_kernels.torch``'s SwiGLU references read both APIs' calls."""
    x = torch.randn(12, 64)
    p2tt = torch.tensor([0, 1, 2, -1, 3, 4, 5, -1, 6, 7, -1, -1], dtype=torch.int32)
    w2 = torch.rand(4, 2)
    count3 = torch.zeros(3, dtype=torch.int64)
    v1 = tile_kernels.torch.swiglu_forward(x, p2tt, w2, 0.5, count3)
    rows = torch.tensor([float(w2.view(-1)[p]) if p >= 0 else 0.0 for p in p2tt.tolist()])
    assert_equal(v1, forward_fp32(x, rows, None, 1, None, 0.5)) and int(count3.sum()) > 0
    count4 = torch.zeros(4, dtype=torch.int64)
    asc = tile_kernels.torch.swiglu_forward(x, None, rows, 2.0, 0.5, count4)
    assert_equal(asc, forward_fp32(x, rows, None, 1, 2.0, 0.5)) and int(count4[3]) == 12 * 32
    dx, dw, out = tile_kernels.torch.swiglu_backward(x, torch.randn(12, 32), None, rows)
    assert dx.shape == (12, 64) and dw.shape == (12,) and out.shape == (12, 32)
