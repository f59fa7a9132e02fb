"""DeepEP's V1 ``deep_ep.Buffer`` behind the ep family on CUDA: the normal (high-throughput) dispatch, cached
dispatch and combine (deepseek-ai/DeepEP; specs/deepep_api.md §2-§5) and the low-latency pair, the chain's first
entry where the library is installed; V2's ``ElasticBuffer`` (``elastic``) for what V1 refuses, our transport
(``backends/portable/ep``, NCCL) otherwise. Switched off alone as ``deep_ep.legacy``.

The op stays ours (schema, fake, autograd, compiler passes); only the data movement is DeepEP's. What that means:

* **The same header first.** Every rank still exchanges our fixed-length header before any row moves (the op's
  validation on every rank with one verdict, a mismatch between ranks raising on all of them, the deadline), now
  naming the transport: a rank where DeepEP is installed and one where it is not raise on both instead of waiting
  in different collectives. ``takes`` reads only what every rank shares (the group's size, H, dtypes, K, E, the
  options), never a rank's own token count, so the ranks choose alike. The header also carries every rank's send
  counts, so a static dispatch whose ``num_worst_tokens`` is too small raises on every rank before DeepEP writes a
  row (its kernel would write past the buffer). Cost: one small all-gather per call, as our transport pays.
* **Our handle, exactly, plus DeepEP's.** The dispatch returns the handle our transport would (``send_src``,
  ``send_counts``, ``recv_counts``, ``recv_gather``: built from DeepEP's layout and the header, bitwise the
  portable ones), so any later call DeepEP does not take (FP32 gradients, ``copy_order``) runs our transport on the
  same routing; and DeepEP's own handle in ``backend_state``: its combine needs ``send_head``, which DeepEP's
  dispatch kernel writes and which cannot be rebuilt from ours. Receive order is DeepEP V1's, source-rank-major then
  ascending source token: ours. Rows past ``num_recv`` (static dispatch), which DeepEP leaves uninitialized, are
  zeroed as our op defines them.
* **A buffer per process group**, built collectively on the first call that needs it (every rank makes that call),
  sized from DeepEP's own hints (``Config.get_nvl_buffer_size_hint`` / ``get_rdma_buffer_size_hint`` for the
  dispatch and combine configs, ``hidden_bytes = H * max(element size, 2)`` as DeepEP's README sizes it) and
  rebuilt, larger, when a call needs more. ``chain.refresh()`` drops them.
* **Combine** is DeepEP's: biases first, then each rank's copy in ascending rank, FP32, one BF16 rounding (ours,
  bitwise), weights summed.

Taken: 2, 4 or 8 ranks (DeepEP's intranode kernels; its internode handle is not packed here yet), rows whose width
is a multiple of 16 bytes, FP32 / int32 scales, FP32 weights, BF16 combine rows and biases, not while a CUDA graph
is captured (the header is a host read; DeepEP's compact dispatch waits on the host too), not with
``torch.use_deterministic_algorithms`` filling uninitialized memory (DeepEP asserts it off).

``backend_state`` (1-D int32) is DeepEP's intranode handle, flattened: ``rank_prefix_matrix [R, R]``,
``channel_prefix_matrix [R, C]``, ``recv_channel_prefix_matrix [R, C]``, ``recv_src_idx [N]``, ``is_token_in_rank
[T, R]`` (0/1), ``send_head [T, R]``. Its length gives ``C`` from what the combine already knows (``R``, ``T``,
``N``): unpacking reads nothing on the host.

Verified how: ``tests/upstream/test_deep_ep_backend.py`` on 2 and 4 gloo ranks with a stand-in ``deep_ep`` written
from DeepEP's sources (``tests/standins/deep_ep``). Not run on GPUs.
"""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck
from torch_ascend_moe.backends.chain import first_refusal, kernel, refuse
from torch_ascend_moe.backends.portable.ep.header import Transport, cached_fields, combine_fields
from torch_ascend_moe.backends.portable.ep.low_latency import ll_combine_checks, ll_dispatch_checks
from torch_ascend_moe.backends.portable.ep.outputs import absent, no_backend_state
from torch_ascend_moe.backends.portable.ep.route import cached_row_errors, checked_route
from torch_ascend_moe.backends.upstream import Library
from torch_ascend_moe.backends.upstream import deep_ep as shared
from torch_ascend_moe.checks import ep as ep_checks
from torch_ascend_moe.distributed import capture


def _v1_build(module) -> str | None:
    if not hasattr(module, "Buffer"):
        return "deep_ep has no Buffer (DeepEP's V1 API): an ElasticBuffer-only build"
    return None


