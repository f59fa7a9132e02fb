"""``MoE``: a DeepSeek-V3 / Mixtral / Qwen-MoE style mixture-of-experts layer on the ascend_moe ops.

``MoEGate`` (router: ``moe_gating_topk``) picks each token's experts, ``GroupedExperts`` runs them as grouped
GEMMs (BF16/FP32 or FP8), optional shared experts (one SwiGLU MLP every token goes through) are added. With
``ep_group`` the routed experts are split across the group's ranks: tokens travel with ``ep_dispatch`` and
come back with ``ep_combine`` (expert parallelism), everything else is replicated.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from torch_ascend_moe.backends import cpu_gemm
from torch_ascend_moe.nn.grouped_experts import GroupedExperts, resolve_activation
from torch_ascend_moe.ops.gemm import bf16_gemm
from torch_ascend_moe.ops.moe_gate import moe_topk_gate
from torch_ascend_moe.ops.moe_routing import moe_gating_topk


def _error(module: str, arg: str, expected: str, actual) -> ValueError:
    return ValueError(f"{module}: argument '{arg}': expected {expected}, got {actual}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_SCORE_FUNCS = ("softmax", "sigmoid", "sqrtsoftplus")  # moe_gating_topk's two, moe_topk_gate's DeepSeek-V4 one


def _following_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
    """``torch.cat([a, b])`` without a copy where ``b``'s rows follow ``a``'s in one storage (both contiguous, plain
    tensors or parameters, same dtype and row shape): a detached view of both; otherwise None."""
    plain = (torch.Tensor, nn.Parameter)
    if type(a) not in plain or type(b) not in plain or a.dtype != b.dtype or a.shape[1:] != b.shape[1:]:
        return None
    if a.dim() == 0 or not (a.is_contiguous() and b.is_contiguous()) or a.device != b.device:
        return None
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return None
    if b.data_ptr() != a.data_ptr() + a.numel() * a.element_size():
        return None
    return a.detach().as_strided((a.shape[0] + b.shape[0], *a.shape[1:]), a.stride())


class MoEGate(nn.Module):
    """The router: ``logits = x @ weight^T`` (in ``router_dtype``, FP32 by default, as DeepSeek-V3), then
    ``moe_gating_topk``. ``use_expert_bias`` adds DeepSeek-V3's ``e_score_correction_bias`` buffer (steers the
    choice, not the weights; updated from expert loads by ``MoE.update_expert_bias``, not by gradients).
    ``forward(x [T, H]) -> (topk_idx [T, k], topk_weights [T, k] FP32, logits [T, E])``.

    ``score_func="sqrtsoftplus"`` is DeepSeek-V4's router (TileKernels' ``moe_topk_gate_forward``): scores
    ``sqrt(softplus(logits))``, experts ranked by score + bias, weights the chosen scores over their sum
    (``+ 1e-20``) times ``routed_scaling_factor``, through the ``moe_topk_gate`` op; it always renormalizes."""

    def __init__(
        self,
        hidden_size: int,
        num_experts: int,
        topk: int,
        *,
        score_func: str = "softmax",
        num_groups: int = 1,
        topk_groups: int = 1,
        renormalize: bool = True,
        routed_scaling_factor: float = 1.0,
        use_expert_bias: bool = False,
        router_dtype: torch.dtype | None = torch.float32,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if not _is_int(topk) or not 0 < topk <= num_experts:
            raise _error("MoEGate", "topk", f"an integer in [1, num_experts={num_experts}]", topk)
        if score_func not in _SCORE_FUNCS:
            raise _error("MoEGate", "score_func", " or ".join(map(repr, _SCORE_FUNCS)), repr(score_func))
        if not _is_int(num_groups) or num_groups < 1 or num_experts % num_groups:
            raise _error("MoEGate", "num_groups", f"a positive divisor of num_experts={num_experts}", num_groups)
        if not _is_int(topk_groups) or not 0 < topk_groups <= num_groups:
            raise _error("MoEGate", "topk_groups", f"an integer in [1, num_groups={num_groups}]", topk_groups)
        if score_func == "sqrtsoftplus" and not renormalize:
            raise _error(
                "MoEGate",
                "renormalize",
                "True with score_func='sqrtsoftplus' (its weights are normalized)",
                renormalize,
            )
        self.num_experts, self.topk, self.score_func = num_experts, topk, score_func
        self.num_groups, self.topk_groups, self.renormalize = num_groups, topk_groups, renormalize
        self.routed_scaling_factor, self.router_dtype = routed_scaling_factor, router_dtype
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size, device=device, dtype=dtype))
        if use_expert_bias:
            self.register_buffer("e_score_correction_bias", torch.zeros(num_experts, device=device))
        else:
            self.e_score_correction_bias = None
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # nn.Linear's default

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.router_dtype is not None:
            logits = F.linear(x.to(self.router_dtype), self.weight.to(self.router_dtype))
        else:
            logits = F.linear(x, self.weight)
        bias = self.e_score_correction_bias
        if bias is not None and bias.dtype not in (torch.float32, torch.float64):
            bias = bias.float()  # module.bfloat16() casts buffers too; the choice is made in FP32 (as HF's router)
        if self.score_func == "sqrtsoftplus":
            grouped = self.num_groups != self.topk_groups
            scores = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
            weights, idx, _, _ = moe_topk_gate(
                scores,
                None if bias is None else bias.to(scores.dtype),  # the op takes the logits' dtype (FP64 routers)
                self.topk,
                num_groups=self.num_groups if grouped else 0,
                num_topk_groups=self.topk_groups if grouped else 0,
                scoring_func="sqrtsoftplus",
                routed_scaling_factor=self.routed_scaling_factor,
                clamp_denominator=False,
            )
            return idx, weights, logits
        idx, weights = moe_gating_topk(
            logits,
            self.topk,
            bias=bias,
            score_func=self.score_func,
            num_groups=self.num_groups,
            topk_groups=self.topk_groups,
            renormalize=self.renormalize,
            routed_scaling_factor=self.routed_scaling_factor,
        )
        return idx, weights, logits

    def extra_repr(self) -> str:
        return (
            f"num_experts={self.num_experts}, topk={self.topk}, score_func={self.score_func!r}, "
            f"groups={self.topk_groups}/{self.num_groups}, renormalize={self.renormalize}, "
            f"routed_scaling_factor={self.routed_scaling_factor}, bias={self.e_score_correction_bias is not None}"
        )


def _hooked(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks)


def _linear(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)``; a plain bias-free ``nn.Linear`` of a BF16/FP16 2-D CPU input runs as our GEMM (``bf16_gemm``:
    FP32 accumulation, one rounding) where PyTorch's CPU GEMM of that dtype has no dot-product instructions (there
    ours is several times faster; elsewhere both are the same library call, and ``nn.Linear``'s C++ autograd costs
    less per call). Any other module (an ``FP8Linear`` after a conversion, a hooked or biased linear) is called."""
    w = getattr(module, "weight", None)
    plain = type(module) is nn.Linear and module.bias is None and not _hooked(module)
    if plain and x.dim() == 2 and x.device.type == "cpu" and x.dtype == w.dtype and cpu_gemm.emulated(x.dtype):
        return bf16_gemm(x, w)
    return module(x)


