"""``deep_ep.EPHandle`` (V2): upstream's Python class (``deep_ep/buffers/elastic.py:25-192``), verbatim but for the
stand-in's asserts (``_standin.py_assert``) and one ``device='cuda'`` made the received tensor's device.

Positional constructor order (a caller may rebuild a handle from saved tensors and pass it to ``combine`` or a cached
``dispatch``): ``do_expand, num_experts, expert_alignment, num_max_tokens_per_rank, num_sms, topk_idx,
num_recv_tokens, num_expanded_tokens, num_recv_tokens_per_expert_list, psum_num_recv_tokens_per_scaleup_rank,
psum_num_recv_tokens_per_expert, num_unaligned_recv_tokens_per_expert, recv_src_metadata, dst_buffer_slot_idx,
token_metadata_at_forward, channel_linked_list``. ``cached_recv_src_metadata_before_sort`` (set by
``deterministic_sort`` in a non-cached dispatch) is what a cached dispatch on a ``deterministic=True`` buffer sorts
with: a rebuilt handle must carry it there, or upstream's assert (elastic.py:124) fails.
"""

from __future__ import annotations

import torch

from . import _standin as S
from ._standin import ELASTIC_PY, py_assert


class EPHandle:
    """Upstream's ``EPHandle`` (elastic.py:25-192): the communication handle of ``ElasticBuffer.dispatch``, reused by
    cached dispatches and consumed by ``combine``. A caller may build one from saved tensors."""

    @S.logged("EPHandle.__init__")
    def __init__(
        self,
        do_expand: bool,
        num_experts: int,
        expert_alignment: int,
        num_max_tokens_per_rank: int,
        num_sms: int,
        topk_idx: torch.Tensor,
        num_recv_tokens: int,
        num_expanded_tokens: int,
        num_recv_tokens_per_expert_list: list,
        psum_num_recv_tokens_per_scaleup_rank: torch.Tensor,
        psum_num_recv_tokens_per_expert: torch.Tensor,
        num_unaligned_recv_tokens_per_expert: torch.Tensor,
        recv_src_metadata: torch.Tensor,
        dst_buffer_slot_idx: torch.Tensor,
        token_metadata_at_forward: torch.Tensor | None,
        channel_linked_list: torch.Tensor | None,
    ):
        py_assert(topk_idx is not None, None, f"{ELASTIC_PY}:76", "topk_idx is not None")
        self.do_expand = do_expand
        self.num_experts = num_experts
        self.expert_alignment = expert_alignment
        self.num_max_tokens_per_rank = num_max_tokens_per_rank
        self.num_sms = num_sms
        self.topk_idx = topk_idx
        self.psum_num_recv_tokens_per_scaleup_rank = psum_num_recv_tokens_per_scaleup_rank
        self.psum_num_recv_tokens_per_expert = psum_num_recv_tokens_per_expert
        self.num_unaligned_recv_tokens_per_expert = num_unaligned_recv_tokens_per_expert
        self.num_recv_tokens_per_expert_list = num_recv_tokens_per_expert_list
        self.recv_src_metadata = recv_src_metadata
        self.dst_buffer_slot_idx = dst_buffer_slot_idx
        self.token_metadata_at_forward = token_metadata_at_forward
        self.channel_linked_list = channel_linked_list
        # May not be accurate without CPU sync
        self.num_recv_tokens = num_recv_tokens
        self.num_expanded_tokens = num_expanded_tokens
        # For deterministic features
        self.cached_recv_src_metadata_before_sort = None

    def deterministic_sort(
        self,
        do_cpu_sync: bool,
        is_cached_dispatch: bool,
        recv_x: torch.Tensor,
        recv_sf: torch.Tensor | None,
        recv_topk_idx: torch.Tensor,
        recv_topk_weights: torch.Tensor,
        channel_linked_list: torch.Tensor | None,
    ):
        """Sort received tokens by ``src_token_global_idx`` (elastic.py:100-192, verbatim)."""
        if not is_cached_dispatch:
            self.cached_recv_src_metadata_before_sort = self.recv_src_metadata.clone()
        py_assert(
            self.cached_recv_src_metadata_before_sort is not None,
            None,
            f"{ELASTIC_PY}:124",
            "self.cached_recv_src_metadata_before_sort is not None",
        )
        sort_keys = self.cached_recv_src_metadata_before_sort[:, 0]

        # Ignore trailing tokens by setting their `sort_keys` to max
        num_recv_tokens = (
            self.psum_num_recv_tokens_per_scaleup_rank[-1] if not do_cpu_sync else self.recv_src_metadata.shape[0]
        )
        if not do_cpu_sync:
            oob_tokens_mask = (
                torch.arange(0, self.recv_src_metadata.shape[0], device=self.recv_src_metadata.device)
                >= num_recv_tokens
            )
            sort_keys = sort_keys.clone()
            sort_keys[oob_tokens_mask] = torch.iinfo(sort_keys.dtype).max
        orig_indices = torch.sort(sort_keys).indices

        def get_reverse_permutation(perm: torch.Tensor) -> torch.Tensor:
            assert perm.dim() == 1
            result = torch.empty_like(perm)
            result[perm] = torch.arange(0, perm.shape[0], dtype=perm.dtype, device=perm.device)
            return result

        def permute(tensor: torch.Tensor | None, orig_indices: torch.Tensor):
            if tensor is not None:
                tmp = tensor[orig_indices]
                tensor.copy_(tmp)

        if not self.do_expand:
            permute(recv_x, orig_indices)
            permute(recv_sf, orig_indices)
            permute(recv_topk_weights, orig_indices)
            permute(recv_topk_idx, orig_indices)
            if not is_cached_dispatch:
                permute(self.recv_src_metadata, orig_indices)

            if not is_cached_dispatch and channel_linked_list is not None:
                valid_mask = (channel_linked_list >= 0) & (channel_linked_list < num_recv_tokens)
                to_indices = get_reverse_permutation(orig_indices)
                channel_linked_list[valid_mask] = to_indices[channel_linked_list[valid_mask]].to(
                    channel_linked_list.dtype
                )

        elif not is_cached_dispatch:
            src_token_global_index_max_x2 = 10000000000  # 1e10
            tensor_dim0_after_expand = recv_x.shape[0]

            expert_token_idx_start = self.psum_num_recv_tokens_per_expert - self.num_unaligned_recv_tokens_per_expert
            token_idx2expert_idx = torch.bucketize(
                torch.arange(tensor_dim0_after_expand, device=recv_x.device),
                expert_token_idx_start[1:],
                right=True,
                out_int32=False,
            )
            sort_keys_for_expanded_tensors = token_idx2expert_idx * src_token_global_index_max_x2

            slots = self.cached_recv_src_metadata_before_sort[:, 2:]  # [num_recv_tokens, topk]
            src_global_idx = self.cached_recv_src_metadata_before_sort[:, 0]
            valid_mask = slots >= 0
            if not do_cpu_sync:
                valid_mask[oob_tokens_mask] = False
            sort_keys_for_expanded_tensors.scatter_add_(
                0,
                slots[valid_mask],
                -src_token_global_index_max_x2 // 2
                + src_global_idx.unsqueeze(1).expand_as(slots)[valid_mask].to(torch.int64),
            )

            orig_indices_for_expanded_tensors = torch.sort(sort_keys_for_expanded_tensors, stable=True).indices.to(
                torch.int32
            )
            permute(recv_x, orig_indices_for_expanded_tensors)
            permute(recv_sf, orig_indices_for_expanded_tensors)
            permute(recv_topk_weights, orig_indices_for_expanded_tensors)

            to_indices_for_expanded_tensors = get_reverse_permutation(orig_indices_for_expanded_tensors)
            self.recv_src_metadata[:, 2:][valid_mask] = to_indices_for_expanded_tensors[
                self.recv_src_metadata[:, 2:][valid_mask]
            ]
