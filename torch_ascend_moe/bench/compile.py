"""Benchmark cases of the compiler passes (``python -m torch_ascend_moe bench compile``): the same function compiled by
Inductor with our post-grad rewrites (``torch.compile(backend="ascend_moe")``) and without them (``"inductor"``), timed
in the same run: an FP8 linear's inference step (``quantize_fp8`` → ``fp8_gemm``, rewritten to ``fp8_quant_gemm``) and
FP8 experts' (→ ``m_grouped_fp8_gemm``, rewritten to ``m_grouped_fp8_quant_gemm``), an RMSNorm followed by the per-token
FP8 cast (``quantize_fp8`` inlined into Inductor's kernel), the sparse-attention indexer (``mqa_logits`` → ``mqa_topk``,
rewritten to ``mqa_logits_topk``: peak memory too), a combine followed by a residual add (``moe_unpermute`` + ``r`` →
``moe_unpermute(bias=r)``), the demo's MoE layer forward and forward+backward in FP32 and BF16 (``nn.GroupedExperts``
calls the fused L1 + SwiGLU op itself in inference and training graphs keep the L1 output for the backward, so nothing
matches there: the ratio is the passes' cost; in a stack of four with ``options={"recompute_l1": True}`` the forward
fuses and the backward recomputes the L1 GEMM: time and peak memory of that trade), transformers' Mixtral block with
``grouped_mm`` experts as shipped (its ``_grouped_mm`` calls become ours on a CPU without BF16 dot products, where ATen
emulates BF16; kept where the CPU has them, and the ratio is the passes' cost on a stock model: ``grouped_mm.applies``),
the same block with transformers' ``eager`` experts (compiled after ``enable()`` the per-expert loop is traced as one
graph, against Dynamo's graph break per expert), whole tiny Qwen3-MoE and DeepSeek-V3 models as shipped (the same choice
as the block), a BF16 dense MLP (``nn.Linear``'s GEMMs become ``bf16_gemm`` on a CPU without BF16 dot products:
``dense_gemm``), the experts' MLP written as unfused steps (L1 grouped GEMM → SwiGLU → L2, rewritten to
``m_grouped_bf16_gemm_swiglu`` → L2; FP8 inference experts likewise to ``m_grouped_fp8_gemm_swiglu``), a whole FP8
inference MoE layer written as steps (routing, permute, the FP8 experts, combine + residual: the cast inlined and two
fusions), and the compile time itself (each side compiled from scratch, FX graph cache off).
"""

from __future__ import annotations

import types

import torch

from torch_ascend_moe import inductor_lowerings
from torch_ascend_moe.bench import Case, layer_call

ops = torch.ops.ascend_moe
_WITHOUT = "Inductor without the passes"


def _twin(fn):
    """A copy of ``fn`` with its own code object: Dynamo caches compiled code per code object, so the two sides
    never share (or evict) each other's compiled graphs."""
    code = fn.__code__.replace(co_name=fn.__code__.co_name + "_baseline")
    return types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def _both(fn, options=None):
    """(with the passes, without them) compiled versions of ``fn``; ``options`` for our backend
    (``{"recompute_l1": True}``)."""
    ours = torch.compile(fn, backend=inductor_lowerings.BACKEND, fullgraph=True, options=options)
    baseline = torch.compile(_twin(fn), backend="inductor", fullgraph=True)
    return ours, baseline


def _fp8_linear(m, n, k) -> Case:
    def setup():
        g = torch.Generator().manual_seed(0)
        x = torch.randn(m, k, generator=g).bfloat16()
        b, sfb = ops.quantize_fp8(torch.randn(n, k, generator=g), [128, 128])

        def step(x, b, sfb):
            data, sf = ops.quantize_fp8(x, [1, 128])
            return ops.fp8_gemm(data, sf, b, sfb)

        ours, baseline = _both(step)
        return (lambda: ours(x, b, sfb)), (lambda: baseline(x, b, sfb))

    return Case(
        f"FP8 linear (cast + GEMM) {m}x{n}x{k}", 2 * m * n * k, setup, "Inductor without the passes", memory=True
    )


