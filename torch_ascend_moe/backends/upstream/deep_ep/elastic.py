"""DeepEP V2's ``deep_ep.ElasticBuffer`` behind ``ep_dispatch``, ``ep_dispatch_cached`` and ``ep_combine``: on CUDA
(deepseek-ai/DeepEP 2.x, NCCL symmetric memory, any number of ranks) after V1 (``legacy``), and on Ascend, where
DeepEP-Ascend's ``ElasticBuffer`` (same API, same module name ``deep_ep``) is the only DeepEP (specs/deepep_api.md
§2.4, §4.5, §4.6, §5.4, §9.3, §9.4).

How our op maps onto it (the header step and our handle: the package docstring):

* **One buffer per process group**, ``deterministic=True`` (V2's epilogue sorts received rows by their global id,
  ``src_rank * num_max_tokens_per_rank + t``: exactly our order, source-rank-major then ascending token; without
  it V2's order is the arrival order) and ``allow_hybrid_mode=False`` (every rank a direct peer: V2's hybrid handle
  carries per-channel tensors not packed here). Sized by ``ElasticBuffer.get_buffer_size_hint`` for the call's
  ``num_max_tokens_per_rank`` (the largest ``T`` of any rank, from our header, rounded up to a power of two so that
  growing batches rebuild it rarely), H, top-k and FP8; rebuilt, larger, when a call needs more.
* **dispatch** with ``do_cpu_sync=True`` (exact rows; our header already waited on the host): rows, scales and
  top-k ids are V2's; weights, which V2 copies unmasked, are zeroed at other ranks' slots as our op defines them;
  a static dispatch's padding rows are added after V2's rows.
* **backend_state** (1-D int32): V2's ``EPHandle`` flattened, after a head naming it (``MAGIC``) and its sizes:
  ``psum_num_recv_tokens_per_scaleup_rank [S]``, ``psum_num_recv_tokens_per_expert [L]``,
  ``num_unaligned_recv_tokens_per_expert [L]``, ``num_recv_tokens_per_expert_list [L]``, ``recv_src_metadata
  [N, K+2]`` and the same before V2's deterministic sort (what a cached dispatch sorts by), ``dst_buffer_slot_idx
  [T, K]``, ``topk_idx [T, K]``; padded by one word where needed so that its length fits no V1 handle (V1 tells
  its own state by length alone). Unpacking reads the head on the host (the cached dispatch and the combine
  already wait on the host for our handle check).
* **combine**: V2 adds a token's rank partials in top-k slot order (each at its rank's last slot), then the
  biases first: ``ep_combine`` with ``copy_order`` = ``ep_copy_order`` of the dispatch's ids, which is what
  ``nn.MoE`` and our ``deep_ep`` compat pass. A call without that order, or with weights (V2 returns each slot's
  owner's weight where our op sums every rank's), runs our transport on the same routing.

Taken: BF16 or FP8 rows (16-byte multiples), FP32 / int32 scales (at most ``ceil(H / 32)`` per row: the buffer
hint's assumption), FP32 weights, top-k at most 32, not while a graph is captured, not with
``torch.use_deterministic_algorithms`` filling memory (V2 asserts it off). Ascend (the V2 port's limits, §9.4):
``num_sms`` passed explicitly (no automatic SM count there), no CPU buffer, no hybrid mode.

Verified how: ``tests/upstream/test_deep_ep_elastic_backend.py`` on 2 and 4 gloo ranks with the stand-in ``deep_ep``
(``tests/standins/deep_ep``: V2 written from DeepEP dd758ca, its Ascend flavour from the port's documented limits).
Not run on GPUs or NPUs.
"""

from __future__ import annotations

import functools

import torch

