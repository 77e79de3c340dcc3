"""`python -m scripts.index_pages WHEEL_DIR --out DIR`: per-variant find-links pages (PEP 503 style anchors).

pip keeps one file per version, so wheels that differ only in build tag can't be chosen by the
installed torch. One page per CUDA × torch (cu129-torch2.8/index.html) lists only matching wheels:
`pip install sageattn3 -f <out>/cu129-torch2.8/` then never needs to touch torch.
"""
from __future__ import annotations

import argparse
import hashlib
import html
import os
import sys
from pathlib import Path

from scripts.wheel_names import page_name, wheel_flavour


def _page(title: str, links: list[tuple[str, str]]) -> str:
    anchors = "\n".join(f'    <a href="{html.escape(href)}">{html.escape(text)}</a><br/>' for href, text in links)
    return (f"<!DOCTYPE html>\n<html>\n  <head><meta name=\"pypi:repository-version\" content=\"1.0\">"
            f"<title>{html.escape(title)}</title></head>\n  <body>\n    <h1>{html.escape(title)}</h1>\n"
            f"{anchors}\n  </body>\n</html>\n")


def page_of(wheel: Path) -> str:
    found = wheel_flavour(wheel.name)
    if found is None:
        raise ValueError(f"{wheel.name} has no build tag (torch, CUDA): can't place it on a variant page")
    torch, cuda = found
    return page_name(cuda, torch)


def write_pages(wheels: list[Path], out: Path, base_url: str | None = None) -> dict[str, list[Path]]:
    """Write one page per CUDA × torch and a top page linking them; returns page name → wheels."""
    pages: dict[str, list[Path]] = {}
    for wheel in sorted(wheels):
        pages.setdefault(page_of(wheel), []).append(wheel)
    for name, members in pages.items():
        page_dir = out / name
        page_dir.mkdir(parents=True, exist_ok=True)
        links = []
        for wheel in members:
            digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
            href = f"{base_url.rstrip('/')}/{wheel.name}" if base_url else os.path.relpath(wheel, page_dir)
            links.append((f"{href}#sha256={digest}", wheel.name))
        (page_dir / "index.html").write_text(_page(f"Wheels for {name}", links))
    top = [(f"{name}/", name) for name in sorted(pages)]
    (out / "index.html").write_text(_page("Variant pages: pip install PKG -f <page>/", top))
    return pages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.index_pages", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("wheel_dir", type=Path, nargs="?", default=Path("dist/wheels"))
    parser.add_argument("--out", type=Path, default=Path("dist/index"))
    parser.add_argument("--base-url", help="where the wheels will be served (e.g. a release's download URL)")
    args = parser.parse_args(argv)
    try:
        pages = write_pages(sorted(args.wheel_dir.glob("*.whl")), args.out, args.base_url)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, members in pages.items():
        print(f"{args.out / name}/index.html: {len(members)} wheels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
