"""TorchAir GE graph mode: our converters (``_registry.npu_ge_converter``) run inside TorchAir's own FX-to-GE
conversion from the pinned torch_npu wheel (``npu_wheel.ge_graph``: GeConcreteGraph, torch_npu's converters),
and the GE graph they build is evaluated on CPU (tests/npu/ge_eval.py) against the spec's fp64 reference."""

from __future__ import annotations

import importlib

import pytest
import torch

from tests.chains import npu_chain
from tests.grouped.specs import SPECS
from tests.npu import ge_eval
from tests.npu.test_grouped_adapters import _cases as _grouped_cases
from tests.npu.test_grouped_adapters import _out_dtype_variants
from torch_ascend_moe._registry import NPU_GE_CONVERTERS, NPU_GE_IR, with_defaults
from torch_ascend_moe.backends import npu as npu_backend
from torch_ascend_moe.testing import calc_diff, npu_wheel
from torch_ascend_moe.testing.harness import THRESHOLDS

npu_backend.register()  # every family module: their converters are declared at import
GROUPED = [s for s in SPECS if NPU_GE_IR.get(s.name) == "GroupedMatmul"]
ASCEND_A3, ASCEND_950 = 250, 260


@pytest.fixture(scope="module")
def air(npu_ops):
    importlib.import_module("tests.npu.grouped_refs")  # CPU reference of npu_grouped_matmul for ge_eval
    return npu_wheel.torchair()


def _op_call(spec):
    def call(*args):
        return getattr(torch.ops.ascend_moe, spec.name)(*args)

    return call


def _tensor_args(s):
    return [a for a in s.args if isinstance(a, torch.Tensor)]


def _bind(s):
    """The sample as fn(*tensors): non-tensor arguments fixed, so they reach the converter as Python values."""
    positions = [i for i, a in enumerate(s.args) if isinstance(a, torch.Tensor)]

    def bound(call):
        def fn(*tensors):
            args = list(s.args)
            for i, t in zip(positions, tensors):
                args[i] = t
            return call(*args)

        return fn

    return bound


def _cases(spec):
    """Non-empty samples (TorchAir replaces an all-empty node by zeros before any converter runs), in the spec's
    dtypes and with an explicit out_dtype other than the input's."""
    return [(dtype, s) for dtype, s in _grouped_cases(spec) + _out_dtype_variants(spec) if s.args[0].numel()]


def test_every_converter_is_registered_in_torchair(air):
    assert {"m_grouped_bf16_gemm", "m_grouped_bf16_gemm_masked", "k_grouped_bf16_gemm"} <= NPU_GE_CONVERTERS.keys()
    for name in NPU_GE_CONVERTERS:
        assert air.converter(getattr(torch.ops.ascend_moe, name).default) is not None, name


DYNAMIC = pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])  # torch.compile(dynamic=)


@DYNAMIC
@pytest.mark.parametrize("soc", [ASCEND_A3, ASCEND_950], ids=["A3", "950"])
@pytest.mark.parametrize("spec", GROUPED, ids=str)
def test_grouped_ge_graph_values(spec, soc, dynamic, air):
    """One GroupedMatmul per graph with the adapter's attributes; the graph's values are the reference's."""
    reference = with_defaults(spec.name, spec.reference)
    for dtype, s in _cases(spec):
        where = f"{spec.name}[{s.name}, {dtype}, soc {soc}]"
        fn = _bind(s)(_op_call(spec))
        graph, _ = npu_wheel.ge_graph(fn, *_tensor_args(s), soc=soc, dynamic=dynamic)
        gmm = [op for op in graph.op if op.type == NPU_GE_IR[spec.name]]
        assert len(gmm) == 1, where
        data_dims = [d for op in graph.op if op.type == "Data" for desc in op.output_desc for d in desc.shape.dim]
        assert (-1 in data_dims) == dynamic, f"{where}: input dims {data_dims}"  # symbolic sizes stay symbolic
        attrs = gmm[0].attr
        assert attrs["split_item"].i == 3 and attrs["group_list_type"].i == 0, where
        assert attrs["group_type"].i == (2 if spec.name.startswith("k_") else 0), where
        with air.active():
            (out,) = ge_eval.evaluate(graph, _tensor_args(s))
        ours, ref = spec.op(*s.args), reference(*s.args)
        assert out.shape == ours.shape and out.dtype == ours.dtype, where
        # Another output dtype than the input's, or k-grouped's c (added in FP32): FP32 requested from the kernel
        # on Ascend 950, FP32 operands before it.
        with_c = spec.name == "k_grouped_bf16_gemm" and s.args[6] is not None
        fp32 = dtype != torch.float32 and (out.dtype != dtype or with_c)
        requested = attrs["dtype"].i == 3
        assert requested == (fp32 and soc >= ASCEND_950), f"{where}: dtype attr {attrs['dtype'].i}"
        assert torch.isfinite(out).all(), f"{where}: non-finite values (a padding row leaked)"
        assert (out[ref == 0] == 0).all(), f"{where}: rows no group owns are not zeros"
        diff = calc_diff(out, ref)
        assert diff < max(THRESHOLDS[dtype], THRESHOLDS[out.dtype]), f"{where}: calc_diff {diff:.3g}"
        assert calc_diff(out, ours) < THRESHOLDS[out.dtype], where  # rounded once, as our op


