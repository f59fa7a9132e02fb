"""``deep_ep.utils.envs``: process-group and environment helpers of DeepEP's tests, upstream's names.

``init_dist`` reads upstream's environment (``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` = nodes, ``RANK`` =
node rank) and, as upstream, makes BF16 the default dtype. Upstream always uses NCCL and CUDA; without CUDA
this uses gloo and leaves the default device alone, so DeepEP's test scripts run on CPU. The hardware probes
(NVLink, RDMA NIC) answer as upstream's do when their tools are missing: 0 GB/s, no fast atomics.
``get_physical_domain_size`` / ``get_logical_domain_size`` (V2's topology) count the ranks on each host
(one all_gather of host names, cached per group); ``TORCH_ASCEND_MOE_EP_RANKS_PER_NODE=n`` makes every ``n``
consecutive ranks one node instead, to run a multi-node topology on one machine.
"""

from __future__ import annotations

import functools
import os
import random
import re
import socket
import subprocess
import zlib

import torch
import torch.distributed as dist

# Upstream DeepEP and DeepGEMM ship the same process-group helpers: one implementation serves both.
from torch_ascend_moe.deep_gemm.utils.dist import dist_print
from torch_ascend_moe.deep_gemm.utils.dist import init_dist as _join

_local_seed = 0
_global_seed = 0

_DEFAULT_NIC_NAME = os.getenv("EP_NIC_NAME", "mlx5_0")


def init_seed(global_seed: int) -> None:
    """Seed ``torch`` and ``random`` with ``global_seed + rank`` (the local seed)."""
    global _local_seed, _global_seed
    _local_seed = global_seed + dist.get_rank()
    _global_seed = global_seed
    torch.manual_seed(_local_seed)
    random.seed(_local_seed)


def get_local_seed() -> int:
    return _local_seed


def get_global_seed() -> int:
    return _global_seed


def init_dist(local_rank: int, num_local_ranks: int, seed: int = 0) -> tuple[int, int, dist.ProcessGroup]:
    """Join the job as ``node_rank * num_local_ranks + local_rank`` (DeepGEMM's ``init_dist``, the same helper
    upstream), then as DeepEP's: BF16 default dtype and ``init_seed(seed)``. Returns ``(rank, world size, group
    of all)``."""
    joined = _join(local_rank, num_local_ranks)
    torch.set_default_dtype(torch.bfloat16)
    init_seed(seed)
    return joined


def check_nvlink_connections(group: dist.ProcessGroup) -> None:
    """Upstream asserts NVLink between PCIe GPUs of the group; nothing to check without CUDA or NVLink."""
    if torch.cuda.is_available() and "PCIE" in torch.cuda.get_device_name():
        if group.size() > 2:
            raise RuntimeError("deep_ep.utils.envs.check_nvlink_connections: PCIe GPUs only have pairwise NVLink")


def check_torch_deterministic() -> None:
    """Deterministic algorithms and ``fill_uninitialized_memory`` must not both be on (upstream's assert)."""
    if torch.are_deterministic_algorithms_enabled() and torch.utils.deterministic.fill_uninitialized_memory:
        raise RuntimeError(
            "deep_ep.utils.envs.check_torch_deterministic: torch.use_deterministic_algorithms and "
            "torch.utils.deterministic.fill_uninitialized_memory are both enabled"
        )


@functools.lru_cache
def get_nvlink_gbs(factor: float = 0.9) -> float:
    """Total NVLink GB/s of this GPU from ``nvidia-smi nvlink -s`` times ``factor``; 0 when it cannot be read."""
    try:
        output = subprocess.run(["nvidia-smi", "nvlink", "-s"], capture_output=True, text=True, check=True).stdout
        match = re.search(r"GPU \d+:.*?(?=^GPU \d+:|^$)", output, re.MULTILINE | re.DOTALL)
        links = re.findall(r"Link \d+:\s*([\d\.]+) GB/s", match.group(0)) if match else []
        if not links:
            raise RuntimeError("no NVLink in nvidia-smi's output")
        return sum(float(bw) for bw in links) * factor
    except Exception as e:  # noqa: BLE001  (upstream: any failure means 0)
        print(f"Failed to get NVLink connection speed: {e}")
        return 0


