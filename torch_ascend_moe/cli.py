"""``python -m torch_ascend_moe {demo,info,bench}`` (also the ``torch-ascend-moe`` console script)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys

import torch
from rich.console import Console
from rich.progress import track
from rich.table import Table

import torch_ascend_moe
from torch_ascend_moe import NAMESPACE, _registry, backends, bench
from torch_ascend_moe.backends import chain

_KERNEL_KEYS = {"CPU": "CPU", "CUDA": "CUDA", "NPU": "PrivateUse1"}


def op_names() -> list[str]:
    """Every op registered in the ascend_moe namespace, read from the dispatcher."""
    return _registry.op_names()


def capabilities(name: str) -> dict[str, bool]:
    """What the live registrations provide for ``ascend_moe::name``."""
    from torch._library.simple_registry import singleton
    from torch.utils.flop_counter import flop_registry

    qualname = f"{NAMESPACE}::{name}"
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    # Computed: a device served by the CompositeExplicitAutograd portable kernel counts.
    caps = {
        device: torch._C._dispatch_has_computed_kernel_for_dispatch_key(qualname, key)
        for device, key in _KERNEL_KEYS.items()
    }
    caps["fake"] = singleton.find(qualname).fake_impl.kernel is not None or has(qualname, "Meta")
    caps["autograd"] = has(qualname, "Autograd") or has(qualname, "AutogradCPU")
    packet = getattr(torch.ops.ascend_moe, name)
    caps["flops"] = packet in flop_registry or packet.default in flop_registry
    caps["pt2"] = torch.Tag.pt2_compliant_tag in packet.default.tags
    return caps


def chains() -> dict[str, dict[str, list[str]]]:
    """Every op's kernel chain per device (``backends.chain``), first choice first: what ``choose`` asks in
    order. Every device's kernels are declared to read them (harmless on a machine without that device)."""
    backends.register_all()
    return {op: {d: [k.label for k in chain.chain(op, d)] for d in chain.devices()} for op in op_names()}


def build_info() -> dict[str, object]:
    ext = torch_ascend_moe._C
    return {
        "torch_ascend_moe": torch_ascend_moe.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "extension": ext.__file__,
        "built with torch": ext.built_with_torch,
        "compiler": ext.compiler,
        "OpenMP": bool(ext.openmp),
        "CPU threads": torch.get_num_threads(),
        "CPU capability": torch.backends.cpu.get_cpu_capability(),
    }


def backend_info() -> dict[str, str]:
    cuda = "not built"
    if torch.backends.cuda.is_built():
        cuda = f"{torch.cuda.device_count()} device(s)" if torch.cuda.is_available() else "built, no device"
    npu = "torch_npu not installed"
    if backends.REGISTERED["npu"]:
        npu = "registered (torch_npu imported)"
    elif "torch_npu" in sys.modules or _installed("torch_npu"):
        npu = "torch_npu installed but not importable (CANN missing?)"
    return {
        "cpu": "C++ kernels",
        "cuda": cuda + (", kernels registered" if backends.REGISTERED["cuda"] else ""),
        "npu": npu,
    }


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def cmd_info(args, console: Console) -> int:
    if args.explain:
        return cmd_explain(args, console)
    if args.json:
        print(
            json.dumps(
                {
                    "build": build_info(),
                    "backends": backend_info(),
                    "ops": {n: capabilities(n) for n in op_names()},
                    "chains": chains(),
                    "portable by design": portable_whys(),
                },
                indent=2,
                default=str,
            )
        )
        return 0
    table = Table(title="build", show_header=False)
    for k, v in {**build_info(), **{f"backend {k}": v for k, v in backend_info().items()}}.items():
        table.add_row(k, str(v))
    console.print(table)
    names = op_names()
    matrix = Table(title=f"torch.ops.{NAMESPACE}: {len(names)} ops (live registrations)")
    columns = list(capabilities(names[0])) if names else []
    # Every name whole, terminal or pipe (``info | grep m_grouped_fp8_quant_gemm`` must find it); the chains wrap.
    matrix.add_column("op", no_wrap=True, min_width=max(map(len, names), default=2))
    for col in columns:
        matrix.add_column(col, justify="center")
    matrix.add_column("CUDA chain")
    matrix.add_column("NPU chain")
    matrix.add_column("GE graph")
    every = chains()
    for name in names:
        caps = capabilities(name)
        # TorchAir's GE mode: the Ascend IR op our converter builds, for the cases the adapter maps
        ge_ir = _registry.NPU_GE_IR.get(name, "-")
        cuda_chain, npu_chain = (_chain_text(name, d, every[name][d]) for d in ("cuda", "npu"))
        matrix.add_row(name, *("yes" if caps[c] else "-" for c in columns), cuda_chain, npu_chain, ge_ir)
    console.print(matrix)
    return 0


