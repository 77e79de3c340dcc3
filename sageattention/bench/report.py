"""Regenerate the result blocks of docs/performance.md from the results of record.

    python -m sageattention.bench.report            # rewrite every generated block
    python -m sageattention.bench.report --check    # exit 1 naming the blocks that differ from their results

A block is everything between the lines `<!-- BEGIN generated:<gpu_dir>/<suite> -->` and `<!-- END
generated:<gpu_dir>/<suite> -->` (each on a line of its own). It becomes the tables of <results>/<gpu_dir>/<suite>.json, rendered by the tool that wrote the file (its
meta["tool"]: the same renderer as the file's .md), then one line with the device, software, commit, date and command
of the run, and a link to <suite>.png where there is one. Needs torch and Triton (the renderers' modules import
them), no GPU.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
from pathlib import Path

from sageattention.bench.results import RESULTS, ROOT, provenance

DOC = ROOT / "docs" / "performance.md"
TOOLS = ("run", "models", "accuracy", "crossover", "item_costs")  # the modules whose results have a `body`
KEY = r"[\w-][\w.-]*/[\w-][\w.-]*"
# Markers stand on lines of their own (a marker quoted inside a line of prose is not one).
BLOCK = re.compile(rf"^(<!-- BEGIN generated:({KEY}) -->\n)(.*?)^(<!-- END generated:\2 -->)$", re.S | re.M)
BEGIN = re.compile(r"^<!-- BEGIN generated:(.*?) -->$", re.M)


class ReportError(Exception):
    """A block that cannot be generated: a malformed marker, or no result file for it."""


def result_file(key: str, results: Path) -> Path:
    gpu, suite = key.split("/")
    path = results / gpu / f"{suite}.json"
    if path.is_file():
        return path
    if not (results / gpu).is_dir():
        known = sorted(p.name for p in results.iterdir() if p.is_dir()) if results.is_dir() else []
        raise ReportError(f"generated:{key}: no results for GPU {gpu!r} in {results} (GPUs: {', '.join(known)})")
    known = sorted(p.stem for p in (results / gpu).glob("*.json"))
    raise ReportError(f"generated:{key}: no suite {suite!r} in {results / gpu} (suites: {', '.join(known)})")


def render(key: str, results: Path, doc: Path) -> str:
    """A block's text: the tables of its result file, its provenance and its plot."""
    path = result_file(key, results)
    result = json.loads(path.read_text())
    tool = result["meta"].get("tool")
    if tool not in TOOLS:
        raise ReportError(f"generated:{key}: {path} names no known tool (meta.tool {tool!r}; known: {TOOLS})")
    body = importlib.import_module(f"sageattention.bench.{tool}").body(result)
    line = provenance(result["meta"])
    png = path.with_suffix(".png")
    if png.is_file():
        line += f"; plot: [{png.name}]({Path(os.path.relpath(png, doc.resolve().parent)).as_posix()})"
    return f"\n{body.strip()}\n\n{line}\n\n"  # blank lines: the markers stay apart from the tables


def regenerate(text: str, doc: Path, results: Path) -> tuple[str, list[str]]:
    """(the document with every block regenerated, the keys of the blocks that changed)."""
    blocks = list(BLOCK.finditer(text))
    if len(blocks) != len(BEGIN.findall(text)):
        closed = {m.group(2) for m in blocks}
        broken = [k for k in BEGIN.findall(text) if k not in closed]
        raise ReportError(f"{doc}: BEGIN markers without a matching END, or malformed keys: {broken}")
    stale, out, end = [], [], 0
    for m in blocks:
        new = render(m.group(2), results, doc)
        if new != m.group(3):
            stale.append(m.group(2))
        out += [text[end:m.end(1)], new]
        end = m.start(4)
    return "".join(out) + text[end:], stale


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sageattention.bench.report", description=__doc__.splitlines()[0])
    ap.add_argument("--doc", type=Path, default=DOC, help=f"the document (default: {DOC})")
    ap.add_argument("--results", type=Path, default=RESULTS, help=f"the results directory (default: {RESULTS})")
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is stale")
    args = ap.parse_args(argv)
    try:
        text, stale = regenerate(args.doc.read_text(), args.doc, args.results)
    except (ReportError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.check:
        if stale:
            print(f"{args.doc}: stale generated blocks: {', '.join(stale)}; run python -m sageattention.bench.report",
                  file=sys.stderr)
            return 1
        return 0
    if stale:
        args.doc.write_text(text)
    print(f"{args.doc}: {len(stale)} block(s) regenerated: {', '.join(stale) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
