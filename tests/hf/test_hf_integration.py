"""transformers v5 integration on tiny random-weight configs built locally (no downloads): the "ascend_moe"
experts implementation and swap_moe_blocks against HF's own blocks (Mixtral, Qwen3-MoE, DeepSeek-V3)."""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import torch_ascend_moe.hf as hf  # noqa: E402  (registers the implementations)
from torch_ascend_moe.bench.moe import randomize_routing  # noqa: E402
from torch_ascend_moe.nn import MegaMoE, MoE  # noqa: E402
from torch_ascend_moe.testing import calc_diff  # noqa: E402


def _tiny(family: str, **extra):
    common = dict(
        vocab_size=128,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
    )
    if family == "mixtral":
        config = transformers.MixtralConfig(**common, intermediate_size=128, num_local_experts=8, num_experts_per_tok=2)
        cls = transformers.MixtralForCausalLM
    elif family == "qwen3_moe":
        config = transformers.Qwen3MoeConfig(
            **common,
            intermediate_size=256,
            moe_intermediate_size=128,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            head_dim=32,
        )
        cls = transformers.Qwen3MoeForCausalLM
    else:
        config = transformers.DeepseekV3Config(
            **common,
            intermediate_size=256,
            moe_intermediate_size=128,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            n_shared_experts=1,
            first_k_dense_replace=1,
            routed_scaling_factor=2.5,
            kv_lora_rank=32,
            q_lora_rank=None,
            qk_rope_head_dim=16,
            qk_nope_head_dim=16,
            v_head_dim=32,
        )
        cls = transformers.DeepseekV3ForCausalLM
    for k, v in extra.items():
        setattr(config, k, v)
    torch.manual_seed(0)
    return randomize_routing(cls(config).eval())


FAMILIES = ["mixtral", "qwen3_moe", "deepseek_v3"]


@pytest.mark.parametrize("family", FAMILIES)
def test_experts_implementation_matches_eager(family):
    model = _tiny(family)
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    model.set_experts_implementation("eager")
    with torch.no_grad():
        expected = model(ids).logits
    model.set_experts_implementation(hf.IMPLEMENTATION)
    assert set(model.get_experts_implementation().values()) == {hf.IMPLEMENTATION}
    with torch.no_grad():
        got = model(ids).logits
    assert calc_diff(got, expected) < 1e-10
    # Training through our ops.
    model.train()
    loss = model(ids, labels=ids).loss
    loss.backward()
    experts = next(m for m in model.modules() if hasattr(m, "gate_up_proj"))
    assert experts.gate_up_proj.grad is not None and experts.gate_up_proj.grad.abs().sum() > 0


@pytest.mark.parametrize("family", FAMILIES)
def test_swap_moe_blocks_matches_hf_blocks(family):
    model = _tiny(family)
    blocks = {n: m for n, m in model.named_modules() if type(m).__name__ in hf.BLOCKS}
    assert blocks
    x = torch.randn(2, 9, 128, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = {n: m(x.clone()) for n, m in blocks.items()}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    swapped = hf.swap_moe_blocks(model)
    assert sorted(swapped) == sorted(blocks)
    for name in swapped:
        moe = model.get_submodule(name)
        assert isinstance(moe, MoE)
        with torch.no_grad():
            assert calc_diff(moe(x), expected[name]) < 1e-10, name
    # The state dict keeps HF's names and values: it loads back into a fresh HF model.
    assert {k: v.shape for k, v in model.state_dict().items()} == {k: v.shape for k, v in state.items()}
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k


@pytest.mark.parametrize("mega", [False, True], ids=["MoE", "MegaMoE"])
@pytest.mark.parametrize("family", FAMILIES)
def test_swapped_bf16_model_per_block(family, mega):
    """BF16 models: each swapped MoE block within calc_diff 1e-5 of HF's block. MegaMoE (routed + shared experts
    in one fused op) rounds where the fused kernel does, not where HF's BF16 ops do: it is within 1e-5 of the
    FP64 block (closer than HF's own BF16 block, up to 1.3e-5 away here) and 2e-5 of HF's BF16 block."""
    model = _tiny(family).to(torch.bfloat16)
    blocks = {n: m for n, m in model.named_modules() if type(m).__name__ in hf.BLOCKS}
    x = torch.randn(2, 9, 128, generator=torch.Generator().manual_seed(3)).bfloat16()
    truth = copy.deepcopy(model).double()
    hf.swap_moe_blocks(truth)  # our FP64 MoE: HF's block to < 1e-10 (test_swap_moe_blocks_matches_hf_blocks)
    with torch.no_grad():
        expected = {n: m(x.clone()) for n, m in blocks.items()}
        exact = {n: truth.get_submodule(n)(x.double()) for n in blocks}
    hf.swap_moe_blocks(model, mega=mega)
    for name, ref in expected.items():
        swapped = model.get_submodule(name)
        assert type(swapped) is (MegaMoE if mega else MoE)
        with torch.no_grad():
            y = swapped(x)
        if mega:
            assert calc_diff(y, exact[name]) < 1e-5, name
            assert calc_diff(y, exact[name]) <= calc_diff(ref, exact[name]) * 1.2, name
            assert calc_diff(y, ref) < 2e-5, name
        else:
            assert calc_diff(y, ref) < 1e-5, name


def test_swapped_mega_model_saves_and_reloads(tmp_path):
    """``save_pretrained`` after ``swap_moe_blocks(mega=True)``: MegaMoE's shared gate and up weights are views of one
    buffer (disjoint halves of a storage, which safetensors and transformers accept), saved under HF's names; the
    reloaded HF model is the original, bit for bit."""
    model = _tiny("deepseek_v3")
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids).logits
    hf.swap_moe_blocks(model, mega=True)
    mega = next(m for m in model.modules() if isinstance(m, MegaMoE))
    gate, up = mega.shared_experts.gate_proj.weight, mega.shared_experts.up_proj.weight
    assert gate.untyped_storage().data_ptr() == up.untyped_storage().data_ptr()  # the joined buffer
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, expected)


