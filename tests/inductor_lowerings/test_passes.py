"""The pass machinery (inductor_lowerings/__init__.py, _pass.py): opt-in and opt-out, composition with a user's own
post-grad pass, the ``ascend_moe`` torch.compile backend, the FX graph cache (a second compile hits and still runs the
fused op; a changed user pass misses; a plain-function user pass bypasses, as without us), and the same rewrites in
TorchAir's config (GE mode: only fused ops with a GE converter; npugraph_ex: all), checked with the wheel's TorchAir."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor import config
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._inductor.utils import fresh_cache
from torch.fx.experimental.proxy_tensor import make_fx

from tests.inductor_lowerings.graphs import Recorder, assert_same, graph_text
from torch_ascend_moe import inductor_lowerings

ops = torch.ops.ascend_moe


def _chain(x, b, sfb, q, k, w, ks, ke):
    data, sf = ops.quantize_fp8(x, [1, 128])
    y = ops.fp8_gemm(data, sf, b, sfb)
    values, idx = ops.mqa_topk(ops.mqa_logits(q, None, k, None, w, ks, ke), ks, ke, 4)
    return y, values, idx


def _args():
    g = torch.Generator().manual_seed(0)
    b, sfb = ops.quantize_fp8(torch.randn(64, 256, generator=g), [128, 128])
    ks = torch.zeros(8, dtype=torch.int32)
    ke = torch.randint(1, 17, (8,), generator=g, dtype=torch.int32)
    return (
        torch.randn(8, 256, generator=g),
        b,
        sfb,
        torch.randn(8, 2, 32, generator=g),
        torch.randn(16, 32),
        torch.rand(8, 2),
        ks,
        ke,
    )


def test_enable_disable_and_the_context_manager_restore_the_users_pass():
    mine = Recorder()
    with config.patch(post_grad_custom_post_pass=mine):
        assert not inductor_lowerings.is_enabled()
        with inductor_lowerings.enabled():
            assert inductor_lowerings.is_enabled() and config.post_grad_custom_post_pass.user is mine
            inductor_lowerings.enable()  # idempotent: not wrapped twice
            assert config.post_grad_custom_post_pass.user is mine
        assert config.post_grad_custom_post_pass is mine
        inductor_lowerings.enable()
        inductor_lowerings.disable()
        assert config.post_grad_custom_post_pass is mine


def test_users_pass_runs_after_ours_and_backend_applies_them_for_one_model():
    args, mine = _args(), Recorder()
    torch._dynamo.reset()
    with config.patch(post_grad_custom_post_pass=mine):
        got = torch.compile(_chain, backend=inductor_lowerings.BACKEND, fullgraph=True)(*args)
        assert config.post_grad_custom_post_pass is mine  # the backend left the process config alone
    torch._dynamo.reset()
    assert "fp8_quant_gemm" in mine.graphs[-1] and "mqa_logits_topk" in mine.graphs[-1]
    assert_same(got, _chain(*args))


class _UserPass(CustomGraphPass):
    def __init__(self, tag: str) -> None:
        self.tag, self.calls = tag, 0

    def __call__(self, graph):
        self.calls += 1

    def uuid(self):
        return self.tag


def _compile_counting(args, user=None):
    counters.clear()
    torch._dynamo.reset()
    with config.patch(post_grad_custom_post_pass=user, fx_graph_cache=True), inductor_lowerings.enabled():
        out = torch.compile(_chain, fullgraph=True)(*args)
    torch._dynamo.reset()
    return out, dict(counters["inductor"])


def test_fx_graph_cache_hits_keys_on_the_users_pass_and_bypasses_for_plain_functions():
    args = _args()
    with fresh_cache():
        before = inductor_lowerings.MATCHES.total()
        first, c1 = _compile_counting(args, _UserPass("a"))
        assert c1.get("fxgraph_cache_miss") == 1 and inductor_lowerings.MATCHES.total() == before + 2
        second, c2 = _compile_counting(args, _UserPass("a"))
        assert c2.get("fxgraph_cache_hit") == 1, c2
        assert inductor_lowerings.MATCHES.total() == before + 2  # a hit runs no pass, the cached code the fused ops
        assert_same(second, first)
        _, c3 = _compile_counting(args, _UserPass("b"))
        assert c3.get("fxgraph_cache_miss") == 1, c3
        _, c4 = _compile_counting(args, lambda graph: None)
        assert c4.get("fxgraph_cache_bypass") == 1, c4
    assert_same(first, _chain(*args))


@pytest.fixture
def torchair_config():
    from torch_ascend_moe.testing import npu_wheel

    air = npu_wheel.torchair()
    with air.active():
        import sys

        yield sys.modules["torchair.configs.compiler_config"].CompilerConfig


@pytest.mark.parametrize("mode", ["max-autotune", "npugraph_ex"])
def test_torchair_config_gets_the_rewrites_ge_mode_only_with_ge_converters(torchair_config, mode):
    """TorchAir's own ``CompilerConfig`` (the wheel's): its post-grad custom post pass runs ours, then the one it
    had. GE mode (``max-autotune``) takes only rewrites whose fused op has a GE converter (``fp8_quant_gemm``: yes;
    ``mqa_logits_topk``: no, GE has no eager fallback); ``npugraph_ex`` runs ops eagerly and takes them all."""
    cfg, seen = torchair_config(), []
    cfg.mode = mode
    cfg.post_grad_custom_post_pass = lambda gm, inputs, c: seen.append(graph_text(gm.graph))
    inductor_lowerings.npugraph_ex_passes(cfg)
    args = _args()
    gm = make_fx(_chain, tracing_mode="fake")(*args)
    cfg.post_grad_custom_post_pass.value(gm, args, cfg)
    assert "fp8_quant_gemm" in seen[-1] and "quantize_fp8" not in seen[-1]
    assert ("mqa_logits_topk" in seen[-1]) == (mode == "npugraph_ex"), seen[-1]
    assert_same(gm(*args), _chain(*args))


@pytest.mark.parametrize("mode", ["max-autotune", "npugraph_ex"])
def test_torchair_takes_the_grouped_quant_gemm_in_npugraph_ex_only(torchair_config, mode):
    """``m_grouped_fp8_quant_gemm`` has no GE converter: GE mode keeps the cast and the grouped GEMM apart (each has
    one), ``npugraph_ex`` fuses them."""
    from tests.grouped.specs import _quantize_experts

    cfg, seen = torchair_config(), []
    cfg.mode = mode
    cfg.post_grad_custom_post_pass = lambda gm, inputs, c: seen.append(graph_text(gm.graph))
    inductor_lowerings.npugraph_ex_passes(cfg)

    def grouped(x, b, sfb, layout):
        data, sf = ops.quantize_fp8(x, [1, 128], True)
        return ops.m_grouped_fp8_gemm(data, sf, b, sfb, layout)

    g = torch.Generator().manual_seed(1)
    b, sfb, _ = _quantize_experts(torch.randn(2, 16, 256, generator=g), ("fp8-block", 128, 128, True))
    args = (torch.randn(7, 256, generator=g), b, sfb, torch.tensor([3, 7], dtype=torch.int32))
    gm = make_fx(grouped, tracing_mode="fake")(*args)
    cfg.post_grad_custom_post_pass.value(gm, args, cfg)
    assert ("m_grouped_fp8_quant_gemm" in seen[-1]) == (mode == "npugraph_ex"), seen[-1]
    assert ("quantize_fp8" in seen[-1]) == (mode != "npugraph_ex"), seen[-1]
    assert_same(gm(*args), grouped(*args))


def test_backend_name_works_without_importing_the_passes():
    """``backend="ascend_moe"`` is a ``torch_dynamo_backends`` entry point: a fresh interpreter that only imported
    torch finds it, and ``import torch_ascend_moe`` does not import the passes (nor Inductor)."""
    import subprocess
    import sys

    script = (
        "import sys, torch\n"
        "import torch_ascend_moe\n"
        "assert 'torch_ascend_moe.inductor_lowerings' not in sys.modules\n"
        "f = torch.compile(lambda x: x * 2, backend='ascend_moe', fullgraph=True)\n"
        "assert torch.equal(f(torch.ones(3)), torch.full((3,), 2.0))\n"
        "assert 'torch_ascend_moe.inductor_lowerings._pass' in sys.modules\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]
