"""``torch_ascend_moe.deep_gemm`` on calls a hostile or careless client makes: operands of the wrong rank in the
transposed layouts (checked before ``.mT``, which names no argument), a bare tensor for MQA's ``(kv, kv_sf)`` pair,
a zero block size for the casts, and two ``deep_gemm.utils.math`` helpers whose edge values follow upstream's
reference exactly (``unpack_ue8m0_from_int``'s bit shift, ``per_custom_dims_cast_to_fp8``'s ``sf.squeeze()``)."""

import pytest
import torch

import torch_ascend_moe.deep_gemm as dg
from torch_ascend_moe import quant


def _bf(*shape):
    return torch.randn(*shape).bfloat16()


def _f8(*shape):
    return torch.randn(*shape).to(torch.float8_e4m3fn)


WRONG_RANK = {
    "bf16_gemm_nn": (lambda: dg.bf16_gemm_nn(_bf(4, 128), _bf(128), torch.empty(4, 1).bfloat16()), "b"),
    "bf16_gemm_tn": (lambda: dg.bf16_gemm_tn(_bf(128), _bf(128, 8), torch.empty(1, 8).bfloat16()), "a"),
    "bf16_gemm_tt": (lambda: dg.bf16_gemm_tt(_bf(128), _bf(8, 128), torch.empty(1, 8).bfloat16()), "a"),
    "cublaslt_gemm_nn": (lambda: dg.cublaslt_gemm_nn(_bf(4, 128), _bf(128), torch.empty(4, 1).bfloat16()), "b"),
    "cublaslt_gemm_tn": (lambda: dg.cublaslt_gemm_tn(_bf(128), _bf(128, 8), torch.empty(1, 8).bfloat16()), "a"),
    "cublaslt_gemm_tt": (lambda: dg.cublaslt_gemm_tt(_bf(128), _bf(8, 128), torch.empty(1, 8).bfloat16()), "a"),
    "fp8_gemm_tn": (
        lambda: dg.fp8_gemm_tn(
            (_f8(128), torch.ones(1)), (_f8(128, 16), torch.ones(1, 1)), torch.empty(1, 16).bfloat16()
        ),
        "a",
    ),
    "fp8_gemm_nn": (
        lambda: dg.fp8_gemm_nn(
            (_f8(4, 128), torch.ones(4, 1)), (_f8(128), torch.ones(1)), torch.empty(4, 1).bfloat16()
        ),
        "b",
    ),
    "fp8_gemm_tt scales": (
        lambda: dg.fp8_gemm_tt(
            (_f8(128, 4), torch.ones(1)), (_f8(16, 128), torch.ones(1, 1)), torch.empty(4, 16).bfloat16()
        ),
        "sfa",
    ),
    "k_grouped_bf16 a": (
        lambda: dg.k_grouped_bf16_gemm_tn_contiguous(
            _bf(128), _bf(128, 16), torch.empty(1, 1, 16), [128], torch.tensor([128], dtype=torch.int32)
        ),
        "a",
    ),
    "k_grouped_bf16 layout": (
        lambda: dg.k_grouped_bf16_gemm_tn_contiguous(
            _bf(128, 8), _bf(128, 16), torch.empty(1, 8, 16), [128], torch.tensor(128, dtype=torch.int32)
        ),
        "grouped_layout",
    ),
    "k_grouped_fp8 a": (
        lambda: dg.k_grouped_fp8_gemm_tn_contiguous(
            (_f8(128), torch.ones(1, 1)),
            (_f8(128, 16), torch.ones(1, 16)),
            torch.empty(1, 1, 16),
            [128],
            torch.tensor([128], dtype=torch.int32),
        ),
        "a",
    ),
}


@pytest.mark.parametrize("case", sorted(WRONG_RANK))
def test_wrong_rank_is_named_before_any_transpose(case):
    call, arg = WRONG_RANK[case]
    with pytest.raises(ValueError, match=rf"^deep_gemm\.\w+: argument '{arg}' rank: expected [12]-D "):
        call()


