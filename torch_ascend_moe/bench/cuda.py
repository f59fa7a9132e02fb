"""Benchmark cases of the CUDA backend (``python -m torch_ascend_moe bench cuda``, on a GPU): each CUDA kernel against
the baseline issue 18 names for it, in the same run: BF16 GEMM vs cuBLAS (``torch.mm``), FP8 block-scaled GEMM vs
``torch._scaled_mm`` with DeepSeek's 1x128 x 128x128 recipe (where this GPU's cuBLAS takes it; else the dequantize
+ BF16 GEMM a PyTorch user writes), BF16 grouped vs ``torch._grouped_mm``, FP8 grouped vs a per-expert loop of
dequantize + GEMM, MQA logits vs the naive einsum, the sparse MLA prefill (BF16, d_qk 576 / d_v 512) vs the
portable kernel, the MoE layer vs transformers' Mixtral block with ``grouped_mm`` experts (BF16 forward). Shapes are
DeepGEMM's and DeepSeek-V3.2's (``--quick``: small ones). Without CUDA there is nothing to time: the family has no
cases then (the CLI says so).
"""

from __future__ import annotations

import torch

from torch_ascend_moe.bench import Case, layer_call
from torch_ascend_moe.quant.encodings import E4M3_AMAX_FLOOR, FP8_MAX


def _device() -> torch.device:
    return torch.device("cuda")


def _bf16(*shape, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, generator=g, device=_device()).bfloat16()


def _fp8_1x128(x: torch.Tensor):
    """(E4M3 data, FP32 scales [rows, K/128]) per 1 x 128 block, DeepGEMM's activation cast."""
    blocks = x.float().unflatten(-1, (-1, 128))
    scale = blocks.abs().amax(-1).clamp(min=E4M3_AMAX_FLOOR) / FP8_MAX
    return (blocks / scale.unsqueeze(-1)).to(torch.float8_e4m3fn).flatten(-2), scale


