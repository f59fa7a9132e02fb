"""Bodies that spawned gloo ranks run, and the one way each rank runs a named check."""

from __future__ import annotations

import datetime
import os
import traceback

import torch.distributed as dist


def run_named(checks: dict, rank: int, world_size: int, store_path: str, name: str, env=None, timeout_s=60):
    """Join the gloo group through ``store_path``, run ``checks[name](rank, world_size)``, end with a barrier.
    Exits the process (0, or 1 after printing the traceback): a broken group can hang interpreter shutdown."""
    os.environ.update(env or {})
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s)
    )
    import torch_ascend_moe  # noqa: F401

    try:
        checks[name](rank, world_size)
        dist.barrier()
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    os._exit(0)
