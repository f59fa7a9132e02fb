"""``torch_ascend_moe.deep_ep`` (DeepEP V1 ``Buffer``) on 2 spawned gloo ranks: the V1 points of issue 16, one
spawn per check (tests.distributed.deep_ep_bodies)."""

import socket

import pytest
import torch
import torch.multiprocessing as mp

from tests.distributed.deep_ep_bodies import CHECKS, internode_handle, reference_handle, run_check, upstream_style
from tests.ep.specs import random_routing
from torch_ascend_moe.deep_ep.buffers.legacy import _DeepEPHandle


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_deep_ep_buffer(name, tmp_path):
    mp.spawn(run_check, args=(2, str(tmp_path / "store"), name), nprocs=2, join=True)


def test_shrink_mode_on_four_ranks(tmp_path):
    """Ranks 1 and 3 never reach the low-latency calls; ranks 0 and 2 mask them and go on (deep_ep_bodies)."""
    mp.spawn(run_check, args=(4, str(tmp_path / "store"), "shrink_masks_ranks_that_never_arrive"), nprocs=4, join=True)


def test_deep_ep_utils_as_upstream_tests_use_them():
    """``deep_ep.utils`` (``math``, ``envs``, ``testing``, ``event``): a DeepEP-style test script that joins
    through ``init_dist`` (upstream's environment variables) on a free port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(upstream_style, args=(2, port), nprocs=2, join=True)


def test_internode_handle_on_16_ranks(tmp_path):
    """The buffer's internode path (R > 8): 16 spawned gloo ranks, two "nodes" of 8."""
    mp.spawn(internode_handle, args=(16, str(tmp_path / "store")), nprocs=16, join=True)


def _layouts(num_ranks: int, tokens: list[int], seed: int) -> list[torch.Tensor]:
    from torch_ascend_moe.ops.ep import ep_dispatch_layout

    g = torch.Generator().manual_seed(seed)
    experts = 2 * num_ranks
    return [ep_dispatch_layout(random_routing(t, 4, experts, g), experts, num_ranks)[3] for t in tokens]


@pytest.mark.parametrize("num_ranks", [16, 24])
def test_internode_handle_fields(num_ranks):
    """DeepEP's internode 10-tuple (R > 8: nodes of 8), built from every rank's ``is_token_in_rank`` (what the
    buffer all-gathers) without spawning R processes: each rank's fields equal upstream's kernels simulated token
    by token; ``handle[-4]`` (``recv_gbl_rank_prefix_sum``, what DeepEP's internode test reads) is the inclusive
    prefix over source ranks of the tokens this rank receives; ``recv_src_meta`` is ``[N, 8]`` bytes."""
    tokens = [(5 * r + 3) % 17 for r in range(num_ranks)]  # uneven, one rank with none
    in_rank = _layouts(num_ranks, tokens, seed=num_ranks)
    for rank in (0, 7, 9, num_ranks - 1):
        for channels in (1, 3, 10):
            rows = sum(int(m[:, rank].sum()) for m in in_rank)
            fields = _DeepEPHandle.internode(rank, channels, in_rank, rows)
            assert len(fields) == 10
            received = torch.tensor([int(m[:, rank].sum()) for m in in_rank])
            assert fields[-4].dtype == torch.int32 and torch.equal(fields[-4], received.cumsum(0).int())
            assert fields[7].dtype == torch.uint8 and fields[7].shape == (rows, 8)
            want = reference_handle(rank, channels, in_rank)
            for k, (got, exp) in enumerate(zip(fields, want)):
                assert got.dtype == exp.dtype and torch.equal(got, exp), f"rank {rank}, C={channels}, field {k}"


def test_intranode_handle_fields_pure():
    """The 6 intranode fields from the counts alone (what the buffer all-gathers), with padding rows: equal to
    upstream's kernels simulated token by token."""
    num_ranks, tokens = 8, [7, 0, 12, 3, 9, 9, 1, 16]
    in_rank = _layouts(num_ranks, tokens, seed=3)
    sent = torch.stack([m.sum(0) for m in in_rank])
    for rank in range(num_ranks):
        want = reference_handle(rank, 4, in_rank, num_rows=40)
        fields = _DeepEPHandle.intranode(rank, 4, in_rank[rank], sent, torch.tensor(tokens), want[3])
        for k, (got, exp) in enumerate(zip(fields, want)):
            assert got.dtype == exp.dtype and torch.equal(got, exp), f"rank {rank}, field {k}"


def test_configs_and_size_hints_equal_upstreams():
    """``Buffer.get_dispatch_config`` / ``get_combine_config`` at every rank count DeepEP tunes, and their buffer size
    hints (what Megatron's and SGLang's buffers are sized from), equal the stand-in's, which is written from
    upstream's tables and ``config.hpp``; so do ``Config``'s checks (an odd ``num_sms`` only fails the hints)."""
    import torch_ascend_moe.deep_ep as ours
    from tests.upstream.standin import installed

    with installed("deep_ep") as upstream:
        for name in ("get_dispatch_config", "get_combine_config"):
            for ranks in (2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 144, 160):
                mine, theirs = getattr(ours.Buffer, name)(ranks), getattr(upstream.Buffer, name)(ranks)
                for hidden_bytes in (7168 * 2, 4096):
                    got = (mine.get_nvl_buffer_size_hint(hidden_bytes, ranks),
                           mine.get_rdma_buffer_size_hint(hidden_bytes, ranks))  # fmt: skip
                    want = (theirs.get_nvl_buffer_size_hint(hidden_bytes, ranks),
                            theirs.get_rdma_buffer_size_hint(hidden_bytes, ranks))  # fmt: skip
                    assert got == want, (name, ranks, hidden_bytes, got, want)
        odd = ours.Config(21, 6, 256, 6, 128)  # upstream's constructor takes it; its hints assert an even count
        with pytest.raises(ValueError, match="argument 'num_sms' value: expected an even number"):
            odd.get_nvl_buffer_size_hint(4096, 8)
        for args in ((20, 8, 8), (20, 6, 256, 8, 5), (20, 6, 256, 0, 128), (-2,)):
            with pytest.raises(RuntimeError):
                upstream.Config(*args)
            with pytest.raises(ValueError, match="deep_ep.Config"):
                ours.Config(*args)