def _fp8_128x128(w: torch.Tensor):
    """(E4M3 data, FP32 scales [ceil(N/128), K/128]) per 128 x 128 block, DeepGEMM's weight cast (N = 2112, the
    MLA down-projection's, ends in a partial block: zero rows pad it for the amax and are cut off)."""
    n, k = w.shape[-2:]
    nb = -(-n // 128)
    padded = torch.nn.functional.pad(w.float(), (0, 0, 0, nb * 128 - n))
    blocks = padded.unflatten(-2, (nb, 128)).unflatten(-1, (k // 128, 128))  # [.., nb, 128, kb, 128]
    scale = blocks.abs().amax((-3, -1)).clamp(min=E4M3_AMAX_FLOOR) / FP8_MAX
    data = (blocks / scale.unsqueeze(-1).unsqueeze(-3)).to(torch.float8_e4m3fn)
    return data.flatten(-2).flatten(-3, -2)[..., :n, :], scale


def _gemm(m, n, k) -> Case:
    def setup():
        a, b = _bf16(m, k), _bf16(n, k, seed=1)
        return (lambda: torch.ops.ascend_moe.bf16_gemm(a, b)), (lambda: torch.mm(a, b.T))

    return Case(f"bf16_gemm {m}x{n}x{k}", 2 * m * n * k, setup, "torch.mm (cuBLAS)")


def _gemm_fp32_out(m, n, k) -> Case:
    def setup():
        a, b = _bf16(m, k), _bf16(n, k, seed=1)
        ours = lambda: torch.ops.ascend_moe.bf16_gemm(a, b, out_dtype=torch.float32)  # noqa: E731
        return ours, (lambda: torch.mm(a.float(), b.float().T))

    return Case(f"bf16_gemm {m}x{n}x{k} -> FP32", 2 * m * n * k, setup, "FP32 copies through torch.mm")


def _fp8_gemm(m, n, k) -> Case:
    def setup():
        (a, sa), (b, sb) = _fp8_1x128(_bf16(m, k)), _fp8_128x128(_bf16(n, k, seed=1))
        ours = lambda: torch.ops.ascend_moe.fp8_gemm(a, sa, b, sb, out_dtype=torch.bfloat16)  # noqa: E731

        def scaled_mm():  # DeepSeek's recipe: scale_a [M, K/128] outer-dim-major, scale_b [K/128, N/128]
            return torch._scaled_mm(a, b.T, sa.T.contiguous().T, sb.T.contiguous(), out_dtype=torch.bfloat16)

        try:
            scaled_mm()
            return ours, scaled_mm
        except (RuntimeError, ValueError):
            a_d = (a.float().unflatten(-1, (-1, 128)) * sa.unsqueeze(-1)).flatten(-2).bfloat16()
            b_d = torch.ops.ascend_moe.dequantize(b, sb, [128, 128], out_dtype=torch.bfloat16)
            return ours, (lambda: torch.mm(a_d, b_d.T))

    return Case(f"fp8_gemm 1x128.128x128 {m}x{n}x{k}", 2 * m * n * k, setup, "torch._scaled_mm (else dequant + mm)")


def _grouped(groups, m_per, n, k) -> Case:
    def setup():
        a, b = _bf16(groups * m_per, k), _bf16(groups, n, k, seed=1)
        ends = torch.arange(1, groups + 1, device=_device(), dtype=torch.int32) * m_per
        ours = lambda: torch.ops.ascend_moe.m_grouped_bf16_gemm(a, b, ends)  # noqa: E731
        return ours, (lambda: torch._grouped_mm(a, b.transpose(1, 2), offs=ends))

    return Case(f"m_grouped_bf16_gemm {groups}x{m_per}x{n}x{k}", 2 * groups * m_per * n * k, setup, "torch._grouped_mm")


def _grouped_fp8(groups, m_per, n, k) -> Case:
    def setup():
        (a, sa), (b, sb) = _fp8_1x128(_bf16(groups * m_per, k)), _fp8_128x128(_bf16(groups, n, k, seed=1))
        ends = torch.arange(1, groups + 1, device=_device(), dtype=torch.int32) * m_per
        ours = lambda: torch.ops.ascend_moe.m_grouped_fp8_gemm(a, sa, b, sb, ends)  # noqa: E731

        def loop():
            out = []
            for g in range(groups):
                rows = slice(g * m_per, (g + 1) * m_per)
                a_d = (a[rows].float().unflatten(-1, (-1, 128)) * sa[rows].unsqueeze(-1)).flatten(-2).bfloat16()
                b_d = torch.ops.ascend_moe.dequantize(b[g], sb[g], [128, 128], out_dtype=torch.bfloat16)
                out.append(torch.mm(a_d, b_d.T))
            return torch.cat(out)

        return ours, loop

    return Case(
        f"m_grouped_fp8_gemm {groups}x{m_per}x{n}x{k}", 2 * groups * m_per * n * k, setup, "per-expert dequant + mm"
    )


def _mqa(s, s_kv, h, d) -> Case:
    def setup():
        q, k = _bf16(s, h, d).to(torch.float8_e4m3fn), _bf16(s_kv, d, seed=1).to(torch.float8_e4m3fn)
        w = torch.rand(s, h, device=_device())
        ks = torch.zeros(s, dtype=torch.int32, device=_device())
        ke = torch.arange(s, dtype=torch.int32, device=_device()) + (s_kv - s)
        ours = lambda: torch.ops.ascend_moe.mqa_logits(q, None, k, None, w, ks, ke)  # noqa: E731

        def naive():
            scores = torch.einsum("ihd,jd->ihj", q.float(), k.float()).relu()
            logits = torch.einsum("ihj,ih->ij", scores, w)
            j = torch.arange(s_kv, device=_device())
            return logits.masked_fill((j < ks[:, None]) | (j >= ke[:, None]), float("-inf"))

        return ours, naive

    return Case(f"mqa_logits fp8 S{s} S_kv{s_kv} H{h} D{d}", s * h * s_kv * (2 * d + 2), setup, "naive einsum fp32")


def _sparse_prefill(s, s_kv, h, topk) -> Case:
    d_qk, d_v = 576, 512  # DeepSeek-V3.2's latent rows: 512 NoPE (V) + 64 RoPE

    def setup():
        from torch_ascend_moe.backends.portable import sparse_mla as portable

        q, kv = _bf16(s, h, d_qk) / 10, _bf16(s_kv, 1, d_qk, seed=1) / 10
        g = torch.Generator(device=_device()).manual_seed(2)
        indices = torch.randint(0, s_kv, (s, 1, topk), generator=g, device=_device(), dtype=torch.int32)
        args = (q, kv, indices, d_qk**-0.5, d_v, None, None)
        return (lambda: torch.ops.ascend_moe.sparse_mla_prefill(*args)), (lambda: portable.sparse_mla_prefill(*args))

    flops = 2 * s * h * topk * (d_qk + d_v)
    return Case(f"sparse_mla_prefill s{s} s_kv{s_kv} h{h} top-{topk}", flops, setup, "portable kernel (torch ops)")


def _moe(t, h, k, e) -> Case:
    def setup():
        from torch_ascend_moe.bench.moe import models

        block, ours, x = models((t, h, k, e), "grouped_mm", _device(), torch.bfloat16)
        return layer_call(ours, x, False), layer_call(block, x, False)

    flops = t * (2 * h * e + k * 6 * h * h)
    return Case(f"MoE fwd BF16 T{t} H{h} top-{k} of {e}", flops, setup, "HF MixtralSparseMoeBlock, grouped_mm experts")


def cases(quick: bool = False) -> list[Case]:
    if not torch.cuda.is_available():
        return []
    if quick:
        quick_cases = [_gemm(128, 256, 512), _fp8_gemm(128, 256, 512), _grouped(4, 64, 256, 512), _mqa(64, 256, 16, 64)]
        return [*quick_cases, _sparse_prefill(64, 256, 16, 128), _moe(64, 128, 2, 4)]
    return [
        _gemm(4096, 7168, 2048),
        _gemm_fp32_out(4096, 7168, 2048),
        _fp8_gemm(4096, 2112, 7168),
        _fp8_gemm(128, 7168, 2048),
        _grouped(8, 1024, 4096, 7168),
        _grouped_fp8(8, 1024, 4096, 7168),
        _mqa(4096, 8192, 64, 128),
        _sparse_prefill(1024, 8192, 128, 2048),
        _moe(4096, 2048, 8, 64),
    ]
