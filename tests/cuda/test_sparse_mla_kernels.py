"""The sparse_mla family's CUDA kernel (backends/cuda/_sparse_mla.py behind ``sparse_mla_prefill``) on CPU tensors
in Triton's interpreter (tests/conftest.py sets ``TRITON_INTERPRET=1`` without a GPU): values against the specs'
fp64 reference and the C++ kernel (BF16, FP16, FP32; d_qk 576 / d_v 512 once), the exact semantics of invalid
indices, ``topk_length``, sinks (+-inf, NaN), lonely tokens and NaN in rows nobody selects, head and column tails,
strides, which samples take the kernel, no host read under an emulated capture, the bad-input campaign, opcheck and
``torch.compile`` through an opaque op, and the ``bench cuda`` row. On a GPU the family's contract harness runs the
compiled kernel (tools/device_check.sh)."""

from __future__ import annotations

import math
from unittest import mock

import pytest
import torch

pytest.importorskip("triton")

from tests.capture_emulation import capturing_everywhere  # noqa: E402
from tests.chains import cuda_chain as kernels  # noqa: E402
from tests.chains import labels  # noqa: E402
from tests.cuda.opaque import check_opaque  # noqa: E402
from tests.npu.test_capture import no_host_reads  # noqa: E402
from tests.sparse_mla import specs as T  # noqa: E402
from torch_ascend_moe.backends.cuda import _sparse_mla, _triton  # noqa: E402
from torch_ascend_moe.testing import calc_diff, campaign  # noqa: E402
from torch_ascend_moe.testing.harness import THRESHOLDS  # noqa: E402

pytestmark = [
    pytest.mark.skipif(
        not _triton.INTERPRETED, reason="Triton's interpreter is off in this process (a GPU compiles the kernels)"
    ),
    # numpy under the interpreter warns where IEEE gives inf / NaN on purpose (a lonely token's log(0), NaN inputs)
    pytest.mark.filterwarnings("ignore:(divide by zero|invalid value|overflow) encountered:RuntimeWarning"),
]
SPEC = next(s for s in T.SPECS if s.name == "sparse_mla_prefill")
DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


def _samples(dtypes=DTYPES):
    return [(dtype, s) for dtype in dtypes for small in (False, True) for s in T.samples("cpu", dtype, small=small)]


def _takes(s) -> bool:
    q, kv, indices = s.args[:3]
    return q.dtype != torch.float64 and min(q.shape[0], q.shape[1], kv.shape[0], indices.shape[2]) > 0


def test_registered():
    assert labels("sparse_mla_prefill", "cuda") == [
        "flash_mla.sparse_prefill_fwd",
        "flash_mla.flash_mla_sparse_fwd (G2: flash_mla.cuda)",
        "triton: _sparse_mla",
        "portable",
    ]


def _ulps(dtype) -> int:
    """How far from the C++ kernel, in ulps of the output's largest magnitude: the same FP32 terms summed in
    another order (over d_qk in chunks, over the top-k online), then one rounding (16-bit: at most one step)."""
    return {torch.bfloat16: 1, torch.float16: 2}.get(dtype, 64)


def _agree(got, want, ref, where, threshold=None) -> None:
    """Each output: the op's meta, NaN / +-inf exactly where ``want`` (the C++ kernel) has them, within a few ulps
    of it, and (``threshold``) within the fp64 reference's calc_diff threshold."""
    for k, (g, w, r) in enumerate(zip(got, want, ref, strict=True)):
        at = f"{where} output {k}"
        assert (g.shape, g.dtype, g.stride()) == (w.shape, w.dtype, w.stride()), at
        g64, w64 = g.double(), w.double()
        assert torch.equal(g64.isnan(), w64.isnan()), f"{at}: NaN placement"
        special = ~w64.isfinite() & ~w64.isnan()
        assert torch.equal(g64.isfinite(), w64.isfinite()) and torch.equal(g64[special], w64[special]), f"{at}: inf"
        finite = w64.isfinite()
        if finite.any():
            scale = max(w64[finite].abs().max().item(), 1e-30)
            tol = _ulps(g.dtype) * torch.finfo(g.dtype).eps * scale
            assert (g64[finite] - w64[finite]).abs().max().item() <= tol, at
            if threshold is not None and r.double()[finite].square().sum() > 0:
                assert calc_diff(g64[finite], r.double()[finite]) < threshold, at


