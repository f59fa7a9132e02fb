"""transformers' own DeepGEMM client (``transformers/integrations/deepgemm.py``) handed our ``deep_gemm`` as
its kernel: every forward it has (BF16 experts, FP8/FP4 experts, the FP8/FP4 linear, Mega MoE) runs on
CPU tensors and matches the ``eager`` experts (issue 14, point 11).

The loader is patched to return ``torch_ascend_moe.deep_gemm`` and the CUDA capability is faked: SM90
selects the id layout (``-1`` padding rows, ``a`` sized with an upper bound of padded rows), SM100 the
psum layout and packed UE8M0 scales. FP8/FP4 weights are compared against the ``eager`` BF16 experts
holding the dequantized weights: transformers' eager FP8 loop would call its Triton kernels (CUDA only).
"""

import pytest
import torch

import torch_ascend_moe.deep_gemm as deep_gemm
from torch_ascend_moe.testing import calc_diff

transformers = pytest.importorskip("transformers")
dg_client = pytest.importorskip("transformers.integrations.deepgemm")
fp8_client = pytest.importorskip("transformers.integrations.finegrained_fp8")
from transformers.models.mixtral.configuration_mixtral import MixtralConfig  # noqa: E402
from transformers.models.mixtral.modeling_mixtral import MixtralExperts  # noqa: E402

# SM100 packs UE8M0 scales of 128 channels 4 per int32 (upstream asserts it), so K dims are multiples of 512.
H, INTER, E, TOPK, TOKENS = 512, 512, 4, 2, 9


@pytest.fixture(params=[9, 10], ids=["sm90", "sm100"])
def arch(request, monkeypatch):
    """Fake a Hopper / Blackwell device and make transformers load our deep_gemm."""
    major = request.param
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (major, 0))
    for module in (dg_client, fp8_client):
        monkeypatch.setattr(module, "is_deepgemm_loadable", lambda raise_error=False: True)
    monkeypatch.setattr(dg_client, "lazy_load_kernel", lambda name: deep_gemm if name == "deep-gemm" else None)
    monkeypatch.setattr(dg_client, "_DEEPGEMM", None)
    return major


def _config(**kwargs):
    config = MixtralConfig(
        hidden_size=H, intermediate_size=INTER, num_local_experts=E, num_experts_per_tok=TOPK, **kwargs
    )
    config._experts_implementation = "eager"
    return config


def _routing(seed):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(TOKENS, H, generator=g).bfloat16()
    scores = torch.randn(TOKENS, E, generator=g).softmax(-1)
    weights, index = scores.topk(TOPK, dim=-1)
    return hidden, index, (weights / weights.sum(-1, keepdim=True)).bfloat16()


def _bf16_experts(gate_up, down):
    experts = MixtralExperts(_config())
    with torch.no_grad():
        experts.gate_up_proj.copy_(gate_up)
        experts.down_proj.copy_(down)
    return experts.bfloat16()


def _eager(experts, hidden, index, weights):
    experts.config._experts_implementation = "eager"
    with torch.no_grad():
        return experts(hidden, index, weights).float()


