"""Drop-in ``nn.Module`` replacements backed by the ascend_moe ops."""

from torch_ascend_moe.nn.fp8_linear import FP8Linear, convert_to_fp8_linear
from torch_ascend_moe.nn.grouped_experts import GroupedExperts
from torch_ascend_moe.nn.hyper_connection import HyperConnection
from torch_ascend_moe.nn.lightning_indexer import LightningIndexer, indexer_kl_loss
from torch_ascend_moe.nn.moe import MegaMoE, MoE, MoEGate, SwiGLUMLP
from torch_ascend_moe.nn.sparse_attention import DSAttention, PagedDSACache

__all__ = [
    "DSAttention",
    "FP8Linear",
    "GroupedExperts",
    "HyperConnection",
    "LightningIndexer",
    "MegaMoE",
    "MoE",
    "MoEGate",
    "PagedDSACache",
    "SwiGLUMLP",
    "convert_to_fp8_linear",
    "indexer_kl_loss",
]