@DYNAMIC
def test_mx_grouped_ge_graphs_equal_the_adapters(dynamic, air, monkeypatch):
    """FP8 m-grouped GEMMs with E8M0 scale tensors on Ascend 950: one MX GroupedMatmul per graph, the scale codes
    expanded and paired in GE ops; the graph's values are the eager adapter's, bitwise (both through our CPU
    reading of npu_grouped_matmul's MX form)."""
    from tests.npu.test_grouped_adapters import _mx_samples
    from torch_ascend_moe.backends.npu import grouped as adapters

    monkeypatch.setattr(adapters, "soc_version", lambda: ASCEND_950)
    taken = 0
    for name, args in _mx_samples():
        if args[1].dtype != torch.float8_e8m0fnu:
            continue  # FP32 scales need the host's power-of-two check: no graph (below)
        s = type("S", (), {"args": args})
        fn = _bind(s)(lambda *a, name=name: getattr(torch.ops.ascend_moe, name)(*a))
        graph, _ = npu_wheel.ge_graph(fn, *_tensor_args(s), soc=ASCEND_950, dynamic=dynamic)
        assert sum(op.type == "GroupedMatmul" for op in graph.op) == 1, name
        with air.active():
            (out,) = ge_eval.evaluate(graph, _tensor_args(s))
        eager = getattr(npu_chain, name)(*args)
        assert out.dtype == eager.dtype and torch.equal(out, eager), name
        taken += 1
    assert taken >= 2


@pytest.mark.parametrize("case", ["A3", "FP32 scales"])
def test_mx_grouped_without_a_graph(case, air, monkeypatch):
    from tests.npu.test_grouped_adapters import _mx_samples

    name, args = next((n, a) for n, a in _mx_samples() if n == "m_grouped_fp8_gemm" and a[1].dtype == torch.float32)
    if case == "A3":
        args = (args[0], args[1].to(torch.float8_e8m0fnu), args[2], args[3].to(torch.float8_e8m0fnu), *args[4:])
    s = type("S", (), {"args": args})
    fn = _bind(s)(lambda *a: torch.ops.ascend_moe.m_grouped_fp8_gemm(*a))
    soc = ASCEND_A3 if case == "A3" else ASCEND_950
    with pytest.raises(NotImplementedError, match="ascend_moe::m_grouped_fp8_gemm: no GE graph"):
        npu_wheel.ge_graph(fn, *_tensor_args(s), soc=soc)


def test_float64_has_no_graph(air):
    """FP64 (no Ascend matmul) fails while the graph is built, naming the op, instead of a graph that rounds."""
    spec = next(s for s in GROUPED if s.name == "m_grouped_bf16_gemm")
    s = spec.sample_inputs("cpu", torch.float64)[0]
    with pytest.raises(NotImplementedError, match=r"ascend_moe::m_grouped_bf16_gemm: no GE graph .*float64"):
        npu_wheel.ge_graph(_bind(s)(_op_call(spec)), *_tensor_args(s))


ROUTED = ("quantize_fp8", "moe_gating_topk", "fp8_gemm", "moe_permute")  # converters of the eager mappings