def _random_weights(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(E, 2 * INTER, H, generator=g) / 8, torch.randn(E, H, INTER, generator=g) / 8


def test_bf16_experts_match_eager(arch):
    gate_up, down = _random_weights(0)
    experts = _bf16_experts(gate_up, down)
    hidden, index, weights = _routing(1)
    ref = _eager(experts, hidden, index, weights)
    experts.config._experts_implementation = "deepgemm"
    with torch.no_grad():
        out = experts(hidden, index, weights)
    assert out.dtype == torch.bfloat16 and out.shape == hidden.shape
    assert calc_diff(out, ref) < 1e-5


def _fp8_experts(expert_dtype="fp8", scale_fmt="float"):
    cls = fp8_client.use_experts_implementation(
        experts_class=type("Experts", (fp8_client.FP8Experts,), {}),  # a subclass: the decorator edits its class
        experts_interface=fp8_client.ALL_FP8_EXPERTS_FUNCTIONS,
    )
    block = None if expert_dtype == "fp4" else (128, 128)
    return cls(_config(), block_size=block, scale_fmt=scale_fmt, expert_dtype=expert_dtype)


def _quantize(w, fp4, ue8m0):
    """Per-expert (weights, scales) as a checkpoint stores them, and the dequantized BF16 weights."""
    data, scales, deq = [], [], []
    for x in w:
        if fp4:
            q, sf = deep_gemm.per_token_cast_to_fp4(x, use_ue8m0=True, gran_k=32)
            deq.append(deep_gemm.cast_back_from_fp4(q, sf, gran_k=32))
        else:
            q, sf = deep_gemm.per_block_cast_to_fp8(x, use_ue8m0=ue8m0)
            deq.append(
                q.float() * sf.repeat_interleave(128, 0)[: x.shape[0]].repeat_interleave(128, 1)[:, : x.shape[1]]
            )
        data.append(q)
        scales.append(sf.to(torch.float8_e8m0fnu) if ue8m0 else sf)
    return torch.stack(data), torch.stack(scales), torch.stack(deq).bfloat16()


def _load(experts, gate_up, down, fp4, ue8m0):
    """Quantized weights into ``experts``; returns the eager BF16 experts holding their dequantized values."""
    q1, s1, d1 = _quantize(gate_up, fp4, ue8m0)
    q2, s2, d2 = _quantize(down, fp4, ue8m0)
    for name, value in (
        ("gate_up_proj", q1),
        ("gate_up_proj_scale_inv", s1),
        ("down_proj", q2),
        ("down_proj_scale_inv", s2),
    ):
        setattr(experts, name, torch.nn.Parameter(value, requires_grad=False))
    return _bf16_experts(d1, d2)


@pytest.mark.parametrize("fp4", [False, True], ids=["fp8", "fp4"])
def test_fp8_fp4_experts_match_eager(arch, fp4):
    if fp4 and arch == 9:
        pytest.skip("transformers (like DeepGEMM) has no FP4 path on SM90: it raises NotImplementedError")
    ue8m0 = arch == 10  # SM100 has no FP32-scale path (transformers refuses it); checkpoints carry UE8M0 there
    experts = _fp8_experts("fp4" if fp4 else "fp8", "ue8m0" if ue8m0 else "float")
    reference = _load(experts, *_random_weights(2), fp4, ue8m0)
    hidden, index, weights = _routing(3)
    ref = _eager(reference, hidden, index, weights)
    experts.config._experts_implementation = "deepgemm"
    with torch.no_grad():
        out = experts(hidden, index, weights)
    assert out.dtype == torch.bfloat16 and out.shape == hidden.shape
    assert calc_diff(out, ref) < (0.02 if fp4 else 2e-3)  # FP8 activations (and FP4 weights) vs BF16


@pytest.mark.parametrize("fp4", [False, True], ids=["fp8", "fp4"])
def test_fp8_fp4_linear_matches_eager(arch, fp4):
    if fp4 and arch == 9:
        pytest.skip("no FP4 path on SM90 (transformers raises NotImplementedError and falls back to Triton)")
    ue8m0 = arch == 10
    g = torch.Generator().manual_seed(4)
    w, x = torch.randn(1, 192, H, generator=g) / 8, torch.randn(2, 5, H, generator=g).bfloat16()
    q, sf, deq = _quantize(w, fp4, ue8m0)
    out = dg_client.deepgemm_fp8_fp4_linear(x, q[0], sf[0], block_size=None if fp4 else (128, 128))
    assert out.shape == (2, 5, 192) and out.dtype == torch.bfloat16
    assert calc_diff(out, torch.nn.functional.linear(x, deq[0])) < (0.02 if fp4 else 2e-3)
    # FP8Linear's dispatcher takes the DeepGEMM route too (is_deepgemm_loadable is faked true).
    routed = fp8_client.fp8_linear(x, q[0], sf[0], None if fp4 else [128, 128])
    assert torch.equal(routed, out)


@pytest.fixture
def one_rank_group(tmp_path):
    """A single-rank gloo group: Mega MoE's buffers are keyed by, and rendezvous over, a real group."""
    import torch.distributed as dist

    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    group = dist.new_group([0])
    yield group
    dg_client.destroy_megamoe_buffers()
    if owned:
        dist.destroy_process_group()


def test_megamoe_experts_match_eager(arch, one_rank_group):
    if arch == 9:
        pytest.skip("Mega MoE is SM100-only in transformers (FP4 weights raise NotImplementedError on SM90)")
    experts = _fp8_experts("fp4", "ue8m0")
    reference = _load(experts, *_random_weights(5), fp4=True, ue8m0=True)
    hidden, index, weights = _routing(6)
    ref = _eager(reference, hidden, index, weights)
    experts.config._experts_implementation = "deepgemm_megamoe"
    with torch.no_grad():
        out = experts(hidden, index, weights, process_group=one_rank_group)
        again = experts(hidden, index, weights, process_group=one_rank_group)  # weights transformed once
    assert out.dtype == torch.bfloat16 and out.shape == hidden.shape
    assert torch.equal(out, again)
    assert calc_diff(out, ref) < 0.02  # FP8 activations x FP4 weights vs BF16
