"""``nn.MoE`` on a GPU as one unit (issue 18): a DeepSeek-V3-routed BF16 layer's forward captured in a CUDA graph and
replayed with new tokens equals eager, and ``torch.compile(mode="reduce-overhead")`` runs it through CUDA graphs
without skipping them (a host sync anywhere on the path would make Inductor skip the graph). Needs a GPU
(tools/device_check.sh); on CPU the no-host-read property of each op's kernels is checked by tests/test_capture.py and
tests/cuda's emulated captures."""

from __future__ import annotations

import pytest
import torch

from torch_ascend_moe.nn import MoE

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (tools/device_check.sh)")


def _layer():
    torch.manual_seed(0)
    moe = MoE(
        512, 256, num_experts=16, topk=4, num_shared_experts=1, score_func="sigmoid", num_groups=4, topk_groups=2,
        use_expert_bias=True, routed_scaling_factor=2.5,
    )  # fmt: skip
    with torch.no_grad():
        moe.gate.e_score_correction_bias.normal_(0, 0.01)
    return moe.cuda().bfloat16().eval()


def test_moe_forward_captures_in_a_cuda_graph_and_replays():
    moe, g = _layer(), torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(256, 512, device="cuda", generator=g).bfloat16()
    with torch.no_grad():
        moe(x)  # warm-up outside the capture (Triton compiles, allocator)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = moe(x)
        for _ in range(2):
            x.copy_(torch.randn(256, 512, device="cuda", generator=g).bfloat16())
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, moe(x))


def test_moe_compiles_with_reduce_overhead_without_skipping_cuda_graphs():
    from torch._dynamo.utils import counters

    moe, g = _layer(), torch.Generator(device="cuda").manual_seed(2)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(moe, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for _ in range(3):  # warm-up, record, replay
            x = torch.randn(256, 512, device="cuda", generator=g).bfloat16()
            got = compiled(x).clone()
            want = moe(x)
            assert torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
