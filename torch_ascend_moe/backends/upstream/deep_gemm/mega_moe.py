"""``mega_moe`` on DeepGEMM's Mega MoE: DeepGEMM's on CUDA (``deep_gemm.mega``: ``fp8_fp4_mega_moe`` /
``bf16_mega_moe``, SM100, 2.6.x; specs/deepgemm_api.md §10) and DeepGEMM-Ascend's on Ascend 950 (its
``fp8_fp4_mega_moe`` with fused shared experts; §16.2, read from the Afloat16/DeepGEMM-Ascend fork @ 8491bbb, the
official source not being readable): dispatch, L1, SwiGLU, L2 and combine in one kernel over symmetric memory.

How our op maps onto it:

* **A header first** (expert-parallel calls): our check on every rank with one verdict, every rank's ``T`` and
  bad-id flag exchanged, as ``ep_dispatch`` does in the portable pipeline, before anything collective of
  DeepGEMM's (building its ``SymmBuffer``, the kernel itself): a rank whose arguments fail raises on every rank
  instead of leaving the others in the kernel. Bad ids raise the words the portable pipeline raises.
* **One ``SymmBuffer`` per process group and shape**, sized for the largest ``T`` any rank has passed (rounded up to
  a power of two), rebuilt, larger, when a call needs more; ``chain.refresh()`` drops them. CUDA: a local call (no
  group) runs on a one-rank group object (what DeepGEMM does for a group of size 1: a plain tensor, no symmetric
  memory); Ascend needs an HCCL group (its buffer is registered with the group's communicator). Each call copies its
  rows, scales, ids and weights into the buffer's views (the kernel consumes them).
* **Weights transformed once per weight version** by the library's own ``transform_weights_for_mega_moe`` (CUDA:
  after ``transform_sf_into_required_layout``; gate/up interleaved, scales permuted; Ascend: BLOCK_N blocks, FP4
  scales' exponents biased, shared FP8 weights in the NZ order), cached while the weight tensors live and their
  ``_version`` is unchanged (an optimizer step re-transforms). Cost: one transformed copy per cached version.
* **Scales**: the kernels read 1x32 UE8M0 scales (CUDA: four per int32; Ascend: pairs per int16); ours are FP32.
  FP32 powers of two are exactly their exponent byte; a call is taken only after a host read says they are
  (weights' once per version, ``x_sf`` per call; TileKernels' casts pay the same read).
* SwiGLU: CUDA runs with ``fast_math=False`` (the op defines exact ``exp``); DeepGEMM-Ascend has only its fast math
  (it asserts it), an approximate ``exp`` within the op's BF16 bound.
* The second output is the pair count per local expert: the library's ``cumulative_local_expert_recv_stats`` added
  to a zeroed tensor.

Not taken (CUDA): shared experts (DeepGEMM 2.6 fuses none), GPUs other than SM100, shapes its kernels' asserts reject
(BF16: ``H`` a multiple of 256, of 512 above 4096, ``I`` of 128; FP8: both of 512; top-k at most 32; at most 72
ranks). Not taken (Ascend): BF16 (FP8 x FP4 only), a local call, ``H`` / ``I`` not multiples of its ``BLOCK_N``, ``I``
below 512, shared experts other than 1 or 2 of ``I`` (``I_s = S * I``), FP4 weight scales above 2^121 (its +6 bias).
Both: scales not powers of two, graph capture (the header is a host read).

Verified how: ``tests/upstream/test_deep_gemm_backend_mega.py`` with the stand-in ``deep_gemm``
(``tests/standins/deep_gemm/_cuda_mega.py`` from DeepGEMM 54e2261, ``_ascend_mega.py`` from the fork). Not run on
a GPU or an NPU (the lent H200 is SM90, where Mega MoE does not exist).
"""

from __future__ import annotations

import importlib
import weakref

import torch

from torch_ascend_moe.backends.chain import first_refusal, kernel, on_refresh, refuse
from torch_ascend_moe.backends.portable.ep.header import bad_ids
from torch_ascend_moe.backends.upstream.deep_gemm import (
    ASCEND,
    CUDA,
    SM100,
    as_library_fp4,
    cuda_arch,
    cuda_refusal,
    real_refusal,
)
from torch_ascend_moe.checks.mega_moe import GRAN, OP, check_topk_values, mega_moe_signature
from torch_ascend_moe.distributed import agreement, capture
from torch_ascend_moe.distributed.groups import group_size, resolve_group

RECIPE = (1, 1, 32)
MIN_TOKENS = 64  # the smallest T a buffer is built for (DeepGEMM aligns it up to 384 anyway)
MAX_RANKS = 72  # its symmetric buffer's rank limit (layout/mega_moe.cuh)

# ---- what DeepGEMM takes ----