def test_swap_fp8_documented_tolerance():
    model = _tiny("deepseek_v3")
    name, block = next((n, m) for n, m in model.named_modules() if type(m).__name__ in hf.BLOCKS)
    x = torch.randn(16, 128, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = block(x.view(1, 16, 128).clone()).view(16, 128)
    hf.swap_moe_blocks(model, fp8=True, convert_linears_to_fp8=True)
    with torch.no_grad():
        # Five FP8 GEMMs in a row (routed experts and the FP8Linear shared experts): < 5e-3 (docs/ops.md).
        assert calc_diff(model.get_submodule(name)(x), expected) < 5e-3
    assert any(type(m).__name__ == "FP8Linear" for m in model.modules())


def test_fp8_experts_implementation():
    model = _tiny("mixtral")
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        model.set_experts_implementation("eager")
        expected = model(ids).logits
        model.set_experts_implementation(hf.IMPLEMENTATION_FP8)
        got = model(ids).logits
    assert calc_diff(got, expected) < 2e-3


def test_compile_fullgraph_swapped_block():
    model = _tiny("deepseek_v3")
    hf.swap_moe_blocks(model)
    name = next(n for n, m in model.named_modules() if isinstance(m, MoE))
    moe = model.get_submodule(name)
    x = torch.randn(2, 5, 128)
    explain = torch._dynamo.explain(moe)(x)
    assert explain.graph_break_count == 0


def test_swap_bad_weights():
    model = _tiny("mixtral")
    block = next(m for m in model.modules() if type(m).__name__ == "MixtralSparseMoeBlock")
    block.experts.gate_up_proj = torch.nn.Parameter(torch.randn(4, 256, 128))  # 4 experts, config says 8
    with pytest.raises(
        ValueError,
        match=r"swap_moe_blocks: MixtralSparseMoeBlock: argument 'experts.gate_up_proj' shape: expected 8 experts",
    ):
        hf.swap_moe_blocks(model)
    model = _tiny("mixtral", hidden_size=96)
    with pytest.raises(ValueError, match=r"MegaMoE: argument 'hidden_size, intermediate_size': expected multiples"):
        hf.swap_moe_blocks(model, mega=True, fp8=True)  # the FP8 mode's 128x128 weight blocks


def test_swap_mega_fp8_serves_inference():
    """``swap_moe_blocks(mega=True, fp8=True)``: MegaMoE's FP8 mode in the model, close to the BF16 model; a training
    forward says it serves inference."""
    from torch_ascend_moe.nn import MegaMoE
    from torch_ascend_moe.testing import calc_diff

    torch.manual_seed(0)
    model = _tiny("mixtral").bfloat16().eval()
    ids = torch.randint(0, 128, (2, 9))
    with torch.no_grad():
        reference = model(ids).logits
    names = hf.swap_moe_blocks(model, mega=True, fp8=True)
    assert names and all(type(model.get_submodule(n)) is MegaMoE for n in names)
    with torch.no_grad():
        assert calc_diff(model(ids).logits, reference) < 5e-3
    with pytest.raises(RuntimeError, match="MegaMoE: fp8=True serves inference"):
        model(ids)


def test_bench_moe_quick(tmp_path):
    import json

    from torch_ascend_moe.cli import main

    out = tmp_path / "moe.json"
    assert main(["bench", "moe", "--quick", "--min-run-time", "0.02", "--json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    baselines = [r["baseline"].split(", ")[1] for r in results]
    expected = ["eager experts", "grouped_mm experts"] * 2 + ["shared expert on nn.Linear"] * 2
    # nn.MegaMoE against nn.MoE: BF16 forward and forward+backward, FP8 forward
    assert baselines == expected + ["the same weights"] * 4 + ["the same weights (fp8=True)"] * 2
    assert all(r["ours_ms"] > 0 and r["baseline_ms"] > 0 for r in results)
    assert all(r["ours_faults"] is not None for r in results if r["case"].startswith("MegaMoE"))
