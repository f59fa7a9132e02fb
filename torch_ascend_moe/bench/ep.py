"""Benchmark cases of the ep family: ``torchrun --nproc-per-node N -m torch_ascend_moe bench ep``.

DeepEP's workload (tokens per rank, hidden, top-k of E experts; options ``--tokens --hidden --topk
--experts``, scaled for a CPU by default; DeepEP-Ascend publishes 16384 tokens/rank, hidden 7168, top-6 of
256). Bandwidth is counted the way DeepEP counts it (specs §8.1): the received ``x`` bytes (BF16; FP8 rows
times ``(1 + 4/128) / 2``), the same bytes for combine. The baseline is a bare ``all_to_all_single`` moving
those rows with the same splits in the same run, so the ratio is our overhead over the transport (the
header exchange, routing metadata, packing and the ordered reduction). Without torchrun it runs on one rank.

The V2 cases run DeepEP V2's ``ElasticBuffer`` (compat API) on the same workload: ``dispatch`` (compact, and
``do_expand`` into the GEMM-ready layout) and ``combine`` (slot-order reduction; expanded rows reduced locally
first), each against the same bare all-to-all, so they read next to the V1 op rows.
"""

from __future__ import annotations

import datetime
import os
import tempfile

import torch
import torch.distributed as dist

from torch_ascend_moe.bench import OPTIONS, Case
from torch_ascend_moe.ops.ep import ep_combine, ep_dispatch


def _init() -> None:
    if dist.is_initialized():
        return
    if "WORLD_SIZE" in os.environ:  # torchrun
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    else:
        store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)


def _workload(quick: bool):
    _init()
    r, rank = dist.get_world_size(), dist.get_rank()
    t = OPTIONS.get("tokens", 64 if quick else 2048)
    h = OPTIONS.get("hidden", 256 if quick else 2048)
    k = OPTIONS.get("topk", 2 if quick else 6)
    e = OPTIONS.get("experts", 4 * r if quick else 16 * r)
    g = torch.Generator().manual_seed(rank)
    scores = torch.rand(t, e, generator=g)
    idx = scores.topk(k, dim=1).indices
    w = torch.rand(t, k, generator=g)
    x = torch.randn(t, h, generator=g).bfloat16()
    return r, t, h, k, e, x, idx, w


def _a2a_baseline(rows_out: int, send: torch.Tensor, out_splits, in_splits):
    out = send.new_empty(rows_out, send.shape[1])

    def run():
        dist.all_to_all_single(out, send, out_splits, in_splits)
        return out

    return run


def _dispatch_case(quick: bool, fp8: bool) -> Case:
    state = {"bytes": 0.0}

    def setup():
        r, t, h, k, e, x, idx, w = _workload(quick)
        scales = None
        if fp8:
            x, scales = x.float().to(torch.float8_e4m3fn), torch.rand(t, max(1, h // 128))
        out = ep_dispatch(x, idx, w, num_experts=e, x_scales=scales)
        handle = out.handle
        send = x.view(torch.uint8)[handle.send_src]
        state["bytes"] = out.recv_x.shape[0] * h * 2 * ((1 + 4 / 128) / 2 if fp8 else 1)
        base = _a2a_baseline(out.recv_x.shape[0], send, handle.recv_counts.tolist(), handle.send_counts.tolist())
        return (lambda: ep_dispatch(x, idx, w, num_experts=e, x_scales=scales)), base

    name = "ep_dispatch " + ("FP8" if fp8 else "BF16")
    return Case(
        _label(name, quick),
        0,
        setup,
        "all_to_all_single of the same rows",
        bytes=lambda: state["bytes"],
        iterations=3 if quick else 30,
    )


def _combine_case(quick: bool) -> Case:
    state = {"bytes": 0.0}

    def setup():
        r, t, h, k, e, x, idx, w = _workload(quick)
        out = ep_dispatch(x, idx, w, num_experts=e)
        y, handle = out.recv_x, out.handle
        state["bytes"] = y.shape[0] * h * 2
        base = _a2a_baseline(handle.send_src.shape[0], y, handle.send_counts.tolist(), handle.recv_counts.tolist())
        return (lambda: ep_combine(y, handle)), base

    return Case(
        _label("ep_combine BF16", quick),
        0,
        setup,
        "all_to_all_single of the same rows",
        bytes=lambda: state["bytes"],
        iterations=3 if quick else 30,
    )


def _elastic_case(quick: bool, what: str) -> Case:
    state = {"bytes": 0.0}

    def setup():
        from torch_ascend_moe.deep_ep import ElasticBuffer

        r, t, h, k, e, x, idx, w = _workload(quick)
        buffer = ElasticBuffer(dist.group.WORLD, num_max_tokens_per_rank=t, hidden=h, num_topk=k)
        expand = what.endswith("expand")
        recv_x, _, recv_w, handle, _ = buffer.dispatch(x, idx, w, num_experts=e, do_expand=expand)
        route = handle.route
        compact = route.recv_gather.shape[0]
        state["bytes"] = compact * h * 2
        if what.startswith("dispatch"):
            send = x[route.send_src]
            base = _a2a_baseline(compact, send, route.recv_counts.tolist(), route.send_counts.tolist())
            return (lambda: buffer.dispatch(x, idx, w, num_experts=e, do_expand=expand)), base
        y = torch.randn(recv_x.shape).bfloat16()
        rows = torch.randn(compact, h).bfloat16()
        base = _a2a_baseline(route.send_src.shape[0], rows, route.send_counts.tolist(), route.recv_counts.tolist())
        return (lambda: buffer.combine(y, handle, topk_weights=recv_w)), base

    return Case(
        _label(f"ElasticBuffer.{what} BF16", quick),
        0,
        setup,
        "all_to_all_single of the same rows",
        bytes=lambda: state["bytes"],
        iterations=3 if quick else 30,
    )


def _label(name: str, quick: bool) -> str:
    _init()
    t = OPTIONS.get("tokens", 64 if quick else 2048)
    h = OPTIONS.get("hidden", 256 if quick else 2048)
    k = OPTIONS.get("topk", 2 if quick else 6)
    e = OPTIONS.get("experts", 4 * dist.get_world_size() if quick else 16 * dist.get_world_size())
    return f"{name} R{dist.get_world_size()} T{t} H{h} top-{k} of {e}"


def cases(quick: bool = False) -> list[Case]:
    v2 = [_elastic_case(quick, what) for what in ("dispatch", "dispatch expand", "combine", "combine expand")]
    return [_dispatch_case(quick, False), _dispatch_case(quick, True), _combine_case(quick), *v2]