class SwiGLUMLP(nn.Module):
    """``down(act(gate(x)) * up(x))`` with bias-free linears (the shared experts; HF's ``*MLP`` layout); ``act``
    is SiLU (SwiGLU) unless ``activation`` names another (``GroupedExperts``'s choices). On CPUs whose PyTorch BF16
    GEMM lacks dot-product instructions the projections run as our GEMMs (``bf16_gemm``)."""

    def __init__(
        self, hidden_size: int, intermediate_size: int, *, activation: str | Callable = "silu", device=None, dtype=None
    ) -> None:
        super().__init__()
        self.act_fn = resolve_activation(activation, "SwiGLUMLP")
        factory = {"device": device, "dtype": dtype}
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False, **factory)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False, **factory)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _linear(self.down_proj, self.act_fn(_linear(self.gate_proj, x)) * _linear(self.up_proj, x))


class MoE(nn.Module):
    """Router + routed experts + optional shared experts; ``forward(x [..., H]) -> [..., H]``.

    Routing options are ``moe_gating_topk``'s (Mixtral: defaults; DeepSeek-V3: ``score_func="sigmoid"``,
    ``use_expert_bias=True``, ``num_groups``/``topk_groups``, ``routed_scaling_factor``; DeepSeek-V4:
    ``score_func="sqrtsoftplus"``, through ``moe_topk_gate``). ``fp8=True`` runs
    the routed experts' GEMMs in FP8 (DeepSeek-V3's 1x128 / 128x128 recipe; ragged sizes zero-padded by the op).
    ``activation`` is the experts' (routed and shared) gate activation: SiLU by default, a name of
    ``grouped_experts.ACTIVATIONS`` or any elementwise callable (e.g. an HF ``ACT2FN`` module). ``input_jitter=j``
    multiplies the input by noise uniform in ``[1-j, 1+j]`` while training (Mixtral's ``router_jitter_noise``:
    router and experts see the same noisy tokens).

    ``ep_group`` (a process group or its name) enables expert parallelism: rank r holds experts
    ``[r·E/R, (r+1)·E/R)`` (``self.experts`` has E/R of them; parameters under the same names, so a full
    state dict is sliced by ``load_full_state_dict``); tokens go out with ``ep_dispatch`` and return with
    ``ep_combine``. ``ep_static_tokens=T`` uses the static dispatch (``num_worst_tokens = R·T``, every rank
    passing T tokens: fixed shapes, capturable) instead of the compact one (data-dependent row count).
    ``ep_expand=True`` takes DeepEP V2's path: the dispatched rows are expanded (``ep_expand``: one row per
    (token, local expert), blocks aligned to ``ep_alignment``) straight into the grouped GEMMs, and each token's
    weighted expert outputs are reduced locally in slot order (``ep_reduce_slots``) before ``ep_combine`` adds the
    ranks' partials in slot order, as ``ElasticBuffer`` does; no permute.

    >>> moe = MoE(64, 32, num_experts=4, topk=2, num_shared_experts=1)
    >>> moe(torch.randn(2, 3, 64)).shape
    torch.Size([2, 3, 64])
    """

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        num_experts: int,
        topk: int,
        *,
        num_shared_experts: int = 0,
        shared_intermediate_size: int | None = None,
        score_func: str = "softmax",
        num_groups: int = 1,
        topk_groups: int = 1,
        renormalize: bool = True,
        routed_scaling_factor: float = 1.0,
        use_expert_bias: bool = False,
        router_dtype: torch.dtype | None = torch.float32,
        fp8: bool = False,
        block: int = 128,
        ep_group=None,
        ep_static_tokens: int | None = None,
        ep_expand: bool = False,
        ep_alignment: int = 1,
        activation: str | Callable = "silu",
        input_jitter: float = 0.0,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if hidden_size <= 0 or intermediate_size <= 0 or num_experts <= 0:
            raise _error(
                "MoE",
                "hidden_size, intermediate_size, num_experts",
                "positive integers",
                (hidden_size, intermediate_size, num_experts),
            )
        if not _is_int(topk) or not 0 < topk <= num_experts:
            raise _error("MoE", "topk", f"an integer in [1, num_experts={num_experts}]", topk)
        if not _is_int(num_shared_experts) or num_shared_experts < 0:
            raise _error("MoE", "num_shared_experts", "a non-negative integer", num_shared_experts)
        activation = resolve_activation(activation, "MoE")
        self.hidden_size, self.num_experts, self.topk = hidden_size, num_experts, topk
        self.ep_group_name, self.ep_rank, self.ep_size = None, 0, 1
        if ep_group is not None:
            from torch_ascend_moe.distributed.groups import group_name_of, resolve_group

            self.ep_group_name = group_name_of(ep_group)
            group = resolve_group("MoE", self.ep_group_name)
            self.ep_rank, self.ep_size = group.rank(), group.size()
            if num_experts % self.ep_size:
                raise _error("MoE", "num_experts", f"a multiple of the EP world size {self.ep_size}", num_experts)
        self.ep_static_tokens = ep_static_tokens
        if ep_alignment < 1:
            raise _error("MoE", "ep_alignment", "a positive integer", ep_alignment)
        self.ep_expand, self.ep_alignment = ep_expand, ep_alignment
        self.input_jitter = input_jitter
        factory = {"device": device, "dtype": dtype}
        self.gate = MoEGate(
            hidden_size,
            num_experts,
            topk,
            score_func=score_func,
            num_groups=num_groups,
            topk_groups=topk_groups,
            renormalize=renormalize,
            routed_scaling_factor=routed_scaling_factor,
            use_expert_bias=use_expert_bias,
            router_dtype=router_dtype,
            **factory,
        )
        self.experts = GroupedExperts(
            num_experts // self.ep_size,
            hidden_size,
            intermediate_size,
            fp8=fp8,
            block=block,
            activation=activation,
            **factory,
        )
        self.shared_experts = None
        if num_shared_experts:
            size = shared_intermediate_size or intermediate_size * num_shared_experts
            self.shared_experts = SwiGLUMLP(hidden_size, size, activation=activation, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 0 or x.shape[-1] != self.hidden_size:
            raise _error("MoE", "x", f"[..., hidden_size={self.hidden_size}]", list(x.shape))
        x = self._jitter(x)
        shape = x.shape
        tokens = x.reshape(-1, self.hidden_size)
        idx, weights, _ = self.gate(tokens)
        if self.ep_group_name is None:
            out = self.experts(tokens, idx, weights)
        else:
            out = self._expert_parallel(tokens, idx, weights)
        if self.shared_experts is not None:
            out = out + self.shared_experts(tokens)
        return out.view(shape)

    def _jitter(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and self.input_jitter > 0):
            return x
        return x * torch.empty_like(x).uniform_(1.0 - self.input_jitter, 1.0 + self.input_jitter)

    def _expert_parallel(self, tokens, idx, weights):
        from torch_ascend_moe.ops.ep import ep_combine, ep_dispatch

        worst = 0 if self.ep_static_tokens is None else self.ep_static_tokens * self.ep_size
        sent = ep_dispatch(
            tokens, idx, weights, num_experts=self.num_experts, group=self.ep_group_name, num_worst_tokens=worst
        )
        if not self.ep_expand:
            local = self.experts(sent.recv_x, sent.recv_topk_idx, sent.recv_topk_weights)
            out, _ = ep_combine(local, sent.handle)
            return out
        from torch_ascend_moe.ops.ep import ep_copy_order, ep_expand, ep_reduce_slots

        local_experts, k = self.num_experts // self.ep_size, idx.shape[1]
        # Static dispatch: a static expanded capacity too (every row on min(K, L) experts, plus the padding).
        rows = 0
        if worst:
            rows = worst * min(k, local_experts) + (self.ep_alignment - 1) * local_experts
        ex = ep_expand(
            sent.recv_x,
            sent.recv_topk_idx,
            sent.recv_topk_weights,
            num_local_experts=local_experts,
            expert_alignment=self.ep_alignment,
            num_rows=rows,
        )
        hidden = self.experts.expanded(ex.x, ex.psum, self.ep_alignment)
        partial = ep_reduce_slots(hidden, ex.expand_rows, weights=ex.weights)
        order = ep_copy_order(idx, self.num_experts, self.ep_size)
        out, _ = ep_combine(partial, sent.handle, copy_order=order)
        return out

    @torch.no_grad()
    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load a state dict holding every expert (a single-process MoE's) into this rank's slice."""
        local = self.num_experts // self.ep_size
        mine = dict(state)
        for name in ("experts.gate_up_proj", "experts.down_proj"):
            mine[name] = state[name][self.ep_rank * local : (self.ep_rank + 1) * local]
        self.load_state_dict(mine)

    @torch.no_grad()
    def update_expert_bias(self, tokens_per_expert: torch.Tensor, rate: float = 1e-3) -> None:
        """DeepSeek-V3's auxiliary-loss-free balancing: raise the bias of under-loaded experts by ``rate``,
        lower over-loaded ones (``tokens_per_expert [E]``: this step's counts, e.g. ``ep_dispatch_layout``'s)."""
        bias = self.gate.e_score_correction_bias
        if bias is None:
            raise ValueError("MoE.update_expert_bias: the gate has no expert bias (use_expert_bias=False)")
        load = tokens_per_expert.to(bias)
        bias += rate * torch.sign(load.mean() - load)


class MegaMoE(MoE):
    """``MoE`` whose routed experts run as one ``mega_moe`` op (DeepGEMM's fused MegaMoE): BF16 tokens and
    expert weights, the routing weight applied before the second GEMM, optional ``activation_clamp``; expert
    parallel over ``ep_group`` inside the op. The shared experts are fused into the op too (DeepGEMM-Ascend;
    computed at each token's home rank) while they are plain ``nn.Linear`` layers; after a conversion to
    ``FP8Linear`` they run beside it. Same parameters and ``state_dict`` as ``MoE`` (checkpoints move both ways).

    ``fp8=True`` serves in FP8 with the op's block-scaled mode (DeepGEMM's SM90 FP8 MegaMoE, DeepSeek-V3's recipe as
    ``MoE(fp8=True)``'s: tokens per 1x128, weights per 128x128 block, ``experts.use_ue8m0``'s scales; the L1 output
    kept in FP32 and the activation requantized per 1x64). The BF16 parameters stay the module's state; their FP8 copy
    (half their size) is made once and remade when a parameter changes. Inference only (the quantized mode carries
    no gradient: train with ``fp8=False``, or with ``MoE(fp8=True)`` and load its state here); ``hidden_size`` and
    ``intermediate_size`` multiples of ``block=128``; shared experts run beside the op (in BF16, as ``MoE``'s).

    Training on CPU: each routed expert weight's gradient is written into the previous step's gradient buffer once
    nothing else holds it (after ``zero_grad()``, or once it was added into a kept ``.grad``), so a step allocates
    no fresh gradient memory; that buffer stays while the module lives (at most one gradient's size per weight,
    as a kept ``.grad``): ``MegaMoE.release_gradient_buffers()`` frees every such buffer.

    >>> moe = MegaMoE(64, 32, num_experts=4, topk=2, num_shared_experts=1)
    >>> moe(torch.randn(2, 3, 64)).shape
    torch.Size([2, 3, 64])
    """

    def __init__(self, *args, activation_clamp: float | None = None, fp8: bool = False, **kwargs) -> None:
        from torch_ascend_moe.checks.mega_moe import BLOCK

        if kwargs.get("activation", "silu") not in ("silu", F.silu):
            raise _error("MegaMoE", "activation", "'silu' (the fused op's SwiGLU)", kwargs["activation"])
        if fp8 and kwargs.get("block", BLOCK) != BLOCK:
            raise _error("MegaMoE", "block", f"{BLOCK} with fp8=True (the op's 128x128 weight blocks)", kwargs["block"])
        super().__init__(*args, fp8=fp8, **kwargs)
        if fp8:
            hidden, inter = self.hidden_size, self.experts.down_proj.shape[-1]
            if hidden % BLOCK or inter % BLOCK:
                raise _error(
                    "MegaMoE", "hidden_size, intermediate_size", f"multiples of {BLOCK} with fp8=True", (hidden, inter)
                )
        self.activation_clamp = activation_clamp
        self._fp8_weights: tuple | None = None  # (key, l1, l1_sf, l2, l2_sf): the FP8 copy, remade on a change
        self._join_shared_l1()

    @staticmethod
    def release_gradient_buffers() -> None:
        """Frees the buffers kept for the routed experts' weight gradients of every ``mega_moe`` trained on CPU (a
        gradient still held elsewhere stays valid; the next backward allocates afresh)."""
        from torch_ascend_moe.autograd.mega_moe import release_gradient_buffers

        release_gradient_buffers()

    def _apply(self, fn, recurse=True):
        # A dtype or device conversion gives each parameter storage of its own: join the shared halves again.
        super()._apply(fn, recurse)
        self._join_shared_l1()
        return self

    def _shared_l1_halves(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The shared experts' gate and up weights where the op takes them (plain ``nn.Linear`` layers), else None."""
        mlp = self.shared_experts
        if mlp is None or type(mlp) is not SwiGLUMLP or _hooked(mlp):
            return None
        layers = (mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        if any(type(layer) is not nn.Linear or layer.bias is not None or _hooked(layer) for layer in layers):
            return None  # the op would skip what the layer adds (an FP8Linear's casts, a bias, a hook)
        return mlp.gate_proj.weight, mlp.up_proj.weight

    @torch.no_grad()
    def _join_shared_l1(self) -> None:
        """Keep the shared experts' gate and up weights in one ``[2I, H]`` buffer, the op's ``shared_l1_weights``
        layout, each ``nn.Linear``'s weight (the same ``Parameter``) a view of its half: a ``state_dict`` loads into
        them in place, and a forward without autograd passes the whole buffer instead of concatenating the two
        (a fresh ``[2I, H]`` copy per call, its pages faulted in again whenever the allocator has trimmed them)."""
        halves = self._shared_l1_halves()
        if halves is None or _following_rows(*halves) is not None:
            return
        gate, up = halves
        if type(gate) is not nn.Parameter or type(up) is not nn.Parameter or gate.dtype != up.dtype:
            return  # a tensor subclass (DTensor, a quantized weight) keeps its own storage
        joined = torch.cat([gate, up])
        gate.data, up.data = joined[: gate.shape[0]], joined[gate.shape[0] :]

    def _quantized_experts(self) -> tuple[torch.Tensor, ...]:
        """The routed experts' weights in the op's block-scaled FP8 mode: E4M3 with FP32 128x128-block scales,
        ``(l1, l1_sf, l2, l2_sf)``; cached while the parameters are the same tensors at the same version (outside
        tracing, which quantizes in the graph)."""
        from torch_ascend_moe.checks.mega_moe import BLOCK
        from torch_ascend_moe.ops.quant import quantize_fp8

        weights = (self.experts.gate_up_proj, self.experts.down_proj)
        tracing = torch.compiler.is_compiling()
        if not tracing:
            key = (self.experts.use_ue8m0, *((w.data_ptr(), w._version, w.dtype, w.device) for w in weights))
            if self._fp8_weights is not None and self._fp8_weights[0] == key:
                return self._fp8_weights[1:]
        out = []
        with torch.no_grad():
            for w in weights:
                e, n, k = w.shape  # n a multiple of 128: no block straddles two experts
                q, sf = quantize_fp8(w.reshape(e * n, k), (BLOCK, BLOCK), use_ue8m0=self.experts.use_ue8m0)
                out += [q.view(e, n, k), sf.view(e, n // BLOCK, k // BLOCK)]
        if not tracing:
            self._fp8_weights = (key, *out)
        return tuple(out)

    def _fused_shared(self) -> dict:
        halves = self._shared_l1_halves()
        if halves is None:
            return {}
        joined = None
        if not (torch.compiler.is_compiling() or (torch.is_grad_enabled() and any(w.requires_grad for w in halves))):
            joined = _following_rows(*halves)  # no autograd to record: the joined buffer itself (_join_shared_l1)
        return dict(
            shared_l1_weights=(torch.cat(halves) if joined is None else joined).bfloat16(),
            shared_l2_weights=self.shared_experts.down_proj.weight.bfloat16(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch_ascend_moe.ops.mega_moe import mega_moe

        if x.dim() == 0 or x.shape[-1] != self.hidden_size:
            raise _error("MegaMoE", "x", f"[..., hidden_size={self.hidden_size}]", list(x.shape))
        x = self._jitter(x)
        shape = x.shape
        tokens = x.reshape(-1, self.hidden_size)
        idx, weights, _ = self.gate(tokens)
        if self.experts.fp8:
            out = self._fp8_experts(tokens, idx, weights)
            shared = {}
        else:
            shared = self._fused_shared()
            out, _ = mega_moe(
                tokens.bfloat16(),
                idx,
                weights.float(),
                self.experts.gate_up_proj.bfloat16(),
                self.experts.down_proj.bfloat16(),
                group=self.ep_group_name,
                activation_clamp=self.activation_clamp,
                **shared,
            )
        out = out.to(x.dtype)
        if self.shared_experts is not None and not shared:
            out = out + self._shared_beside(tokens)
        return out.view(shape)

    def _shared_beside(self, tokens: torch.Tensor) -> torch.Tensor:
        """The shared experts where the op does not take them (converted or hooked layers, ``fp8=True``), with the
        op's ``activation_clamp`` (``gate <= c``, ``|up| <= c``) as the fused path applies it."""
        mlp, c = self.shared_experts, self.activation_clamp
        if c is None:
            return mlp(tokens)
        gate = _linear(mlp.gate_proj, tokens).clamp(max=c)
        up = _linear(mlp.up_proj, tokens).clamp(-c, c)
        return _linear(mlp.down_proj, mlp.act_fn(gate) * up)

    def _fp8_experts(self, tokens, idx, weights) -> torch.Tensor:
        from torch_ascend_moe.checks.mega_moe import BLOCK
        from torch_ascend_moe.ops.mega_moe import mega_moe
        from torch_ascend_moe.ops.quant import quantize_fp8

        wanted = [tokens, self.experts.gate_up_proj, self.experts.down_proj]
        if torch.is_grad_enabled() and any(t.requires_grad for t in wanted):
            raise RuntimeError(
                "MegaMoE: fp8=True serves inference (the op's FP8 mode carries no gradient): call it under "
                "torch.no_grad() or torch.inference_mode(), or train with fp8=False (or with MoE(fp8=True) and load "
                "its state_dict here)"
            )
        l1, l1_sf, l2, l2_sf = self._quantized_experts()
        x_q, x_sf = quantize_fp8(tokens, (1, BLOCK), use_ue8m0=self.experts.use_ue8m0)
        out, _ = mega_moe(
            x_q,
            idx,
            weights.float(),
            l1,
            l2,
            x_sf=x_sf,
            l1_sf=l1_sf,
            l2_sf=l2_sf,
            group=self.ep_group_name,
            activation_clamp=self.activation_clamp,
        )
        return out