_POW2: dict[tuple, tuple[weakref.ref, bool]] = {}


def _powers_of_two(sf: torch.Tensor, top: int = 254) -> bool:
    """Every entry a positive normal power of two (exactly its UE8M0 exponent byte) with an exponent byte at most
    ``top``: one host read."""
    bits = sf.contiguous().view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    return bool((((bits & 0x807FFFFF) == 0) & (exponent > 0) & (exponent <= top)).all())


def _weights_powers_of_two(sf: torch.Tensor, top: int = 254) -> bool:
    """``_powers_of_two`` of a weight's scales, remembered while that tensor lives at this version."""
    key = (id(sf), sf._version, top)
    held = _POW2.get(key)
    if held is not None and held[0]() is sf:
        return held[1]
    ok = _powers_of_two(sf, top)
    if len(_POW2) > 64:
        _POW2.clear()
    _POW2[key] = (weakref.ref(sf), ok)
    return ok


def _refusal(args) -> str | None:
    fp8 = args.x.dtype == torch.float8_e4m3fn
    h, inter = args.x.shape[1], args.l1_weights.shape[1] // 2
    if args.shared_l1_weights is not None:
        return "shared experts (DeepGEMM 2.6's Mega MoE fuses none)"
    if args.l1_weights.dtype == torch.float8_e4m3fn:
        return (
            "FP8 routed weights (DeepGEMM 2.8's fp8xfp8 or SM90's block-scaled form; this backend maps 2.6's fp8xfp4)"
        )
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


def _signature(args):
    return mega_moe_signature(args, group_size(OP, args.group_name))


def _takes(args):
    try:
        _signature(args)
    except ValueError:
        return refuse("arguments our check refuses (the kernel chosen raises the op's error)")
    return first_refusal(_refusal(args))


ASCEND_FP4_TOP = 248  # DeepGEMM-Ascend biases FP4 weight scales' exponents by +6 (``_scale_fp4_weight_sf``)
ASCEND_MAX_SHARED = 2


def block_n(lib) -> int:
    """DeepGEMM-Ascend's Mega MoE N block (``deep_gemm.mega.BLOCK_N``)."""
    mega = getattr(lib, "mega", None) or importlib.import_module(f"{lib.__name__}.mega")
    return int(mega.BLOCK_N)


def _ascend_refusal(args) -> str | None:
    if args.x.dtype != torch.float8_e4m3fn or args.l1_weights.dtype == torch.float8_e4m3fn:
        return "BF16 x or FP8 routed weights (DeepGEMM-Ascend's Mega MoE is FP8 x FP4 only)"
    if args.group_name is None:
        return "no process group (DeepGEMM-Ascend's Mega MoE runs on an HCCL group's symmetric buffer)"
    why = real_refusal(args.x, args.x_sf, args.topk_idx, args.topk_weights, args.l1_weights, args.l2_weights)
    if why:
        return why
    if capture.capturing(args.x.device):
        return "a graph is being captured (the header and the scales' check are host reads)"
    h, inter, k = args.x.shape[1], args.l1_weights.shape[1] // 2, args.topk_idx.shape[1]
    ranks = resolve_group(OP, args.group_name).size()
    unit = block_n(ASCEND.module())
    if ranks >= 256 or k > 32:
        return f"{ranks} ranks, top-{k} (DeepGEMM-Ascend's Mega MoE takes fewer than 256 ranks, top-k at most 32)"
    if h % unit or inter % unit or inter < 512:
        return f"H = {h}, I = {inter}: DeepGEMM-Ascend takes multiples of its BLOCK_N {unit}, I at least 512"
    if args.shared_l1_weights is not None:
        shared = args.shared_l1_weights.shape[0] // 2
        if shared % inter or shared // inter > ASCEND_MAX_SHARED:
            return (
                f"shared experts of I_s = {shared}: DeepGEMM-Ascend fuses 1 or {ASCEND_MAX_SHARED} of I = {inter} "
                "(I_s = S * I)"
            )
    fp4 = (args.l1_sf, args.l2_sf)
    shared_sf = tuple(sf for sf in (args.shared_l1_sf, args.shared_l2_sf) if sf is not None)
    if not (
        _powers_of_two(args.x_sf)
        and all(_weights_powers_of_two(sf, ASCEND_FP4_TOP) for sf in fp4)
        and all(map(_weights_powers_of_two, shared_sf))
    ):
        return (
            "FP32 scales that are not all powers of two (DeepGEMM-Ascend reads UE8M0 scales; FP4 weights' at most "
            f"2^{ASCEND_FP4_TOP - 127})"
        )
    return None


def _takes_ascend(args):
    try:
        _signature(args)
    except ValueError:
        return refuse("arguments our check refuses (the kernel chosen raises the op's error)")
    return first_refusal(_ascend_refusal(args))


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


