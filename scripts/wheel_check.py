"""`python -m scripts.wheel_check WHEEL…`: validate exported wheels, then install each in a fresh venv and import it.

Checks: PEP 427 filename; build tag decodes to torch × CUDA (280.129 = torch 2.8 + CUDA 12.9);
METADATA name/version match the filename and require torch of that minor (a stable-ABI build, 2100up.130:
that minor and up); WHEEL tags and Build match the filename; RECORD hashes hold; the license files are in
dist-info/licenses. Wheels for another interpreter or platform are validated but not installed. With
--cuda-torch, a CUDA build of the wheel's torch is installed first (PyTorch's index for the wheel's CUDA line
beside PyPI, e.g. https://download.pytorch.org/whl/cu129) and must report that CUDA major: importing the compiled
modules needs no GPU, but it needs torch's CUDA libraries (libc10_cuda), which a CPU torch lacks.
Exit status: 2 when a wheel is malformed, 1 when a sound wheel does not install or import.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from email.parser import Parser
from pathlib import Path

from packaging.tags import sys_tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from rich.table import Table
from wheel.wheelfile import WheelFile

from scripts.matrix import console
from scripts.wheel_names import wheel_flavour, wheel_torch_requirement


TORCH_INDEX = "https://download.pytorch.org/whl/cu{cuda}"  # PyTorch's wheels for one CUDA line, e.g. cu129


def problems(wheel: Path) -> list[str]:
    """Everything wrong with one wheel's name and metadata (empty when it is sound)."""
    try:
        name, version, build, tags = parse_wheel_filename(wheel.name)
        flavour = wheel_flavour(wheel.name)
    except ValueError as exc:
        return [str(exc)]
    if flavour is None:
        return ["no build tag: expected <torch>0.<CUDA>, e.g. 280.129"]
    found = []
    try:
        with WheelFile(wheel) as whl:
            meta = Parser().parsestr(whl.read(f"{whl.dist_info_path}/METADATA").decode())
            info = Parser().parsestr(whl.read(f"{whl.dist_info_path}/WHEEL").decode())
            names, dist_info = whl.namelist(), whl.dist_info_path
            for item in whl.infolist():  # reading verifies each file against RECORD
                whl.read(item)
    except Exception as exc:  # noqa: BLE001 - any unreadable or inconsistent archive is a finding
        return [f"unreadable wheel: {exc}"]
    if canonicalize_name(meta["Name"]) != name or meta["Version"] != str(version):
        found.append(f"METADATA says {meta['Name']} {meta['Version']}, filename says {name} {version}")
    wanted = wheel_torch_requirement(wheel.name)
    if wanted not in (meta.get_all("Requires-Dist") or []):
        found.append(f"METADATA does not require {wanted} as the build tag says")
    if {str(t) for t in tags} != set(info.get_all("Tag") or []):
        found.append(f"WHEEL tags {info.get_all('Tag')} differ from the filename's {sorted(map(str, tags))}")
    if info["Build"] != f"{build[0]}{build[1]}":
        found.append(f"WHEEL Build {info['Build']!r} differs from the filename's {build[0]}{build[1]}")
    licenses = meta.get_all("License-File") or []
    if not licenses:
        found.append("METADATA names no License-File")
    missing = [f for f in licenses if f"{dist_info}/licenses/{f}" not in names]
    if missing:
        found.append(f"License-File {', '.join(missing)} not in {dist_info}/licenses/")
    return found


def installable_here(wheel: Path) -> bool:
    _, _, _, tags = parse_wheel_filename(wheel.name)
    return bool(set(tags) & set(sys_tags()))


# A compiled extension module's file: sageattn3/_C.cpython-311-x86_64-linux-gnu.so, _C.cp312-win_amd64.pyd, x.abi3.so.
_EXTENSION = re.compile(r"\.(cpython-[^./]+|abi3|cp\d+-win_amd64)\.(so|pyd)$")


def modules_to_import(paths: list[str]) -> list[str]:
    """Top-level packages among site-packages-relative `paths`, then their compiled extensions (e.g. sageattn3._C)."""
    packages = sorted({p.split("/")[0] for p in paths if p.count("/") == 1 and p.endswith("/__init__.py")})
    extensions = sorted(_EXTENSION.sub("", p).replace("/", ".") for p in paths
                        if _EXTENSION.search(p) and p.split("/")[0] in packages)
    return packages + extensions


def top_level_packages(wheel: Path) -> list[str]:
    """What install_and_import imports: the wheel's top-level packages and compiled extension modules."""
    with WheelFile(wheel) as whl:
        return modules_to_import(whl.namelist())


