"""The static ep ops captured in a CUDA graph on a one-rank NCCL group, replayed with new data, against eager.
Needs a GPU (tools/device_check.sh runs it on a lent one); on CPU the same no-host-sync property is checked by
tests.distributed.ep_bodies.emulated_capture (test_ep_ranks.py, test_ep_kernels.py)."""

import datetime
import os
import tempfile

import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a GPU")


def _capture_in_subprocess(queue):
    try:
        store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
        import torch_ascend_moe  # noqa: F401
        from torch_ascend_moe.ops.ep import ep_combine, ep_dispatch, ep_low_latency_combine, ep_low_latency_dispatch

        g = torch.Generator(device="cuda").manual_seed(0)
        t, h, k, e = 64, 256, 4, 8
        x = torch.randn(t, h, device="cuda", generator=g).bfloat16()
        idx = torch.rand(t, e, device="cuda", generator=g).topk(k, dim=1).indices
        w = torch.rand(t, k, device="cuda", generator=g)

        def step():
            out = ep_dispatch(x, idx, w, num_experts=e, num_worst_tokens=t)
            y, _ = ep_combine(out.recv_x * 2, out.handle)
            recv, _, handle = ep_low_latency_dispatch(x, idx, t, e, use_fp8=False)
            z = ep_low_latency_combine(recv * 3, idx, w, handle)
            return y, z

        step()  # warm up outside the capture (allocations, NCCL communicator)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y, z = step()
        for _ in range(2):  # replay with new data in the same input buffers
            x.copy_(torch.randn(t, h, device="cuda", generator=g).bfloat16())
            w.copy_(torch.rand(t, k, device="cuda", generator=g))
            idx.copy_(torch.rand(t, e, device="cuda", generator=g).topk(k, dim=1).indices)
            graph.replay()
            ref_y, ref_z = step()
            torch.cuda.synchronize()
            assert torch.equal(y, ref_y), "captured static dispatch -> combine differs from eager"
            assert torch.equal(z, ref_z), "captured low-latency dispatch -> combine differs from eager"
        dist.destroy_process_group()
        queue.put("ok")
    except BaseException as exc:  # noqa: BLE001  (report anything to the parent)
        import traceback

        queue.put(traceback.format_exc() or repr(exc))


def test_static_ep_ops_capture_in_cuda_graph():
    ctx = torch.multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_capture_in_subprocess, args=(queue,))
    proc.start()
    proc.join(timeout=240)
    assert not proc.is_alive(), "capture test hung"
    assert queue.get(timeout=5) == "ok"
