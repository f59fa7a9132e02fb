"""DeepEP's own kernels behind the ep family, one module per generation as DeepEP's own files are split
(``deep_ep/buffers/legacy.py`` and ``elastic.py``):

* ``legacy``: DeepEP's V1 ``deep_ep.Buffer`` on CUDA (intranode normal mode on 2/4/8 ranks, low-latency mode);
* ``elastic``: DeepEP's V2 ``deep_ep.ElasticBuffer`` on CUDA and DeepEP-Ascend's ``ElasticBuffer`` on Ascend (one
  API, one module name: the device tells the builds apart), normal mode on any number of ranks.

On CUDA V1 comes first (its handle and limits are the better known), V2 takes what V1 refuses. Either way the op
stays ours (schema, fake, autograd, compiler passes); only the data movement is DeepEP's, and every call keeps our
header exchange in front (validation on every rank with one verdict, the transport named so that ranks moving rows
differently raise on all of them instead of waiting in different collectives). What both generations share lives
here: the header step of a dispatch, our handle built from the rows DeepEP moved, the buffers cached per process
group.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from torch_ascend_moe._registry import result_type
from torch_ascend_moe.backends.chain import on_refresh
from torch_ascend_moe.backends.portable.ep.header import bad_ids, dispatch_fields, static_overflow
from torch_ascend_moe.backends.portable.ep.layout import layout_of, per_local_expert
from torch_ascend_moe.backends.portable.ep.outputs import absent
from torch_ascend_moe.checks import ep as ep_checks
from torch_ascend_moe.distributed import agreement, capture
from torch_ascend_moe.distributed.groups import checked_size, resolve_group

# ---- buffers ----


class _Held(NamedTuple):
    buffer: object
    sizes: tuple[int, ...]  # what it was built for (bytes, queue pairs, tokens): a call needing no more reuses it


# One buffer per (process group, kind): V1 normal-mode, V1 low-latency and V2 buffers apart, as vLLM and SGLang keep
# them (a low-latency buffer used for normal kernels would need cleaning first).
_BUFFERS: dict[tuple[str, str], _Held] = {}


@on_refresh
def _drop_buffers() -> None:
    _BUFFERS.clear()


def held(key: tuple[str, str], sizes: tuple[int, ...]):
    """The buffer held for ``key`` if it was built for at least ``sizes``, else None."""
    entry = _BUFFERS.get(key)
    return entry.buffer if entry is not None and all(h >= s for h, s in zip(entry.sizes, sizes)) else None


def held_sizes(key: tuple[str, str]) -> tuple[int, ...] | None:
    entry = _BUFFERS.get(key)
    return None if entry is None else entry.sizes


def buffer(key: tuple[str, str], sizes: tuple[int, ...], build):
    """The buffer held for ``key`` if it is big enough for ``sizes``, else ``build(sizes)`` (grown to at least the
    old one's sizes: never shrink, the smaller calls fit too); building is collective, and every rank reaches this
    call alike."""
    found = held(key, sizes)
    if found is not None:
        return found
    old = _BUFFERS.pop(key, None)
    if old is not None:
        sizes = tuple(max(a, b) for a, b in zip(sizes, old.sizes))
        del old  # DeepEP frees a buffer when its last reference goes (explicitly_destroy=False)
    built = build(sizes)
    _BUFFERS[key] = _Held(built, sizes)
    return built


# ---- what every generation refuses alike ----

FILLS = "torch.use_deterministic_algorithms fills uninitialized memory (DeepEP asserts it is off)"
INVALID = "arguments our check refuses (the kernel chosen raises the op's error, on every rank)"
NO_STATE = "the dispatch did not go through DeepEP (no DeepEP handle in backend_state)"


def fills_uninitialized() -> bool:
    """DeepEP's ``check_torch_deterministic``: the fill kernel would race with its communication stream."""
    return torch.are_deterministic_algorithms_enabled() and torch.utils.deterministic.fill_uninitialized_memory


def valid(op: str, signature, args) -> int | None:
    """The world size when our check (``signature(args, R)``) passes, else None (the kernel then chosen raises the
    op's error on every rank: a ``takes`` must not raise, or the other ranks would wait for this one's header)."""
    try:
        return checked_size(op, signature, args)
    except ValueError:
        return None


def has_data(*tensors) -> bool:
    return all(t is None or capture.has_data(t) for t in tensors)


# ---- telling the generations' states apart ----

V2_MAGIC = -0x45503256  # V2's state's first word ("V2EP", negative: V1's first word is a count)
V2_HEAD = 12  # V2_MAGIC, E, alignment, num_max_tokens_per_rank, num_sms, K, L, S, T, N, num_recv, num_expanded


def read_v2_head(state: torch.Tensor) -> list[int] | None:
    """A V2 state's head on the host (one read), or None when ``state`` is not V2's (``elastic.pack``)."""
    if state.numel() < V2_HEAD:
        return None
    head = state[:V2_HEAD].tolist()
    return head if head[0] == V2_MAGIC else None


def v1_channels(numel: int, r: int, t: int, n: int) -> int | None:
    """The channel count ``C`` a V1 intranode handle of ``numel`` words holds for ``R, T, N`` (its length is
    ``R*R + 2*R*C + N + 2*T*R``); None when the length fits no ``C >= 1``."""
    rest = numel - (r * r + n + 2 * t * r)
    return rest // (2 * r) if rest >= 2 * r and rest % (2 * r) == 0 else None


def state_refusal(state, r: int, t: int, n: int, generation: str) -> str | None:
    """Whether a kernel of ``generation`` ("V1", "V2") refuses ``state``. V1's handle is told by its length alone (no
    host read); V2's state is padded to fit no V1 length and starts with ``V2_MAGIC``, read only when the length fits
    no V1 handle. A corrupt state goes to V1 (V2 where V1 is off), whose kernel raises the op's error."""
    if state is None or state.numel() == 0:
        return NO_STATE
    v1 = v1_channels(state.numel(), r, t, n) is not None
    if generation == "V2":
        return "backend_state is DeepEP V1's handle (its length fits one), not V2's" if v1 else None
    if not v1 and read_v2_head(state) is not None:
        return "backend_state is DeepEP V2's handle (ElasticBuffer), not V1's"
    return None


# ---- a dispatch: our header first, our handle after ----


class Header(NamedTuple):
    r: int
    group: object
    ids: torch.Tensor  # int64 expert ids, bad ones as -1 (they never reach DeepEP: the header raised)
    in_rank: torch.Tensor  # [T, R] bool
    per_rank: torch.Tensor  # [R] int32
    per_node: torch.Tensor
    per_expert: torch.Tensor  # [E] int32
    table: torch.Tensor  # [R, 2R] int64 on the host: every rank's send counts, then every rank's T
    received: torch.Tensor  # [R] rows each rank receives


def dispatch_header(args, transport: int) -> Header:
    """Our check and header exchange before any of DeepEP's collectives (building its buffer is one): a rank
    rejecting its arguments, or one on another transport, makes every rank raise instead of leaving the others in
    DeepEP's collective. DeepEP's ``get_dispatch_layout`` is computed by ours (same definitions, device ops). A
    static dispatch whose ``num_worst_tokens`` is too small raises on every rank before DeepEP writes a row."""
    op = ep_checks.DISPATCH
    r = agreement.checked(
        op, args.group_name, args.x, args.timeout_s, lambda: checked_size(op, ep_checks.dispatch_signature, args)
    )
    group = resolve_group(op, args.group_name)
    t = args.topk_idx.shape[0]
    idx = args.topk_idx.long()
    bad = (idx < -1) | (idx >= args.num_experts)
    ids = torch.where(bad, -1, idx)
    per_rank, per_node, per_expert, in_rank = layout_of(ids, args.num_experts, r)
    # Every rank's send counts and T: receive counts, a too-small num_worst_tokens, and the static handle's T's.
    extra = torch.cat([per_rank.long().cpu(), torch.full((r,), t, dtype=torch.int64)])
    errors = {"topk_idx": (bool(bad.any()), bad_ids(args.num_experts))}
    table = agreement.exchange_header(
        op, group, args.x.device, dispatch_fields(args, transport), extra, errors, args.timeout_s
    )
    received = table[:, :r].sum(0)
    if args.num_worst_tokens > 0 and bool((received > args.num_worst_tokens).any()):
        worst = int(received.argmax())
        raise ValueError(static_overflow(op, args.num_worst_tokens, worst, int(received[worst])))
    return Header(r, group, ids, in_rank, per_rank, per_node, per_expert, table, received)


def zero_padding(rows: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
    """Rows where ``pad`` [N] holds zeroed in place (any dtype: as bytes), no host read."""
    if rows.numel():
        rows.view(torch.uint8).view(rows.shape[0], -1).masked_fill_(pad.unsqueeze(1), 0)
    return rows


def dispatch_outputs(args, head: Header, recv_x, recv_scales, recv_idx, recv_w, src, state) -> tuple:
    """``ep_dispatch``'s twelve outputs from the rows DeepEP moved (``N`` rows, the real ones first, in our order:
    source-rank-major, ascending source token; ``src`` each row's source token) and DeepEP's state: our handle
    exactly as our transport builds it (so any later call DeepEP does not take runs our transport on the same
    routing), padding rows zero / -1 as the op defines them (DeepEP leaves them uninitialized)."""
    device, r = args.x.device, head.r
    rank = head.group.rank()
    t = args.topk_idx.shape[0]
    n, n_real = recv_x.shape[0], int(head.received[rank])
    from_me = head.table[:, rank].to(device)  # rows each source sends this rank
    src = src.long()
    if args.num_worst_tokens > 0:
        # Our static handle: every rank sends every rank a slot per token; a received row's slot in the receive
        # buffer is its source's offset (the T's before it) plus its token.
        send_src = torch.where(head.in_rank.t(), torch.arange(t, device=device), -1).reshape(-1)
        send_counts = torch.full((r,), t, dtype=torch.int64, device=device)
        recv_counts = head.table[:, r].to(device).clone()
        rows = torch.arange(n, device=device)
        source = torch.searchsorted(torch.cumsum(from_me, 0), rows, right=True).clamp(max=r - 1)
        slot_start = torch.cumsum(recv_counts, 0) - recv_counts
        pad = rows >= n_real
        recv_gather = torch.where(pad, -1, slot_start[source] + src)
        src = torch.where(pad, -1, src)
        for rows_ in (recv_x, recv_scales, recv_w):
            if rows_ is not None:
                zero_padding(rows_, pad)
        recv_idx.masked_fill_(pad.unsqueeze(1), -1)
    else:
        send_src = head.in_rank.t().nonzero()[:, 1].contiguous()  # destination-major, ascending token
        send_counts, recv_counts = head.per_rank.long(), from_me.clone()
        recv_gather = torch.arange(n, device=device)
    local = args.num_experts // r
    return result_type("ep_dispatch")(
        recv_x=recv_x,
        recv_x_scales=absent(args.x, n) if recv_scales is None else recv_scales,
        recv_topk_idx=recv_idx,
        recv_topk_weights=absent(args.x, n) if args.topk_weights is None else recv_w,
        num_recv_tokens_per_expert=per_local_expert(recv_idx, recv_idx >= 0, local, args.expert_alignment),
        num_recv=torch.full((1,), n_real, dtype=torch.int64, device=device),
        send_src=send_src,
        send_counts=send_counts,
        recv_counts=recv_counts,
        recv_gather=recv_gather,
        recv_src_idx=src,
        backend_state=state,
    )


# Declaring their kernels, V1 first: within a tier the chain asks kernels in the order they are declared.
from torch_ascend_moe.backends.upstream.deep_ep import legacy  # noqa: E402,F401,I001
from torch_ascend_moe.backends.upstream.deep_ep import elastic  # noqa: E402,F401
