"""FLOP formulas (``torch.utils.flop_counter``) of the GEMM-like ops, one module per family."""

from torch_ascend_moe.flops import fp8_gemm, gemm  # noqa: F401
