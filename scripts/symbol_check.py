"""`python -m scripts.symbol_check WHEEL…`: torch's libraries export every torch symbol a wheel's modules need.

A compiled module built against one torch and imported with another fails with "undefined symbol" when a torch
function it calls is missing or named differently there; the C++ string ABI renames every function that takes a
std::string (PyPI's Linux torch before 2.7 uses the pre-C++11 ABI: `std::string` where conda-forge's builds, and so
ours, have `std::__cxx11::basic_string`). For each wheel this lists the undefined dynamic symbols of its ELF
extension modules that belong to torch (C++ names in the namespaces c10, at, torch and caffe2, and the C functions
of torch's stable ABI), gets the PyPI torch wheel its Requires-Dist names for its Python and CPU (pip download
--no-deps into --cache, default .cache/torch-wheels; --torch-wheel gives one), reads what that wheel's libtorch* and
libc10* export (each extracted alone and deleted again; the list is cached beside the wheel) and reports every
needed symbol none exports. Exit status 1 when a symbol is missing, 2 when a wheel or torch can't be read.
"""
from __future__ import annotations

import argparse
import gzip
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from email.parser import Parser
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from packaging.requirements import Requirement
from packaging.utils import parse_wheel_filename

from scripts.variants import ROOT

CACHE = ROOT / ".cache" / "torch-wheels"
# Itanium-mangled names in torch's namespaces (plus their vtables and typeinfo), and the stable ABI's C shims.
TORCH_SYMBOL = re.compile(r"^(?:_Z(?:T[VIS])?N[rVKRO]*(?:3c10|2at|5torch|6caffe2)\d|aoti_torch_|torch_)")
# torch's own libraries inside its wheel (not the bundled libgomp, cuDNN, ...).
TORCH_LIBRARY = re.compile(r"^torch/lib/lib(?:torch|c10)[^/]*\.so(?:\.\d+)*$")
# pip's platform tags for a CPU: `pip download --platform` matches them literally, and torch's wheels changed tag.
PIP_PLATFORMS = {
    "x86_64": ["manylinux1_x86_64", "manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64"],
    "aarch64": ["manylinux2014_aarch64", "manylinux_2_17_aarch64", "manylinux_2_28_aarch64"],
}


class SymbolCheckError(RuntimeError):
    """A wheel or torch wheel that can't be read or fetched."""


def _dynamic_symbols(elf: Path):
    try:
        with elf.open("rb") as fh:
            table = ELFFile(fh).get_section_by_name(".dynsym")
            yield from table.iter_symbols() if table else ()
    except ELFError as exc:
        raise SymbolCheckError(f"{elf.name}: not a readable ELF file: {exc}") from exc


def undefined_torch_symbols(elf: Path) -> set[str]:
    """The torch symbols a shared object needs from elsewhere (weak references may stay unresolved: left out)."""
    return {s.name for s in _dynamic_symbols(elf)
            if s["st_shndx"] == "SHN_UNDEF" and s["st_info"]["bind"] == "STB_GLOBAL" and TORCH_SYMBOL.match(s.name)}


def exported_symbols(elf: Path) -> set[str]:
    """The symbols a shared object defines for others to link against."""
    return {s.name for s in _dynamic_symbols(elf)
            if s["st_shndx"] != "SHN_UNDEF" and s["st_info"]["bind"] in ("STB_GLOBAL", "STB_WEAK", "STB_GNU_UNIQUE")
            and s["st_other"]["visibility"] in ("STV_DEFAULT", "STV_PROTECTED")}


def extract(archive: Path, wanted, dest: Path) -> list[Path]:
    """Extract the members of a zip (a wheel) whose names `wanted` accepts into dest; members already there are
    kept. Returns their paths."""
    out = []
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            if info.is_dir() or not wanted(info.filename):
                continue
            target = dest / info.filename
            if not target.exists() or target.stat().st_size != info.file_size:
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, target.open("wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
            out.append(target)
    return out


def torch_exports(torch_wheel: Path) -> set[str]:
    """Everything torch's libraries in a torch wheel export, cached as <wheel>.exports.gz beside it."""
    cached = torch_wheel.with_name(torch_wheel.name + ".exports.gz")
    if cached.exists():
        return set(gzip.decompress(cached.read_bytes()).decode().split())
    found: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="torch-libs-", dir=torch_wheel.parent) as tmp:
        with zipfile.ZipFile(torch_wheel) as zf:
            members = [n for n in zf.namelist() if TORCH_LIBRARY.match(n)]
        if not members:
            raise SymbolCheckError(f"{torch_wheel.name} holds no torch/lib/libtorch*.so or libc10*.so")
        for member in members:  # one at a time: libtorch_cuda.so alone is up to 1 GB
            (lib,) = extract(torch_wheel, member.__eq__, Path(tmp))
            found |= exported_symbols(lib)
            lib.unlink()
    cached.write_bytes(gzip.compress("\n".join(sorted(found)).encode()))
    return found