DEEP_EP = Library("deep_ep", accept=_v1_build)

INTRANODE_RANKS = (2, 4, 8)  # DeepEP's intranode kernels are instantiated for these
MAX_LOCAL_EXPERTS = 1024  # its notify kernels' limit on E / R
MAX_SCALES = 128  # what its buffer size hints assume
MAX_TOPK = 32  # intranode.cu's device asserts (dispatch and combine): num_topk <= 32


# ---- buffers ----


def normal_buffer(group_name: str, group, hidden_bytes: int):
    """The group's normal-mode ``deep_ep.Buffer``, big enough for rows of ``hidden_bytes`` (DeepEP's hints for its
    dispatch and combine configs)."""
    lib = DEEP_EP.module()
    r = group.size()
    configs = (lib.Buffer.get_dispatch_config(r), lib.Buffer.get_combine_config(r))
    nvl = max(c.get_nvl_buffer_size_hint(hidden_bytes, r) for c in configs)
    rdma = max(c.get_rdma_buffer_size_hint(hidden_bytes, r) for c in configs)
    return shared.buffer((group_name, "normal"), (nvl, rdma), lambda sizes: lib.Buffer(group, *sizes))


def _hidden_bytes(x: torch.Tensor) -> int:
    return x.shape[1] * max(x.element_size(), 2)


# ---- backend_state: DeepEP's intranode handle, flattened ----


def pack(handle) -> torch.Tensor:
    rank_prefix, channel_prefix, recv_channel_prefix, recv_src_idx, in_rank, send_head = handle
    parts = (rank_prefix, channel_prefix, recv_channel_prefix, recv_src_idx, in_rank, send_head)
    return torch.cat([p.reshape(-1).to(torch.int32) for p in parts])


def _bad_state(op: str, r: int, t: int, n: int, got) -> ValueError:
    expected = (
        f"DeepEP's handle of the dispatch this handle comes from (R={r}, T={t}, N={n}: R*R + 2*R*C + N + 2*T*R int32 "
        "entries for some channel count C >= 1)"
    )
    return ValueError(ck.message(op, "backend_state", "value", expected, f"{got} entries"))


def unpack(op: str, state: torch.Tensor, r: int, t: int, n: int) -> tuple:
    """DeepEP's handle from a ``backend_state`` (``t`` tokens dispatched, ``n`` rows received); ``send_head`` is a
    copy (DeepEP's combine rewrites it in place; the state is our op's input, never written)."""
    c = shared.v1_channels(state.numel(), r, t, n)
    if c is None:
        raise _bad_state(op, r, t, n, state.numel())
    sizes = [r * r, r * c, r * c, n, t * r, t * r]
    rank_prefix, channel_prefix, recv_channel_prefix, recv_src_idx, in_rank, send_head = state.split(sizes)
    return (
        rank_prefix.view(r, r),
        channel_prefix.view(r, c),
        recv_channel_prefix.view(r, c),
        recv_src_idx,
        in_rank.view(t, r).bool(),
        send_head.view(t, r).clone(),
    )


# ---- what DeepEP takes ----


def _shared_refusal(x: torch.Tensor, r: int, *tensors) -> str | None:
    """Refusals every normal-mode call shares (all of them rank-independent)."""
    if not shared.has_data(x, *tensors):
        return "fake or meta tensors (the library runs on data; our fake serves tracing)"
    if r not in INTRANODE_RANKS:
        return f"{r} ranks: DeepEP's intranode kernels take 2, 4 or 8 (its internode handle is not wired here)"
    if capture.capturing(x.device):
        return "a CUDA graph is being captured (the header every rank exchanges first is a host read)"
    if shared.fills_uninitialized():
        return shared.FILLS
    if (x.shape[1] * x.element_size()) % 16:
        return f"rows of {x.shape[1] * x.element_size()} bytes (DeepEP moves rows of 16-byte multiples)"
    return None


def _takes_dispatch(args):
    r = shared.valid(ep_checks.DISPATCH, ep_checks.dispatch_signature, args)
    if r is None:
        return refuse(shared.INVALID)
    return first_refusal(
        _shared_refusal(args.x, r, args.x_scales, args.topk_idx, args.topk_weights),
        None
        if args.x_scales is None or args.x_scales.shape[1] <= MAX_SCALES
        else f"{args.x_scales.shape[1]} scales per row (DeepEP's buffers assume at most {MAX_SCALES})",
        None if args.topk_idx.shape[1] <= MAX_TOPK else f"top-{args.topk_idx.shape[1]} (DeepEP traps above {MAX_TOPK})",
        None
        if args.topk_weights is None or args.topk_weights.dtype == torch.float32
        else f"{args.topk_weights.dtype} weights (DeepEP moves FP32 ones)",
        None
        if args.num_experts // r <= MAX_LOCAL_EXPERTS
        else f"{args.num_experts // r} experts per rank (DeepEP takes at most {MAX_LOCAL_EXPERTS})",
    )


