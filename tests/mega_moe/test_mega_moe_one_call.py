"""mega_moe's fixed cost on CPU. A single-process BF16 call without autograd runs as one C++ call, the fused shared
experts included (``_C._mega_moe_bf16_local``, csrc/ops/mega_moe_cpu.cpp): the same bits as the pipeline of our ops
it replaces, on both CPU paths (ATen's BF16 GEMM where the CPU has BF16 dot products, FP32 panels elsewhere), with
hostile routing and values; taken only where nothing records or traces the call; an out-of-range id raises the op's
own error. The checks' verdict is remembered per dtypes and shapes."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torch_ascend_moe import _C, mega_moe
from torch_ascend_moe.backends.portable import mega_moe as portable


@pytest.fixture(params=[1, 0], ids=["BF16 dot products", "FP32 panels"])
def native(request):
    was = _C._set_native_bf16_dot(request.param)
    yield request.param
    _C._set_native_bf16_dot(was)


def _inputs(seed, t, h, inter, e, k, drop, idx_dtype, hostile):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g).bfloat16()
    l1 = (torch.randn(e, 2 * inter, h, generator=g) * h**-0.5).bfloat16()
    l2 = (torch.randn(e, h, inter, generator=g) * inter**-0.5).bfloat16()
    idx = torch.randint(0, e, (t, k), generator=g)
    idx[torch.rand(t, k, generator=g) < drop] = -1
    w = torch.rand(t, k, generator=g)
    if hostile and t > 2:
        idx[0] = -1  # a token routed nowhere, holding the only subnormal value: it must not pick the path
        x[0, 0] = 1e-39
        w[1, 0], w[2, -1] = float("nan"), -3e38
        x[1, 1], x[2, 2] = -0.0, 3e38
    return x, idx.to(idx_dtype), w, l1, l2


def _pipeline(monkeypatch, *args, **kwargs):
    """The op with steps 2-7 as separate ops (the one call switched off)."""
    with monkeypatch.context() as m:
        m.setattr(portable, "_one_call", lambda a, keep_l1: False)
        return mega_moe(*args, **kwargs)


def _bits(t):
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


# The fixture is set once for all examples (the setting it holds does not change between them).
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    t=st.sampled_from([0, 1, 3, 8, 9, 40, 300]),
    shape=st.sampled_from([(64, 32), (128, 96), (64, 64)]),
    e=st.integers(1, 9),
    k=st.integers(1, 4),
    drop=st.sampled_from([0.0, 0.3, 0.9]),
    clamp=st.sampled_from([None, 0.5, 7.0]),
    shared=st.booleans(),
    idx_dtype=st.sampled_from([torch.int64, torch.int32]),
    hostile=st.booleans(),
    strided=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_one_call_is_the_pipeline_bit_for_bit(
    native, t, shape, e, k, drop, clamp, shared, idx_dtype, hostile, strided, seed
):
    h, inter = shape
    k = min(k, e)
    x, idx, w, l1, l2 = _inputs(seed, t, h, inter, e, k, drop, idx_dtype, hostile)
    if strided:  # a column slice: x's rows are not contiguous in memory
        x = torch.cat([x, x], dim=1)[:, :h]
    extra = {}
    if shared:
        g = torch.Generator().manual_seed(seed + 1)
        extra = dict(
            shared_l1_weights=(torch.randn(2 * inter, h, generator=g) * h**-0.5).bfloat16(),
            shared_l2_weights=(torch.randn(h, inter, generator=g) * inter**-0.5).bfloat16(),
        )
    calls, shared_calls = [], []
    real, real_shared = _C._mega_moe_bf16_local, portable.shared_experts
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_C, "_mega_moe_bf16_local", lambda *a: calls.append(1) or real(*a))
        m.setattr(portable, "shared_experts", lambda *a: shared_calls.append(1) or real_shared(*a))
        y, counts = mega_moe(x, idx, w, l1, l2, activation_clamp=clamp, **extra)
        assert calls == [1] and shared_calls == []  # the shared experts too inside the one call
        y_ref, counts_ref = _pipeline(m, x, idx, w, l1, l2, activation_clamp=clamp, **extra)
        assert calls == [1] and shared_calls == ([1] if shared else [])
    assert torch.equal(_bits(y), _bits(y_ref))
    assert torch.equal(counts, counts_ref)
    assert counts.tolist() == [int((idx == g).sum()) for g in range(e)]


def test_taken_only_where_nothing_records_or_traces(monkeypatch):
    x, idx, w, l1, l2 = _inputs(3, 9, 64, 32, 4, 2, 0.2, torch.int64, False)
    calls = []
    real = _C._mega_moe_bf16_local
    monkeypatch.setattr(_C, "_mega_moe_bf16_local", lambda *a: calls.append(1) or real(*a))
    y, _ = mega_moe(x, idx, w, l1, l2)  # no input requires grad
    assert calls == [1]
    with torch.no_grad():
        mega_moe(x, idx, w, l1.requires_grad_(), l2)
    assert calls == [1, 1]
    recorded, _ = mega_moe(x, idx, w, l1, l2)  # recorded for a backward: the tape's separate ops
    assert calls == [1, 1] and recorded.requires_grad
    assert torch.equal(_bits(recorded.detach()), _bits(y))
    l1.requires_grad_(False)
    compiled = torch.compile(lambda *a: mega_moe(*a)[0], fullgraph=True, backend="aot_eager")
    assert torch.equal(_bits(compiled(x, idx, w, l1, l2)), _bits(y))  # traced, then run eagerly: one call again


@pytest.mark.parametrize("bad", [-2, 4], ids=["below -1", "E"])
def test_an_out_of_range_id_raises_the_ops_error(bad, monkeypatch):
    x, idx, w, l1, l2 = _inputs(4, 5, 64, 32, 4, 2, 0.0, torch.int32, False)
    idx[3, 1] = bad
    with pytest.raises(ValueError) as one_call:
        mega_moe(x, idx, w, l1, l2)
    with pytest.raises(ValueError) as separate:
        _pipeline(monkeypatch, x, idx, w, l1, l2)
    assert str(one_call.value) == str(separate.value)
    assert "ascend_moe::mega_moe" in str(one_call.value) and f"got {bad}" in str(one_call.value)


def test_the_checks_verdict_is_remembered_per_dtypes_and_shapes(monkeypatch):
    """The op's Python checks run once per distinct (dtypes, shapes, clamp, timeout, group size); a bad call is
    checked (and refused) every time, whatever was called before."""
    monkeypatch.setattr(portable, "_CHECKED", {})
    runs = []
    real = portable.mega_moe_signature
    monkeypatch.setattr(portable, "mega_moe_signature", lambda *a: runs.append(1) or real(*a))
    x, idx, w, l1, l2 = _inputs(5, 6, 64, 32, 4, 2, 0.0, torch.int64, False)
    for _ in range(3):
        mega_moe(x, idx, w, l1, l2)
    assert len(runs) == 1
    mega_moe(x[:5], idx[:5], w[:5], l1, l2)  # another T
    mega_moe(x, idx, w, l1, l2, activation_clamp=1.0)
    assert len(runs) == 3
    for _ in range(2):
        with pytest.raises(ValueError, match="topk_weights"):
            mega_moe(x, idx, w.double(), l1, l2)
        with pytest.raises(ValueError, match="activation_clamp"):
            mega_moe(x, idx, w, l1, l2, activation_clamp=-1.0)
    assert len(runs) == 7
