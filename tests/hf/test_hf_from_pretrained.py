"""``from_pretrained(..., experts_implementation="ascend_moe")`` on a tiny model saved locally, and swap_moe_blocks
attaching an expert-parallel group (2 gloo ranks) against the unswapped model."""

import pytest
import torch
import torch.multiprocessing as mp

transformers = pytest.importorskip("transformers")

import torch_ascend_moe.hf as hf  # noqa: E402
from torch_ascend_moe.testing import calc_diff  # noqa: E402


def _tiny_mixtral():
    config = transformers.MixtralConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=32,
    )
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("gate.weight"):
                p.normal_(0, 0.1)
    return model


def test_from_pretrained_with_ascend_moe_experts(tmp_path):
    model = _tiny_mixtral()
    model.save_pretrained(tmp_path)
    ids = torch.randint(0, 64, (1, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids).logits
    loaded = transformers.MixtralForCausalLM.from_pretrained(tmp_path, experts_implementation=hf.IMPLEMENTATION).eval()
    assert set(loaded.get_experts_implementation().values()) == {hf.IMPLEMENTATION}
    with torch.no_grad():
        assert calc_diff(loaded(ids).logits, expected) < 1e-10


def _ep_worker(rank, world_size, store_path):
    import datetime
    import os
    import traceback

    import torch.distributed as dist

    store = dist.FileStore(store_path, world_size)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=120)
    )
    try:
        model = _tiny_mixtral()
        ids = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(10 + rank))
        with torch.no_grad():
            expected = model(ids).logits
        hf.swap_moe_blocks(model, ep_group=dist.group.WORLD)
        moe = next(m for m in model.modules() if isinstance(m, hf.MoE))
        assert moe.experts.gate_up_proj.shape[0] == 4 // world_size
        with torch.no_grad():
            assert calc_diff(model(ids).logits, expected) < 1e-10
        with pytest.raises(ValueError, match="MoE: argument 'num_experts': expected a multiple of the EP world size"):
            hf.MoE(64, 64, 3, 2, ep_group=dist.group.WORLD)
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    os._exit(0)


def test_swap_with_expert_parallel_group(tmp_path):
    mp.spawn(_ep_worker, args=(2, str(tmp_path / "store")), nprocs=2, join=True)
