"""nn.MoE: numerics against an FP64 loop reference (Mixtral-, Qwen- and DeepSeek-style routing, shared experts,
FP8 experts), training, torch.compile(fullgraph=True) with no graph breaks, torch.export round trip, bad
input, and expert parallelism on 2 gloo ranks against one process."""

import pytest
import torch
import torch.multiprocessing as mp

from tests.distributed.moe_bodies import ep_parity_worker
from torch_ascend_moe.nn import MegaMoE, MoE
from torch_ascend_moe.testing import calc_diff
from torch_ascend_moe.testing.references import moe_reference

CONFIGS = {
    "mixtral": dict(),
    "qwen": dict(renormalize=False, num_shared_experts=1),
    "deepseek": dict(
        score_func="sigmoid",
        use_expert_bias=True,
        num_groups=4,
        topk_groups=2,
        routed_scaling_factor=2.5,
        num_shared_experts=2,
    ),
}


def _layer(name, dtype=torch.float32, **extra):
    torch.manual_seed(0)
    moe = MoE(64, 32, 8, 2, dtype=dtype, **CONFIGS[name], **extra)
    if moe.gate.e_score_correction_bias is not None:
        with torch.no_grad():
            moe.gate.e_score_correction_bias.copy_(torch.randn(8) * 0.05)
    return moe


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_moe_matches_fp64_reference(name, dtype):
    moe = _layer(name, dtype)
    x = torch.randn(3, 7, 64).to(dtype)
    y = moe(x)
    assert y.shape == x.shape and y.dtype == dtype
    assert calc_diff(y, moe_reference(moe, x)) < (1e-10 if dtype == torch.float32 else 1e-4)


def test_fp8_experts_within_recipe_tolerance():
    torch.manual_seed(0)
    moe = MoE(128, 128, 4, 2, fp8=True, num_shared_experts=1)
    x = torch.randn(16, 128)
    assert calc_diff(moe(x), moe_reference(moe, x)) < 2e-3  # DeepGEMM's FP8 threshold is 1e-3 per GEMM


