"""``ElasticBuffer`` in one process (a one-rank gloo group): what DeepEP's V2 test measures with
``bench_kineto``: upstream's kernel names time our phases (its bandwidth lines divide by them)."""

import torch

from tests.ep.specs import init_single_rank_group


def test_bench_kineto_finds_upstreams_kernel_names():
    import torch.distributed as dist

    import torch_ascend_moe.deep_ep as deep_ep
    from torch_ascend_moe.deep_ep.utils.testing import bench_kineto

    init_single_rank_group()
    buffer = deep_ep.ElasticBuffer(dist.group.WORLD, num_max_tokens_per_rank=16, hidden=64, num_cpu_timeout_secs=30)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 64, generator=g).bfloat16()
    idx = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(16)])
    w = torch.rand(16, 2, generator=g)
    names = (("dispatch_impl", "dispatch_copy_epilogue_impl"), ("combine_impl", "combine_reduce_epilogue_impl"))
    for expand in (False, True):
        args = dict(x=x, topk_idx=idx, topk_weights=w, num_experts=8, do_expand=expand)
        recv_x, _, recv_w, handle, _ = buffer.dispatch(**args)
        calls = (
            (lambda a=args: buffer.dispatch(**a), names[0]),
            (lambda h=handle, e=expand: buffer.dispatch(x, handle=h, do_expand=e), names[0]),
            (lambda y=recv_x, h=handle, rw=recv_w: buffer.combine(y, h, topk_weights=rw), names[1]),
        )
        for fn, kernels in calls:
            times = bench_kineto(fn, kernels, num_tests=3, suppress_kineto_output=True)
            assert all(t > 0 for t in times), (expand, kernels, times)
