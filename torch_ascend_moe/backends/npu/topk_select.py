"""The topk_select family on Ascend: ``topk_select`` runs DeepSelect's own Ascend build where it is installed and takes
the call (``backends/upstream/deep_select.py``, its one home with the CUDA build's); torch_npu 2.13 has no top-k of
its own beyond ``torch.topk``, which the chain's next kernel, the portable one, uses (a ``torch.topk`` of packed int64
keys: ACLNN ops on an NPU).
"""

from torch_ascend_moe.backends.chain import stays_portable

stays_portable(
    "topk_select",
    device="npu",
    why=(
        "DeepSelect's Ascend build where installed; torch_npu has no top-k beyond torch.topk, which the "
        "portable kernel uses"
    ),
)
