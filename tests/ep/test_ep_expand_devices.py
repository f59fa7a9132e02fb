"""``ep_expand`` compares its tensors' devices as every other op does: a ``meta`` ``topk_idx`` / ``topk_weights`` /
``x_scales`` beside a CPU ``x`` is an error naming the argument (it used to return CPU tensors of uninitialised
memory with ``num_rows``, and an error naming no argument without it)."""

from __future__ import annotations

import pytest
import torch

from torch_ascend_moe.ops.ep import ep_expand

X = torch.randn(4, 8)
IDX = torch.tensor([[0, 1], [2, -1], [1, 0], [1, 2]])
W = torch.rand(4, 2)


@pytest.mark.parametrize("num_rows", [0, 16])
@pytest.mark.parametrize("meta", ["topk_idx", "topk_weights", "x_scales"])
def test_meta_tensor_beside_cpu_x_is_refused(meta, num_rows):
    x, idx, w, scales = X, IDX, W, None
    if meta == "x_scales":
        x, scales = X.to(torch.float8_e4m3fn), torch.ones(4, 1, device="meta")
    elif meta == "topk_idx":
        idx = IDX.to("meta")
    else:
        w = W.to("meta")
    with pytest.raises(
        ValueError, match=rf"ep_expand: argument '{meta}' device: expected cpu \(same as 'x'\), got meta"
    ):
        ep_expand(x, idx, w, num_local_experts=3, x_scales=scales, num_rows=num_rows)


def test_same_device_still_works():
    out = ep_expand(X, IDX, W, num_local_experts=3, num_rows=16)
    assert out.x.shape == (16, 8) and out.x.device == X.device
