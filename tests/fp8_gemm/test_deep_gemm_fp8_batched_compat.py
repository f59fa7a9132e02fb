"""torch_ascend_moe.deep_gemm's fp8_bmm, fp8_einsum and the FP8Quantization epilogue, as upstream calls them."""

import pytest
import torch

import torch_ascend_moe.deep_gemm as deep_gemm
from tests.fp8_gemm.specs import quantize_einsum_operand
from torch_ascend_moe import quant
from torch_ascend_moe.deep_gemm.epilogue import FP8Quantization
from torch_ascend_moe.testing import calc_diff


def _stack_cast(x: torch.Tensor, cast, *args):
    parts = [cast(x[i], *args) for i in range(x.shape[0])]
    return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])


@pytest.mark.parametrize("packed", [None, torch.int16, torch.int32])
def test_fp8_bmm_ascend_default_recipe(packed):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 9, 256, generator=g), torch.randn(3, 20, 256, generator=g)
    a = _stack_cast(x, quant.per_token_cast_to_fp8, True, 32)  # recipe (1, 1, 32): 8 UE8M0 scales per row
    b = _stack_cast(w, quant.per_token_cast_to_fp8, True, 32)
    if packed is not None:
        pack = quant.pack_ue8m0_to_int if packed == torch.int32 else quant.pack_ue8m0_to_int16
        a, b = (a[0], pack(a[1])), (b[0], pack(b[1]))
    d = torch.empty(3, 9, 20)
    deep_gemm.fp8_bmm(a, b, d)
    assert calc_diff(d, x.double() @ w.double().mT) < 1e-3
    c = torch.randn(3, 9, 20)
    d2 = c.clone()
    deep_gemm.fp8_bmm(a, b, d2, c=d2)
    torch.testing.assert_close(d2, d + c)


def test_fp8_bmm_fp4_weights():
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(2, 16, 1024, generator=g), torch.randn(2, 64, 1024, generator=g)
    a = _stack_cast(x, quant.per_token_cast_to_fp8, True, 32)
    b = _stack_cast(w, quant.per_token_cast_to_fp4, True, 32)
    d = torch.empty(2, 16, 64, dtype=torch.bfloat16)
    deep_gemm.fp8_bmm(a, b, d)
    assert calc_diff(d, x.double() @ w.double().mT) < 1e-2


