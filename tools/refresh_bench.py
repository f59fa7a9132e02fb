"""Re-run stored bench runs with the command each records, overwriting ``docs/bench/<name>.json`` (the performance
page's tables and plots are rendered from these files when the site is built, ``tools/bench_pages.py``).

    python tools/refresh_bench.py             # every stored run this machine can make
    python tools/refresh_bench.py cpu-gemm    # just these

A run measured on a GPU is skipped where no GPU is visible, and a transcribed one (its ``source`` says from where)
cannot be re-run: a GPU run is refreshed by ``tools/device_check.sh`` on a lent machine, its
``$OUT/bench_cuda.json`` copied to ``docs/bench/<name>.json``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "docs" / "bench"


def cannot_refresh(run: dict) -> str | None:
    """Why this machine cannot re-make ``run`` (a transcribed table, a GPU run without a GPU), or None."""
    import torch

    if run.get("source"):
        return "a transcription, no run to repeat: " + run["source"]
    if run["machine"].get("gpu") and not torch.cuda.is_available():
        return f"measured on {run['machine']['gpu']}: refresh it with tools/device_check.sh on a lent GPU"
    return None


def refresh_command(name: str, run: dict) -> list[str]:
    """The argv that re-makes run ``name`` here: its recorded command with this interpreter, writing to
    ``docs/bench/<name>.json``."""
    argv = shlex.split(run["command"])[1:]  # without the recorded interpreter's name
    at = argv.index("--json")
    argv[at + 1] = f"docs/bench/{name}.json"  # relative (run from the root): the file records its command
    return [sys.executable, *argv]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="stored runs (file names in docs/bench/ without .json); none: all")
    names = parser.parse_args().names or sorted(p.stem for p in RUNS.glob("*.json"))
    for name in names:
        run = json.loads((RUNS / f"{name}.json").read_text())
        why = cannot_refresh(run)
        if why:
            print(f"{name}: skipped, {why}")
            continue
        argv = refresh_command(name, run)
        print(f"{name}: {shlex.join(argv)}", flush=True)
        subprocess.run(argv, cwd=ROOT, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
