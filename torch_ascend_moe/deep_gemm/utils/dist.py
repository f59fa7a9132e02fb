"""``deep_gemm.utils.dist``: the process-group helpers DeepGEMM's multi-rank tests use.

``init_dist`` reads the same environment as upstream (``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` =
nodes, ``RANK`` = node rank). Upstream always uses NCCL and makes CUDA the default device; without CUDA
this uses gloo and leaves the default device alone, so the same test scripts run on CPU.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

__all__ = ["dist_print", "init_dist", "uneven_all_gather"]

_local_rank: int | None = None


def init_dist(local_rank: int, num_local_ranks: int) -> tuple[int, int, dist.ProcessGroup]:
    """Join the job as ``node_rank * num_local_ranks + local_rank``; returns ``(rank, world size, group of all)``."""
    global _local_rank
    ip = os.getenv("MASTER_ADDR", "127.0.0.1")
    port = int(os.getenv("MASTER_PORT", "8361"))
    num_nodes = int(os.getenv("WORLD_SIZE", "1"))
    node_rank = int(os.getenv("RANK", "0"))
    _local_rank = local_rank
    cuda = torch.cuda.is_available()
    params = {
        "backend": "nccl" if cuda else "gloo",
        "init_method": f"tcp://{ip}:{port}",
        "world_size": num_nodes * num_local_ranks,
        "rank": node_rank * num_local_ranks + local_rank,
    }
    if cuda:
        params["device_id"] = torch.device(f"cuda:{local_rank}")
    dist.init_process_group(**params)
    if cuda:
        torch.set_default_device("cuda")
        torch.cuda.set_device(local_rank)
    return dist.get_rank(), dist.get_world_size(), dist.new_group(list(range(num_local_ranks * num_nodes)))


def uneven_all_gather(tensor: torch.Tensor, dim: int = 0, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along ``dim`` in rank order; the sizes along ``dim`` may differ."""
    world_size = dist.get_world_size(group)
    size = torch.tensor([tensor.shape[dim]], device=tensor.device, dtype=torch.long)
    sizes = [torch.zeros_like(size) for _ in range(world_size)]
    dist.all_gather(sizes, size, group=group)
    sizes = [int(s) for s in sizes]
    # all_gather needs equal shapes: pad to the largest, then trim each rank's part back.
    pad = [0, 0] * (tensor.dim() - 1 - dim % tensor.dim()) + [0, max(sizes) - tensor.shape[dim]]
    padded = torch.nn.functional.pad(tensor, pad).contiguous()
    gathered = [torch.empty_like(padded) for _ in range(world_size)]
    dist.all_gather(gathered, padded, group=group)
    return torch.cat([g.narrow(dim, 0, n) for g, n in zip(gathered, sizes)], dim=dim)


def dist_print(s: str = "", once_in_node: bool = False) -> None:
    """Print ``s`` on every rank (or local rank 0 only), then barrier; needs ``init_dist`` first."""
    if _local_rank is None:
        raise RuntimeError("dist_print: call init_dist first")
    if not once_in_node or _local_rank == 0:
        print(s, flush=True)
    dist.barrier()