def cuda_torch_step(wheel: Path, pip_args: list[str]) -> list[str]:
    """pip arguments installing a CUDA build of the wheel's torch: PyTorch's index for its CUDA line, beside the
    other indexes (PyPI's Linux torch is a CUDA build too; its Windows torch is CPU-only)."""
    torch, cuda = wheel_flavour(wheel.name)
    index = [] if "--no-index" in pip_args else ["--extra-index-url", TORCH_INDEX.format(cuda=cuda.replace(".", ""))]
    return [*pip_args, *index, f"torch=={torch}.*"]


def import_script(wheel: Path, cuda_torch: bool) -> str:
    """Python that imports the wheel's modules (after torch, as users do) and prints the torch it ran with; with
    cuda_torch it first fails unless torch is a build for the wheel's CUDA major."""
    lines = ["import torch", "cuda = torch.version.cuda"]
    if cuda_torch:
        major = wheel_flavour(wheel.name)[1].split(".")[0]
        lines.append(f"if (cuda or '').split('.')[0] != {major!r}: raise SystemExit("
                     f"f'torch {{torch.__version__}} is a {{\"CUDA \" + cuda if cuda else \"CPU\"}} build; "
                     f"this wheel needs a CUDA {major} build')")
    lines += [f"import {m}" for m in top_level_packages(wheel)]
    lines.append("print(f'torch {torch.__version__} (CUDA {cuda})')")
    return "\n".join(lines)


def install_and_import(wheel: Path, pip_args: list[str], system_site_packages: bool,
                       base_python: str | None = None, cuda_torch: bool = False) -> tuple[bool, str]:
    """Install into a fresh venv of base_python (default: this one), with a CUDA torch first when cuda_torch, and
    import top_level_packages(wheel). Returns (True, the torch it imported against) or (False, the error)."""
    with tempfile.TemporaryDirectory(prefix="sage-check-") as tmp:
        flags = ["--system-site-packages"] if system_site_packages else []
        subprocess.run([base_python or sys.executable, "-m", "venv", *flags, tmp], check=True)
        python = str(Path(tmp) / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python"))
        pip = [python, "-m", "pip", "install", "--disable-pip-version-check"]
        steps = [[*pip, *cuda_torch_step(wheel, pip_args)]] if cuda_torch else []
        steps += [[*pip, *pip_args, str(wheel)], [python, "-c", import_script(wheel, cuda_torch)]]
        for step in steps:
            # In the venv's folder: run from a checkout, `import sageattention` would find its sources instead.
            cwd = tmp if step is steps[-1] else None
            proc = subprocess.run(step, capture_output=True, text=True, check=False, cwd=cwd)
            if proc.returncode != 0:
                return False, (proc.stderr or proc.stdout).strip().splitlines()[-1]
    return True, proc.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.wheel_check", description=__doc__)
    parser.add_argument("wheels", nargs="*", type=Path, default=sorted(Path("dist/wheels").glob("*.whl")))
    parser.add_argument("--no-install", action="store_true", help="validate names and metadata only")
    parser.add_argument("--find-links", "-f", action="append", default=[], help="extra find-links for pip (torch)")
    parser.add_argument("--no-index", action="store_true", help="pip may not reach an index")
    parser.add_argument("--system-site-packages", action="store_true", help="let the venv see an installed torch")
    parser.add_argument("--python", help="make the venv from this interpreter (e.g. the wheel's Python in CI); "
                        "every wheel is then installed, whatever this interpreter's tags")
    parser.add_argument("--extra-index-url", action="append", default=[], help="extra index for pip")
    parser.add_argument("--cuda-torch", action="store_true",
                        help="install a CUDA build of the wheel's torch first (PyTorch's index for its CUDA line "
                        "unless --no-index) and require it: what pip users have, and what the compiled modules need")
    args = parser.parse_args(argv)
    if not args.wheels:
        print("error: no wheels given and none in dist/wheels", file=sys.stderr)
        return 2
    pip_args = [*(["--no-index"] if args.no_index else []), *(a for f in args.find_links for a in ("-f", f)),
                *(a for url in args.extra_index_url for a in ("--extra-index-url", url))]
    table = Table(title="wheel check")
    for col in ("wheel", "torch", "CUDA", "result"):
        table.add_column(col)
    malformed = failed = 0
    for wheel in args.wheels:
        found = problems(wheel)
        flavour = wheel_flavour(wheel.name) if not found else None
        malformed += bool(found)
        result = "ok"
        if not found and not args.no_install:
            if args.python or installable_here(wheel):
                ok, text = install_and_import(wheel, pip_args, args.system_site_packages, args.python, args.cuda_torch)
                found = [] if ok else [f"install/import failed: {text}"]
                result = f"ok, installed and imported with {text}"
            else:
                result = "ok (not installable on this interpreter/platform)"
        failed += bool(found)
        table.add_row(wheel.name, *(flavour or ("?", "?")), "; ".join(found) or result)
        for problem in found:
            print(f"error: {wheel}: {problem}", file=sys.stderr)
    console().print(table)
    return 2 if malformed else 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
