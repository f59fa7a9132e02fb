"""DeepEP-Ascend's host-side tests (``tests/test_event_overlap_hooks_host.py``,
``tests/test_reference_optional_weights_host.py``), ported to our ``deep_ep``: ``EventOverlap``'s hook semantics
and ``refs.dispatch`` with optional weights, on CPU with single-rank collective doubles, as upstream runs them."""

from __future__ import annotations

from unittest.mock import Mock, patch

import pytest
import torch
import torch.distributed as dist

from torch_ascend_moe.deep_ep.utils import refs
from torch_ascend_moe.deep_ep.utils.event import EventOverlap


class FakeEvent:
    def __init__(self):
        self.wait_count = 0

    def current_stream_wait(self):
        self.wait_count += 1


@pytest.fixture
def overlap():
    event = FakeEvent()
    return EventOverlap(event), event


def test_hook_returns_result_and_runs_once(overlap):
    ov, event = overlap
    hook = Mock(return_value="done")
    ov.register_hook_after_wait(hook)
    assert ov.wait() == "done"
    assert ov.wait() is None
    hook.assert_called_once_with()
    assert event.wait_count == 2


def test_reentrant_wait_does_not_repeat_hook(overlap):
    ov, event = overlap
    calls = []

    def hook():
        calls.append("hook")
        if len(calls) == 1:
            ov.wait()

    ov.register_hook_after_wait(hook)
    ov.wait()
    assert calls == ["hook"] and event.wait_count == 2


def test_failing_hook_is_not_retried(overlap):
    ov, _ = overlap
    error = RuntimeError("partially applied epilogue")
    hook = Mock(side_effect=error)
    ov.register_hook_after_wait(hook)
    with pytest.raises(RuntimeError) as caught:
        ov.wait()
    assert caught.value is error and ov.hook_after_wait is None and ov.wait() is None
    hook.assert_called_once_with()


def test_hook_may_register_a_successor(overlap):
    ov, _ = overlap
    successor = Mock(return_value="second")

    def first():
        ov.register_hook_after_wait(successor)
        return "first"

    ov.register_hook_after_wait(first)
    assert ov.wait() == "first"
    successor.assert_not_called()
    assert ov.wait() == "second" and ov.hook_after_wait is None


def test_duplicate_registration_is_still_rejected(overlap):
    ov, _ = overlap
    ov.register_hook_after_wait(lambda: None)
    with pytest.raises(AssertionError, match="already registered"):  # upstream asserts
        ov.register_hook_after_wait(lambda: None)


def test_successful_wait_can_release_handle(overlap):
    ov, _ = overlap
    ov.register_hook_after_wait(lambda: "done")
    assert ov.current_stream_wait(release_handle=True) == "done" and ov.event is None


def test_native_wait_failure_does_not_consume_hook(overlap):
    ov, event = overlap
    hook = Mock()
    ov.register_hook_after_wait(hook)
    with (
        patch.object(event, "current_stream_wait", side_effect=RuntimeError("wait failed")),
        pytest.raises(RuntimeError),
    ):
        ov.wait()
    assert ov.hook_after_wait is hook
    hook.assert_not_called()


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("empty", [False, True])
def test_reference_dispatch_optional_weights(weighted, packed, empty):
    exchanges = []

    def exchange(output, input, output_split_sizes=None, input_split_sizes=None):
        assert output_split_sizes == input_split_sizes
        if input_split_sizes is not None:
            assert input_split_sizes == [input.shape[0]]
        exchanges.append(input)
        output.copy_(input)

    x = torch.arange(12, dtype=torch.float32).view(3, 4)
    indices = torch.tensor([[0, 1], [2, -1], [-1, -1]], dtype=torch.int64)
    weights = torch.tensor([[0.25, 0.75], [1.0, 0.0], [0.0, 0.0]]) if weighted else None
    scale = torch.arange(6, dtype=torch.float32).view(3, 2)
    with (
        patch.object(dist, "get_rank", return_value=0),
        patch.object(dist, "get_world_size", return_value=1),
        patch.object(dist, "all_to_all_single", side_effect=exchange),
    ):
        idx = torch.full_like(indices, -1) if empty else indices
        data, received_indices, received_weights, source_indices, counts = refs.dispatch(
            (x, scale) if packed else x, idx, weights, 3, 4
        )
    rows = 0 if empty else 2
    if packed:
        torch.testing.assert_close(data[0], x[:rows])
        torch.testing.assert_close(data[1], scale[:rows])
    else:
        torch.testing.assert_close(data, x[:rows])
    torch.testing.assert_close(received_indices, idx[:rows])
    torch.testing.assert_close(source_indices, torch.arange(rows, dtype=torch.int32))
    torch.testing.assert_close(counts, torch.tensor([rows], dtype=torch.int32))
    assert len(exchanges) == 4 + int(packed) + int(weighted)
    if weights is None:
        assert received_weights is None
    else:
        torch.testing.assert_close(received_weights, weights[:rows])


@pytest.mark.parametrize("reduce_in_local", [False, True])
def test_reference_combine_ascend_signature(reduce_in_local):
    """DeepEP-Ascend's ``refs.combine(y, topk_idx, num_experts, bias, reduce_in_local)`` (no scale-out) is
    upstream's direct-mode recipe on one domain of all ranks; a 1-tuple bias is allowed there."""
    g = torch.Generator().manual_seed(3)
    y = torch.randn(6, 4, 16, generator=g).bfloat16()
    idx = torch.randint(-1, 8, (6, 4), generator=g)
    bias = torch.randn(6, 16, generator=g).bfloat16()
    with patch.object(dist, "get_world_size", return_value=2):
        ascend = refs.combine(y, idx, 8, (bias,), reduce_in_local)
        keyword = refs.combine(y, idx, num_experts=8, bias=bias, reduce_in_local=reduce_in_local)
    upstream = refs.combine(y, idx, 1, 2, 8, bias, reduce_in_local, False)
    assert torch.equal(ascend, upstream) and torch.equal(keyword, upstream)
    with pytest.raises(TypeError, match="expected"):
        refs.combine(y, idx, 1, 2, 8, bias)