def test_values_vs_fp64_and_the_cpu_kernel():
    """The specs' samples (upstream's invalid values incl. the int32 extremes, a repeated row, a lonely token, +-inf
    sinks, topk_length from 0, strided q and kv, d_qk 576 / d_v 512 and 512 / 512, h_q 64 / 16 / 4 / 2 / 3): the
    Triton path taken exactly where ``_takes`` says, the op's outputs, within the fp64 reference's threshold."""
    taken = 0
    for dtype, s in _samples():
        where = f"{s.name}, {dtype}"
        with mock.patch.object(_sparse_mla, "sparse_mla_prefill", wraps=_sparse_mla.sparse_mla_prefill) as launch:
            got = kernels.sparse_mla_prefill(*s.args)
        assert launch.called == _takes(s), f"{where}: Triton path taken = {launch.called}"
        taken += launch.called
        want = torch.ops.ascend_moe.sparse_mla_prefill(*s.args)
        # FP64 is the portable kernel's (its own tests hold it to the reference); here: that it is handed over.
        threshold = THRESHOLDS[dtype] if dtype != torch.float64 else None
        _agree(got, want, T.reference(*s.args), where, threshold)
    assert taken


def test_the_gpu_dot_forms_interpreted():
    """The GPU's forms of the dots (a 16-bit QK dot; P split into a TF32 head and tail against V), which the
    interpreter runs right for FP16 (not for BF16, see _mqa): the same agreement."""
    for s in T.samples("cpu", torch.float16)[:3]:
        with mock.patch.object(_sparse_mla, "INTERPRETED", False):
            got = kernels.sparse_mla_prefill(*s.args)
        want = torch.ops.ascend_moe.sparse_mla_prefill(*s.args)
        _agree(got, want, T.reference(*s.args), s.name, THRESHOLDS[torch.float16])


def _edge_case(dtype, seed=3):
    """Tails everywhere: h_q 72 (a full 64-head block and a partial one), d_qk 40 / d_v 24 (under one column block),
    topk 70 (three position blocks, the last partial); indices a strided view with invalid values, q with its heads
    apart in memory; topk_length 0, negative, topk, past topk; sinks +inf, -inf and NaN."""
    g = torch.Generator().manual_seed(seed)
    s_q, h_q, d_qk, d_v, s_kv, topk = 6, 72, 40, 24, 50, 70
    q = torch.randn(h_q, s_q, d_qk, generator=g).to(dtype).transpose(0, 1)  # strides (d_qk, s_q * d_qk, 1)
    kv = torch.randn(s_kv, 1, d_qk, generator=g).to(dtype)
    indices = torch.empty(s_q, 1, 2 * topk, dtype=torch.int32)[..., ::2]
    indices.copy_(T.make_indices(s_q, s_kv, topk, g))
    acc = torch.float32 if dtype != torch.float64 else torch.float64
    sink = torch.randn(h_q, generator=g).to(acc)
    sink[:3] = torch.tensor([math.inf, -math.inf, math.nan])
    length = torch.tensor([0, -3, topk, topk + 9, 33, 1], dtype=torch.int32)
    return q, kv, indices, 0.3, d_v, sink, length


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_tails_strides_lengths_and_sinks(dtype):
    args = _edge_case(dtype)
    with mock.patch.object(_sparse_mla, "sparse_mla_prefill", wraps=_sparse_mla.sparse_mla_prefill) as launch:
        got = kernels.sparse_mla_prefill(*args)
    assert launch.called
    _agree(got, torch.ops.ascend_moe.sparse_mla_prefill(*args), T.reference(*args), dtype, THRESHOLDS[dtype])
    out, max_logits, lse = got
    for i in (0, 1):  # topk_length 0 and negative: lonely tokens, whatever the sink (NaN included)
        assert torch.equal(out[i], torch.zeros_like(out[i]))
        assert max_logits[i].isneginf().all() and lse[i].isposinf().all()
    # A NaN sink poisons its head's output where the token has a row (lse finite: the sink never touches it) only.
    assert torch.equal(out[:, 2].isnan().all(-1), lse[:, 2].isfinite()) and lse[2:, 2].isfinite().any()
    assert not out[:, torch.arange(72) != 2].isnan().any()


