"""The shim itself: torch_npu's schemas and meta rules load on CPU, and they are the wheel's (a wrong call fails
the way torch_npu would), without touching torch's own Meta kernels or leaving a torch_npu module behind."""

import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode


def test_schemas_and_metas_are_the_wheels(npu_ops):
    schema = str(torch.ops.npu.npu_grouped_matmul.default._schema)
    assert "int? group_list_type=0" in schema and "Tensor[] weight, *," in schema
    assert not npu_ops.failed.keys() & {"npu_grouped_matmul", "npu_moe_distribute_dispatch_v2", "npu_dynamic_mx_quant"}
    with FakeTensorMode():
        x = torch.empty(64, 256, dtype=torch.bfloat16)
        w = torch.empty(4, 256, 128, dtype=torch.bfloat16)
        (y,) = torch.ops.npu.npu_grouped_matmul(
            [x], [w], group_list=torch.tensor([16, 32, 48, 64]), split_item=3, group_type=0, group_list_type=0
        )
        assert y.shape == (64, 128) and y.dtype == torch.bfloat16
        q, s = torch.ops.npu.npu_dynamic_mx_quant(x, dst_type=292)
        assert q.dtype == torch.float8_e4m3fn and s.shape == (64, 4, 2) and s.dtype == torch.uint8
        with pytest.raises(RuntimeError, match="takes 2 positional"):  # keyword-only, as the schema says
            torch.ops.npu.npu_grouped_matmul([x], [w], None)
    assert "torch_npu" not in sys.modules  # the stand-in was only there while the metas were defined
    assert "npu_grouped_matmul" in npu_ops.docs("npu_grouped_matmul")
    assert "npu_lightning_indexer" in npu_ops.docs("npu_lightning_indexer")
    assert "npu_mhc_pre_backward" not in npu_ops.docs("npu_mhc_pre")[:200]


def test_torch_meta_kernels_untouched(npu_ops):
    """The wheel's ``aten::_convolution`` Meta override is dropped: torch's own conv meta still serves."""
    with FakeTensorMode():
        out = torch.nn.functional.conv2d(torch.empty(1, 3, 8, 8), torch.empty(4, 3, 3, 3))
    assert out.shape == (1, 4, 6, 6)


def test_every_adapter_calls_torch_npu_ops_that_exist(npu_ops):
    """The NPU chains' torch_npu kernels (``info``'s NPU chain column): each names a torch_npu op of the pinned wheel
    (FlashMLA's Ascend release's ``flash_mla.*`` ops and DeepSelect's Ascend build ``deep_select.*`` are their
    libraries' kernels: tests/npu/test_flash_mla_ascend_adapter.py, tests/upstream/test_deep_select_backend.py)."""
    from torch_ascend_moe.backends import chain, npu

    npu.register()
    for op in chain.ops_with_kernels("npu"):
        for k in chain.chain(op, "npu"):
            if k.library != "torch_npu":
                continue
            name = k.calls.split(" ")[0]
            assert hasattr(torch.ops.npu, name) and name not in npu_ops.failed, f"{op}: torch_npu has no {name}"
