"""``mega_moe`` on DeepGEMM's Mega MoE (``deep_gemm.mega``: ``fp8_fp4_mega_moe`` / ``bf16_mega_moe``, SM100, 2.6.x;
specs/deepgemm_api.md §10): dispatch, L1, SwiGLU, L2 and combine in one kernel over symmetric memory.

How our op maps onto it:

* **A header first** (expert-parallel calls): our check on every rank with one verdict, every rank's ``T`` and
  bad-id flag exchanged, as ``ep_dispatch`` does in the portable pipeline, before anything collective of
  DeepGEMM's (building its ``SymmBuffer``, the kernel itself): a rank whose arguments fail raises on every rank
  instead of leaving the others in the kernel. Bad ids raise the words the portable pipeline raises.
* **One ``SymmBuffer`` per process group and shape** (``get_symm_buffer_for_mega_moe``: E, K, H, I, the mode), sized
  for the largest ``T`` any rank has passed (rounded up to a power of two), rebuilt, larger, when a call needs more;
  ``chain.refresh()`` drops them. A local call (no group) runs on a one-rank group object (what DeepGEMM does for a
  group of size 1: a plain tensor, no symmetric memory). Each call copies its rows, scales, ids and weights into
  the buffer's views (the kernel consumes them).
* **Weights transformed once per weight version**: ``transform_sf_into_required_layout`` (FP32 1x32 scales to
  packed UE8M0, MN-major) then ``transform_weights_for_mega_moe`` (gate/up interleaved, scales permuted for UTCCP),
  cached while the weight tensors live and their ``_version`` is unchanged (an optimizer step re-transforms).
  Cost: one transformed copy of the experts' weights per cached version.
* **Scales**: DeepGEMM reads 1x32 UE8M0 scales; ours are FP32. FP32 scales that are powers of two are exactly
  their exponent byte; a call is taken only after a host read says they are (weights' once per version, ``x_sf``
  per call; TileKernels' casts pay the same read).
* ``fast_math=False``: the op defines SwiGLU with exact ``exp`` (DeepGEMM's default approximates it).
* The second output is the pair count per local expert: DeepGEMM's ``cumulative_local_expert_recv_stats`` added to
  a zeroed tensor.

Not taken: shared experts (DeepGEMM 2.6 fuses none; DeepGEMM-Ascend's form is another API), GPUs other than SM100,
shapes its kernels' asserts reject (BF16: ``H`` a multiple of 256, of 512 above 4096, ``I`` of 128; FP8: both of
512; top-k at most 32; at most 72 ranks), scales not powers of two, graph capture (the header is a host read).
DeepGEMM-Ascend's Mega MoE (int16 scale pairs, fused shared experts) is not mapped yet.

Verified how: ``tests/upstream/test_deep_gemm_backend_mega.py`` with the stand-in ``deep_gemm``
(``tests/standins/deep_gemm/_cuda_mega.py``, written from DeepGEMM 54e2261). Not run on a GPU (the lent H200 is
SM90, where Mega MoE does not exist).
"""

from __future__ import annotations

import types
import weakref

import torch

from torch_ascend_moe.backends.chain import first_refusal, kernel, on_refresh, refuse
from torch_ascend_moe.backends.portable import ep as ep_ours
from torch_ascend_moe.backends.upstream.deep_gemm import (
    CUDA,
    SM100,
    as_library_fp4,
    cuda_arch,
    cuda_refusal,
    real_refusal,
)
from torch_ascend_moe.distributed import capture, exchange
from torch_ascend_moe.distributed.groups import resolve_group
from torch_ascend_moe.meta.mega_moe import GRAN, OP, mega_moe_signature

RECIPE = (1, 1, 32)
MIN_TOKENS = 64  # the smallest T a buffer is built for (DeepGEMM aligns it up to 384 anyway)
MAX_RANKS = 72  # its symmetric buffer's rank limit (layout/mega_moe.cuh)

# ---- what DeepGEMM takes ----

_POW2: dict[tuple, tuple[weakref.ref, bool]] = {}


def _powers_of_two(sf: torch.Tensor) -> bool:
    """Every entry a positive normal power of two (exactly its UE8M0 exponent byte): one host read."""
    bits = sf.contiguous().view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    return bool((((bits & 0x807FFFFF) == 0) & (exponent > 0) & (exponent < 255)).all())


def _weights_powers_of_two(sf: torch.Tensor) -> bool:
    """``_powers_of_two`` of a weight's scales, remembered while that tensor lives at this version."""
    key = (id(sf), sf._version)
    held = _POW2.get(key)
    if held is not None and held[0]() is sf:
        return held[1]
    ok = _powers_of_two(sf)
    if len(_POW2) > 64:
        _POW2.clear()
    _POW2[key] = (weakref.ref(sf), ok)
    return ok


