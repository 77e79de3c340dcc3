"""`python -m scripts.index_pages WHEEL_DIR --out DIR`: PEP 503 simple indexes, one per CUDA × torch.

pip keeps one file per version, so from one folder of wheels that differ only in build tag it takes
the highest tag and then wants another torch. Each index here lists only the wheels of one torch
minor and one CUDA major, e.g. DIR/cu12-torch2.8/simple/, so `pip install sageattn3==1.0.0 --extra-index-url
<that index>` keeps the installed torch. One index per CUDA major, not per CUDA line: a wheel links
the CUDA runtime of its major (libcudart.so.12), so torch 2.8 built for CUDA 12.8 (PyPI's) takes our
CUDA 12.9 build. Wheels without a URL of their own are published under DIR/files/, so every link stays
inside DIR and any static server can serve it (a wheel may be listed by several indexes). Each project
page also links, per version, a guard source distribution: pip only builds it when none of that
version's wheels fits, and building it stops with the reason (sage_install.refusal) instead of letting
pip settle for a same-named package on PyPI. DIR also gets indexes.json (index -> package -> versions,
oldest first), index.html (the list, for people) and sage_install.py, the helper that picks the index
for the running torch and Python.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import html
import io
import json
import os
import shutil
import sys
import tarfile
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version
from wheel.wheelfile import WheelFile

from scripts.outputs import source_date_epoch
from scripts.wheel_names import page_name, wheel_flavour

HELPER = Path(__file__).with_name("sage_install.py")


def _page(title: str, links: list[tuple[str, str, dict[str, str]]]) -> str:
    def anchor(href: str, text: str, attrs: dict[str, str]) -> str:
        extra = "".join(f' {k}="{html.escape(v)}"' for k, v in attrs.items())
        return f'    <a href="{html.escape(href)}"{extra}>{html.escape(text)}</a><br/>'
    return (f"<!DOCTYPE html>\n<html>\n  <head><meta name=\"pypi:repository-version\" content=\"1.0\">"
            f"<title>{html.escape(title)}</title></head>\n  <body>\n    <h1>{html.escape(title)}</h1>\n"
            + "\n".join(anchor(*link) for link in links) + "\n  </body>\n</html>\n")


def indexes_of(wheel: Path) -> tuple[str, ...]:
    """The indexes that list `wheel`: today the one of its CUDA major × torch (a build for several torches would
    name more)."""
    found = wheel_flavour(wheel.name)
    if found is None:
        raise ValueError(f"{wheel.name} has no build tag (torch, CUDA): can't place it on an index")
    torch, cuda = found
    return (page_name(cuda, torch),)


def _requires_python(wheel: Path) -> dict[str, str]:
    with WheelFile(wheel) as whl:
        meta = whl.read(f"{whl.dist_info_path}/METADATA").decode()
    found = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Python:")]
    return {"data-requires-python": found[0]} if found else {}


def _publish(wheel: Path, files: Path) -> None:
    """Put `wheel` under files/ (a hard link where the file system allows, else a copy)."""
    target = files / wheel.name
    files.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    try:
        os.link(wheel, target)
    except OSError:
        shutil.copyfile(wheel, target)


def helper_text(site_url: str) -> str:
    """sage_install.py as published: its default --site is where the indexes are served."""
    return HELPER.read_text().replace('\nSITE = ""', f"\nSITE = {site_url.rstrip('/')!r}", 1)


def guard_sdist(folder: Path, project: str, version: str, index: str, wheels: list[str], site_url: str) -> Path:
    """The guard source distribution of one version on one index (see the module docstring), byte for byte the
    same for the same input."""
    dist = f"{project.replace('-', '_')}-{version}"
    guard = {"package": project, "index": index, "wheels": sorted(wheels)}
    members = {
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n",
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "sage_install"\nbackend-path = ["."]\n',
        HELPER.name: helper_text(site_url).replace("\nGUARD = None", f"\nGUARD = {guard!r}", 1),
    }
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, text in sorted(members.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"{dist}/{name}")
            info.size, info.mode, info.mtime = len(data), 0o644, source_date_epoch()
            tar.addfile(info, io.BytesIO(data))
    path = folder / f"{dist}.tar.gz"
    path.write_bytes(gzip.compress(raw.getvalue(), mtime=0))
    return path


def write_indexes(wheels: dict[Path, str | None], out: Path, site_url: str = "") -> dict[str, dict[str, list[str]]]:
    """Write one simple index per CUDA major × torch for `wheels` (file -> the URL pip downloads it from, or None
    to publish it under out/files/), plus indexes.json, index.html and the install helper, which gets site_url
    (where `out` will be served) as its default --site. Returns indexes.json's content."""
    grouped: dict[str, dict[str, list[Path]]] = {}
    for wheel in sorted(wheels):
        project = canonicalize_name(parse_wheel_filename(wheel.name)[0])
        for index in indexes_of(wheel):
            grouped.setdefault(index, {}).setdefault(project, []).append(wheel)
    for wheel, url in wheels.items():
        if url is None:
            _publish(wheel, out / "files")
    listing = {}
    for index, projects in sorted(grouped.items()):
        simple = out / index / "simple"
        listing[index] = {}
        for project, members in sorted(projects.items()):
            folder = simple / project
            folder.mkdir(parents=True, exist_ok=True)
            links = []
            for wheel in members:
                digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
                href = wheels[wheel] or f"../../../files/{wheel.name}"
                links.append((f"{href}#sha256={digest}", wheel.name, _requires_python(wheel)))
            versions = sorted({str(parse_wheel_filename(w.name)[1]) for w in members}, key=Version)
            for version in versions:
                names = [w.name for w in members if str(parse_wheel_filename(w.name)[1]) == version]
                guard = guard_sdist(folder, project, version, index, names, site_url)
                links.append((f"{guard.name}#sha256={hashlib.sha256(guard.read_bytes()).hexdigest()}", guard.name, {}))
            (folder / "index.html").write_text(_page(f"Links for {project}", links))
            listing[index][project] = versions
        (simple / "index.html").write_text(_page(f"Simple index {index}", [(f"{p}/", p, {}) for p in sorted(projects)]))
    (out / "indexes.json").write_text(json.dumps(listing, indent=1) + "\n")
    (out / "index.html").write_text(_page("pip indexes: pip install PKG==VERSION --extra-index-url <index>/simple",
                                          [(f"{name}/simple/", name, {}) for name in listing]))
    (out / HELPER.name).write_text(helper_text(site_url))
    return listing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.index_pages", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("wheel_dir", type=Path, nargs="?", default=Path("dist/wheels"))
    parser.add_argument("--out", type=Path, default=Path("dist/index"))
    parser.add_argument("--base-url", help="where the wheels will be served (default: published under DIR/files/)")
    parser.add_argument("--site-url", default="", help="where DIR will be served (the helper's default --site)")
    args = parser.parse_args(argv)
    wheels = sorted(args.wheel_dir.glob("*.whl"))
    where = {w: f"{args.base_url.rstrip('/')}/{w.name}" if args.base_url else None for w in wheels}
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
