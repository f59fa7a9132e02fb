"""The sparse_mla family on Ascend: ``sparse_mla_prefill`` and ``sparse_mla_decode`` run FlashMLA's own Ascend 950
kernels where its release is installed and takes the call (``backends/upstream/flash_mla.py``, their one home with
the CUDA release's); no torch_npu op maps (CANN's ``npu_sparse_flash_attention``: see that module), so the chain's
next kernel is the portable one (gathers, einsums and a logsumexp: ACLNN ops on an NPU).
"""

from torch_ascend_moe.backends.chain import stays_portable

stays_portable(
    "sparse_mla_prefill",
    "sparse_mla_decode",
    device="npu",
    why="FlashMLA's Ascend 950 kernels where installed; no torch_npu op maps",
)