def _refusal(args) -> str | None:
    fp8 = args.x.dtype == torch.float8_e4m3fn
    h, inter = args.x.shape[1], args.l1_weights.shape[1] // 2
    if args.shared_l1_weights is not None:
        return "shared experts (DeepGEMM 2.6's Mega MoE fuses none)"
    why = real_refusal(args.x, args.x_sf, args.topk_idx, args.topk_weights, args.l1_weights, args.l2_weights)
    if why:
        return why
    if capture.capturing(args.x.device):
        return "a CUDA graph is being captured (the header and the scales' check are host reads)"
    why = cuda_refusal()
    if why:
        return why
    if cuda_arch() != SM100:
        return f"SM{cuda_arch()}x: DeepGEMM's Mega MoE kernels are SM100's"
    ranks = 1 if args.group_name is None else resolve_group(OP, args.group_name).size()
    if ranks > MAX_RANKS:
        return f"{ranks} ranks (DeepGEMM's Mega MoE takes at most {MAX_RANKS})"
    if args.topk_idx.shape[1] > 32:
        return f"top-{args.topk_idx.shape[1]} (DeepGEMM's Mega MoE takes at most 32)"
    # Its kernels' static asserts (JIT compile errors otherwise): 2-CTA clusters need an even count of 128-wide N
    # blocks in L1 (2I) and L2 (H); K blocks of up to 256 (FP8) / 128 (BF16) must divide H and I; the combine's
    # chunks (two above H = 4096) must be multiples of 32 16-byte lanes. FP8: its buffer's per-token scale rows
    # (H / 32 and I / 32 bytes) must be TMA-aligned (layout/mega_moe.cuh).
    h_unit = 512 if fp8 or h > 4096 else 256
    i_unit = 512 if fp8 else 128
    if h % h_unit or inter % i_unit:
        return f"H = {h}, I = {inter}: DeepGEMM's Mega MoE takes H a multiple of {h_unit}, I of {i_unit}"
    if fp8 and not (_powers_of_two(args.x_sf) and all(map(_weights_powers_of_two, (args.l1_sf, args.l2_sf)))):
        return "FP32 scales that are not all powers of two (DeepGEMM reads UE8M0 scales)"
    return None


def _takes(args):
    try:
        mega_moe_signature(args)
    except ValueError:
        return refuse("arguments our check refuses (the kernel chosen raises the op's error)")
    return first_refusal(_refusal(args))


# ---- buffers and transformed weights ----


class _LocalGroup:
    """What DeepGEMM reads of a process group of one rank (``size``, ``rank``, ``barrier``): a local call's."""

    def size(self) -> int:
        return 1

    def rank(self) -> int:
        return 0

    def barrier(self) -> None:
        return None


_LOCAL = _LocalGroup()
_BUFFERS: dict[tuple, object] = {}
_WEIGHTS: dict[tuple, tuple] = {}


@on_refresh
def _drop() -> None:
    for held in _BUFFERS.values():
        held.destroy()
    _BUFFERS.clear()
    _WEIGHTS.clear()
    _POW2.clear()


def _buffer(lib, key: tuple, group, num_experts: int, tokens: int, k: int, h: int, inter: int, mma: str):
    """The group's ``SymmBuffer`` for this shape with room for ``tokens`` per rank (collective when built)."""
    want = max(MIN_TOKENS, 1 << max(tokens - 1, 0).bit_length())
    held = _BUFFERS.get(key)
    if held is not None and held.num_max_tokens_per_rank >= tokens:
        return held
    if held is not None:
        want = max(want, held.num_max_tokens_per_rank)
        held.destroy()
        del _BUFFERS[key]
    built = lib.get_symm_buffer_for_mega_moe(group, num_experts, want, k, h, inter, mma_type=mma)
    _BUFFERS[key] = built
    return built


def _version(*tensors) -> tuple:
    return tuple((id(t), t._version) for t in tensors if t is not None)