def _takes_cached(args):
    r = shared.valid(ep_checks.CACHED, ep_checks.cached_signature, args)
    if r is None:
        return refuse(shared.INVALID)
    return first_refusal(
        shared.state_refusal(args.backend_state, r, args.x.shape[0], args.recv_gather.shape[0], "V1"),
        _shared_refusal(args.x, r, args.x_scales, args.backend_state),
        None
        if args.x_scales is None or args.x_scales.shape[1] <= MAX_SCALES
        else f"{args.x_scales.shape[1]} scales per row (DeepEP's buffers assume at most {MAX_SCALES})",
    )


def _takes_combine(args):
    r = shared.valid(ep_checks.COMBINE, ep_checks.combine_signature, args)
    if r is None:
        return refuse(shared.INVALID)
    biases = [b for b in (args.bias_0, args.bias_1) if b is not None]
    return first_refusal(
        shared.state_refusal(args.backend_state, r, args.num_tokens, args.x.shape[0], "V1"),
        _shared_refusal(args.x, r, args.topk_weights, args.backend_state, *biases),
        None if args.x.dtype == torch.bfloat16 else f"{args.x.dtype} rows (DeepEP's combine is built for BF16)",
        None if all(b.dtype == torch.bfloat16 for b in biases) else "biases not BF16 (DeepEP adds BF16 biases)",
        None
        if args.topk_weights is None or args.topk_weights.dtype == torch.float32
        else f"{args.topk_weights.dtype} weights (DeepEP sums FP32 ones)",
        None
        if args.topk_weights is None or args.topk_weights.shape[1] <= MAX_TOPK
        else f"top-{args.topk_weights.shape[1]} weights (DeepEP traps above {MAX_TOPK})",
        None if args.copy_order is None else "copy_order (DeepEP adds a token's copies in ascending rank)",
    )


# ---- kernels ----


@kernel(
    device="cuda",
    library="deep_ep.legacy",
    calls="deep_ep.Buffer.dispatch",
    takes=_takes_dispatch,
    available=DEEP_EP.available,
)
def ep_dispatch(args):
    head = shared.dispatch_header(args, Transport.DEEP_EP)
    t, k = args.topk_idx.shape
    buffer = normal_buffer(args.group_name, head.group, _hidden_bytes(args.x))
    weights = args.topk_weights if args.topk_weights is not None else torch.zeros(t, k, device=args.x.device)
    payload = args.x.contiguous() if args.x_scales is None else (args.x.contiguous(), args.x_scales)
    recv, recv_idx, recv_w, _, handle, _ = buffer.dispatch(
        payload,
        num_tokens_per_rank=head.per_rank,
        num_tokens_per_rdma_rank=head.per_node if head.r > INTRANODE_RANKS[-1] else None,
        is_token_in_rank=head.in_rank,
        num_tokens_per_expert=head.per_expert,
        topk_idx=head.ids,
        topk_weights=weights,
        expert_alignment=args.expert_alignment,
        num_worst_tokens=args.num_worst_tokens,
    )
    recv_x, recv_scales = recv if args.x_scales is not None else (recv, None)
    return shared.dispatch_outputs(args, head, recv_x, recv_scales, recv_idx, recv_w, handle[3], pack(handle))


@kernel(
    device="cuda",
    library="deep_ep.legacy",
    calls="deep_ep.Buffer.dispatch(handle=)",
    takes=_takes_cached,
    available=DEEP_EP.available,
)
def ep_dispatch_cached(args):
    op = ep_checks.CACHED
    r, group, _ = checked_route(
        op,
        ep_checks.cached_signature,
        cached_fields,
        args,
        Transport.DEEP_EP,
        lambda: cached_row_errors(op, args.x, args.send_src),
    )
    n = args.recv_gather.shape[0]
    handle = unpack(op, args.backend_state, r, args.x.shape[0], n)
    buffer = normal_buffer(args.group_name, group, _hidden_bytes(args.x))
    payload = args.x.contiguous() if args.x_scales is None else (args.x.contiguous(), args.x_scales)
    recv, *_ = buffer.dispatch(payload, handle=handle)
    recv_x, recv_scales = recv if args.x_scales is not None else (recv, None)
    pad = args.recv_gather < 0
    shared.zero_padding(recv_x, pad)
    if recv_scales is None:
        return recv_x, absent(args.x, n)
    return recv_x, shared.zero_padding(recv_scales, pad)


