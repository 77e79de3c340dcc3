"""`python -m scripts.index_pages WHEEL_DIR --out DIR`: PEP 503 simple indexes, one per CUDA × torch.

pip keeps one file per version, so from one folder of wheels that differ only in build tag it takes
the highest tag and then wants another torch. Each index here lists only the wheels of one torch
minor and one CUDA major, e.g. DIR/cu12-torch2.8/simple/, so `pip install sageattn3 --extra-index-url
<that index>` keeps the installed torch. One index per CUDA major, not per CUDA line: a wheel links
the CUDA runtime of its major (libcudart.so.12), so torch 2.8 built for CUDA 12.8 (PyPI's) takes our
CUDA 12.9 build. DIR also gets indexes.json (index -> package -> versions, oldest first), index.html
(the list, for people) and sage_install.py, the helper that picks the index for the running torch.
"""
from __future__ import annotations

import argparse
import hashlib
import html
import json
import os
import sys
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version
from wheel.wheelfile import WheelFile

from scripts.wheel_names import page_name, wheel_flavour

HELPER = Path(__file__).with_name("sage_install.py")


def _page(title: str, links: list[tuple[str, str, dict[str, str]]]) -> str:
    def anchor(href: str, text: str, attrs: dict[str, str]) -> str:
        extra = "".join(f' {k}="{html.escape(v)}"' for k, v in attrs.items())
        return f'    <a href="{html.escape(href)}"{extra}>{html.escape(text)}</a><br/>'
    return (f"<!DOCTYPE html>\n<html>\n  <head><meta name=\"pypi:repository-version\" content=\"1.0\">"
            f"<title>{html.escape(title)}</title></head>\n  <body>\n    <h1>{html.escape(title)}</h1>\n"
            + "\n".join(anchor(*link) for link in links) + "\n  </body>\n</html>\n")


def index_of(wheel: Path) -> str:
    found = wheel_flavour(wheel.name)
    if found is None:
        raise ValueError(f"{wheel.name} has no build tag (torch, CUDA): can't place it on an index")
    torch, cuda = found
    return page_name(cuda, torch)


def _requires_python(wheel: Path) -> dict[str, str]:
    with WheelFile(wheel) as whl:
        meta = whl.read(f"{whl.dist_info_path}/METADATA").decode()
    found = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Python:")]
    return {"data-requires-python": found[0]} if found else {}


def write_indexes(wheels: dict[Path, str], out: Path, site_url: str = "") -> dict[str, dict[str, list[str]]]:
    """Write one simple index per CUDA major × torch for `wheels` (file -> the URL pip downloads it from, or a path
    relative to out), plus indexes.json, index.html and the install helper, which gets site_url (where `out` will
    be served) as its default --site. Returns indexes.json's content."""
    grouped: dict[str, dict[str, list[Path]]] = {}
    for wheel in sorted(wheels):
        project = canonicalize_name(parse_wheel_filename(wheel.name)[0])
        grouped.setdefault(index_of(wheel), {}).setdefault(project, []).append(wheel)
    listing = {}
    for index, projects in sorted(grouped.items()):
        simple = out / index / "simple"
        for project, members in projects.items():
            (simple / project).mkdir(parents=True, exist_ok=True)
            links = []
            for wheel in members:
                digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
                href = wheels[wheel] if "://" in wheels[wheel] else os.path.relpath(out / wheels[wheel], simple / project)
                links.append((f"{href}#sha256={digest}", wheel.name, _requires_python(wheel)))
            (simple / project / "index.html").write_text(_page(f"Links for {project}", links))
        (simple / "index.html").write_text(_page(f"Simple index {index}", [(f"{p}/", p, {}) for p in sorted(projects)]))
        listing[index] = {p: sorted({str(parse_wheel_filename(w.name)[1]) for w in members}, key=Version)
                          for p, members in sorted(projects.items())}
    (out / "indexes.json").write_text(json.dumps(listing, indent=1) + "\n")
    (out / "index.html").write_text(_page("pip indexes: pip install PKG --extra-index-url <index>/simple",
                                          [(f"{name}/simple/", name, {}) for name in listing]))
    helper = HELPER.read_text()
    (out / HELPER.name).write_text(helper.replace('\nSITE = ""', f"\nSITE = {site_url.rstrip('/')!r}", 1))
    return listing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.index_pages", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("wheel_dir", type=Path, nargs="?", default=Path("dist/wheels"))
    parser.add_argument("--out", type=Path, default=Path("dist/index"))
    parser.add_argument("--base-url", help="where the wheels will be served (default: links to WHEEL_DIR)")
    parser.add_argument("--site-url", default="", help="where DIR will be served (the helper's default --site)")
    args = parser.parse_args(argv)
    wheels = sorted(args.wheel_dir.glob("*.whl"))
    where = {w: f"{args.base_url.rstrip('/')}/{w.name}" if args.base_url else os.path.relpath(w, args.out)
             for w in wheels}
    try:
        listing = write_indexes(where, args.out, args.site_url)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, projects in listing.items():
        print(f"{args.out / name}/simple/: {', '.join(projects)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