def _buffer(key: tuple, tokens: int, build):
    """The buffer held for ``key`` (a group and shape) with room for ``tokens`` per rank, else ``build(T_max)``
    (collective; every rank reaches it alike: T_max comes from the header)."""
    want = max(MIN_TOKENS, 1 << max(tokens - 1, 0).bit_length())
    held = _BUFFERS.get(key)
    if held is not None and held.num_max_tokens_per_rank >= tokens:
        return held
    if held is not None:
        want = max(want, held.num_max_tokens_per_rank)
        held.destroy()
        del _BUFFERS[key]
    _BUFFERS[key] = built = build(want)
    return built


def _version(*tensors) -> tuple:
    return tuple(None if t is None else (id(t), t._version) for t in tensors)


def _cached(parts: tuple, transform):
    """``transform()`` of the weight tensors ``parts``, once per version of them (while they live)."""
    key = _version(*parts)
    held = _WEIGHTS.get(key)
    if held is not None and all(ref is None or ref() is t for ref, t in zip(held[0], parts)):
        return held[1]
    out = transform()
    if len(_WEIGHTS) >= 8:  # a few versions at a time (layers of one model each hold their own)
        _WEIGHTS.pop(next(iter(_WEIGHTS)))
    _WEIGHTS[key] = (tuple(None if t is None else weakref.ref(t) for t in parts), out)
    return out