def _chain_text(op: str, device: str, labels: list[str]) -> str:
    """A chain as ``info`` prints it, the reason appended where the op stays portable there by design."""
    why = chain.portable_why(op, device)
    return " > ".join(labels) + (f" ({why})" if why else "")


def portable_whys() -> dict[str, dict[str, str]]:
    """Per device, the ops that run their portable kernel there on purpose, and why (``chain.stays_portable``)."""
    backends.register_all()
    return {
        d: {op: why for op in op_names() if (why := chain.portable_why(op, d))} for d in chain.devices() if d != "cpu"
    }


def cmd_explain(args, console: Console) -> int:
    """``info --explain OP --device D [--args ...|--call FILE]``: the chain's answer for one call."""
    from torch_ascend_moe.backends import explain as explaining

    backends.register_all()
    try:
        if args.call:
            call = explaining.load_call(args.call, args.device)
        else:
            call = explaining.parse_args(args.explain, args.args or "", args.device)
    except ValueError as e:
        print(f"info --explain: {e}")
        return 2
    print(explaining.report(call.op, args.device, call.args))  # plain text: no wrapping of long reasons
    return 0


def _secondary_rank() -> bool:
    return torch.distributed.is_initialized() and torch.distributed.get_rank() != 0


def _thread_counts(text: str | None) -> list[int]:
    """``--threads 1,2``: the CPU thread counts to time at, each a positive integer; none: the current count."""
    if text is None:
        return [torch.get_num_threads()]
    counts = []
    for part in text.split(","):
        if not part.strip().isdigit() or int(part) < 1:
            raise SystemExit(f"bench: --threads expects positive integers separated by commas, got {text!r}")
        counts.append(int(part))
    return counts


def cmd_bench(args, console: Console) -> int:
    bench.OPTIONS.update({k: getattr(args, k) for k in ("tokens", "hidden", "topk", "experts") if getattr(args, k)})
    cases = bench.cases(args.family, quick=args.quick)
    if not cases:
        console.print(f"bench {args.family}: nothing to time on this machine (the family needs a device it lacks)")
        return 0
    was = torch.get_num_threads()
    load_before = _load_average()
    records = []
    try:
        for threads in _thread_counts(args.threads):
            torch.set_num_threads(threads)
            records += _bench_at(args, cases, threads, console, args.busy)
    finally:
        torch.set_num_threads(was)
    if args.json and not _secondary_rank():
        with open(args.json, "w") as f:
            json.dump(run_record(args, records, load_before), f, indent=2)
    return 0