def test_training_reduces_loss():
    moe = _layer("deepseek")
    g = torch.Generator().manual_seed(1)
    x, target = torch.randn(32, 64, generator=g), torch.randn(32, 64, generator=g)
    opt = torch.optim.Adam(moe.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = torch.nn.functional.mse_loss(moe(x), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < 0.8 * losses[0], losses
    assert moe.gate.weight.grad is not None and moe.experts.down_proj.grad is not None


def test_compile_fullgraph_no_graph_breaks():
    from torch._dynamo.testing import CompileCounterWithBackend

    moe = _layer("deepseek")
    x = torch.randn(2, 5, 64, requires_grad=True)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(moe, fullgraph=True, backend=counter)
    out = compiled(x)
    torch.testing.assert_close(out, moe(x), rtol=1e-5, atol=1e-5)
    assert counter.frame_count == 1
    explain = torch._dynamo.explain(moe)(x)
    assert explain.graph_break_count == 0 and explain.graph_count == 1
    out.sum().backward()
    assert x.grad is not None and moe.experts.gate_up_proj.grad is not None


def test_export_round_trip(tmp_path):
    moe = _layer("qwen").eval()
    x = torch.randn(6, 64)
    program = torch.export.export(moe, (x,))
    path = tmp_path / "moe.pt2"
    torch.export.save(program, path)
    loaded = torch.export.load(path).module()
    assert torch.equal(loaded(x), moe(x))


def test_update_expert_bias():
    moe = _layer("deepseek")
    before = moe.gate.e_score_correction_bias.clone()
    moe.update_expert_bias(torch.tensor([10, 0, 5, 5, 5, 5, 5, 5]), rate=0.1)
    delta = moe.gate.e_score_correction_bias - before
    assert delta[0] < 0 < delta[1] and delta[2] == 0


def test_module_cast_to_bf16_keeps_routing_in_fp32():
    """``moe.bfloat16()`` casts the expert-bias buffer too; the router still chooses with it in FP32 (as HF's
    DeepSeek-V3 router adds a BF16 bias to FP32 scores), so the choice equals the FP32-bias layer's."""
    moe = _layer("deepseek")
    with torch.no_grad():
        moe.gate.e_score_correction_bias.normal_(0, 0.05)
    fp32_bias = moe.gate.e_score_correction_bias.bfloat16().float()
    moe = moe.bfloat16()
    assert moe.gate.e_score_correction_bias.dtype == torch.bfloat16
    x = torch.randn(5, moe.gate.weight.shape[1]).bfloat16()
    idx, weights, _ = moe.gate(x)
    moe.gate.e_score_correction_bias = fp32_bias
    want_idx, want_weights, _ = moe.gate(x)
    assert torch.equal(idx, want_idx) and torch.equal(weights, want_weights)
    assert moe(x).dtype == torch.bfloat16


def test_bad_input():
    with pytest.raises(ValueError, match=r"MoE: argument 'topk': expected an integer in \[1, num_experts=4\], got 5"):
        MoE(64, 32, 4, 5)
    with pytest.raises(ValueError, match=r"MoE: argument 'topk': expected an integer in \[1, num_experts=4\], got 2.5"):
        MoE(64, 32, 4, 2.5)
    with pytest.raises(ValueError, match=r"MoE: argument 'num_shared_experts': expected a non-negative integer"):
        MoE(64, 32, 4, 2, num_shared_experts=-1)
    with pytest.raises(ValueError, match=r"MoEGate: argument 'score_func': expected 'softmax' or 'sigmoid' or"):
        MoE(64, 32, 4, 2, score_func="bogus")
    with pytest.raises(ValueError, match=r"MoEGate: argument 'topk_groups': expected an integer in \[1, num_groups=2"):
        MoE(64, 32, 4, 2, num_groups=2, topk_groups=3)
    with pytest.raises(ValueError, match=r"MoE: argument 'x': expected \[\.\.\., hidden_size=64\], got \[\]"):
        MoE(64, 32, 4, 2)(torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"MoE: argument 'activation': expected a callable or one of"):
        MoE(64, 32, 4, 2, activation="nope")
    with pytest.raises(ValueError, match=r"MegaMoE: argument 'activation': expected 'silu'"):
        MegaMoE(64, 32, 4, 2, activation="gelu")
    with pytest.raises(ValueError, match=r"MoE: argument 'x': expected \[\.\.\., hidden_size=64\], got \[3, 32\]"):
        MoE(64, 32, 4, 2)(torch.randn(3, 32))
    with pytest.raises(ValueError, match=r"MoEGate: argument 'num_groups': expected a positive divisor of num_exp"):
        MoE(64, 32, 6, 2, num_groups=4)


def test_expert_parallel_matches_single_process(tmp_path):
    mp.spawn(ep_parity_worker, args=(2, str(tmp_path / "store")), nprocs=2, join=True)


def test_sqrtsoftplus_gate_is_deepseek_v4s_router():
    """score_func='sqrtsoftplus': sqrt(softplus(logits)) ranked with the bias, weights over their sum + 1e-20,
    scaled; gradients reach the router weight; renormalize=False is refused."""
    from torch_ascend_moe.nn import MoEGate

    torch.manual_seed(0)
    gate = MoEGate(32, 16, 4, score_func="sqrtsoftplus", routed_scaling_factor=2.5, use_expert_bias=True)
    with torch.no_grad():
        gate.e_score_correction_bias.normal_(0, 0.05)
    x = torch.randn(10, 32)
    idx, weights, logits = gate(x)
    u = torch.nn.functional.softplus(logits.double()).sqrt()
    chosen = torch.sort(u.float() + gate.e_score_correction_bias, dim=1, descending=True, stable=True).indices[:, :4]
    assert torch.equal(idx, chosen)
    s = u.gather(1, chosen)
    torch.testing.assert_close(weights.double(), s / (s.sum(-1, keepdim=True) + 1e-20) * 2.5, rtol=1e-6, atol=1e-7)
    weights.square().sum().backward()
    assert gate.weight.grad is not None and gate.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="renormalize"):
        MoEGate(32, 16, 4, score_func="sqrtsoftplus", renormalize=False)
    # The bias buffer (FP32) follows the router's dtype: an FP64 router, or a module cast to FP64.
    for gate64 in (MoEGate(32, 16, 4, score_func="sqrtsoftplus", use_expert_bias=True, router_dtype=torch.float64),
                   MoEGate(32, 16, 4, score_func="sqrtsoftplus", use_expert_bias=True).double()):  # fmt: skip
        gate64.load_state_dict(gate.state_dict())
        assert torch.equal(gate64(x.double())[0], idx)


@pytest.mark.parametrize("native", [False, True])
def test_shared_experts_on_our_gemm_where_torch_bf16_gemm_is_slow(native, monkeypatch):
    """On a CPU without BF16 dot products the shared experts' projections run as bf16_gemm (FP32 accumulation, one
    rounding, as nn.Linear): outputs and gradients within BF16 rounding of the nn.Linear path; where PyTorch's BF16
    GEMM is native the modules are called; a converted (non-Linear) projection is always called."""
    from torch_ascend_moe.backends import cpu_gemm
    from torch_ascend_moe.nn import moe as moe_module
    from torch_ascend_moe.ops import gemm

    monkeypatch.setitem(cpu_gemm.NATIVE, torch.bfloat16, native)
    calls = []
    monkeypatch.setattr(moe_module, "bf16_gemm", lambda a, b: calls.append(1) or gemm.bf16_gemm(a, b))
    torch.manual_seed(0)
    mlp = moe_module.SwiGLUMLP(64, 96, dtype=torch.bfloat16)
    x = torch.randn(33, 64, dtype=torch.bfloat16, requires_grad=True)
    got = mlp(x)
    assert len(calls) == (0 if native else 3)
    want = mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
    assert calc_diff(got, want) < 1e-5
    g_got = torch.autograd.grad(got.float().sum(), (x, mlp.up_proj.weight))
    g_want = torch.autograd.grad(want.float().sum(), (x, mlp.up_proj.weight))
    assert all(calc_diff(a, b) < 1e-5 for a, b in zip(g_got, g_want))
    calls.clear()
    mlp.up_proj = torch.nn.Linear(64, 96, bias=True, dtype=torch.bfloat16)
    mlp(x)
    assert len(calls) == (0 if native else 2)  # the biased projection is the module's own call