def _transformed(lib, args):
    """The experts' weights in DeepGEMM's layout, transformed once per weight version (while the tensors live)."""
    parts = (args.l1_weights, args.l1_sf, args.l2_weights, args.l2_sf)
    key = _version(*parts)
    held = _WEIGHTS.get(key)
    if held is not None and all(ref() is t for ref, t in zip(held[0], parts) if t is not None):
        return held[1]
    if args.l1_sf is None:
        l1, l2 = lib.transform_weights_for_mega_moe(args.l1_weights.contiguous(), args.l2_weights.contiguous())
    else:
        experts, two_i, h = args.l1_weights.shape[0], args.l1_weights.shape[1], args.x.shape[1]
        sf1 = lib.transform_sf_into_required_layout(args.l1_sf.contiguous(), two_i, h, (1, GRAN), experts)
        sf2 = lib.transform_sf_into_required_layout(args.l2_sf.contiguous(), h, two_i // 2, (1, GRAN), experts)
        w1, w2 = (as_library_fp4(w).contiguous() for w in (args.l1_weights, args.l2_weights))
        l1, l2 = lib.transform_weights_for_mega_moe((w1, sf1), (w2, sf2))
    if len(_WEIGHTS) >= 8:  # a few versions at a time (layers of one model each hold their own)
        _WEIGHTS.pop(next(iter(_WEIGHTS)))
    _WEIGHTS[key] = (tuple(weakref.ref(t) if t is not None else None for t in parts), (l1, l2))
    return l1, l2


def packed_ue8m0(sf: torch.Tensor) -> torch.Tensor:
    """FP32 powers of two ``[T, H/32]`` as DeepGEMM's packed UE8M0 ``[T, H/128]`` int32 (four exponent bytes per
    int, the lowest column in the lowest byte), on the device."""
    exponent = ((sf.contiguous().view(torch.int32) >> 23) & 0xFF).to(torch.uint8)
    return exponent.view(torch.int32)


# ---- the kernel ----


def _header(args, num_experts: int):
    """(group, the largest T of any rank): our check on every rank and the bad-id verdict, before anything of
    DeepGEMM's. A local call checks its ids here."""
    idx = args.topk_idx
    bad = (idx < -1) | (idx >= num_experts)
    if args.group_name is None:
        if bool(bad.any()):
            raise ValueError(
                f"{OP}: argument 'topk_idx' values: expected expert ids in [-1, {num_experts}), got {int(idx[bad][0])}"
            )
        return _LOCAL, args.x.shape[0]
    group = resolve_group(OP, args.group_name)
    fields = {
        "x's shape[1] (H)": args.x.shape[1],
        "x's dtype": exchange.dtype_code(args.x.dtype),
        "topk_idx's K": idx.shape[1],
        "l1_weights' shape (E_local, 2I)": args.l1_weights.shape[0] * 1_000_000 + args.l1_weights.shape[1],
    }
    # The words ep_dispatch raises in the portable pipeline for the same ids.
    words = ep_ours.bad_ids(types.SimpleNamespace(num_experts=num_experts))
    table = exchange.exchange_header(
        OP,
        group,
        args.x.device,
        fields,
        torch.tensor([args.x.shape[0]]),
        {"topk_idx": (bool(bad.any()), words)},
        args.timeout_s,
    )
    return group, int(table[:, 0].max())


@kernel(
    device="cuda",
    library="deep_gemm",
    calls="deep_gemm.fp8_fp4_mega_moe / bf16_mega_moe",
    takes=_takes,
    available=CUDA.available,
)
def mega_moe(args):
    num_experts, _ = exchange.checked(OP, args.group_name, args.x, args.timeout_s, lambda: mega_moe_signature(args))
    group, tokens = _header(args, num_experts)
    lib = CUDA.module()
    fp8 = args.x.dtype == torch.float8_e4m3fn
    (t, h), k = args.x.shape, args.topk_idx.shape[1]
    experts, inter = args.l1_weights.shape[0], args.l1_weights.shape[1] // 2
    mma = "fp8xfp4" if fp8 else "bf16xbf16"
    key = (args.group_name, num_experts, k, h, inter, mma)
    buffer = _buffer(lib, key, group, num_experts, tokens, k, h, inter, mma)
    l1, l2 = _transformed(lib, args)
    buffer.x[:t].copy_(args.x)
    if fp8:
        buffer.x_sf[:t].copy_(packed_ue8m0(args.x_sf))
    buffer.topk_idx[:t].copy_(args.topk_idx)
    buffer.topk_weights[:t].copy_(args.topk_weights)
    y = torch.empty(t, h, dtype=torch.bfloat16, device=args.x.device)
    counts = torch.zeros(experts, dtype=torch.int32, device=args.x.device)
    run = lib.fp8_fp4_mega_moe if fp8 else lib.bf16_mega_moe
    extra = {"recipe": RECIPE} if fp8 else {}
    run(y, l1, l2, buffer, counts, activation_clamp=args.activation_clamp, fast_math=False, **extra)
    return y, counts