from torch_ascend_moe import _registry
from torch_ascend_moe import checks as ck
from torch_ascend_moe.backends.chain import first_refusal, kernel, refuse
from torch_ascend_moe.backends.portable.ep.header import Transport, cached_fields, combine_fields
from torch_ascend_moe.backends.portable.ep.outputs import absent
from torch_ascend_moe.backends.portable.ep.route import cached_row_errors, checked_route
from torch_ascend_moe.backends.upstream import Library
from torch_ascend_moe.backends.upstream import deep_ep as shared
from torch_ascend_moe.checks import ep as ep_checks
from torch_ascend_moe.distributed import capture
from torch_ascend_moe.ops.ep import ep_copy_order


def _v2_build(module) -> str | None:
    if not (hasattr(module, "ElasticBuffer") and hasattr(module, "EPHandle")):
        return "deep_ep has no ElasticBuffer / EPHandle (DeepEP's V2 API): a V1-only build"
    return None


DEEP_EP_V2 = Library("deep_ep", accept=_v2_build)

MAX_TOPK = 32  # "lots of kNumTopk <= 32 restrictions" (csrc/elastic/buffer.hpp, calculate_buffer_size)
MIN_TOKENS = 64  # the smallest num_max_tokens_per_rank a buffer is built for
ASCEND_SMS = 72  # DeepEP-Ascend takes num_sms in [1, 72] and has no automatic choice (specs/deepep_api.md §9.4)
MAGIC, HEAD = shared.V2_MAGIC, shared.V2_HEAD


# ---- buffers ----


@functools.lru_cache(maxsize=64)
def _hint(group, num_max: int, hidden: int, k: int, fp8: bool) -> int:
    lib = DEEP_EP_V2.module()
    return int(
        lib.ElasticBuffer.get_buffer_size_hint(
            group, num_max, hidden, k, use_fp8_dispatch=fp8, allow_hybrid_mode=False, allow_multiple_reduction=True
        )
    )


def _buffer(group_name: str, group, tokens: int, hidden: int, k: int, fp8: bool):
    """The group's ``ElasticBuffer`` big enough for ``tokens`` per rank of this shape, and the
    ``num_max_tokens_per_rank`` to call it with (every rank computes both from what the header shared)."""
    key = (group_name, "elastic")
    before = shared.held_sizes(key)
    num_max = max(MIN_TOKENS, 1 << max(tokens - 1, 0).bit_length(), before[1] if before else 0)
    sizes = (_hint(group, num_max, hidden, k, fp8), num_max)
    lib = DEEP_EP_V2.module()

    def build(sizes):
        return lib.ElasticBuffer(
            group, num_bytes=sizes[0], num_max_tokens_per_rank=sizes[1], deterministic=True, allow_hybrid_mode=False
        )

    built = shared.buffer(key, sizes, build)
    return built, shared.held_sizes(key)[1]


def _num_sms(device: torch.device) -> int:
    return ASCEND_SMS if _registry.device_kind(device) == "npu" else 0  # 0: V2's own choice (get_theoretical_num_sms)


# ---- backend_state: V2's EPHandle, flattened ----


def pack(handle, r: int, t: int, rows: int) -> torch.Tensor:
    """The state of a dispatch of ``t`` tokens whose outputs have ``rows`` rows (padded to fit no V1 length for
    those; V2 received ``N <= rows`` of them)."""
    k = handle.topk_idx.shape[1]
    s = handle.psum_num_recv_tokens_per_scaleup_rank.shape[0]
    local = handle.psum_num_recv_tokens_per_expert.shape[0]
    device = handle.recv_src_metadata.device
    head = [MAGIC, handle.num_experts, handle.expert_alignment, handle.num_max_tokens_per_rank, handle.num_sms]
    n = handle.recv_src_metadata.shape[0]
    head += [k, local, s, t, n, handle.num_recv_tokens, handle.num_expanded_tokens]
    presort = handle.cached_recv_src_metadata_before_sort
    parts = [
        torch.tensor(head, dtype=torch.int32, device=device),
        handle.psum_num_recv_tokens_per_scaleup_rank,
        handle.psum_num_recv_tokens_per_expert,
        handle.num_unaligned_recv_tokens_per_expert,
        torch.tensor(list(handle.num_recv_tokens_per_expert_list), dtype=torch.int32, device=device),
        handle.recv_src_metadata,
        handle.recv_src_metadata if presort is None else presort,
        handle.dst_buffer_slot_idx,
        handle.topk_idx,
    ]
    flat = [p.reshape(-1).to(torch.int32) for p in parts]
    length = sum(p.numel() for p in flat)
    if shared.v1_channels(length, r, t, rows) is not None:
        flat.append(torch.zeros(1, dtype=torch.int32, device=device))
    return torch.cat(flat)


