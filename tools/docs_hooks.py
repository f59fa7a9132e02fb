"""MkDocs hooks (``mkdocs.yml``): pages filled from the repository when the site is built, so they cannot drift.

- ``index.md`` is README.md (its links into ``docs/`` rewritten for the site);
- ``changelog.md`` is CHANGELOG.md;
- ``reference.md`` gets one entry per ``torch.ops.ascend_moe`` op from the live registry: the schema, the
  capabilities ``python -m torch_ascend_moe info --json`` reports, each device's kernel chain, and the Python
  wrapper's docstring;
- ``<!-- bench: <name> -->`` (``performance.md``) becomes the stored run ``docs/bench/<name>.json``'s table, and
  ``img/bench/<name>.png`` its plot, generated here (``bench_pages``), never committed.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import bench_pages  # a sibling: MkDocs puts a hook's folder on sys.path while it loads the hook
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]


def _readme() -> str:
    text = (ROOT / "README.md").read_text()
    text = re.sub(r"\]\(docs/", "](", text)
    return text.replace("](CHANGELOG.md)", "](changelog.md)").replace("](CONTRIBUTING.md)", "](design.md#adding-an-op)")


def _wrappers() -> dict:
    """The Python wrapper of each op (``torch_ascend_moe.ops.<family>.<op>``), by op name."""
    import torch_ascend_moe.ops as ops

    found = {}
    for info in pkgutil.iter_modules(ops.__path__):
        module = importlib.import_module(f"{ops.__name__}.{info.name}")
        for name, fn in vars(module).items():
            if inspect.isfunction(fn) and fn.__module__ == module.__name__ and not name.startswith("_"):
                found.setdefault(name, fn)
    return found


def _reference() -> str:
    import torch

    from torch_ascend_moe.cli import capabilities, chains, op_names

    wrappers, kernel_chains = _wrappers(), chains()
    parts = []
    for name in op_names():
        schema = str(getattr(torch.ops.ascend_moe, name).default._schema)
        caps = capabilities(name)
        parts.append(f"## `{name}`\n")
        parts.append(f"```text\n{schema}\n```\n")
        has = ", ".join(k for k, v in caps.items() if v is True) or "none"
        parts.append(f"Capabilities: {has}.\n")
        for device, chain in kernel_chains.get(name, {}).items():
            parts.append(f"- {device.upper()} chain: " + " → ".join(f"`{k}`" for k in chain))
        parts.append("")
        doc = inspect.getdoc(wrappers[name]) if name in wrappers else None
        if doc:
            # Doctest prompts and reST double backticks read as plain code here.
            doc = re.sub(r"^>>> ?|^\.\.\. ?", "    ", doc, flags=re.M).replace("``", "`")
            parts.append(doc + "\n")
    return "\n".join(parts)


def on_files(files, config):
    for name, run in bench_pages.runs().items():
        files.append(File.generated(config, bench_pages.image_path(name), content=bench_pages.plot_png(name, run)))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    if bench_pages.placeholders(markdown):
        return bench_pages.render(markdown, bench_pages.runs())
    if "<!-- readme -->" in markdown:
        return markdown.replace("<!-- readme -->", _readme())
    if "<!-- changelog -->" in markdown:
        return markdown.replace("<!-- changelog -->", (ROOT / "CHANGELOG.md").read_text())
    if "<!-- op-reference -->" in markdown:
        return markdown.replace("<!-- op-reference -->", _reference())
    return markdown