@functools.lru_cache
def check_fast_rdma_atomic_support(nic_name: str = _DEFAULT_NIC_NAME) -> bool:
    """Whether ``ibstat`` reports the NIC as MT4131 (or newer); False when it cannot be read."""
    try:
        output = subprocess.run(["ibstat"], capture_output=True, text=True, check=True).stdout
        match = re.search(rf"CA '{nic_name}'.*?CA type:\s*(\S+)", output, re.DOTALL)
        return bool(match) and match.group(1) == "MT4131"
    except Exception:  # noqa: BLE001
        return False


@functools.lru_cache
def get_rdma_gbs(nic_name: str = _DEFAULT_NIC_NAME) -> float:
    """The NIC's port rate / 8 from ``ibstat`` in GB/s; 0 when it cannot be read."""
    try:
        output = subprocess.run(["ibstat"], capture_output=True, text=True, check=True).stdout
        match = re.search(rf"CA '{nic_name}'.*?Port \d+:\s*.*?Rate:\s*(\d+)", output, re.DOTALL)
        if not match:
            raise RuntimeError(f"no rate for {nic_name} in ibstat's output")
        return int(match.group(1)) / 8
    except Exception as e:  # noqa: BLE001
        print(f"Failed to get RDMA connection speed: {e}")
        return 0


_DOMAINS: dict[str, tuple[int, int]] = {}


def get_physical_domain_size(group: dist.ProcessGroup) -> tuple[int, int]:
    """``(num_rdma_ranks, num_nvlink_ranks)``: nodes, and ranks per node (upstream reads them from its NCCL
    communicator). Collective the first time per group: the ranks exchange host names. Ranks must be laid out
    node-major with the same count per node, as upstream's ``rank = node · ranks_per_node + local`` assumes."""
    from torch_ascend_moe.distributed import waits

    key = group.group_name
    if key not in _DOMAINS:
        r = group.size()
        per_node = os.environ.get("TORCH_ASCEND_MOE_EP_RANKS_PER_NODE")
        if per_node is not None:
            n = int(per_node)
            if n < 1 or r % n:
                raise ValueError(
                    "deep_ep.get_physical_domain_size: TORCH_ASCEND_MOE_EP_RANKS_PER_NODE value: expected a "
                    f"positive divisor of the group size {r}, got {per_node}"
                )
            hosts = [i // n for i in range(r)]
        else:
            device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else "cpu"
            mine = torch.tensor([zlib.crc32(socket.gethostname().encode())], dtype=torch.int64, device=device)
            gathered = [torch.empty_like(mine) for _ in range(r)]
            work = dist.all_gather(gathered, mine, group=group, async_op=True)
            waits.wait("deep_ep.get_physical_domain_size", group, work, 300.0, "the host-name exchange")
            hosts = [int(t) for t in gathered]
        firsts = list(dict.fromkeys(hosts))
        per = len(hosts) // len(firsts)
        node_major = all(hosts[i] == firsts[i // per] for i in range(r)) and len(hosts) % len(firsts) == 0
        if not node_major:
            raise ValueError(
                "deep_ep.get_physical_domain_size: the group's ranks are not node-major with equal ranks per node "
                f"(host of each rank: {hosts}); DeepEP's topology needs rank = node * ranks_per_node + local rank"
            )
        _DOMAINS[key] = (len(firsts), per)
    return _DOMAINS[key]


def get_logical_domain_size(group: dist.ProcessGroup, allow_hybrid_mode: bool = True) -> tuple[int, int]:
    """``(num_scaleout_ranks, num_scaleup_ranks)``: the physical domains in hybrid mode, else one scale-out
    domain whose scale-up peers are all ranks (upstream's direct mode)."""
    nodes, per_node = get_physical_domain_size(group)
    return (nodes, per_node) if allow_hybrid_mode else (1, nodes * per_node)


__all__ = [
    "check_fast_rdma_atomic_support",
    "check_nvlink_connections",
    "check_torch_deterministic",
    "dist_print",
    "get_global_seed",
    "get_local_seed",
    "get_logical_domain_size",
    "get_nvlink_gbs",
    "get_physical_domain_size",
    "get_rdma_gbs",
    "init_dist",
    "init_seed",
]
