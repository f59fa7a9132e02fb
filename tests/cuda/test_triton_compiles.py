"""Every Triton kernel launch the op samples make, compiled for a Hopper GPU (sm90) on this CPU machine.

Triton's interpreter, which runs our kernels in CI, executes the kernel source as Python, and accepts code the
compiler rejects (found on the first lent H200: an early ``return`` in a constexpr branch compiles both returns,
"Inconsistent return types"). Here each op with a Triton kernel runs its contract samples through its CUDA kernel
under the interpreter while ``_triton.launch`` records every launch; a subprocess without the interpreter then
compiles each distinct launch (the kernel, its constexprs, argument dtypes and alignment) through Triton's whole
pipeline to a cubin with its bundled ptxas, against a stand-in driver that names an sm90 target. No GPU runs
anything: a compile error, not a wrong value, is what this finds.
"""

from __future__ import annotations

import importlib
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from tests.chains import cuda_chain, labels  # noqa: E402
from torch_ascend_moe.backends.cuda import _triton  # noqa: E402

pytestmark = pytest.mark.skipif(
    not _triton.INTERPRETED, reason="Triton's interpreter is off in this process (a GPU compiles the kernels)"
)

ROOT = Path(__file__).resolve().parents[2]


def _specs():
    """The contract specs of every op whose CUDA chain starts with a Triton kernel, each with that chain."""
    specs = []
    for path in sorted(ROOT.glob("tests/*/specs.py")):
        module = importlib.import_module(f"tests.{path.parent.name}.specs")
        for spec in getattr(module, "SPECS", []):
            if labels(spec.name, "cuda")[0].startswith("triton"):
                specs.append((spec, getattr(cuda_chain, spec.name)))
    return specs


def _describe(value):
    """What Triton specializes a launch on: tensors by dtype and 16-byte alignment, ints by value (1, a multiple of
    16); constexprs (and floats, bools, None) by value."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, value.data_ptr() % 16 == 0)
    if isinstance(value, int) and not isinstance(value, bool):
        return ("int", value)
    return ("value", value)


def _key(kernel, args, meta):
    """A launch's compile-relevant identity: the kernel, its constexprs, its tensors' dtypes and alignment (integer
    arguments' own specializations, 1 or a multiple of 16, change vectorization, not what compiles: left out, which
    saves a quarter of the compiles)."""
    described = tuple(("int",) if d[0] == "int" else d for d in map(_describe, args))
    return (kernel.fn.__module__, kernel.fn.__name__, described, tuple(sorted(meta.items())))


def _record():
    """Distinct launches of every Triton op's samples, as (module, kernel name, grid, args, meta) descriptions."""
    launches = {}
    _triton.RECORDED = recorded = []
    try:
        for spec, kernel in _specs():
            for dtype in spec.dtypes:
                for small in (False, True):
                    for s in spec.sample_inputs("cpu", dtype, small=small):
                        recorded.clear()
                        try:
                            kernel(*s.args)
                        except Exception:  # a sample the op rejects: what was launched before still counts
                            pass
                        for k, grid, args, meta in recorded:
                            key = _key(k, args, meta)
                            if key not in launches:
                                grid = grid if isinstance(grid, tuple) else (1,)
                                launches[key] = (key[0], key[1], grid, [_describe(a) for a in args], dict(meta))
    finally:
        _triton.RECORDED = None
    return list(launches.values())


COMPILER = textwrap.dedent(
    """
    import importlib, pickle, sys, torch, triton
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    class Hopper:  # the driver's answers a compile needs: no GPU is touched
        def get_current_target(self): return GPUTarget("cuda", 90, 32)
        def get_current_device(self): return 0
        def get_current_stream(self, device=None): return 0
        def get_active_torch_device(self): return torch.device("cpu")

    driver.set_active(Hopper())
    failures = []
    for module, name, grid, args, meta in pickle.load(open(sys.argv[1], "rb")):
        kernel = getattr(importlib.import_module(module), name)
        values = []
        for kind, *rest in args:
            if kind == "tensor":
                dtype, aligned = rest
                t = torch.empty(64, dtype=dtype)
                values.append(t if aligned else t[1:])
            else:
                values.append(rest[0])
        try:
            kernel.warmup(*values, grid=grid, **meta)
        except Exception as e:
            failures.append(f"{module}.{name} {meta}: {type(e).__name__}: {e}")
    print(f"compiled {len(pickle.load(open(sys.argv[1], 'rb')))} launches, {len(failures)} failed")
    print("\\n\\n".join(failures))
    sys.exit(1 if failures else 0)
    """
)


def test_every_launch_compiles_for_sm90(tmp_path):
    launches = _record()
    names = {(m, n) for m, n, *_ in launches}
    assert len(names) >= 10, f"too few kernels recorded: {sorted(names)}"
    path = tmp_path / "launches.pkl"
    path.write_bytes(pickle.dumps(launches))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "cache"), TRITON_DEFAULT_FP_FUSION="1", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", COMPILER, str(path)], env=env, capture_output=True, text=True, timeout=1500
    )
    assert done.returncode == 0, done.stdout[-20000:] + done.stderr[-5000:]
