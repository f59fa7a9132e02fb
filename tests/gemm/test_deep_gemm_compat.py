"""torch_ascend_moe.deep_gemm: upstream signatures and out-parameter semantics of the BF16 family."""

import pytest
import torch

import torch_ascend_moe.deep_gemm as deep_gemm
from tests.gemm.specs import make_operand
from torch_ascend_moe.deep_gemm import epilogue
from torch_ascend_moe.testing import calc_diff

BF16 = torch.bfloat16


@pytest.fixture
def operands():
    g = torch.Generator().manual_seed(0)
    return make_operand((16, 64), BF16, "cpu", generator=g), make_operand((24, 64), BF16, "cpu", generator=g)


def _ref(a, b):
    return a.double() @ b.double().T


def test_writes_d_and_returns_none(operands):
    a, b = operands
    d = torch.full((16, 24), float("nan"), dtype=BF16)
    assert deep_gemm.bf16_gemm_nt(a, b, d) is None
    assert calc_diff(d, _ref(a, b)) < 1e-5


def test_c_is_d_accumulates_in_place(operands):
    a, b = operands
    d = make_operand((16, 24), torch.float32, "cpu", scale=32)
    before = d.clone()
    deep_gemm.bf16_gemm_nt(a, b, d, c=d)
    assert calc_diff(d, before.double() + _ref(a, b)) < 1e-12


def test_distinct_c_is_read_not_written(operands):
    a, b = operands
    c = make_operand((16, 24), BF16, "cpu", scale=32)
    c_before = c.clone()
    d = torch.empty(16, 24, dtype=BF16)
    deep_gemm.bf16_gemm_nt(a, b, d, c=c)
    assert torch.equal(c, c_before)
    assert calc_diff(d, c.double() + _ref(a, b)) < 1e-5


def test_empty_m_or_n_writes_nothing(operands):
    a, b = operands
    d = torch.empty(0, 24, dtype=BF16)
    deep_gemm.bf16_gemm_nt(a[:0], b, d)
    sentinel = torch.full((16, 0), 1.0, dtype=BF16)
    deep_gemm.bf16_gemm_nt(a, b[:0], sentinel)
    assert d.shape == (0, 24) and sentinel.shape == (16, 0)


def test_k_zero_writes_c_or_zeros():
    a, b = torch.empty(3, 0, dtype=BF16), torch.empty(5, 0, dtype=BF16)
    d = torch.full((3, 5), 7.0)
    deep_gemm.bf16_gemm_nt(a, b, d)
    assert torch.equal(d, torch.zeros(3, 5))
    c = torch.randn(3, 5)
    deep_gemm.bf16_gemm_nt(a, b, d, c=c)
    assert torch.equal(d, c)


def test_layout_aliases_match_nt(operands):
    a, b = operands
    expected = torch.empty(16, 24)
    deep_gemm.bf16_gemm_nt(a, b, expected)
    for fn, x, y in [
        (deep_gemm.bf16_gemm_nn, a, b.t()),
        (deep_gemm.bf16_gemm_tn, a.t(), b.t()),
        (deep_gemm.bf16_gemm_tt, a.t(), b),
        (deep_gemm.cublaslt_gemm_nn, a, b.t()),
        (deep_gemm.aclnn_bf16_gemm_tt, a.t(), b),
    ]:
        d = torch.empty(16, 24)
        fn(x, y, d)
        assert torch.equal(d, expected), fn.__name__


def test_alpha_and_epilogues(operands):
    a, b = operands
    plain, scaled, via_epilogue = (torch.empty(16, 24) for _ in range(3))
    deep_gemm.bf16_gemm_nt(a, b, plain, epilogue=epilogue.Identity())
    deep_gemm.bf16_gemm_nt(a, b, scaled, alpha=-0.5)
    deep_gemm.bf16_gemm_nt(a, b, via_epilogue, epilogue=epilogue.Alpha(-0.5))
    assert torch.equal(scaled, via_epilogue)
    assert torch.allclose(scaled, -0.5 * plain)
    with pytest.raises(ValueError, match="argument 'alpha'"):
        deep_gemm.bf16_gemm_nt(a, b, plain, alpha=2.0, epilogue=epilogue.Alpha(2.0))
    with pytest.raises(TypeError, match="argument 'epilogue'"):
        deep_gemm.bf16_gemm_nt(a, b, plain, epilogue="relu")