@kernel(
    device="cuda",
    library="deep_ep.legacy",
    calls="deep_ep.Buffer.combine",
    takes=_takes_combine,
    available=DEEP_EP.available,
)
def ep_combine(args):
    op = ep_checks.COMBINE
    r, group, _ = checked_route(op, ep_checks.combine_signature, combine_fields, args, Transport.DEEP_EP)
    handle = unpack(op, args.backend_state, r, args.num_tokens, args.x.shape[0])
    buffer = normal_buffer(args.group_name, group, _hidden_bytes(args.x))
    biases = tuple(b.contiguous() for b in (args.bias_0, args.bias_1) if b is not None)
    weights = None if args.topk_weights is None else args.topk_weights.contiguous()
    combined, combined_w, _ = buffer.combine(
        args.x.contiguous(), handle, topk_weights=weights, bias=biases if len(biases) == 2 else (biases or (None,))[0]
    )
    if weights is None:
        return combined, absent(args.x, args.num_tokens)
    return combined, combined_w


# ---- low-latency mode ----
#
# DeepEP's low-latency kernels (one message per (token, expert) into [L, R * T_max, H] buffers over NVSHMEM) serve
# ep_low_latency_dispatch / _combine. Their handle is ours field for field (src_info, layout_range, T_max, H, E), so
# no backend_state: our transport's combine can take DeepEP's dispatch and the other way round. Rows arrive in
# arrival order (DeepEP: segments and rows by atomic counters), which the op allows: src_info / layout_range say where
# each row came from, our combine and the backward read them whatever the order. Rows past recv_count are left as
# DeepEP leaves them (the op leaves them unspecified; zeroing them would cost a pass over the whole buffer).

LL_HIDDEN = (2048, 2560, 3072, 4096, 5120, 6144, 7168, 8192)  # the hidden sizes its kernels are instantiated for
LL_MAX_TOPK = 11
LL_MAX_TOKENS = 511  # NVSHMEM's default QP depth (1024) holds 2 * (T_max + 1) messages


def _ll_sizes(group_size: int, t_max: int, hidden: int, num_experts: int) -> tuple[int, int]:
    """A low-latency buffer's RDMA bytes (DeepEP's hint) and queue pairs per rank (one per local expert)."""
    lib = DEEP_EP.module()
    return lib.Buffer.get_low_latency_rdma_size_hint(t_max, hidden, group_size, num_experts), num_experts // group_size


def low_latency_buffer(group_name: str, group, t_max: int, hidden: int, num_experts: int):
    """The group's low-latency ``deep_ep.Buffer``; never built while a graph is captured (``takes``)."""
    lib = DEEP_EP.module()
    return shared.buffer(
        (group_name, "low latency"),
        _ll_sizes(group.size(), t_max, hidden, num_experts),
        lambda sizes: lib.Buffer(group, 0, sizes[0], low_latency_mode=True, num_qps_per_rank=sizes[1]),
    )


