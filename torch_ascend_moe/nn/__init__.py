"""Drop-in ``nn.Module`` replacements backed by the ascend_moe ops."""

from torch_ascend_moe.nn.fp8_linear import FP8Linear, convert_to_fp8_linear
from torch_ascend_moe.nn.grouped_experts import GroupedExperts

__all__ = ["FP8Linear", "GroupedExperts", "convert_to_fp8_linear"]