@pytest.mark.parametrize(
    "case,match",
    [
        ("fp32 a", r"deep_gemm.bf16_gemm_nt: argument 'a' dtype: expected torch.bfloat16, got torch.float32"),
        ("mismatched K", r"argument 'b' size\(1\) \(K\): expected 64"),
        ("3-D a", r"argument 'a' rank"),
        ("non-contiguous d", r"argument 'd' stride\(-1\): expected 1"),
        ("c dtype", r"argument 'c' dtype: expected torch.float32 \(same as 'd'\), got torch.bfloat16"),
        ("d shape", r"argument 'd' shape: expected \[16, 24\], got \[16, 25\]"),
        ("fp16 d", r"argument 'd' dtype: expected torch.bfloat16 or torch.float32"),
        ("strided a", r"argument 'a' strides"),
        ("aliasing c", r"argument 'c' layout"),
        ("device", r"argument 'b' device"),
    ],
)
def test_bad_inputs(operands, case, match):
    a, b = operands
    d, shared = torch.empty(16, 24), torch.empty(16, 48)
    args = {
        "fp32 a": (a.float(), b, d),
        "mismatched K": (a, b[:, :32], d),
        "3-D a": (a[None], b, d),
        "non-contiguous d": (a, b, torch.empty(24, 16).t()),
        "c dtype": (a, b, d, d.bfloat16()),
        "d shape": (a, b, torch.empty(16, 25)),
        "fp16 d": (a, b, d.half()),
        "strided a": (a[:, ::2], b[:, ::2], d),
        "aliasing c": (a, b, shared[:, :24], shared[:, 24:]),
        "device": (a, b.to("meta"), d),
    }[case]
    with pytest.raises((ValueError, RuntimeError), match=match):
        deep_gemm.bf16_gemm_nt(*args)


def test_bf16_bmm():
    g = torch.Generator().manual_seed(1)
    a = make_operand((3, 8, 32), BF16, "cpu", generator=g)
    b = make_operand((3, 12, 32), BF16, "cpu", mn_major=True, generator=g)
    d = make_operand((3, 8, 12), torch.float32, "cpu", generator=g)
    before = d.clone()
    deep_gemm.bf16_bmm(a, b, d, c=d)
    assert calc_diff(d, before.double() + a.double() @ b.double().transpose(1, 2)) < 1e-12
    with pytest.raises(ValueError, match=r"argument 'b' size\(0\) \(batch\)"):
        deep_gemm.bf16_bmm(a, b[:2], d)


def test_einsum_expressions_and_rules():
    g = torch.Generator().manual_seed(2)
    x = make_operand((4, 64, 32), BF16, "cpu", generator=g)
    y = make_operand((4, 48, 32), BF16, "cpu", generator=g)
    d = make_operand((64, 48), torch.float32, "cpu", generator=g)
    before = d.clone()
    deep_gemm.einsum("bmk,bnk->mn", x, y, d, c=d)
    assert calc_diff(d, before.double() + torch.einsum("bmk,bnk->mn", x.double(), y.double())) < 1e-12
    with pytest.raises(ValueError, match=r"argument 'c' value: expected c is d"):
        deep_gemm.einsum("bmk,bnk->mn", x, y, d)
    with pytest.raises(ValueError, match=r"argument 'c' value: expected None for a BF16 output"):
        deep_gemm.einsum("bmk,bnk->mn", x, y, d.bfloat16(), c=d.bfloat16())
    with pytest.raises(ValueError, match=r"argument 'use_cublaslt'"):
        deep_gemm.einsum("bmk,bnk->mn", x, y, d.bfloat16(), use_cublaslt=True)
    with pytest.raises(ValueError, match=r"argument 'expr' value"):
        deep_gemm.einsum("ij,jk->ik", x, y, d)
    a = make_operand((5, 4, 16), BF16, "cpu", generator=g)
    w = make_operand((4, 8, 16), BF16, "cpu", generator=g)
    out = torch.empty(5, 4, 8, dtype=BF16)
    deep_gemm.einsum("bhr,hdr->bhd", a, w, out)
    assert calc_diff(out, torch.einsum("bhr,hdr->bhd", a.double(), w.double())) < 1e-5
    with pytest.raises(ValueError, match=r"argument 'c' value: expected None for 'bhr,hdr->bhd'"):
        deep_gemm.einsum("bhr,hdr->bhd", a, w, out, c=out)