def test_sinks_and_lengths_are_exact():
    """A -inf sink is no sink and a +inf sink zeroes the output, bit for bit, neither touching the stats; a
    topk_length is the same call with the positions past it set to -1."""
    q, kv, indices, scale, d_v, _, length = _edge_case(torch.float32)
    plain = kernels.sparse_mla_prefill(q, kv, indices, scale, d_v, None, None)
    minus = kernels.sparse_mla_prefill(q, kv, indices, scale, d_v, torch.full((72,), -math.inf), None)
    plus = kernels.sparse_mla_prefill(q, kv, indices, scale, d_v, torch.full((72,), math.inf), None)
    for a, b in zip(plain, minus, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(plus[0], torch.zeros_like(plus[0]))
    assert torch.equal(plus[1], plain[1]) and torch.equal(plus[2], plain[2])
    cut = indices.clone()
    for i, n in enumerate(length.tolist()):
        cut[i, 0, max(n, 0) :] = -1
    got = kernels.sparse_mla_prefill(q, kv, indices, scale, d_v, None, length)
    for a, b in zip(got, kernels.sparse_mla_prefill(q, kv, cut, scale, d_v, None, None), strict=True):
        assert torch.equal(a, b)


def test_nan_only_where_selected():
    """NaN in every KV row no valid position selects (rows only positions past topk_length point at included)
    changes nothing, bit for bit; NaN in a selected row reaches the tokens (all their heads) that select it, as in
    the C++ kernel."""
    q, kv, indices, scale, d_v, sink, length = _edge_case(torch.bfloat16, seed=4)
    args = (q, kv, indices, scale, d_v, sink, length)
    want = kernels.sparse_mla_prefill(*args)
    positions = torch.arange(indices.shape[2])
    valid = (indices[:, 0] >= 0) & (indices[:, 0] < kv.shape[0]) & (positions < length[:, None])
    selected = set(indices[:, 0][valid].tolist())
    assert selected and len(selected) < kv.shape[0]
    poisoned = kv.clone()
    poisoned[[r for r in range(kv.shape[0]) if r not in selected]] = math.nan
    for a, b in zip(kernels.sparse_mla_prefill(q, poisoned, *args[2:]), want, strict=True):
        assert torch.equal(a.nan_to_num(), b.nan_to_num()) and torch.equal(a.isnan(), b.isnan())
    poisoned[min(selected), 0, 5] = math.nan
    got = kernels.sparse_mla_prefill(q, poisoned, *args[2:])
    ours = torch.ops.ascend_moe.sparse_mla_prefill(q, poisoned, *args[2:])
    assert got[0].isnan().any()
    for a, b in zip(got, ours, strict=True):
        assert torch.equal(a.isnan(), b.isnan())


def test_overflowing_logits_as_the_cpu_kernel():
    """A logit that overflows FP32 to +inf: max_logits and lse +inf, out NaN (exp(inf - inf)); a head whose every
    logit is -inf: out 0, max_logits and lse -inf (it has rows: not lonely). Sinks or not."""
    g = torch.Generator().manual_seed(0)
    q, kv = torch.randn(3, 2, 16, generator=g), torch.randn(9, 1, 16, generator=g).clamp(-1, 1)
    kv[4, 0, 0] = 10
    q[1, 0], q[2, 1] = 0, 0
    q[1, 0, 0], q[2, 1, 0] = 3e38, -3e38  # 0.5 * 3e38 * 10 overflows; token 2 selects only row 4
    indices = torch.tensor([[[4, 1, 2]], [[0, 4, 7]], [[4, 4, 4]]], dtype=torch.int32)
    for sink in (None, torch.tensor([0.5, -1.0])):
        args = (q, kv, indices, 0.5, 8, sink, None)
        got, want = kernels.sparse_mla_prefill(*args), torch.ops.ascend_moe.sparse_mla_prefill(*args)
        _agree(got, want, want, "overflow")
        assert got[0][1, 0].isnan().all() and got[2][1, 0].isposinf() and got[2][2, 1].isneginf()


def test_rows_after_an_empty_block_with_very_negative_logits():
    """A token whose first block of positions has no row and whose rows' logits are about -250 (exp(250)
    overflows FP32: the first rescale must not be formed from it)."""
    g = torch.Generator().manual_seed(1)
    kv = torch.randn(5, 1, 16, generator=g)
    q = torch.stack([-50 * kv[3, 0], kv[1, 0]])[:, None, :].expand(2, 3, 16).contiguous()
    indices = torch.full((2, 1, _sparse_mla.BLOCK_K + 8), -1, dtype=torch.int32)
    indices[0, 0, _sparse_mla.BLOCK_K :] = 3
    indices[1, 0, -1] = 1
    args = (q, kv, indices, 1.0, 16, None, None)
    got = kernels.sparse_mla_prefill(*args)
    # Against the fp64 reference only: the C++ kernel's exp(logit - lse) carries an FP32 ulp of 250 (~1e-5).
    for a, ref in zip(got, T.reference(*args), strict=True):
        assert a.isfinite().all() and calc_diff(a.double(), ref) < 1e-10
    assert got[1][0].max() < -100 and torch.allclose(got[0][0], kv[3, 0].expand(3, 16))


def test_no_host_read_while_capturing():
    for _, s in _samples((torch.bfloat16,)):
        if not _takes(s):
            continue
        eager = kernels.sparse_mla_prefill(*s.args)
        with capturing_everywhere(), no_host_reads():
            captured = kernels.sparse_mla_prefill(*s.args)
        for a, b in zip(eager, captured, strict=True):
            assert torch.equal(a, b), s.name


def test_bad_inputs_raise_our_errors():
    for bad in SPEC.bad_inputs("cpu"):
        with pytest.raises(bad.error, match=bad.match):
            kernels.sparse_mla_prefill(*bad.args)


def test_hostile_inputs_agree_with_the_cpu_kernel():
    samples = T.samples("cpu", torch.float32, small=True)[:1]
    problems, count = campaign.kernel_problems(SPEC, kernels.sparse_mla_prefill, samples)
    assert count and not problems, "\n".join(problems[:5])


def test_opcheck_and_compile_through_an_opaque_op():
    samples = [s for _, s in _samples((torch.bfloat16,)) if _takes(s) and s.args[0].shape[2] < 100]
    check_opaque("sparse_mla_prefill", kernels.sparse_mla_prefill, [samples[-1], samples[-2]])


def test_bench_case_times_two_equal_computations(monkeypatch):
    """``bench cuda``'s row on CPU tensors (the C++ kernel there): our op and its baseline compute the same."""
    from torch_ascend_moe.bench import cuda as cases_module

    def bf16(*shape, seed=0):
        return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).bfloat16()

    monkeypatch.setattr(cases_module, "_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(cases_module, "_bf16", bf16)
    ours, baseline = cases_module._sparse_prefill(8, 32, 4, 16).setup()
    for a, b in zip(ours(), baseline(), strict=True):
        assert a.shape == b.shape and calc_diff(a.float(), b.float()) < 1e-5
