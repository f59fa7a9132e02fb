"""The docs: README is a landing page whose links resolve, the MkDocs site builds with warnings as errors (its op
reference generated from the live registry), and every Python example in README and the docs runs as written."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tools import bench_pages, refresh_bench

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.S | re.M)


def test_readme_is_a_landing_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert readme.startswith("# torch_ascend_moe\n\n```bash\n# 1. ")  # CI reads the two commands from there


@pytest.mark.parametrize("page", [p for p in PAGES if p.parent == ROOT], ids=lambda p: p.name)
def test_relative_links_resolve(page):
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
        assert (page.parent / target).exists(), f"{page.name}: link to {target} does not resolve"


def test_docs_site_builds_strict(tmp_path):
    """``mkdocs build --strict``: a broken link, a page missing from the nav or a hook error fails the build."""
    pytest.importorskip("mkdocs")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    reference = (tmp_path / "site" / "reference" / "index.html").read_text()
    import torch_ascend_moe.cli as cli

    missing = [name for name in cli.op_names() if f"ascend_moe::{name}(" not in reference]
    assert not missing, f"ops missing from the generated reference: {missing}"
    performance = (tmp_path / "site" / "performance" / "index.html").read_text()
    for name in bench_pages.runs():
        assert (tmp_path / "site" / bench_pages.image_path(name)).read_bytes().startswith(b"\x89PNG"), name
        assert f'src="../{bench_pages.image_path(name)}"' in performance, name
    assert "<!-- bench:" not in performance


def test_each_stored_bench_run_has_one_placeholder_and_each_placeholder_a_run():
    """``docs/bench/<name>.json`` and ``<!-- bench: <name> -->`` come in pairs: a run no page shows, or a page asking
    for a run that is not stored, is a drift (the build also refuses the latter)."""
    asked = [name for page in PAGES for name in bench_pages.placeholders(page.read_text())]
    stored = bench_pages.runs()
    assert stored, "no stored bench runs in docs/bench/"
    assert sorted(asked) == sorted(stored), f"placeholders {sorted(asked)} vs stored runs {sorted(stored)}"
    with pytest.raises(ValueError, match="no docs/bench/nope.json"):
        bench_pages.render("<!-- bench: nope -->", stored)


def test_each_stored_bench_run_is_refreshed_by_its_own_command():
    """``tools/refresh_bench.py`` re-runs the command a run records, into that run's file (a CPU run records that very
    file: one copied under another name is a drift); a run it cannot repeat says why."""
    for name, run in bench_pages.runs().items():
        why = refresh_bench.cannot_refresh(run)
        if why:
            assert run.get("source") or run["machine"]["gpu"], (name, why)
            continue
        recorded = shlex.split(run["command"])
        at = recorded.index("--json")
        argv = refresh_bench.refresh_command(name, run)
        assert argv[at + 1] == f"docs/bench/{name}.json", name
        assert argv[1:at] + argv[at + 2 :] == recorded[1:at] + recorded[at + 2 :], name  # the same bench call
        if not run["machine"]["gpu"]:  # a CPU run is written in place (a GPU run comes from the device's $OUT)
            assert recorded[at + 1] == f"docs/bench/{name}.json", name


@pytest.mark.parametrize("name", sorted(bench_pages.runs()))
def test_rendered_bench_table_is_the_stored_run(name):
    """The page's table for a stored run shows that run's cases, times and speedups (to the table's rounding), in
    order; and the run says where it was measured (``bench --json``'s header)."""
    run = bench_pages.runs()[name]
    assert run["command"].startswith(("python -m torch_ascend_moe bench ", "python3 -m torch_ascend_moe bench "))
    assert run["date"][:4].isdigit() and (run["machine"]["cpu_count"] or run["machine"]["gpu"])
    section = bench_pages.render(f"<!-- bench: {name} -->", {name: run})
    lines = [line for line in section.splitlines() if line.startswith("| ")][1:]  # the header row left out
    assert len(lines) == len(run["results"])
    for line, row in zip(lines, run["results"]):
        cells = [c.strip() for c in re.split(r"(?<!\\) \| ", line.strip("| "))]
        assert cells[0].startswith(row["case"].replace("|", "\\|"))
        assert cells[3] == row["baseline"]
        ours, baseline, speedup = float(cells[1]), float(cells[4]), float(cells[6].rstrip("×"))
        assert ours == pytest.approx(row["ours_ms"], rel=5e-4)
        assert baseline == pytest.approx(row["baseline_ms"], rel=5e-4)
        assert speedup == pytest.approx(row["speedup"], abs=0.005)


EXAMPLES = [(p, i) for p in PAGES for i in range(len(_python_blocks(p)))]


@pytest.mark.parametrize(("page", "index"), EXAMPLES, ids=[f"{p.relative_to(ROOT)}[{i}]" for p, i in EXAMPLES])
def test_python_examples_run(page, index):
    exec(compile(_python_blocks(page)[index], str(page.relative_to(ROOT)), "exec"), {})


def test_readme_names_every_op():
    """The README's "Ops at a glance" table lists every registered op, and nothing else (it cannot drift)."""
    import torch_ascend_moe.cli as cli

    readme = (ROOT / "README.md").read_text()
    table = readme.split("## Ops at a glance", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `[a-z0-9_]+` \| (.*) \|$", table, flags=re.M)
    listed = [name for row in rows for name in re.findall(r"`([a-z0-9_]+)`", row)]
    assert sorted(listed) == sorted(cli.op_names())


def test_op_tables_are_compact_and_complete():
    """docs/ops.md: every registered op has one short row in the family tables (linked to its note) and a note."""
    import torch_ascend_moe.cli as cli

    page = (ROOT / "docs" / "ops.md").read_text()
    rows = re.findall(r"^\| \[`([a-z0-9_]+)`\]\(#\1\) \|.*\|$", page, flags=re.M)
    assert sorted(rows) == sorted(cli.op_names())
    long_rows = [line[:60] for line in page.splitlines() if line.startswith("| [`") and len(line) > 200]
    assert not long_rows, f"op table rows over 200 characters (move the detail to the op's note): {long_rows}"
    notes = re.findall(r"^#### `([a-z0-9_]+)`$", page, flags=re.M)
    assert sorted(notes) == sorted(cli.op_names())


_DOCSTRING_MODULES = sorted(
    ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    for p in (ROOT / "torch_ascend_moe").rglob("*.py")
    if ">>> " in p.read_text()
)


@pytest.mark.parametrize("module", _DOCSTRING_MODULES)
def test_docstring_examples_run(module):
    """Every ``>>>`` example in the package's docstrings runs and prints what it shows (one needing a GPU or a
    model, or declaring a kernel, says ``# doctest: +SKIP``): a stale example is a wrong answer to the first reader
    who tries it."""
    import doctest
    import importlib

    from torch_ascend_moe import _registry

    kernels = dict(_registry.PORTABLE)
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    result = doctest.testmod(importlib.import_module(module), optionflags=flags, verbose=False, report=False)
    assert result.failed == 0, f"{module}: {result.failed} of {result.attempted} docstring examples failed"
    # An example that declares a kernel would replace the real one for every later test in this process.
    assert dict(_registry.PORTABLE) == kernels, f"{module}: an example registered a kernel (mark it +SKIP)"
