"""mega_moe beyond the harness: bitwise equality with the unfused pipeline of our separate ops (upstream's
test), gradients against autograd through that pipeline, compile fullgraph forward+backward, and expert
parallelism on 2 gloo ranks against one process."""

import pytest
import torch
import torch.multiprocessing as mp

from torch_ascend_moe import mega_moe
from torch_ascend_moe.testing.mega_moe import ep_worker, samples, unfused


@pytest.mark.parametrize("case", range(4))
def test_bitwise_equal_to_unfused_pipeline(case):
    args = samples("cpu", torch.bfloat16)[case].args
    x, x_sf, idx, w, l1, l1_sf, l2, l2_sf, _, clamp = args
    y, counts = torch.ops.ascend_moe.mega_moe(*args)
    expected = unfused(x, x_sf, idx, w, l1, l1_sf, l2, l2_sf, clamp)
    assert torch.equal(y.view(torch.int16), expected.view(torch.int16))
    assert counts.tolist() == [int((idx == e).sum()) for e in range(l1.shape[0])]


def test_gradients_match_the_unfused_pipeline():
    x, _, idx, w, l1, _, l2, _, _, clamp = samples("cpu", torch.bfloat16)[1].args
    leaves = [t.clone().requires_grad_() for t in (x, w, l1, l2)]
    twins = [t.clone().requires_grad_() for t in (x, w, l1, l2)]
    c = torch.randn(x.shape).bfloat16()
    y, _ = mega_moe(leaves[0], idx, leaves[1], leaves[2], leaves[3], activation_clamp=clamp)
    (y.float() * c).sum().backward()
    ref = unfused(twins[0], None, idx, twins[1], twins[2], None, twins[3], None, clamp)
    (ref.float() * c).sum().backward()
    for a, b, name in zip(leaves, twins, ("x", "topk_weights", "l1", "l2")):
        assert torch.equal(a.grad, b.grad), name


def test_compile_fullgraph_forward_backward():
    from torch._dynamo.testing import CompileCounterWithBackend

    x, _, idx, w, l1, _, l2, _, _, clamp = samples("cpu", torch.bfloat16)[0].args

    def f(x, l1, l2):
        return mega_moe(x, idx, w, l1, l2, activation_clamp=clamp)[0].float().square().sum()

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(f, fullgraph=True, backend=counter)
    inputs = [t.clone().requires_grad_() for t in (x, l1, l2)]
    twins = [t.clone().requires_grad_() for t in (x, l1, l2)]
    compiled(*inputs).backward()
    f(*twins).backward()
    assert counter.frame_count == 1
    for a, b in zip(inputs, twins):
        torch.testing.assert_close(a.grad, b.grad)


def test_expert_parallel_matches_single_process(tmp_path):
    mp.spawn(ep_worker, args=(2, str(tmp_path / "store")), nprocs=2, join=True)


def test_nn_megamoe_matches_moe():
    from torch_ascend_moe.nn import MegaMoE, MoE
    from torch_ascend_moe.testing import calc_diff

    torch.manual_seed(0)
    config = dict(num_shared_experts=1, score_func="sigmoid", use_expert_bias=True, num_groups=2, topk_groups=1)
    moe = MoE(64, 32, 4, 2, dtype=torch.bfloat16, **config)
    mega = MegaMoE(64, 32, 4, 2, dtype=torch.bfloat16, **config)
    mega.load_state_dict(moe.state_dict())
    x = torch.randn(3, 5, 64).bfloat16()
    assert calc_diff(mega(x), moe(x)) < 1e-5  # MegaMoE rounds the activation to BF16 after the routing weight
    x = x.requires_grad_()
    mega(x).float().sum().backward()
    assert x.grad is not None and mega.experts.gate_up_proj.grad is not None
    with pytest.raises(ValueError, match="MegaMoE: argument 'fp8'"):
        MegaMoE(128, 128, 4, 2, fp8=True)