@pytest.mark.parametrize("api", ["fp8_mqa_logits", "fp8_fp4_mqa_logits"])
def test_mqa_kv_must_be_a_pair(api):
    q, kv = _f8(4, 8, 128), _f8(8, 128)
    ks, ke = torch.zeros(4, dtype=torch.int32), torch.ones(4, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"argument 'kv' value: expected a \(kv, kv_sf\) pair, got a tensor of shape"):
        getattr(dg, api)(q, kv, torch.ones(4, 8), ks, ke)


@pytest.mark.parametrize(
    "call",
    [
        lambda: dg.per_token_cast_to_fp8(torch.randn(4, 128), False, 0),
        lambda: dg.per_channel_cast_to_fp8(torch.randn(128, 4), False, 0),
        lambda: dg.cast_back_from_fp4(torch.zeros(4, 64, dtype=torch.int8), torch.ones(4, 1), 0),
        lambda: quant.dequantize_fp8(_f8(4, 128), torch.ones(4, 1), 1, 0),
    ],
)
def test_zero_block_size_is_an_argument_error(call):
    with pytest.raises(ValueError, match=r"argument 'gran_k' value: expected a positive integer, got 0"):
        call()


def test_unpack_ue8m0_from_int_is_upstreams_bit_shift():
    codes = torch.tensor([0, 1, 126, 127, 128, 254, 255, 0], dtype=torch.uint8)
    got = dg.unpack_ue8m0_from_int(codes.view(torch.int32))
    # upstream: (packed.view(uint8).int() << 23).view(float): code 0 is +0.0 and 255 is +inf
    expected = [0.0, 2.0**-126, 0.5, 1.0, 2.0, 2.0**127, float("inf"), 0.0]
    assert got.tolist() == expected and got.dtype == torch.float32 and got.shape == (8,)
    # the round trip of pack_ue8m0_to_int holds on every power of two it packs
    sf = torch.pow(2.0, torch.randint(-126, 128, (3, 8)).float())
    assert torch.equal(dg.unpack_ue8m0_from_int(dg.pack_ue8m0_to_int(sf)), sf)
    with pytest.raises(ValueError, match=r"unpack_ue8m0_from_int: argument 'packed' dtype"):
        dg.unpack_ue8m0_from_int(codes)


@pytest.mark.parametrize(
    ("shape", "dims", "sf_shape"),
    [((1, 128), (0,), ()), ((1, 4, 128), (0, 1), (4,)), ((5, 128), (0,), (5,)), ((3, 1, 64), (0, 1), (3,))],
)
def test_per_custom_dims_scales_are_squeezed_as_upstream(shape, dims, sf_shape):
    x = torch.randn(*shape)
    q, sf = dg.per_custom_dims_cast_to_fp8(x, dims, False)
    assert q.shape == x.shape and tuple(sf.shape) == sf_shape
    amax = x.abs().float().amax(dim=[d for d in range(x.dim()) if d not in dims]).clamp(1e-4)
    assert torch.equal(sf, (amax / 448.0).squeeze())


@pytest.mark.parametrize(("d", "width"), [(64, 66), (32, 36)])
def test_mxfp8_pages_of_an_empty_cache(d, width):
    """DeepGEMM 2.8's MXFP8 KV pages (D < 128) with no blocks: the repacked pages are empty, of the right width
    (a reshape with -1 cannot infer a size when there are 0 blocks)."""
    from torch_ascend_moe.deep_gemm.mqa import _mx_fp8_pages

    for blocks in (0, 2):
        kv = torch.randint(0, 120, (blocks, 16, 1, d + 4), dtype=torch.uint8)
        pages, ascend_layout = _mx_fp8_pages(kv, d)
        assert pages.shape == (blocks, 16, 1, width) and ascend_layout == (d % 64 == 0)
