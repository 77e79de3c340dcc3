"""`python -m scripts.wheel_check WHEEL…`: validate exported wheels, then install each in a fresh venv and import it.

Checks: PEP 427 filename; build tag decodes to torch × CUDA (280.129 = torch 2.8 + CUDA 12.9);
METADATA name/version match the filename and pin torch to that minor; WHEEL tags and Build match
the filename; RECORD hashes hold. Wheels for another interpreter or platform are validated but not installed.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import venv
from email.parser import Parser
from pathlib import Path

from packaging.tags import sys_tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from rich.table import Table
from wheel.wheelfile import WheelFile

from scripts.matrix import console
from scripts.wheel_names import wheel_flavour


def problems(wheel: Path) -> list[str]:
    """Everything wrong with one wheel's name and metadata (empty when it is sound)."""
    try:
        name, version, build, tags = parse_wheel_filename(wheel.name)
        flavour = wheel_flavour(wheel.name)
    except ValueError as exc:
        return [str(exc)]
    if flavour is None:
        return ["no build tag: expected <torch>0.<CUDA>, e.g. 280.129"]
    torch, _ = flavour
    found = []
    try:
        with WheelFile(wheel) as whl:
            dist_info = f"{whl.parsed_filename['namever']}.dist-info"
            meta = Parser().parsestr(whl.read(f"{dist_info}/METADATA").decode())
            info = Parser().parsestr(whl.read(f"{dist_info}/WHEEL").decode())
            for item in whl.infolist():  # reading verifies each file against RECORD
                whl.read(item)
    except Exception as exc:  # noqa: BLE001 - any unreadable or inconsistent archive is a finding
        return [f"unreadable wheel: {exc}"]
    if canonicalize_name(meta["Name"]) != name or meta["Version"] != str(version):
        found.append(f"METADATA says {meta['Name']} {meta['Version']}, filename says {name} {version}")
    if f"torch=={torch}.*" not in (meta.get_all("Requires-Dist") or []):
        found.append(f"METADATA does not pin torch=={torch}.* as the build tag says")
    if {str(t) for t in tags} != set(info.get_all("Tag") or []):
        found.append(f"WHEEL tags {info.get_all('Tag')} differ from the filename's {sorted(map(str, tags))}")
    if info["Build"] != f"{build[0]}{build[1]}":
        found.append(f"WHEEL Build {info['Build']!r} differs from the filename's {build[0]}{build[1]}")
    return found


def installable_here(wheel: Path) -> bool:
    _, _, _, tags = parse_wheel_filename(wheel.name)
    return bool(set(tags) & set(sys_tags()))


def top_level_packages(wheel: Path) -> list[str]:
    with WheelFile(wheel) as whl:
        return sorted({n.split("/")[0] for n in whl.namelist() if n.count("/") == 1 and n.endswith("/__init__.py")})


def install_and_import(wheel: Path, pip_args: list[str], system_site_packages: bool) -> str | None:
    """Install into a fresh venv and import every top-level package; the error text, or None."""
    with tempfile.TemporaryDirectory(prefix="sage-check-") as tmp:
        venv.EnvBuilder(with_pip=True, system_site_packages=system_site_packages).create(tmp)
        python = str(Path(tmp) / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python"))
        steps = [[python, "-m", "pip", "install", "--disable-pip-version-check", *pip_args, str(wheel)],
                 [python, "-c", "; ".join(f"import {m}" for m in top_level_packages(wheel))]]
        for step in steps:
            proc = subprocess.run(step, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                return (proc.stderr or proc.stdout).strip().splitlines()[-1]
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.wheel_check", description=__doc__)
    parser.add_argument("wheels", nargs="*", type=Path, default=sorted(Path("dist/wheels").glob("*.whl")))
    parser.add_argument("--no-install", action="store_true", help="validate names and metadata only")
    parser.add_argument("--find-links", "-f", action="append", default=[], help="extra find-links for pip (torch)")
    parser.add_argument("--no-index", action="store_true", help="pip may not reach an index")
    parser.add_argument("--system-site-packages", action="store_true", help="let the venv see an installed torch")
    args = parser.parse_args(argv)
    if not args.wheels:
        print("error: no wheels given and none in dist/wheels", file=sys.stderr)
        return 2
    pip_args = [*(["--no-index"] if args.no_index else []), *(a for f in args.find_links for a in ("-f", f))]
    table = Table(title="wheel check")
    for col in ("wheel", "torch", "CUDA", "result"):
        table.add_column(col)
    failed = 0
    for wheel in args.wheels:
        found = problems(wheel)
        flavour = wheel_flavour(wheel.name) if not found else None
        if not found and not args.no_install:
            if installable_here(wheel):
                error = install_and_import(wheel, pip_args, args.system_site_packages)
                found = [f"install/import failed: {error}"] if error else []
                result = "ok, installed and imported" if not found else ""
            else:
                result = "ok (not installable on this interpreter/platform)"
        else:
            result = "ok"
        failed += bool(found)
        table.add_row(wheel.name, *(flavour or ("?", "?")), "; ".join(found) or result)
    console().print(table)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