def _routing_cases():
    from tests.npu import test_quant_routing_adapters as adapters

    return [
        pytest.param(soc, name, dtype, id=f"{name}-{str(dtype).split('.')[-1]}-{soc}")
        for soc in (ASCEND_A3, ASCEND_950)
        for name in ROUTED
        for dtype in adapters.SPECS[name].dtypes
    ]


@DYNAMIC
@pytest.mark.parametrize(("soc", "name", "dtype"), _routing_cases())
def test_quant_routing_ge_graphs_equal_the_adapters(soc, name, dtype, dynamic, air, monkeypatch):
    """Every sample the eager adapter maps to torch_npu gets a GE graph whose values equal the adapter's, bit for
    bit (same torch_npu op, the same conversions in GE ops); every sample it leaves portable has no graph."""
    from tests.npu import quant_routing_refs
    from tests.npu import test_quant_routing_adapters as adapters

    quant_routing_refs.register()
    monkeypatch.setitem(npu_wheel.SOC, "version", soc)
    for module in (adapters.npu_quant, adapters.npu_routing, adapters.npu_fp8_gemm):
        monkeypatch.setattr(module, "soc_version", lambda: soc)
    mapped = adapters.MAPPED[soc].get((name, dtype), set())
    seen = 0
    for s in adapters._samples(name, dtype):
        where = f"{name}[{s.name}, {dtype}, soc {soc}]"
        fn = _bind(s)(lambda *args: getattr(torch.ops.ascend_moe, name)(*args))
        if s.args[0].numel() == 0:
            continue  # TorchAir makes all-empty outputs itself, without a converter
        if s.name not in mapped:
            with pytest.raises(NotImplementedError, match=f"ascend_moe::{name}: no GE graph"):
                npu_wheel.ge_graph(fn, *_tensor_args(s), soc=soc, dynamic=dynamic)
            continue
        graph, _ = npu_wheel.ge_graph(fn, *_tensor_args(s), soc=soc, dynamic=dynamic)
        assert sum(op.type == NPU_GE_IR[name] for op in graph.op) == 1, where
        with air.active():
            outs = ge_eval.evaluate(graph, _tensor_args(s))
        eager, _ = adapters._call(name, s.args)
        assert len(outs) == len(eager), where
        for got, want in zip(outs, eager):
            assert got.shape == want.shape and got.dtype == want.dtype, f"{where}: {got.shape} {got.dtype}"
            assert torch.equal(adapters._bits(got), adapters._bits(want)) or (
                got.is_floating_point()
                and torch.equal(got.isnan(), want.isnan())
                and torch.equal(torch.nan_to_num(got.float()), torch.nan_to_num(want.float()))
            ), where
        seen += 1
    assert seen == len(mapped), f"{name}: {seen} of {len(mapped)} mapped samples found"


@DYNAMIC
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_moe_unpermute_ge_graph_is_the_portable_kernel(dtype, dynamic, air):
    """moe_unpermute's GE graph is the portable kernel's slot-order FP32 sum in GE ops: bitwise equal on every
    sample (-1 slots, aligned padding rows, no weights, mixed dtypes), since no value decides the graph."""
    from tests.npu import test_quant_routing_adapters as adapters

    spec = adapters.SPECS["moe_unpermute"]
    samples = [s for s in adapters._samples("moe_unpermute", dtype) if s.args[1].numel() and s.args[0].shape[1]]
    assert any((s.args[1] < 0).any() for s in samples)  # -1 slots are among them
    for s in samples:
        where = f"moe_unpermute[{s.name}, {dtype}]"
        fn = _bind(s)(lambda *args: torch.ops.ascend_moe.moe_unpermute(*args))
        graph, _ = npu_wheel.ge_graph(fn, *_tensor_args(s), dynamic=dynamic)
        with air.active():
            (out,) = ge_eval.evaluate(graph, _tensor_args(s))
        want = spec.portable(*s.args)
        assert out.dtype == want.dtype and torch.equal(out, want), where


def test_moe_unpermute_float64_has_no_graph(air):
    y, row_map = torch.randn(4, 3, dtype=torch.float64), torch.tensor([[0, 1], [2, -1]], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match=r"ascend_moe::moe_unpermute: no GE graph .*float64"):
        npu_wheel.ge_graph(lambda y, r: torch.ops.ascend_moe.moe_unpermute(y, r, None), y, row_map)


