"""Run Megatron-LM's own DeepEP glue (``megatron/core/transformer/moe/fused_a2a.py``) unchanged against
``torch_ascend_moe.deep_ep`` on spawned gloo ranks, with autograd:

    python tools/megatron_fused_a2a_check.py /path/to/megatron/core/transformer/moe/fused_a2a.py [--ranks 2]

The file is loaded as it is, with ``import deep_ep`` resolving to our package and ``megatron.core.utils`` reduced to
the one name it imports (``internal_api``, a decorator); its ``fused_dispatch`` / ``fused_combine`` (autograd
Functions over ``Buffer.get_dispatch_layout`` / ``dispatch`` / ``combine``, ``EventOverlap(EventHandle())``) then
run the checks of ``tests.distributed.deep_ep_bodies.fused_a2a_autograd`` (closed-form outputs and gradients),
synchronous and with ``async_finish``. Not run in CI (it needs Megatron's file; CI runs our transcription of the
same calls, ``check_megatron_fused_a2a_calls``). Tested with NVIDIA/Megatron-LM@d98e8a6 (2 and 4 ranks).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load(path: str):
    import torch_ascend_moe.deep_ep as deep_ep
    from torch_ascend_moe.testing.upstream import install_as

    install_as(deep_ep, "deep_ep")
    for name in ("megatron", "megatron.core"):
        sys.modules.setdefault(name, types.ModuleType(name))
    utils = types.ModuleType("megatron.core.utils")
    utils.internal_api = lambda obj: obj
    sys.modules["megatron.core.utils"] = utils
    spec = importlib.util.spec_from_file_location("megatron_fused_a2a", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.HAVE_DEEP_EP, "Megatron decided DeepEP is not installed (its import of deep_ep failed)"
    return module


def _rank(rank: int, world_size: int, store_path: str, path: str) -> None:
    sys.path.insert(0, str(ROOT))
    from tests.distributed import run_named
    from tests.distributed.deep_ep_bodies import fused_a2a_autograd

    def check(rank, world_size):
        module = _load(path)
        for async_finish in (False, True):
            fused_a2a_autograd(module.fused_dispatch, module.fused_combine, rank, world_size, async_finish)
        if rank == 0:
            print(f"Megatron's fused_dispatch / fused_combine: outputs and gradients as expected on {world_size} ranks")

    run_named({"megatron": check}, rank, world_size, store_path, "megatron")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("fused_a2a", help="path to Megatron-LM's megatron/core/transformer/moe/fused_a2a.py")
    parser.add_argument("--ranks", type=int, default=2, help="gloo ranks (a divisor of the 8 experts)")
    args = parser.parse_args()
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        mp.spawn(_rank, args=(args.ranks, store, os.path.abspath(args.fused_a2a)), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