def _fp8_experts(rows, hidden, n, experts) -> Case:
    """FP8 inference experts on BF16 tokens: the per-token cast → ``m_grouped_fp8_gemm``, rewritten to
    ``m_grouped_fp8_quant_gemm`` (each expert segment cast right before its GEMM; no FP8 copy of every row). The
    layout is DeepGEMM's contiguous one, each expert's rows padded to a multiple of 128: the padding is cast by the
    unfused graph, never read by the fused op."""

    def setup():
        g = torch.Generator().manual_seed(0)
        counts = [max(rows // experts - 41 * (e % 3), 1) for e in range(experts)]
        ends, end = [], 0
        for count in counts:
            end = -(-end // 128) * 128 + count
            ends.append(end)
        offs = torch.tensor(ends, dtype=torch.int32)
        x = torch.randn(-(-end // 128) * 128, hidden, generator=g).bfloat16()
        b, sfb = _fp8_expert_weights(experts, n, hidden, g)

        def experts_step(x, offs):
            data, sf = ops.quantize_fp8(x, [1, 128])
            return ops.m_grouped_fp8_gemm(data, sf, b, sfb, offs, alignment=128)

        ours, baseline = _both(experts_step)
        return (lambda: ours(x, offs)), (lambda: baseline(x, offs))

    flops = 2 * rows * n * hidden
    return Case(
        f"FP8 experts (cast + grouped GEMM) M{rows} H{hidden} N{n} E{experts}", flops, setup, _WITHOUT, memory=True
    )


def _norm_cast(m, k) -> Case:
    """RMSNorm then the per-token FP8 cast (what feeds an FP8 MoE's dispatch or grouped GEMM): ``quantize_inline``
    lets Inductor compute the norm, the block amax and the cast in one pass."""

    def setup():
        g = torch.Generator().manual_seed(0)
        x, w = (torch.randn(m, k, generator=g) * 10).bfloat16(), torch.randn(k, generator=g)

        def norm_cast(x, w):
            xf = x.float()
            y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w).to(x.dtype)
            return ops.quantize_fp8(y, [1, 128])

        ours, baseline = _both(norm_cast)
        return (lambda: ours(x, w)), (lambda: baseline(x, w))

    return Case(f"RMSNorm + FP8 cast {m}x{k}", 0, setup, _WITHOUT, memory=True)


def _indexer(s, s_kv, h, d, topk) -> Case:
    def setup():
        g = torch.Generator().manual_seed(1)
        q, k, w = torch.randn(s, h, d, generator=g), torch.randn(s_kv, d, generator=g), torch.rand(s, h, generator=g)
        ke = (torch.arange(s, dtype=torch.int32) + (s_kv - s)).clamp(min=1)
        ks = torch.zeros(s, dtype=torch.int32)

        def index(q, k, w, ks, ke):
            return ops.mqa_topk(ops.mqa_logits(q, None, k, None, w, ks, ke), ks, ke, topk)

        ours, baseline = _both(index)
        return (lambda: ours(q, k, w, ks, ke)), (lambda: baseline(q, k, w, ks, ke))

    flops = s * h * s_kv * (2 * d + 2)
    return Case(
        f"indexer S{s} S_kv{s_kv} H{h} D{d} top-{topk}", flops, setup, "Inductor without the passes", memory=True
    )


def _combine(t, h, k, e) -> Case:
    def setup():
        g = torch.Generator().manual_seed(3)
        idx = torch.rand(t, e, generator=g).topk(k, dim=1).indices
        _, row_map, _ = ops.moe_permute(torch.zeros(t, 1), idx, e)
        y, w = torch.randn(t * k, h, generator=g).bfloat16(), torch.rand(t, k, generator=g)
        r = torch.randn(t, h, generator=g).bfloat16()

        def combine(y, row_map, w, r):
            return ops.moe_unpermute(y, row_map, w) + r

        ours, baseline = _both(combine)
        return (lambda: ours(y, row_map, w, r)), (lambda: baseline(y, row_map, w, r))

    return Case(f"combine + residual BF16 T{t} H{h} top-{k}", 2 * t * k * h + t * h, setup, _WITHOUT, memory=True)


def _expert_mlp(rows, hidden, inter, experts) -> Case:
    def setup():
        from torch_ascend_moe.nn import GroupedExperts

        torch.manual_seed(0)
        mlp = GroupedExperts(experts, hidden, inter).bfloat16()
        a = torch.randn(rows, hidden).bfloat16()
        offs = torch.full((experts,), rows // experts).cumsum(0).int()

        def expert_mlp(a, offs):  # the unfused steps (GroupedExperts calls the fused op itself in inference)
            gate, up = ops.m_grouped_bf16_gemm(a, mlp.gate_up_proj, offs).chunk(2, dim=-1)
            return ops.m_grouped_bf16_gemm(torch.nn.functional.silu(gate) * up, mlp.down_proj, offs)

        ours, baseline = _both(expert_mlp)
        return layer_call(lambda a: ours(a, offs), a, False), layer_call(lambda a: baseline(a, offs), a, False)

    flops = 2 * rows * hidden * 3 * inter
    return Case(
        f"expert MLP BF16 M{rows} H{hidden} I{inter} E{experts}", flops, setup, _WITHOUT, memory=True, bound=True
    )


def _fp8_expert_weights(experts, n, k, g):
    """Every expert's ``[n, k]`` weight cast 128x128 (DeepSeek-V3's recipe): ``(codes [E, n, k], scales)``."""
    casts = [ops.quantize_fp8(torch.randn(n, k, generator=g) / 8, [128, 128]) for _ in range(experts)]
    return tuple(torch.stack(t) for t in zip(*casts))


def _fp8_expert_mlp(rows, hidden, inter, experts) -> Case:
    """FP8 inference experts (DeepSeek-V3's recipe: 1x128 activations, 128x128 weights) as unfused steps: L1 FP8
    grouped GEMM (BF16 out) → FP32 SwiGLU × routing weight → per-token FP8 requant → L2 FP8 grouped GEMM, the first
    three rewritten to ``m_grouped_fp8_gemm_swiglu``."""

    def setup():
        g = torch.Generator().manual_seed(0)
        a, sfa = ops.quantize_fp8(torch.randn(rows, hidden, generator=g), [1, 128])
        b1, sf1 = _fp8_expert_weights(experts, 2 * inter, hidden, g)
        b2, sf2 = _fp8_expert_weights(experts, hidden, inter, g)
        w = torch.rand(rows, generator=g)
        offs = torch.full((experts,), rows // experts).cumsum(0).int()

        def expert_mlp(a, sfa, w):
            gate, up = ops.m_grouped_fp8_gemm(a, sfa, b1, sf1, offs).chunk(2, dim=-1)
            act, act_sf = ops.quantize_fp8(torch.nn.functional.silu(gate.float()) * up.float() * w[:, None], [1, 128])
            return ops.m_grouped_fp8_gemm(act, act_sf, b2, sf2, offs)

        ours, baseline = _both(expert_mlp)
        return (lambda: ours(a, sfa, w)), (lambda: baseline(a, sfa, w))

    flops = 2 * rows * hidden * 3 * inter
    return Case(f"expert MLP FP8 M{rows} H{hidden} I{inter} E{experts}", flops, setup, _WITHOUT, memory=True)


def _moe_steps(tokens, hidden, inter, experts, topk, fp8: bool) -> Case:
    """A DeepSeek-V3-style inference MoE layer written as steps: router → ``moe_gating_topk`` → ``moe_permute`` → L1
    grouped GEMM → SwiGLU → L2 grouped GEMM → weighted combine ``+ x``; in FP8 (1x128 activations, 128x128 weights) a
    per-token cast before L1 and an FP32 SwiGLU with a per-token requant before L2. The passes rewrite L1 → SwiGLU
    (→ requant) to ``m_grouped_*_gemm_swiglu`` (``swiglu_epilogue``), the combine + residual to one combine with ``x``
    as its bias (``combine_residual``) and inline the FP8 cast into Inductor's code (``quantize_inline``): the whole
    layer, fusion only (and the router's GEMM, ``dense_gemm``, on a CPU without BF16 dot products). The bound column:
    what removing everything but the baseline's ATen GEMMs could gain (the BF16 layer's GEMMs are ATen's)."""

    def setup():
        g = torch.Generator().manual_seed(0)
        x = torch.randn(tokens, hidden, generator=g).bfloat16()
        router = (torch.randn(experts, hidden, generator=g) / hidden**0.5).bfloat16()
        if fp8:
            b1, sf1 = _fp8_expert_weights(experts, 2 * inter, hidden, g)
            b2, sf2 = _fp8_expert_weights(experts, hidden, inter, g)
        else:
            b1 = (torch.randn(experts, 2 * inter, hidden, generator=g) / hidden**0.5).bfloat16()
            b2 = (torch.randn(experts, hidden, inter, generator=g) / inter**0.5).bfloat16()

        def experts_fp8(rows, offs):
            a, sfa = ops.quantize_fp8(rows, [1, 128])
            gate, up = ops.m_grouped_fp8_gemm(a, sfa, b1, sf1, offs).chunk(2, dim=-1)
            act, act_sf = ops.quantize_fp8(torch.nn.functional.silu(gate.float()) * up.float(), [1, 128])
            return ops.m_grouped_fp8_gemm(act, act_sf, b2, sf2, offs)

        def experts_bf16(rows, offs):
            gate, up = ops.m_grouped_bf16_gemm(rows, b1, offs).chunk(2, dim=-1)
            return ops.m_grouped_bf16_gemm(torch.nn.functional.silu(gate) * up, b2, offs)

        experts_mlp = experts_fp8 if fp8 else experts_bf16

        def moe_layer(x):
            weights, idx = ops.moe_gating_topk(torch.nn.functional.linear(x, router).float(), topk)
            rows, row_map, offs = ops.moe_permute(x, idx, experts)
            return ops.moe_unpermute(experts_mlp(rows, offs), row_map, weights) + x

        ours, baseline = _both(moe_layer)
        return (lambda: ours(x)), (lambda: baseline(x))

    flops = 2 * tokens * hidden * (experts + 3 * topk * inter)
    return Case(
        f"MoE layer {'FP8' if fp8 else 'BF16'} inference T{tokens} H{hidden} I{inter} E{experts} top-{topk}",
        flops,
        setup,
        _WITHOUT,
        memory=True,
        bound=True,
    )


def _dense_mlp(tokens, hidden, grad: bool) -> Case:
    """A BF16 dense MLP (``nn.Linear`` H → 4H, GELU, 4H → H, with biases): its GEMMs are ``aten.mm`` / ``addmm``,
    rewritten to ``bf16_gemm`` on a CPU without BF16 dot products (``dense_gemm``), kept where it has them."""

    def setup():
        torch.manual_seed(0)
        mlp = torch.nn.Sequential(
            torch.nn.Linear(hidden, 4 * hidden), torch.nn.GELU(), torch.nn.Linear(4 * hidden, hidden)
        ).bfloat16()
        x = torch.randn(tokens, hidden).bfloat16()

        def forward(x):
            return mlp(x)

        ours, baseline = _both(forward)
        return layer_call(ours, x, grad), layer_call(baseline, x, grad)

    mode = "fwd+bwd" if grad else "fwd"
    flops = 2 * tokens * hidden * 8 * hidden * (3 if grad else 1)
    return Case(f"dense MLP BF16 {mode} T{tokens} H{hidden}", flops, setup, _WITHOUT, grad=grad)


def _moe(tokens, hidden, grad: bool, dtype=torch.float32, layers: int = 1, recompute_l1: bool = False) -> Case:
    """The demo's MoE layer (a stack of ``layers``: the memory a training step keeps grows with the layers, which is
    what ``recompute_l1`` trades time for)."""

    def setup():
        from torch_ascend_moe.nn import MoE

        torch.manual_seed(0)
        block = [MoE(hidden, hidden // 2, num_experts=8, topk=2, num_shared_experts=1) for _ in range(layers)]
        moe = torch.nn.Sequential(*block).to(dtype)
        x = torch.randn(tokens, hidden).to(dtype)

        def forward(x):
            return moe(x)

        ours, baseline = _both(forward, {"recompute_l1": True} if recompute_l1 else None)
        return layer_call(ours, x, grad), layer_call(baseline, x, grad)

    flops = layers * tokens * (2 * hidden * 8 + 3 * 6 * hidden * hidden // 2) * (3 if grad else 1)
    mode = "fwd+bwd" if grad else "fwd"
    stack = f"{layers} MoE layers" if layers > 1 else "MoE layer"
    name = f"{stack} {'BF16 ' if dtype == torch.bfloat16 else ''}{mode} T{tokens} H{hidden}"
    name += ", L1 recomputed (recompute_l1)" if recompute_l1 else ""
    return Case(name, flops, setup, _WITHOUT, grad=grad, memory=recompute_l1)


def _hf_block(tokens, hidden, grad: bool) -> Case:
    def setup():
        from torch_ascend_moe.bench.moe import models

        block, _, x = models((tokens, hidden, 2, 8), "grouped_mm", dtype=torch.bfloat16)

        def forward(x):
            out = block(x)
            return out[0] if isinstance(out, tuple) else out

        ours, baseline = _both(forward)
        return layer_call(ours, x, grad), layer_call(baseline, x, grad)

    flops = tokens * (2 * hidden * 8 + 2 * 6 * hidden * hidden) * (3 if grad else 1)
    mode = "fwd+bwd" if grad else "fwd"
    return Case(f"HF Mixtral block BF16 {mode} T{tokens} H{hidden}", flops, setup, _WITHOUT, grad=grad)


def _hf_eager_block(tokens, hidden, grad: bool, dtype) -> Case:
    """transformers' Mixtral block with its ``eager`` experts: compiled after ``enable()`` the per-expert loop is
    traced as one graph (our grouped ops; in BF16 on CPU transformers' ``grouped_mm`` experts, see
    ``hf.eager_experts_forward``); without, Dynamo breaks the graph at every expert."""

    def setup():
        from torch_ascend_moe.bench.moe import models

        block, _, x = models((tokens, hidden, 2, 8), "eager", dtype=dtype)

        def forward(x):
            out = block(x)
            return out[0] if isinstance(out, tuple) else out

        compiled = torch.compile(forward, backend="inductor", fullgraph=True)
        baseline = torch.compile(_twin(forward), backend="inductor")  # graph breaks: no fullgraph

        def ours(x):
            with inductor_lowerings.enabled():  # Dynamo guards on the switch: on at every call, not just the first
                return compiled(x)

        return layer_call(ours, x, grad), layer_call(baseline, x, grad)

    flops = tokens * (2 * hidden * 8 + 2 * 6 * hidden * hidden) * (3 if grad else 1)
    mode = "fwd+bwd" if grad else "fwd"
    name = f"HF Mixtral block {'BF16' if dtype == torch.bfloat16 else 'FP32'} eager experts {mode} T{tokens} H{hidden}"
    return Case(name, flops, setup, _WITHOUT, grad=grad)


def _hf_model(family, tokens, grad: bool, layers: int = 2) -> Case:
    """A whole tiny transformers model (2 layers unless told, hidden 256, 8 experts top-2, grouped_mm experts as
    shipped), BF16, compiled whole with and without the passes: the passes' effect (and cost) on a stock model."""

    def setup():
        from torch_ascend_moe.bench.moe import tiny_model

        model = tiny_model(family, layers=layers).to(torch.bfloat16)
        ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            model(ids)  # transformers installs its output-capturing hooks at the first call, outside Dynamo

        def forward(ids):
            return model(ids).logits

        ours, baseline = _both(forward)

        def call(fn):
            def step():
                if not grad:
                    with torch.no_grad():
                        return fn(ids)
                model.zero_grad(set_to_none=True)
                fn(ids).float().sum().backward()
                return model.lm_head.weight.grad

            return step

        return call(ours), call(baseline)

    mode = "fwd+bwd" if grad else "fwd"
    size = "" if layers == 2 else f" {layers}-layer"
    return Case(f"HF {family} tiny model{size} BF16 {mode} T{tokens}", 0, setup, _WITHOUT, grad=grad)


def _compile_time(m, n, k) -> Case:
    def setup():
        from torch._inductor import config

        g = torch.Generator().manual_seed(2)
        x = torch.randn(m, k, generator=g)
        b, sfb = ops.quantize_fp8(torch.randn(n, k, generator=g), [128, 128])
        q, kv, w = torch.randn(m, 4, 64, generator=g), torch.randn(2 * m, 64, generator=g), torch.rand(m, 4)
        ks, ke = torch.zeros(m, dtype=torch.int32), torch.full((m,), 2 * m, dtype=torch.int32)

        def both_chains(x, b, sfb, q, kv, w, ks, ke):
            data, sf = ops.quantize_fp8(x, [1, 128])
            y = ops.fp8_gemm(data, sf, b, sfb)
            return y, ops.mqa_topk(ops.mqa_logits(q, None, kv, None, w, ks, ke), ks, ke, 8)

        args = (x, b, sfb, q, kv, w, ks, ke)

        def compile_fresh(backend):
            def call():
                torch._dynamo.reset()
                with config.patch(fx_graph_cache=False):
                    return torch.compile(both_chains, backend=backend, fullgraph=True)(*args)[0]

            return call

        return compile_fresh(inductor_lowerings.BACKEND), compile_fresh("inductor")

    return Case(f"compile time, both chains M{m}", 0, setup, "compile without the passes", iterations=2)


def cases(quick: bool = False) -> list[Case]:
    if quick:
        return [
            _fp8_linear(64, 256, 512),
            _fp8_experts(64, 256, 128, 4),
            _norm_cast(64, 512),
            _indexer(32, 256, 4, 32, 16),
            _moe(64, 64, False),
            _dense_mlp(16, 64, False),
            _expert_mlp(64, 64, 32, 4),
            _fp8_expert_mlp(64, 128, 128, 4),
            _moe_steps(64, 128, 128, 4, 2, fp8=True),
            _moe_steps(64, 128, 128, 4, 2, fp8=False),
            _moe(64, 64, False, torch.bfloat16),
            _moe(64, 64, True, torch.bfloat16, recompute_l1=True),
            _hf_block(32, 64, False),
            _hf_eager_block(32, 64, False, torch.float32),
            _hf_eager_block(32, 64, False, torch.bfloat16),
            _hf_model("qwen3_moe", 32, False, layers=1),
            _combine(64, 128, 2, 4),
            _compile_time(16, 64, 256),
        ]
    return [
        _fp8_linear(2048, 4096, 4096),
        _fp8_experts(4096, 2048, 2048, 8),
        _fp8_experts(64, 2048, 2048, 8),
        _norm_cast(4096, 7168),
        _norm_cast(64, 7168),
        _indexer(1024, 8192, 16, 64, 512),
        _moe(2048, 512, False),
        _moe(2048, 512, True),
        _dense_mlp(2048, 1024, False),
        _dense_mlp(2048, 1024, True),
        _expert_mlp(4096, 1024, 1024, 8),
        _fp8_expert_mlp(4096, 1024, 1024, 8),
        _fp8_expert_mlp(64, 1024, 1024, 8),
        _moe_steps(2048, 1024, 1024, 8, 2, fp8=True),
        _moe_steps(32, 1024, 1024, 8, 2, fp8=True),
        _moe_steps(2048, 1024, 1024, 8, 2, fp8=False),
        _moe_steps(32, 1024, 1024, 8, 2, fp8=False),
        _moe(2048, 1024, False, torch.bfloat16),
        _moe(2048, 1024, True, torch.bfloat16),
        _moe(2048, 1024, True, torch.bfloat16, layers=4, recompute_l1=True),
        _hf_block(2048, 1024, False),
        _hf_block(2048, 1024, True),
        _hf_eager_block(2048, 1024, False, torch.float32),
        _hf_eager_block(2048, 1024, True, torch.float32),
        _hf_eager_block(2048, 1024, False, torch.bfloat16),
        _hf_eager_block(2048, 1024, True, torch.bfloat16),
        _hf_model("qwen3_moe", 1024, False),
        _hf_model("qwen3_moe", 1024, True),
        _hf_model("deepseek_v3", 1024, False),
        _hf_model("deepseek_v3", 1024, True),
        _combine(4096, 4096, 8, 64),
        _compile_time(64, 256, 512),
    ]