def _ll_warp_refusal(device: torch.device, num_experts: int, hidden: int) -> str | None:
    """DeepEP's low-latency kernels give each SM ``ceil(E / SMs)`` warp groups of ``32 // groups`` warps and trap
    (``internode_ll.cu`` device asserts) outside ``1 < warps per group``, ``groups < 15``, and the combine's decode
    warps fitting: refused before. Only on a GPU (the SM count is the device's; a CPU emulation's stand-in checks its
    own)."""
    if device.type != "cuda":
        return None
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    groups = -(-num_experts // sms)
    per_group = 32 // groups
    unroll = 4 if hidden % 1024 == 0 else 2
    decode_warps = -(-(hidden // 8) // (32 * unroll)) * (32 * unroll) // 64
    if per_group <= 1 or groups >= 15 or groups * per_group // (decode_warps + 1) <= 0:
        return f"{num_experts} experts on {sms} SMs ({groups} warp groups per SM): DeepEP's low-latency kernels trap"
    return None


def _ll_refusal(x: torch.Tensor, r: int, group_name: str, t_max: int, hidden: int, num_experts: int, k: int):
    if not capture.has_data(x):
        return "fake or meta tensors (the library runs on data; our fake serves tracing)"
    if r < 2:
        return "a single rank (nothing to exchange)"
    if x.dtype != torch.bfloat16:
        return f"{x.dtype} rows (DeepEP's low-latency kernels move BF16)"
    if hidden not in LL_HIDDEN:
        return f"H = {hidden} (DeepEP's low-latency kernels are built for {', '.join(map(str, LL_HIDDEN))})"
    if k > LL_MAX_TOPK:
        return f"top-{k} (DeepEP's low-latency kernels take at most {LL_MAX_TOPK})"
    if t_max > LL_MAX_TOKENS:
        return f"num_max_dispatch_tokens_per_rank {t_max} (NVSHMEM's default queue depth holds {LL_MAX_TOKENS})"
    if (r * t_max) % 4:
        return f"R * num_max_dispatch_tokens_per_rank = {r * t_max}, not a multiple of 4 (DeepEP asserts it)"
    if shared.fills_uninitialized():
        return shared.FILLS
    why = _ll_warp_refusal(x.device, num_experts, hidden)
    if why:
        return why
    if (
        capture.capturing(x.device)
        and shared.held((group_name, "low latency"), _ll_sizes(r, t_max, hidden, num_experts)) is None
    ):
        return (
            "no DeepEP buffer for these sizes yet, and building one while a graph is captured is collective (warm up)"
        )
    return None


def _takes_ll_dispatch(args):
    r = shared.valid(ep_checks.LL_DISPATCH, ep_checks.ll_dispatch_signature, args)
    if r is None:
        return refuse(shared.INVALID)
    t_max, hidden = args.num_max_dispatch_tokens_per_rank, args.x.shape[1]
    return first_refusal(
        _ll_refusal(args.x, r, args.group_name, t_max, hidden, args.num_experts, args.topk_idx.shape[1]),
        None if args.slot_weights is None else "slot_weights (DeepEP's dispatch scales no messages)",
    )


def _takes_ll_combine(args):
    r = shared.valid(ep_checks.LL_COMBINE, ep_checks.ll_combine_signature, args)
    if r is None:
        return refuse(shared.INVALID)
    local, _, hidden = args.x.shape
    k = args.topk_idx.shape[1]
    t_max = args.num_max_dispatch_tokens_per_rank
    return first_refusal(
        None
        if args.backend_state is None or args.backend_state.numel() == 0
        else "a dispatch whose transport keeps a state (MC2's)",
        _ll_refusal(args.x, r, args.group_name, t_max, hidden, local * r, k),
        None if args.topk_weights.dtype == torch.float32 else f"{args.topk_weights.dtype} weights (DeepEP's are FP32)",
    )


@kernel(
    device="cuda",
    library="deep_ep.legacy",
    calls="deep_ep.Buffer.low_latency_dispatch",
    takes=_takes_ll_dispatch,
    available=DEEP_EP.available,
)
def ep_low_latency_dispatch(args):
    group, r, ids, _ = ll_dispatch_checks(args, transport=Transport.DEEP_EP)
    t_max, (_, hidden) = args.num_max_dispatch_tokens_per_rank, args.x.shape
    buffer = low_latency_buffer(args.group_name, group, t_max, hidden, args.num_experts)
    recv, count, handle, _, _ = buffer.low_latency_dispatch(
        args.x.contiguous(),
        ids,
        t_max,
        args.num_experts,
        use_fp8=args.use_fp8,
        round_scale=args.round_scale,
        use_ue8m0=args.use_ue8m0,
    )
    recv_x, scales = recv if args.use_fp8 else (recv, None)
    local, n = recv_x.shape[:2]
    # DeepEP hands its scales as a transposed view (for TMA): ours are row-major.
    scales = absent(args.x, local * n).view(local, n, 0) if scales is None else scales.contiguous()
    inside = torch.arange(n, device=recv_x.device) < count.unsqueeze(1)
    src_info = torch.where(inside, handle[0], -1)  # DeepEP leaves the rest unwritten; ours marks them -1
    return recv_x, scales, count, src_info, handle[1], no_backend_state(recv_x.device)


@kernel(
    device="cuda",
    library="deep_ep.legacy",
    calls="deep_ep.Buffer.low_latency_combine",
    takes=_takes_ll_combine,
    available=DEEP_EP.available,
)
def ep_low_latency_combine(args):
    group, r, _ = ll_combine_checks(args, transport=Transport.DEEP_EP)
    local, _, hidden = args.x.shape
    t_max = args.num_max_dispatch_tokens_per_rank
    buffer = low_latency_buffer(args.group_name, group, t_max, hidden, local * r)
    handle = (args.src_info, args.layout_range, t_max, hidden, local * r)
    combined, _, _ = buffer.low_latency_combine(
        args.x.contiguous(), args.topk_idx.long(), args.topk_weights.contiguous(), handle
    )
    return combined
