"""``ElasticBuffer`` in one process (a one-rank gloo group): what DeepEP's V2 test measures with
``bench_kineto``: upstream's kernel names time our phases (its bandwidth lines divide by them)."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

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


@st.composite
def _received(draw):
    """A dispatch's receive side and send side as ElasticBuffer's epilogue sees them: sources' row counts, output
    rows (compact, or static with -1 padding rows), local ids with empty lanes, this rank's ids with -1 slots."""
    su = draw(st.integers(1, 3))
    r = su * draw(st.integers(1, 3))
    local, k = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    counts = torch.randint(0, 5, (r,), generator=g)
    rows = int(counts.sum())
    if draw(st.booleans()):  # static: the real rows first, then padding
        gather = torch.cat([torch.arange(rows), torch.full((draw(st.integers(0, 4)),), -1)])
    else:
        gather = torch.arange(rows)
    n, t = gather.shape[0], draw(st.integers(0, 12))
    num_max = max(t, 1)
    src_idx = torch.where(gather >= 0, torch.randint(0, num_max, (n,), generator=g), -1)
    recv_idx = torch.randint(-1, local, (n, k), generator=g)
    recv_idx[gather < 0] = -1
    topk_idx = torch.randint(-1, r * local, (t, k), generator=g)
    return counts, gather, src_idx, recv_idx, topk_idx, num_max, su, local, draw(st.booleans())


@settings(max_examples=150, deadline=None)
@given(_received())
def test_handle_fields_match_portable_path(case):
    """The dispatch epilogue's handle fields: the CPU helper kernel (ascend_moe_kernels::elastic_handle_fields)
    is bitwise the tensor-op path CUDA / NPU take."""
    from torch_ascend_moe.backends.portable.ep import v2

    ours = v2.handle_fields(*case)
    portable = v2.handle_fields_portable(*case)
    for a, b in zip(ours, portable):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