def wheel_target(wheel: Path) -> tuple[str, str, str]:
    """(torch requirement, Python major.minor, CPU) that a wheel's METADATA and tags ask for."""
    _, _, _, tags = parse_wheel_filename(wheel.name)
    tag = sorted(tags, key=str)[0]
    cpu = next((c for c in PIP_PLATFORMS if tag.platform.endswith(c)), None)
    if cpu is None or not tag.platform.startswith(("linux_", "manylinux")):
        raise SymbolCheckError(f"{wheel.name}: platform {tag.platform} is not Linux on {' or '.join(PIP_PLATFORMS)}")
    digits = tag.interpreter.removeprefix("cp")
    python = f"{digits[0]}.{digits[1:]}"
    with zipfile.ZipFile(wheel) as zf:
        (meta,) = [n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
        requires = Parser().parsestr(zf.read(meta).decode()).get_all("Requires-Dist") or []
    torch = [r for r in map(Requirement, requires) if r.name == "torch"]
    if len(torch) != 1:
        raise SymbolCheckError(f"{wheel.name}: METADATA names torch {len(torch)} times in Requires-Dist")
    return f"torch{torch[0].specifier}", python, cpu


def fetch_torch(requirement: str, python: str, cpu: str, cache: Path = CACHE) -> Path:
    """PyPI's torch wheel for a requirement, Python and CPU, in `cache`. An exact version (torch==2.6.0) already
    there is taken without asking PyPI."""
    cache.mkdir(parents=True, exist_ok=True)
    exact = re.fullmatch(r"torch==(\d+\.\d+\.\d+)", requirement)
    tag = f"cp{python.replace('.', '')}"
    if exact:
        have = sorted(cache.glob(f"torch-{exact[1]}-{tag}-{tag}-*{cpu}.whl"))
        if have:
            return have[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(cache),
           "--python-version", python, *(a for p in PIP_PLATFORMS[cpu] for a in ("--platform", p)), requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    saved = re.findall(r"(?:Saved|File was already downloaded) (\S+\.whl)", proc.stdout)
    if proc.returncode != 0 or len(saved) != 1:
        raise SymbolCheckError(f"pip download {requirement} (Python {python}, {cpu}) failed: "
                               + (proc.stderr.strip().splitlines() or ["no wheel saved"])[-1])
    return Path(saved[0])


def missing_symbols(modules: dict[str, Path], exports: set[str]) -> dict[str, list[str]]:
    """Per module, the torch symbols it needs that `exports` lacks (modules lacking none are left out)."""
    found = {name: sorted(undefined_torch_symbols(path) - exports) for name, path in modules.items()}
    return {name: symbols for name, symbols in found.items() if symbols}


def demangle(symbols: list[str]) -> list[str]:
    """C++ names for messages (c++filt where binutils has it, else the mangled ones)."""
    tool = shutil.which("c++filt")
    if not tool or not symbols:
        return symbols
    return subprocess.run([tool], input="\n".join(symbols), capture_output=True, text=True,
                          check=True).stdout.splitlines()


def check_wheel(wheel: Path, torch_wheel: Path | None = None, cache: Path = CACHE,
                torch_version: str | None = None) -> tuple[Path, dict]:
    """(the torch wheel checked against, missing_symbols of the wheel's ELF extension modules). The torch wheel is
    `torch_wheel`, else PyPI's torch==torch_version, else the one the wheel's Requires-Dist names."""
    if torch_wheel is None:
        requirement, python, cpu = wheel_target(wheel)
        torch_wheel = fetch_torch(f"torch=={torch_version}" if torch_version else requirement, python, cpu, cache)
    with tempfile.TemporaryDirectory(prefix="sage-symbols-") as tmp:
        modules = {str(p.relative_to(tmp)): p for p in extract(wheel, lambda n: n.endswith(".so"), Path(tmp))}
        return torch_wheel, missing_symbols(modules, torch_exports(torch_wheel))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.symbol_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("wheels", nargs="+", type=Path)
    parser.add_argument("--torch-wheel", type=Path, help="check against this torch wheel instead of PyPI's")
    parser.add_argument("--torch", action="append", metavar="VERSION",
                        help="check against PyPI's torch==VERSION instead of the one the wheel requires "
                        "(repeatable: a stable-ABI wheel against its oldest and newest torch)")
    parser.add_argument("--cache", type=Path, default=CACHE, help="torch wheels and their export lists")
    args = parser.parse_args(argv)
    status = 0
    for wheel in args.wheels:
        for version in args.torch or [None]:
            status = max(status, _report(wheel, args.torch_wheel, args.cache, version))
    return status


def _report(wheel: Path, torch_wheel: Path | None, cache: Path, version: str | None) -> int:
    """Check one wheel against one torch and print the outcome; returns main's exit status for it."""
    try:
        torch_wheel, missing = check_wheel(wheel, torch_wheel, cache, version)
    except (SymbolCheckError, OSError, ValueError, zipfile.BadZipFile) as exc:
        print(f"error: {wheel.name}: {exc}", file=sys.stderr)
        return 2
    if not missing:
        print(f"{wheel.name}: every torch symbol it needs is exported by {torch_wheel.name}")
    for module, symbols in missing.items():
        print(f"error: {wheel.name}: {module} needs {len(symbols)} torch symbols that {torch_wheel.name} does not "
              "export (a different torch, or its other C++ string ABI):", file=sys.stderr)
        print("\n".join(f"  {name}" for name in demangle(symbols)), file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