def _load_average() -> float | None:
    """The 1-minute load average (None where the OS has none): how many runnable jobs shared the cores."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def run_record(args, results: list[dict], load_before: float | None) -> dict[str, object]:
    """``bench --json``'s file: the rows with what is needed to read them later (stored runs in ``docs/bench/``
    become the performance page's tables): the command, the date (UTC), the machine, its load average before and
    after the run (other jobs on the cores move the times) and the ``--note``."""
    return {
        "command": "python -m torch_ascend_moe " + shlex.join(args.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": bench.machine(),
        "load_average": {"before": load_before, "after": _load_average()},
        "note": args.note,
        "results": results,
    }


def _run_cases(args, cases, threads: int, console: Console, what: str = "") -> list:
    return [
        bench.run_case(c, args.min_run_time)
        for c in track(
            cases,
            description=f"bench {args.family} ({threads} threads{what})",
            console=console,
            disable=_secondary_rank(),
        )
    ]


def _bench_at(args, cases, threads: int, console: Console, busy: bool = False) -> list[dict]:
    """Times every case at ``threads`` CPU threads (ours and the baseline interleaved, as ``run_case`` does) and
    prints one table; returns the results as JSON records. ``busy``: each case is timed again while another process
    keeps one core busy, and the table shows both (the busy rows are recorded with ``"busy": true``)."""
    results = _run_cases(args, cases, threads, console)
    loaded = []
    if busy:
        with bench.busy_core():
            loaded = _run_cases(args, cases, threads, console, ", one core busy")
    if _secondary_rank():
        return []  # one report per run (every rank timed the same collectives)
    records = [{**r.__dict__, "speedup": r.speedup, "threads": threads} for r in results]
    if busy:
        _print_busy(args, threads, results, loaded, console)
        return records + [{**r.__dict__, "speedup": r.speedup, "threads": threads, "busy": True} for r in loaded]
    table = Table(title=f"bench {args.family}: {threads} CPU threads, speedup = baseline time / ours")
    memory = any(r.ours_peak_mb is not None for r in results)
    bandwidth = any(r.ours_gbps is not None for r in results)
    bounded = any(r.bound is not None for r in results)
    faults = any(r.ours_faults is not None for r in results)
    columns = ("case", "ours ms", "TFLOPS", "baseline", "baseline ms", "TFLOPS ", "speedup")
    extra = (
        (("ours peak MB", "baseline peak MB") if memory else ())
        + (("ours GB/s", "baseline GB/s") if bandwidth else ())
        + (("baseline in GEMMs", "bound") if bounded else ())
        + (("ours faults", "baseline faults") if faults else ())
    )
    for col in columns + extra:
        table.add_column(col, justify="left" if col in ("case", "baseline") else "right")

    def mb(x):
        return "-" if x is None else f"{x:.0f}"

    for r in results:
        cells = [r.case, f"{r.ours_ms:.3f}", f"{r.ours_tflops:.4f}", r.baseline, f"{r.baseline_ms:.3f}"]
        cells += [f"{r.baseline_tflops:.4f}", f"{r.speedup:.2f}x"]
        cells += [mb(r.ours_peak_mb), mb(r.baseline_peak_mb)] if memory else []
        cells += [f"{r.ours_gbps:.2f}", f"{r.baseline_gbps:.2f}"] if bandwidth else []
        if bounded:
            cells += ["-", "-"] if r.bound is None else [f"{r.baseline_gemm_share:.0%}", f"{r.bound:.2f}x"]
        cells += [mb(r.ours_faults), mb(r.baseline_faults)] if faults else []
        table.add_row(*cells)
    console.print(table)
    return records


def _print_busy(args, threads: int, idle: list, busy: list, console: Console) -> None:
    """The idle and the busy timing of each case side by side, and how much of its idle speedup a case keeps."""
    table = Table(
        title=f"bench {args.family}: {threads} CPU threads, idle and with one core busy; speedup = baseline time / ours"
    )
    for col in ("case", "baseline", "ours ms", "baseline ms", "speedup", "busy: ours ms", "baseline ms ", "speedup ",
                "kept"):  # fmt: skip
        table.add_column(col, justify="left" if col in ("case", "baseline") else "right")
    for a, b in zip(idle, busy):
        cells = [a.case, a.baseline, f"{a.ours_ms:.3f}", f"{a.baseline_ms:.3f}", f"{a.speedup:.2f}x"]
        cells += [f"{b.ours_ms:.3f}", f"{b.baseline_ms:.3f}", f"{b.speedup:.2f}x", f"{b.speedup / a.speedup:.2f}"]
        table.add_row(*cells)
    console.print(table)


def cmd_demo(args, console: Console) -> int:
    from torch_ascend_moe import demo

    return demo.main(args, console)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_ascend_moe", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    from torch_ascend_moe import demo

    d = sub.add_parser("demo", help="the main job: a small MoE transformer eager, compiled, trained, exported, checked")
    demo.add_arguments(d)
    info = sub.add_parser("info", help="versions, build, backends and the capability matrix of every op")
    info.add_argument("--json", action="store_true", help="print machine-readable JSON")
    info.add_argument(
        "--explain", metavar="OP", help="say which kernel a call of OP takes, and why the earlier ones refused"
    )
    info.add_argument("--device", default="cuda", choices=chain.devices(), help="--explain: the device's chain")
    info.add_argument(
        "--args",
        help="--explain: the call's arguments, space-separated: tensors as dtype[d0,d1,...] (e.g. "
        "float8_e4m3fn[128,7168]), other values as Python literals (None, 1.0, [1,128]) or dtype names; trailing "
        "defaults may be left out",
    )
    info.add_argument(
        "--call", metavar="FILE", help="--explain: a call saved by torch_ascend_moe.backends.explain.save_call"
    )
    b = sub.add_parser("bench", help="time a family's ops against PyTorch baselines measured in the same run")
    b.add_argument("family", choices=(*bench.FAMILIES, *bench.GROUPS))
    b.add_argument("--quick", action="store_true", help="tiny shapes (smoke test)")
    for opt, what in (
        ("tokens", "tokens per rank"),
        ("hidden", "hidden size"),
        ("topk", "experts per token"),
        ("experts", "number of experts"),
    ):
        b.add_argument(f"--{opt}", type=int, default=None, help=f"bench ep: {what}")
    b.add_argument("--min-run-time", type=float, default=0.3, help="seconds per timing (default 0.3)")
    b.add_argument("--json", metavar="PATH", help="also write the results to PATH, with the command and the machine")
    b.add_argument("--note", help="--json: a remark recorded with the run (how loaded the machine was, ...)")
    b.add_argument(
        "--busy",
        action="store_true",
        help="also time every case while another process keeps one core busy; the table shows both, and 'kept' is "
        "the busy speedup over the idle one",
    )
    b.add_argument(
        "--threads",
        metavar="N[,M...]",
        help="CPU thread counts to time at, one table each (default: the current torch.get_num_threads())",
    )
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    # Wide enough for the tables when piped (rich assumes 80 columns without a terminal).
    console = Console(width=None if sys.stdout.isatty() else 150)
    return {"info": cmd_info, "bench": cmd_bench, "demo": cmd_demo}[args.command](args, console)


if __name__ == "__main__":
    sys.exit(main())