@pytest.mark.parametrize(
    "sfd_dtype,gran", [(torch.float32, 128), (torch.float32, 32), (torch.int16, 32), (torch.int32, 32)]
)
def test_fp8_output_epilogue(sfd_dtype, gran):
    """D * sfd dequantizes to the BF16 result within FP8 rounding; UE8M0 scales are powers of two."""
    g = torch.Generator().manual_seed(2)
    m, n = 8, 256
    x, w = torch.randn(m, 512, generator=g), torch.randn(n, 512, generator=g)
    a, b = quant.per_token_cast_to_fp8(x, False), quant.per_block_cast_to_fp8(w, False)
    reference = torch.empty(m, n)
    deep_gemm.fp8_gemm_nt(a, b, reference)
    count = n // gran
    per = {torch.float32: 1, torch.int16: 2, torch.int32: 4}[sfd_dtype]
    d, sfd = torch.empty(m, n, dtype=torch.float8_e4m3fn), torch.empty(m, count // per, dtype=sfd_dtype)
    deep_gemm.fp8_gemm_nt(a, b, d, epilogue=FP8Quantization(sfd))
    scales = quant.scales_to_float(sfd)[:, :count]
    if sfd_dtype != torch.float32:
        assert torch.equal(scales, quant.ceil_to_ue8m0(scales))
    dequantized = d.float() * scales.repeat_interleave(gran, dim=1)
    assert calc_diff(dequantized, reference) < 1e-3
    assert (d.float().abs().amax(dim=1) <= 448).all()


def test_fp8_output_bad_inputs():
    a = quant.per_token_cast_to_fp8(torch.randn(4, 128), False)
    b = quant.per_block_cast_to_fp8(torch.randn(64, 128), False)
    d = torch.empty(4, 64, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="argument 'sfd' shape"):
        deep_gemm.fp8_gemm_nt(a, b, d, epilogue=FP8Quantization(torch.empty(4, 3)))
    with pytest.raises(ValueError, match="argument 'd' dtype"):
        deep_gemm.fp8_gemm_nt(a, b, torch.empty(4, 64), epilogue=FP8Quantization(torch.empty(4, 1)))
    with pytest.raises(TypeError, match="argument 'epilogue'"):
        deep_gemm.bf16_gemm_nt(
            torch.randn(4, 8).bfloat16(),
            torch.randn(2, 8).bfloat16(),
            torch.empty(4, 2),
            epilogue=FP8Quantization(torch.empty(4, 1)),
        )


@pytest.mark.parametrize(
    "expr,sizes,recipe",
    [
        ("bhr,hdr->bhd", {"b": 33, "h": 4, "r": 512, "d": 256}, (1, 128, 128)),
        ("bhd,hdr->bhr", {"b": 7, "h": 2, "d": 256, "r": 384}, (1, 128, 128)),
        ("bhd,bhr->hdr", {"b": 256, "h": 2, "d": 64, "r": 48}, (1, 1, 128)),
    ],
)
def test_fp8_einsum_upstream_expressions(expr, sizes, recipe):
    g = torch.Generator().manual_seed(3)
    sa, sb, so = expr[0:3], expr[4:7], expr[9:]
    x = torch.randn([sizes[c] for c in sa], generator=g)
    w = torch.randn([sizes[c] for c in sb], generator=g)
    a = quantize_einsum_operand(x, sa, so, (recipe[0], recipe[2]), False)
    b = quantize_einsum_operand(w, sb, so, (recipe[1], recipe[2]), False)
    expected = torch.einsum(expr, x.double(), w.double())
    if expr == "bhd,bhr->hdr":  # upstream: FP32 d accumulating in place, C = 10 * randn
        c = 10 * torch.randn([sizes[s] for s in so], generator=g)
        d = c.clone()
        deep_gemm.fp8_einsum(expr, a, b, d, c=d, recipe=recipe)
        assert calc_diff(d, expected + c.double()) < 1e-3
    else:
        d = torch.empty([sizes[s] for s in so], dtype=torch.bfloat16)
        deep_gemm.fp8_einsum(expr, a, b, d, recipe=recipe)
        assert calc_diff(d, expected) < 1e-3


def test_fp8_einsum_fp8_output_pair():
    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(6, 2, 256, generator=g), torch.randn(2, 128, 256, generator=g)
    a = quantize_einsum_operand(x, "bhr", "bhd", (1, 32), True)
    b = quantize_einsum_operand(w, "hdr", "bhd", (1, 32), True)
    d, sfd = torch.empty(6, 2, 128, dtype=torch.float8_e4m3fn), torch.empty(6, 2, 4)
    deep_gemm.fp8_einsum("bhr,hdr->bhd", a, b, (d, sfd), recipe=(1, 1, 32))
    out = d.float() * sfd.repeat_interleave(32, dim=-1)
    assert calc_diff(out, torch.einsum("bhr,hdr->bhd", x.double(), w.double())) < 2e-3


@pytest.mark.parametrize("b", [4, 7])
def test_fp8_einsum_fp8_output_flat_scales_28(b):
    """DeepGEMM 2.8's CUDA form: ``d = (e4m3 [b, h, d], int32 sfd [b, ceil(h*d/128)])`` with MN-major strides
    ``(1, align(b, 4))``: bitwise "BF16 D, then per_token_cast_to_fp8(D.view(b, h*d), use_ue8m0=True, gran_k=32,
    use_packed_ue8m0=True)", and ``cast_back_from_fp8`` within upstream's 2e-3 of the BF16 result."""
    g = torch.Generator().manual_seed(6)
    h, r, dim = 2, 256, 128
    x, w = torch.randn(b, h, r, generator=g), torch.randn(h, dim, r, generator=g)
    a = quantize_einsum_operand(x, "bhr", "bhd", (1, 128), False)
    bq = quantize_einsum_operand(w, "hdr", "bhd", (128, 128), False)
    d_bf16 = torch.empty(b, h, dim, dtype=torch.bfloat16)
    deep_gemm.fp8_einsum("bhr,hdr->bhd", a, bq, d_bf16)
    d = torch.empty(b, h, dim, dtype=torch.float8_e4m3fn)
    sfd = torch.empty_strided((b, h * dim // 128), (1, -(-b // 4) * 4), dtype=torch.int32)
    deep_gemm.fp8_einsum("bhr,hdr->bhd", a, bq, (d, sfd))
    want_q, want_sf = quant.per_token_cast_to_fp8(d_bf16.view(b, h * dim), True, 32, True)
    assert torch.equal(d.view(torch.uint8).view(b, -1), want_q.view(torch.uint8)) and torch.equal(sfd, want_sf)
    back = deep_gemm.utils.math.cast_back_from_fp8(d.view(b, h * dim), sfd, gran_k=32, use_packed_ue8m0=True)
    assert calc_diff(back, d_bf16.view(b, -1).float()) < 2e-3
    with pytest.raises(ValueError, match=rf"argument 'sfd' shape: expected \[{b}, 2\]"):
        deep_gemm.fp8_einsum("bhr,hdr->bhd", a, bq, (d, torch.empty(b, 3, dtype=torch.int32)))
    with pytest.raises(ValueError, match=r"argument 'expr' value: expected 'bhr,hdr->bhd' with a 2-D sfd"):
        deep_gemm.fp8_einsum("bhd,hdr->bhr", a, bq, (d, sfd))


def test_cast_back_from_fp8_28():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(5, 256, generator=g)
    for gran, packed in ((128, False), (32, True), (32, False)):
        q, sf = quant.per_token_cast_to_fp8(x, packed or gran == 32, gran, packed)
        back = deep_gemm.utils.math.cast_back_from_fp8(q, sf, gran_k=gran, use_packed_ue8m0=packed)
        scales = quant.unpack_ue8m0_from_int(sf) if packed else sf
        assert torch.equal(back, q.float() * scales.repeat_interleave(gran, dim=-1)[:, :256])


def test_fp8_einsum_compiles():
    g = torch.Generator().manual_seed(5)
    a = quantize_einsum_operand(torch.randn(4, 2, 128, generator=g), "bhr", "bhd", (1, 128), False)
    b = quantize_einsum_operand(torch.randn(2, 8, 128, generator=g), "hdr", "bhd", (128, 128), False)

    def fn(a0, a1, b0, b1):
        d = torch.empty(4, 2, 8)
        deep_gemm.fp8_einsum("bhr,hdr->bhd", (a0, a1), (b0, b1), d)
        return d

    torch.testing.assert_close(torch.compile(fn, fullgraph=True)(*a, *b), fn(*a, *b), rtol=0, atol=0)


def test_fp4_names_of_28_are_the_fp8_fp4_functions():
    assert deep_gemm.fp4_gemm_nt is deep_gemm.fp8_fp4_gemm_nt
    assert deep_gemm.m_grouped_fp4_gemm_nt_contiguous is deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous
    assert deep_gemm.m_grouped_fp4_gemm_nt_masked is deep_gemm.m_grouped_fp8_fp4_gemm_nt_masked
    assert {"fp4_gemm_nt", "m_grouped_fp4_gemm_nt_contiguous", "m_grouped_fp4_gemm_nt_masked"} <= set(deep_gemm.__all__)