def _length(head: list[int]) -> int:
    _, _, _, _, _, k, local, s, t, n, _, _ = head
    return HEAD + s + 3 * local + 2 * n * (k + 2) + 2 * t * k


def _bad_state(op: str, got: str) -> ValueError:
    expected = (
        "DeepEP's handle of the dispatch this handle comes from "
        f"(DeepEP V2's EPHandle: a head starting with {MAGIC}, then its tensors)"
    )
    return ValueError(ck.message(op, "backend_state", "value", expected, got))


def unpack(op: str, state: torch.Tensor, r: int, t: int):
    """V2's ``EPHandle`` from a ``backend_state`` (``t`` tokens dispatched on this rank), on a copy of the state
    (the state is our op's input, never written). Returns ``(handle, N)``."""
    head = shared.read_v2_head(state)
    if head is None:
        raise _bad_state(op, f"{state.numel()} entries not starting with it")
    _, e, alignment, num_max, num_sms, k, local, s, t_, n, num_recv, num_expanded = head
    length = _length(head)
    if t_ != t or state.numel() not in (length, length + 1):
        raise _bad_state(op, f"a head for T={t_}, N={n}, K={k} and {state.numel()} entries (this call: T={t})")
    lib = DEEP_EP_V2.module()
    sizes = [s, local, local, local, n * (k + 2), n * (k + 2), t * k, t * k]
    psum_s, psum_e, unaligned, listed, src_meta, presort, slots, ids = state[HEAD:length].clone().split(sizes)
    handle = lib.EPHandle(
        False,
        e,
        alignment,
        num_max,
        num_sms,
        ids.view(t, k).to(lib.topk_idx_t),
        num_recv,
        num_expanded,
        listed.tolist(),
        psum_s,
        psum_e,
        unaligned,
        src_meta.view(n, k + 2),
        slots.view(t, k),
        None,
        None,
    )
    handle.cached_recv_src_metadata_before_sort = presort.view(n, k + 2)
    return handle, n


# ---- what V2 takes ----


def _refusal(x: torch.Tensor, *tensors) -> str | None:
    if not shared.has_data(x, *tensors):
        return "fake or meta tensors (the library runs on data; our fake serves tracing)"
    if capture.capturing(x.device):
        return "a graph is being captured (the header every rank exchanges first is a host read)"
    if shared.fills_uninitialized():
        return shared.FILLS
    if (x.shape[1] * x.element_size()) % 16:
        return f"rows of {x.shape[1] * x.element_size()} bytes (DeepEP moves rows of 16-byte multiples)"
    return None