def _transformed(lib, args):
    """The experts' weights in DeepGEMM's layout (``transform_sf_into_required_layout`` then
    ``transform_weights_for_mega_moe``), once per weight version."""
    parts = (args.l1_weights, args.l1_sf, args.l2_weights, args.l2_sf)

    def transform():
        if args.l1_sf is None:
            return lib.transform_weights_for_mega_moe(args.l1_weights.contiguous(), args.l2_weights.contiguous())
        experts, two_i, h = args.l1_weights.shape[0], args.l1_weights.shape[1], args.x.shape[1]
        sf1 = lib.transform_sf_into_required_layout(args.l1_sf.contiguous(), two_i, h, (1, GRAN), experts)
        sf2 = lib.transform_sf_into_required_layout(args.l2_sf.contiguous(), h, two_i // 2, (1, GRAN), experts)
        w1, w2 = (as_library_fp4(w).contiguous() for w in (args.l1_weights, args.l2_weights))
        return lib.transform_weights_for_mega_moe((w1, sf1), (w2, sf2))

    return _cached(parts, transform)


def _ue8m0(sf: torch.Tensor) -> torch.Tensor:
    """FP32 powers of two as their exponent bytes (UE8M0), on the device."""
    return ((sf.contiguous().view(torch.int32) >> 23) & 0xFF).to(torch.uint8)


def ue8m0_pairs(sf: torch.Tensor) -> torch.Tensor:
    """FP32 powers of two ``[..., K/32]`` as DeepGEMM-Ascend's int16 UE8M0 pairs ``[..., K/64]`` (the lower column
    in the lower byte), on the device."""
    return _ue8m0(sf).view(torch.int16)


def _transformed_ascend(lib, args):
    """The routed experts' FP4 and the shared experts' FP8 weights in DeepGEMM-Ascend's layout (its
    ``transform_weights_for_mega_moe``: BLOCK_N blocks, gate/up interleaved, scales transposed, FP4 scales' exponents
    biased, FP8 in the NZ order), once per weight version."""
    parts = (args.l1_weights, args.l1_sf, args.l2_weights, args.l2_sf)
    parts += (args.shared_l1_weights, args.shared_l1_sf, args.shared_l2_weights, args.shared_l2_sf)

    def transform():
        pair = lambda w, sf: (as_library_fp4(w).contiguous(), ue8m0_pairs(sf))  # noqa: E731
        routed = lib.transform_weights_for_mega_moe(pair(*parts[0:2]), pair(*parts[2:4]))
        if args.shared_l1_weights is None:
            return routed, (None, None)
        shared = lib.transform_weights_for_mega_moe(
            (parts[4].contiguous(), ue8m0_pairs(parts[5])), (parts[6].contiguous(), ue8m0_pairs(parts[7]))
        )
        return routed, shared

    return _cached(parts, transform)


def packed_ue8m0(sf: torch.Tensor) -> torch.Tensor:
    """FP32 powers of two ``[T, H/32]`` as DeepGEMM's packed UE8M0 ``[T, H/128]`` int32 (four exponent bytes per
    int, the lowest column in the lowest byte), on the device."""
    return _ue8m0(sf).view(torch.int32)


# ---- the kernel ----


def _header(args, num_experts: int):
    """(group, the largest T of any rank): our check on every rank and the bad-id verdict, before anything of
    DeepGEMM's. A local call checks its ids here."""
    idx = args.topk_idx
    if args.group_name is None:
        check_topk_values(idx, num_experts)
        return _LOCAL, args.x.shape[0]
    bad = (idx < -1) | (idx >= num_experts)
    group = resolve_group(OP, args.group_name)
    fields = {
        "x's shape[1] (H)": args.x.shape[1],
        "x's dtype": agreement.dtype_code(args.x.dtype),
        "topk_idx's K": idx.shape[1],
        "l1_weights' shape (E_local, 2I)": args.l1_weights.shape[0] * 1_000_000 + args.l1_weights.shape[1],
    }
    # The words ep_dispatch raises in the portable pipeline for the same ids.
    words = bad_ids(num_experts)
    table = agreement.exchange_header(
        OP,
        group,
        args.x.device,
        fields,
        torch.tensor([args.x.shape[0]]),
        {"topk_idx": (bool(bad.any()), words)},
        args.timeout_s,
    )
    return group, int(table[:, 0].max())


def _fill(buffer, args) -> None:
    """This call's rows, scales, ids and weights into the buffer's views (the kernel consumes them)."""
    t = args.x.shape[0]
    buffer.x[:t].copy_(args.x)
    if args.x_sf is not None:
        sf = buffer.x_sf
        sf[:t].copy_(packed_ue8m0(args.x_sf) if sf.dtype == torch.int32 else ue8m0_pairs(args.x_sf))
    buffer.topk_idx[:t].copy_(args.topk_idx)
    buffer.topk_weights[:t].copy_(args.topk_weights)


def _prologue(args):
    """What both kernels do first: our check and the header (on a group), then the call's shape:
    ``(E, group, largest T of any rank, H, K, I)``."""
    num_experts, _ = agreement.checked(OP, args.group_name, args.x, args.timeout_s, lambda: _signature(args))
    group, tokens = _header(args, num_experts)
    return num_experts, group, tokens, args.x.shape[1], args.topk_idx.shape[1], args.l1_weights.shape[1] // 2


def _outputs(args):
    """``y`` (upstream's out-parameter) and the pair counts (its ``cumulative_local_expert_recv_stats`` from 0)."""
    y = torch.empty(args.x.shape, dtype=torch.bfloat16, device=args.x.device)
    return y, torch.zeros(args.l1_weights.shape[0], dtype=torch.int32, device=args.x.device)


@kernel(
    device="cuda",
    library="deep_gemm",
    calls="deep_gemm.fp8_fp4_mega_moe / bf16_mega_moe",
    takes=_takes,
    available=CUDA.available,
)
def mega_moe(args):
    num_experts, group, tokens, h, k, inter = _prologue(args)
    lib = CUDA.module()
    fp8 = args.x.dtype == torch.float8_e4m3fn
    mma = "fp8xfp4" if fp8 else "bf16xbf16"
    buffer = _buffer(
        (args.group_name, "cuda", num_experts, k, h, inter, mma),
        tokens,
        lambda t_max: lib.get_symm_buffer_for_mega_moe(group, num_experts, t_max, k, h, inter, mma_type=mma),
    )
    l1, l2 = _transformed(lib, args)
    _fill(buffer, args)
    y, counts = _outputs(args)
    run = lib.fp8_fp4_mega_moe if fp8 else lib.bf16_mega_moe
    extra = {"recipe": RECIPE} if fp8 else {}
    run(y, l1, l2, buffer, counts, activation_clamp=args.activation_clamp, fast_math=False, **extra)
    return y, counts


@kernel(
    "mega_moe",
    device="npu",
    library="deep_gemm",
    calls="deep_gemm.fp8_fp4_mega_moe (DeepGEMM-Ascend)",
    takes=_takes_ascend,
    available=ASCEND.available,
)
def mega_moe_ascend(args):
    num_experts, group, tokens, h, k, inter = _prologue(args)
    lib = ASCEND.module()
    shared = 0 if args.shared_l1_weights is None else args.shared_l1_weights.shape[0] // 2 // inter
    buffer = _buffer(
        (args.group_name, "npu", num_experts, k, h, inter, shared),
        tokens,
        lambda t_max: lib.SymmBuffer(group, num_experts, t_max, k, h, inter, num_shared_experts=shared),
    )
    (l1, l2), (shared_l1, shared_l2) = _transformed_ascend(lib, args)
    _fill(buffer, args)
    y, counts = _outputs(args)
    # fast_math: the only mode DeepGEMM-Ascend has (it asserts it); its exp is approximate, within the op's bound.
    lib.fp8_fp4_mega_moe(
        y, l1, l2, buffer, shared_l1_weights=shared_l1, shared_l2_weights=shared_l2,
        cumulative_local_expert_recv_stats=counts, recipe=RECIPE, activation_clamp=args.activation_clamp,
        fast_math=True,
    )  # fmt: skip
    return y, counts
