"""Self-tests of the CPU stand-in for ``deep_ep`` (``tests/standins/deep_ep``).

In-process: the pieces that need no process group (``Config`` and its hints, the low-latency size hint, the config
tables, events, ``configure``), each checked against arithmetic written here from upstream's formulas
(``csrc/legacy/config.hpp``). On 2 and 4 spawned gloo ranks: dispatch / cached dispatch / combine / low-latency,
the handle's contents, host checks, undersized buffers and corrupted handles
(``tests.distributed.deep_ep_standin_bodies``: one spawn per world size runs every check).
"""

import os

import pytest
import torch
import torch.multiprocessing as mp

from tests.distributed.deep_ep_standin_bodies import rank_checks
from tests.upstream.standin import installed


@pytest.fixture
def deep_ep():
    with installed("deep_ep") as module:
        yield module


def test_exports_and_version(deep_ep):
    assert deep_ep.__version__ == "2.1.0" and deep_ep.topk_idx_t == torch.int64
    for name in ("Buffer", "Config", "EventHandle", "EventOverlap", "ElasticBuffer", "EPHandle"):
        assert hasattr(deep_ep, name)
    with pytest.raises(NotImplementedError, match="V2"):
        deep_ep.ElasticBuffer(None)
    assert deep_ep.Buffer.is_sm90_compiled() is True
    assert deep_ep.Buffer.num_sms == 20


def test_config_checks_and_hidden_fields(deep_ep):
    config = deep_ep.Config()
    with pytest.raises(AttributeError):
        config.num_sms  # noqa: B018 -- pybind11 exposes no fields upstream
    with pytest.raises(RuntimeError, match=r"config\.hpp:43\): num_max_nvl_chunked_send_tokens < "):
        deep_ep.Config(20, 8, 8)
    # rdma_recv is first rounded up to a multiple of rdma_send (config.hpp:47): 5 -> 8, not more than 8
    with pytest.raises(RuntimeError, match=r"config\.hpp:48\): num_max_rdma_chunked_send_tokens < "):
        deep_ep.Config(20, 6, 256, 8, 5)
    with pytest.raises(TypeError, match="incompatible"):
        deep_ep.Config(20.0)


