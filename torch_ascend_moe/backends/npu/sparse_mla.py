"""The sparse_mla family on Ascend: ``sparse_mla_prefill`` stays on its portable kernel for now (gathers, einsums
and a logsumexp: ACLNN ops on an NPU). Why torch_npu 2.13's ``npu_sparse_flash_attention`` is not its adapter yet:

* Its inputs split the latent row into ``query`` / ``key`` and ``query_rope`` / ``key_rope``, take a block table,
  ``actual_seq_lengths_*`` and a ``sparse_block_size`` (DeepSeek-V3.2's 1-token blocks are ``sparse_block_size=1``)
  in BSND/TND layouts, and return three tensors whose meaning (``return_softmax_lse``, its log base, what an empty
  selection gives) is documented only in prose we have not been able to pin against FlashMLA's definitions
  (natural-log lse, +inf / -inf for a token with no row, ``attn_sink`` scaling ``out`` only).
* Invalid indices: ours leaves out anything ``< 0`` or ``>= s_kv`` and positions past ``topk_length``; the CANN
  op's handling of out-of-range entries (beyond ``-1`` padding) is not stated.

``sparse_mla_decode`` stays portable too (it dequantizes the selected records and runs ``sparse_mla_prefill``, so
it follows that op's mapping). FlashMLA's Ascend release decodes V4.1's 528-byte FP8 records with an optional
288-byte FP4 extra cache, token-interleaved: the same byte layouts this op reads (besides V3.2's 656 and V4's 584),
so its kernel could serve those calls unchanged.

FlashMLA's own Ascend 950 release registers ``torch.ops.flash_mla.sparse_prefill_fwd`` for ``PrivateUse1``
(V4.1: d_qk = d_v = 512, h_q = 64 only): where that extension is installed it is the natural adapter, behind the
same checks; mapping either is the next step of issue 20, with their metas checked against our fake.
"""