@DYNAMIC
@pytest.mark.parametrize("soc", [ASCEND_A3, ASCEND_950], ids=["A3", "950"])
def test_fp8_quant_gemm_ge_graph_is_the_two_converters(soc, dynamic, air, monkeypatch):
    """fp8_quant_gemm's graph = DynamicMxQuant then QuantBatchMatmulV4 (Ascend 950, UE8M0 1x128 casts, 128x128
    weights), bitwise the eager composition of the two adapters; no graph on A3 or for other recipes."""
    from tests.fp8_gemm.specs import quantize as fp8_quantize
    from tests.npu import quant_routing_refs
    from torch_ascend_moe.backends import chain
    from torch_ascend_moe.backends.npu import fp8_gemm as npu_fp8_gemm
    from torch_ascend_moe.backends.npu import quant as npu_quant

    quant_routing_refs.register()
    monkeypatch.setitem(npu_wheel.SOC, "version", soc)
    for module in (npu_quant, npu_fp8_gemm):
        monkeypatch.setattr(module, "soc_version", lambda: soc)
    g = torch.Generator().manual_seed(44)
    for m, n, k in [(33, 129, 256), (5, 264, 384)]:
        x = torch.randn(m, k, generator=g).bfloat16()
        b, sfb, _ = fp8_quantize(torch.randn(n, k, generator=g), ("fp8-block", 128, 128, False))
        args = (x, b, sfb, None, 128, [128, 128], True, 1.0, None)

        def fn(x, b, sfb, _args=args):
            return torch.ops.ascend_moe.fp8_quant_gemm(x, b, sfb, *_args[3:])

        if soc < ASCEND_950:
            with pytest.raises(NotImplementedError, match="ascend_moe::quantize_fp8: no GE graph"):
                npu_wheel.ge_graph(fn, x, b, sfb, soc=soc, dynamic=dynamic)
            continue
        graph, _ = npu_wheel.ge_graph(fn, x, b, sfb, soc=soc, dynamic=dynamic)
        assert [op.type for op in graph.op if op.type in ("DynamicMxQuant", "QuantBatchMatmulV4")] == [
            "DynamicMxQuant",
            "QuantBatchMatmulV4",
        ]
        with air.active():
            (out,) = ge_eval.evaluate(graph, [x, b, sfb])
        with chain.on_cpu("npu"):  # the portable kernel's steps on the NPU chains, as NPU tensors
            eager = torch.ops.ascend_moe.fp8_quant_gemm(*args)
        assert out.dtype == eager.dtype == torch.bfloat16 and torch.equal(out, eager), f"M{m}N{n}K{k}"


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_moe_body_through_torchairs_own_compile(dynamic, air):
    """A MoE layer's body (gating -> permute -> expert GEMM -> weighted unpermute) through
    ``torch.compile(backend=TorchAir's npu backend, fullgraph=True)`` itself (dynamo, AOT with TorchAir's
    decompositions and passes, conversion, its graph optimizations): one GE graph holding our IR ops, whose CPU
    evaluation matches the eager ops."""
    from tests.npu import quant_routing_refs

    quant_routing_refs.register()
    g = torch.Generator().manual_seed(7)
    t, h, n, e, k = 12, 32, 24, 4, 2
    x = torch.randn(t, h, generator=g).bfloat16()
    logits = torch.randn(t, e, generator=g)
    w = (torch.randn(e, n, h, generator=g) / 4).bfloat16()

    def body(x, logits, w):
        weights, idx = torch.ops.ascend_moe.moe_gating_topk(logits, k)
        rows, row_map, offs = torch.ops.ascend_moe.moe_permute(x, idx, e)
        y = torch.ops.ascend_moe.m_grouped_bf16_gemm(rows, w, offs)
        return torch.ops.ascend_moe.moe_unpermute(y, row_map, weights)

    graph, feeds = npu_wheel.compile_ge(body, x, logits, w, soc=ASCEND_A3, dynamic=dynamic)
    types = [op.type for op in graph.op]
    for ir in ("MoeGatingTopK", "MoeInitRoutingV3", "GroupedMatmul"):
        assert types.count(ir) == 1, (ir, types)
    with air.active():
        (out,) = ge_eval.evaluate(graph, feeds)
    want = body(x, logits, w)
    assert out.shape == want.shape and out.dtype == want.dtype
    assert calc_diff(out, want) < THRESHOLDS[torch.bfloat16]