def _rows(x: torch.Tensor, x_scales) -> str | None:
    if x_scales is None:
        return None if x.dtype == torch.bfloat16 else f"{x.dtype} rows (DeepEP V2 moves BF16 or FP8 rows)"
    if x.dtype != torch.float8_e4m3fn:
        return f"{x.dtype} rows with scales (DeepEP V2 moves FP8 E4M3 ones)"
    packs = -(-x.shape[1] // 32)
    if x_scales.shape[1] > packs:
        return f"{x_scales.shape[1]} scales per row (DeepEP V2's buffer hint assumes at most ceil(H / 32) = {packs})"
    return None


def _takes_dispatch(args):
    r = shared.valid(ep_checks.DISPATCH, ep_checks.dispatch_signature, args)
    if r is None:
        return refuse(shared.INVALID)
    k = args.topk_idx.shape[1]
    return first_refusal(
        _refusal(args.x, args.x_scales, args.topk_idx, args.topk_weights),
        _rows(args.x, args.x_scales),
        None if k <= MAX_TOPK else f"top-{k} (DeepEP V2 takes at most {MAX_TOPK})",
        None
        if args.topk_weights is None or args.topk_weights.dtype == torch.float32
        else f"{args.topk_weights.dtype} weights (DeepEP moves FP32 ones)",
    )


def _takes_cached(args):
    r = shared.valid(ep_checks.CACHED, ep_checks.cached_signature, args)
    if r is None:
        return refuse(shared.INVALID)
    return first_refusal(
        shared.state_refusal(args.backend_state, r, args.x.shape[0], args.recv_gather.shape[0], "V2"),
        _refusal(args.x, args.x_scales, args.backend_state),
        _rows(args.x, args.x_scales),
    )


def _slot_order_refusal(args, r: int) -> str | None:
    """V2's reduction order is ``ep_copy_order`` of the dispatch's ids: taken only when ``copy_order`` is exactly
    that (a host read of the state's head and of one comparison)."""
    if args.copy_order is None:
        return "no copy_order (DeepEP V2 adds a token's copies in top-k slot order, not ascending rank)"
    head = shared.read_v2_head(args.backend_state)
    if head is None or head[8] != args.num_tokens or args.backend_state.numel() < _length(head):
        return None  # not V2's state: the kernel raises the op's error
    k, n, t = head[5], head[9], head[8]
    at = HEAD + head[7] + 3 * head[6] + 2 * n * (k + 2) + t * k
    ids = args.backend_state[at : at + t * k].view(t, k)
    if not torch.equal(args.copy_order.long(), ep_copy_order(ids, head[1], r)):
        return "a copy_order other than the dispatch's top-k slot order (DeepEP V2's reduction order)"
    return None


def _takes_combine(args):
    r = shared.valid(ep_checks.COMBINE, ep_checks.combine_signature, args)
    if r is None:
        return refuse(shared.INVALID)
    biases = [b for b in (args.bias_0, args.bias_1) if b is not None]
    return first_refusal(
        shared.state_refusal(args.backend_state, r, args.num_tokens, args.x.shape[0], "V2"),
        _refusal(args.x, args.topk_weights, args.copy_order, args.backend_state, *biases),
        None if args.x.dtype == torch.bfloat16 else f"{args.x.dtype} rows (DeepEP V2's combine is built for BF16)",
        None if all(b.dtype == torch.bfloat16 for b in biases) else "biases not BF16 (DeepEP adds BF16 biases)",
        None
        if args.topk_weights is None
        else "topk_weights (DeepEP V2 returns each slot's owner's weight; our op sums every rank's)",
        _slot_order_refusal(args, r),
    )


# ---- kernels ----


def _dispatch(args):
    head = shared.dispatch_header(args, Transport.DEEP_EP_V2)
    fp8 = args.x_scales is not None
    k = args.topk_idx.shape[1]
    most = int(head.table[:, head.r :].max())  # the largest T of any rank
    buffer, num_max = _buffer(args.group_name, head.group, most, args.x.shape[1], k, fp8)
    lib = DEEP_EP_V2.module()
    payload = (args.x.contiguous(), args.x_scales) if fp8 else args.x.contiguous()
    weights = None if args.topk_weights is None else args.topk_weights.contiguous()
    recv, recv_idx, recv_w, handle, _ = buffer.dispatch(
        payload,
        topk_idx=head.ids.to(lib.topk_idx_t).contiguous(),
        topk_weights=weights,
        num_experts=args.num_experts,
        num_max_tokens_per_rank=num_max,
        expert_alignment=args.expert_alignment,
        num_sms=_num_sms(args.x.device),
        do_cpu_sync=True,
    )
    recv_x, recv_scales = recv if fp8 else (recv, None)
    n = recv_x.shape[0]
    recv_idx = recv_idx.long()
    src = handle.recv_src_metadata[:, 0].long() % num_max  # the global id's token part
    if recv_w is not None:
        recv_w = recv_w.masked_fill(recv_idx < 0, 0)  # V2 copies weights unmasked; ours are 0 at other slots
    if recv_scales is not None:
        recv_scales = recv_scales.contiguous()
    # padded against the rows our handle has (what the later calls' takes see): static dispatches have more
    state = pack(handle, head.r, args.topk_idx.shape[0], max(n, args.num_worst_tokens))
    if args.num_worst_tokens > 0:
        recv_x, recv_scales, recv_w = (_pad(t, args.num_worst_tokens) for t in (recv_x, recv_scales, recv_w))
        recv_idx = torch.cat([recv_idx, recv_idx.new_full((args.num_worst_tokens - n, k), -1)])
        src = _pad(src, args.num_worst_tokens)
    return shared.dispatch_outputs(args, head, recv_x, recv_scales, recv_idx, recv_w, src, state)


def _pad(rows: torch.Tensor | None, n: int) -> torch.Tensor | None:
    """``rows`` followed by zero rows up to ``n`` (``dispatch_outputs`` marks them as padding)."""
    if rows is None:
        return None
    out = rows.new_zeros(n, *rows.shape[1:])
    out[: rows.shape[0]] = rows
    return out


def _cached(args):
    op = ep_checks.CACHED
    r, group, _ = checked_route(
        op,
        ep_checks.cached_signature,
        cached_fields,
        args,
        Transport.DEEP_EP_V2,
        lambda: cached_row_errors(op, args.x, args.send_src),
    )
    handle, n = unpack(op, args.backend_state, r, args.x.shape[0])
    fp8 = args.x_scales is not None
    buffer, _ = _buffer(
        args.group_name, group, handle.num_max_tokens_per_rank, args.x.shape[1], handle.topk_idx.shape[1], fp8
    )
    payload = (args.x.contiguous(), args.x_scales) if fp8 else args.x.contiguous()
    # num_sms given: V2 computes its default from num_experts before reading it from the handle (None in a cached call)
    recv, *_ = buffer.dispatch(payload, handle=handle, num_sms=handle.num_sms)
    recv_x, recv_scales = recv if fp8 else (recv, None)
    rows = args.recv_gather.shape[0]
    recv_x = _pad(recv_x, rows) if rows != n else recv_x
    if recv_scales is None:
        return recv_x, absent(args.x, rows)
    recv_scales = recv_scales.contiguous()
    return recv_x, _pad(recv_scales, rows) if rows != n else recv_scales


def _combine(args):
    op = ep_checks.COMBINE
    r, group, _ = checked_route(op, ep_checks.combine_signature, combine_fields, args, Transport.DEEP_EP_V2)
    handle, n = unpack(op, args.backend_state, r, args.num_tokens)
    k = handle.topk_idx.shape[1]
    buffer, _ = _buffer(args.group_name, group, handle.num_max_tokens_per_rank, args.x.shape[1], k, False)
    biases = tuple(b.contiguous() for b in (args.bias_0, args.bias_1) if b is not None)
    bias = biases if len(biases) == 2 else (biases[0] if biases else None)
    combined, _, _ = buffer.combine(args.x[:n].contiguous(), handle, bias=bias, num_sms=_num_sms(args.x.device))
    return combined, absent(args.x, args.num_tokens)


# The same three kernels on both devices (one API): (op, ElasticBuffer method, takes, kernel).
_KERNELS = (
    ("ep_dispatch", "dispatch", _takes_dispatch, _dispatch),
    ("ep_dispatch_cached", "dispatch(handle=)", _takes_cached, _cached),
    ("ep_combine", "combine", _takes_combine, _combine),
)
for _device, _build in (("cuda", ""), ("npu", " (DeepEP-Ascend)")):
    for _op, _method, _takes, _run in _KERNELS:
        kernel(
            _op,
            device=_device,
            library="deep_ep.elastic",
            calls=f"deep_ep.ElasticBuffer.{_method}{_build}",
            takes=_takes,
            available=DEEP_EP_V2.available,
        )(_run)