def _nvl_hint(num_sms, nvl_recv, hidden_bytes, ranks):
    channels, nvl, rdma = num_sms // 2, min(ranks, 8), max(ranks // 8, 1)
    total = channels * nvl * (2 * rdma + 3) * 4
    total += channels * nvl * nvl_recv * (hidden_bytes + 8 + 128 * 8 + 128 * 4 + 128 * 4)
    return -(-total // 128) * 128


def _rdma_hint(num_sms, rdma_recv, hidden_bytes, ranks):
    channels, rdma = num_sms // 2, ranks // 8
    total = channels * rdma * 18 * 2 * 4
    total += channels * rdma * rdma_recv * 2 * (hidden_bytes + 8 + 128 * 8 + 128 * 4 + 128 * 4 + 16)
    return -(-total // 128) * 128


@pytest.mark.parametrize("ranks", [2, 4, 8, 16, 64])
def test_buffer_size_hints(deep_ep, ranks):
    for get in (deep_ep.Buffer.get_dispatch_config, deep_ep.Buffer.get_combine_config):
        config = get(ranks)
        _, args = deep_ep._standin.CALLS[-1]
        assert args["num_sms"] == 20
        for hidden_bytes in (7168 * 2, 4096):
            got = config.get_nvl_buffer_size_hint(hidden_bytes, ranks)
            assert got == _nvl_hint(20, args["num_max_nvl_chunked_recv_tokens"], hidden_bytes, ranks)
            rdma = config.get_rdma_buffer_size_hint(hidden_bytes, ranks)
            send = args["num_max_rdma_chunked_send_tokens"]
            recv = -(-args["num_max_rdma_chunked_recv_tokens"] // send) * send  # rounded up (config.hpp:47)
            assert rdma == (0 if ranks <= 8 else _rdma_hint(20, recv, hidden_bytes, ranks))


def test_config_tables(deep_ep):
    deep_ep.Buffer.get_dispatch_config(16)
    assert deep_ep._standin.CALLS[-1] == (
        "Config",
        {
            "num_sms": 20,
            "num_max_nvl_chunked_send_tokens": 36,
            "num_max_nvl_chunked_recv_tokens": 288,
            "num_max_rdma_chunked_send_tokens": 20,
            "num_max_rdma_chunked_recv_tokens": 128,
        },
    )
    deep_ep.Buffer.set_num_sms(24)
    deep_ep.Buffer.get_combine_config(8)
    assert (
        deep_ep._standin.CALLS[-1][1]["num_sms"] == 24
        and deep_ep._standin.CALLS[-1][1]["num_max_nvl_chunked_send_tokens"] == 4
    )
    with pytest.raises(AssertionError, match="The SM count must be even"):
        deep_ep.Buffer.set_num_sms(3)
    with pytest.raises(AssertionError, match="Unsupported number of EP ranks: 3"):
        deep_ep.Buffer.get_dispatch_config(3)
    deep_ep._standin.configure()  # a fresh library load resets the class default
    assert deep_ep.Buffer.num_sms == 20


@pytest.mark.parametrize(
    ("tokens", "hidden", "ranks", "experts"), [(128, 7168, 8, 288), (8, 2048, 4, 8), (3, 4096, 2, 6)]
)
def test_low_latency_size_hint(deep_ep, tokens, hidden, ranks, experts):
    msg_d = 16 + max(2 * hidden, hidden + 4 * hidden // 128)
    msg_c = 4 * hidden // 128 + 2 * hidden
    send = max(tokens * msg_d, experts * tokens * msg_c)
    recv = max(experts * tokens * msg_d, experts * tokens * msg_c)
    sig = -(-4 * experts // 128) * 128
    total = 2 * (send + recv + sig)
    assert deep_ep.Buffer.get_low_latency_rdma_size_hint(tokens, hidden, ranks, experts) == (total + 128) // 128 * 128


def test_event_overlap(deep_ep):
    event = deep_ep.Buffer.capture()
    seen = []
    event.register_hook_after_wait(lambda: seen.append(1))
    with pytest.raises(AssertionError, match="already registered"):
        event.register_hook_after_wait(lambda: None)
    with event(release_handle=True):
        pass
    assert seen == [1] and event.event is None
    with pytest.raises(AssertionError):
        deep_ep.EventOverlap().current_stream_wait()


class _MirrorComm:
    """An mpi4py-like communicator (``Buffer(None, ..., comm=...)``) whose every rank holds this process's data."""

    def __init__(self, rank, size):
        self.rank, self.size = rank, size

    def Get_rank(self):  # noqa: N802 -- mpi4py's names
        return self.rank

    def Get_size(self):  # noqa: N802
        return self.size

    def allgather(self, obj):
        return [obj] * self.size

    def alltoall(self, items):
        return [items[self.rank]] * self.size

    def Barrier(self):  # noqa: N802
        pass


@pytest.fixture
def restored_environ():
    """The constructor sets NVSHMEM_* variables as upstream does: put the environment back afterwards."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_internode_layout_and_not_modelled(deep_ep, restored_environ):
    buffer = deep_ep.Buffer(None, int(1e8), int(1e8), comm=_MirrorComm(3, 16))
    assert buffer.rank == 3 and buffer.group_size == 16 and os.environ["NVSHMEM_IBGDA_NUM_RC_PER_PE"] == "24"
    # 64 experts, 4 per rank: 0 -> rank 0, 17 -> rank 4 (node 0), 40 and 41 -> rank 10 (node 1); 100 is ignored
    idx = torch.tensor([[0, 17, -1], [40, 41, 100]])
    per_rank, per_rdma, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, 64)
    assert per_rdma.tolist() == [1, 1]
    assert per_rank.nonzero().view(-1).tolist() == [0, 4, 10] and per_rank[10] == 1
    assert per_expert.sum() == 4 and in_rank.sum() == 3
    x = torch.zeros(2, 128, dtype=torch.bfloat16)
    kw = {"num_tokens_per_rank": per_rank, "is_token_in_rank": in_rank, "num_tokens_per_expert": per_expert}
    with pytest.raises(AssertionError, match="Internode dispatch does not support `num_worst_tokens > 0`"):
        buffer.dispatch(x, num_worst_tokens=4, **kw)
    with pytest.raises(NotImplementedError, match="DeepEP stand-in: internode dispatch"):
        buffer.dispatch(x, **kw)
    with pytest.raises(NotImplementedError, match="DeepEP stand-in: internode combine"):
        buffer.combine(x, None)


@pytest.mark.parametrize("world_size", [2, 4])
def test_on_ranks(world_size, tmp_path):
    mp.spawn(rank_checks, args=(world_size, str(tmp_path / "store")), nprocs=world_size, join=True)