def _accumulate(a, b, d):
    deep_gemm.bf16_gemm_nt(a, b, d, c=d)
    return d


def test_compat_under_compile(operands):
    a, b = operands
    compiled = torch.compile(_accumulate, fullgraph=True, dynamic=True)
    for m in (16, 9, 3):  # new sizes reuse the dynamic graph
        d_eager, d_compiled = torch.ones(m, 24), torch.ones(m, 24)
        _accumulate(a[:m], b, d_eager)
        compiled(a[:m], b, d_compiled)
        assert torch.equal(d_eager, d_compiled)


@pytest.mark.parametrize(
    "case,match",
    [("non-contiguous d", r"argument 'd' stride\(-1\)"), ("mismatched K", r"argument 'b' size\(1\) \(K\)")],
)
def test_compat_bad_inputs_under_compile(operands, case, match):
    a, b = operands
    args = {"non-contiguous d": (a, b, torch.empty(24, 16).t()), "mismatched K": (a, b[:, :32], torch.empty(16, 24))}[
        case
    ]
    torch._dynamo.reset()
    with pytest.raises(Exception, match=match):
        torch.compile(_accumulate, fullgraph=True, dynamic=True)(*args)


def test_runtime_config_and_helpers():
    deep_gemm.set_num_sms(1)
    assert deep_gemm.get_num_sms() == 1
    deep_gemm.set_num_sms(0)
    assert deep_gemm.get_num_sms() >= 1
    # upstream's rule, 0 <= num_sms <= the GPU's SMs: without a GPU nothing bounds it from above (SGLang passes the
    # GPU's count), and the value is kept
    deep_gemm.set_num_sms(132)
    assert deep_gemm.get_num_sms() == 132
    deep_gemm.set_num_sms(0)
    with pytest.raises(ValueError, match=r"argument 'num_sms' value: expected >= 0, got -1"):
        deep_gemm.set_num_sms(-1)
    deep_gemm.set_tc_util(0)
    assert deep_gemm.get_tc_util() == 100
    deep_gemm.set_tc_util(75)
    assert deep_gemm.get_tc_util() == 75
    with pytest.raises(ValueError, match="tc_util"):
        deep_gemm.set_tc_util(101)
    deep_gemm.set_pdl(True)
    assert deep_gemm.get_pdl() is True
    deep_gemm.set_block_size_multiple_of((16, 32))
    deep_gemm.set_ignore_compile_dims(True)
    deep_gemm.use_deterministic_algorithms(True)
    assert deep_gemm.get_deterministic_algorithms() is True
    assert (deep_gemm.ceil_div(7, 4), deep_gemm.align(7, 4), deep_gemm.align(8, 4)) == (2, 8, 8)
    assert deep_gemm.get_tma_aligned_size(5, 4) == 8 and deep_gemm.get_tma_aligned_size(9, 2) == 16
    with pytest.raises(ValueError, match="element_size"):
        deep_gemm.get_tma_aligned_size(5, 3)


def test_testing_utilities():
    t = deep_gemm.testing
    x = torch.randn(64)
    assert t.calc_diff(x, x) < 1e-12 and t.calc_diff(torch.zeros(3), torch.zeros(3)) == 0.0
    assert abs(t.calc_diff(x, -x) - 2.0) < 1e-12
    assert t.count_bytes(x, (x.bfloat16(), None)) == 64 * 4 + 64 * 2
    assert t.bench(lambda: x + 1, num_warmups=1, num_tests=3) > 0
    t.assert_bitwise_equal(x, x.clone())
    y = x.clone()
    y[5] += 1
    with pytest.raises(AssertionError, match="element 5"):
        t.assert_bitwise_equal(x, y)
    assert t.get_arch_major() == (torch.cuda.get_device_capability()[0] if torch.cuda.is_available() else 0)
