"""The stored bench runs (``docs/bench/<name>.json``, each written by ``python -m torch_ascend_moe bench ... --json``)
as the performance page's tables and plots, rendered when the site is built (``tools/docs_hooks.py``), so that no
number on the page is typed by hand and no image is committed.

A page asks for a run with ``<!-- bench: <name> -->``; it becomes the run's facts (command, date, machine, note), a
table with one row per case and a bar plot of the speedups (``img/bench/<name>.png``, generated in memory).
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "docs" / "bench"
PLACEHOLDER = re.compile(r"<!-- bench: ([A-Za-z0-9_.-]+) -->")


def runs() -> dict[str, dict]:
    """Every stored run, by file name without ``.json``; e.g. ``runs()["cpu-gemm"]["results"][0]["speedup"]``."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(RUNS.glob("*.json"))}


def placeholders(markdown: str) -> list[str]:
    """The run names a page asks for, in page order: ``placeholders("<!-- bench: cpu-gemm -->") == ["cpu-gemm"]``."""
    return PLACEHOLDER.findall(markdown)


def image_path(name: str) -> str:
    """Where the run's plot sits in the site (relative to ``docs/``): ``img/bench/<name>.png``."""
    return f"img/bench/{name}.png"


def _label(row: dict, threads: bool) -> str:
    label = f"{row['case']} ({row['threads']} threads)" if threads else row["case"]
    return label + (" [one core busy]" if row.get("busy") else "")


def _several_thread_counts(run: dict) -> bool:
    return len({r.get("threads") for r in run["results"]}) > 1


def _num(x: float | None) -> str:
    """Four significant digits, enough for a timing that varies by percents between runs."""
    return "-" if x is None else f"{x:.4g}"


def _tflops(x: float) -> str:
    return "-" if not x else f"{x:.3g}"  # 0: the case counts no FLOPs (a copy, a permutation)


def table(run: dict) -> str:
    """The run's rows as a markdown table: case, each side's time (ms) and TFLOPS, the speedup (baseline time /
    ours), and each side's peak memory, bandwidth or page faults where the run measured them."""
    rows = run["results"]
    threads = _several_thread_counts(run)
    memory = any(r.get("ours_peak_mb") is not None for r in rows)
    bandwidth = any(r.get("ours_gbps") is not None for r in rows)
    faults = any(r.get("ours_faults") is not None for r in rows)
    head = ["case", "ours ms", "TFLOPS", "baseline", "baseline ms", "TFLOPS", "speedup"]
    head += ["peak MB ours", "peak MB baseline"] if memory else []
    head += ["GB/s ours", "GB/s baseline"] if bandwidth else []
    head += ["page faults ours", "page faults baseline"] if faults else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [_label(r, threads), _num(r["ours_ms"]), _tflops(r["ours_tflops"]), r["baseline"]]
        cells += [_num(r["baseline_ms"]), _tflops(r["baseline_tflops"]), f"{r['speedup']:.2f}×"]
        cells += [_num(r.get("ours_peak_mb")), _num(r.get("baseline_peak_mb"))] if memory else []
        cells += [_num(r.get("ours_gbps")), _num(r.get("baseline_gbps"))] if bandwidth else []
        cells += [_num(r.get("ours_faults")), _num(r.get("baseline_faults"))] if faults else []
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def plot_png(name: str, run: dict) -> bytes:
    """The run's speedup per case as horizontal bars from 1× on a log axis (green where ours is faster), as PNG."""
    # The Figure API with its default Agg canvas: no pyplot, so no global backend or state to set.
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    rows = run["results"]
    threads = _several_thread_counts(run)
    # A case may be timed against several baselines: the baseline is part of the bar's name.
    labels = [f"{_label(r, threads)} vs {r['baseline']}" for r in rows][::-1]
    speedups = [r["speedup"] for r in rows][::-1]
    fig = Figure(figsize=(11, 0.9 + 0.32 * len(rows)), layout="constrained")
    ax = fig.subplots()
    # Bars grow from 1× (a tie) to the speedup, left when ours is slower: a bar's length is how far from a tie.
    bars = ax.barh(
        labels, [s - 1 for s in speedups], left=1, color=["#2a9d4b" if s >= 1 else "#c0392b" for s in speedups]
    )
    ax.bar_label(bars, labels=[f"{s:.2f}×" for s in speedups], fontsize=7, padding=2)
    ax.set_xscale("log")
    ax.margins(x=0.15)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}×"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("speedup = baseline time / ours (log scale; right of the line: ours faster)")
    machine = run["machine"].get("gpu") or run["machine"].get("cpu") or "unknown machine"
    ax.set_title(f"{name}: {machine}, {run['date'][:10]}", fontsize=10)
    ax.tick_params(axis="y", labelsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    return buf.getvalue()


def _facts(name: str, run: dict) -> str:
    m = run["machine"]
    where = ", ".join(
        part
        for part in (
            m.get("gpu"),
            m.get("cpu") and f"{m['cpu']} ({m.get('cpu_count')} cores, {m.get('cpu_capability')})",
            m.get("torch") and f"torch {m['torch']}",
            m.get("triton") and f"Triton {m['triton']}",
        )
        if part
    )
    load = run.get("load_average") or {}
    if load.get("before") is not None:
        where += f"; load average {load['before']:.1f} before the run, {load['after']:.1f} after"
    lines = [f"- Command: `{run['command']}`", f"- Measured: {run['date']}, {where}"]
    if run.get("note"):
        lines.append(f"- Note: {run['note']}")
    if run.get("source"):
        lines.append(f"- Source: {run['source']}")
    lines.append(f"- Raw data: [bench/{name}.json](bench/{name}.json)")
    return "\n".join(lines)


def section(name: str, run: dict) -> str:
    """What ``<!-- bench: <name> -->`` becomes: the run's facts, its table and its plot."""
    return f"{_facts(name, run)}\n\n{table(run)}\n\n![{name}: speedup per case]({image_path(name)})\n"


def render(markdown: str, stored: dict[str, dict]) -> str:
    """``markdown`` with each placeholder replaced by its run's section; a name without a stored run is an error
    (the strict build must fail rather than show a stale or empty table)."""

    def replace(match: re.Match) -> str:
        name = match.group(1)
        if name not in stored:
            raise ValueError(f"<!-- bench: {name} -->: no docs/bench/{name}.json (stored: {sorted(stored)})")
        return section(name, stored[name])

    return PLACEHOLDER.sub(replace, markdown)
