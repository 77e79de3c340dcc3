"""`python -m scripts.standin_channel`: a STAND-IN conda channel made from this machine. Never publish it.

No conda channel is reachable on the rehearsal machine, so this makes, for one linux-64 variant,
the packages our recipes take from conda-forge, under the names, versions and build-string
shapes the recipes ask for (`pytorch 2.11.*`, `pytorch * cuda*`, `cuda-version 13.0.*`,
`gcc_linux-64 15.*`, ...), so that the real recipes solve unchanged:

| stand-in | holds |
|---|---|
| python, python_abi | a venv-style interpreter around this machine's CPython; the ABI metapackage |
| pip, setuptools, triton, pytorch | links into a pip-installed PyPI tree: torch's CUDA build and all it needs |
| cuda-version | metapackage that constrains `__cuda` (set CONDA_OVERRIDE_CUDA without a driver) |
| cuda-nvcc_linux-64 | `bin/nvcc` running this machine's nvcc; conda-forge's activation (flags, `-ccbin`) |
| cuda-cudart(-dev), libcu{blas,sparse,solver}(-dev) | toolkit and nvidia-* wheel headers and libraries, in `targets/` |
| gcc_linux-64, gxx_linux-64 | this machine's gcc/g++ under conda-forge's tool names and activation flags |
| sysroot_linux-64, libgcc, libstdcxx | metapackages: this machine's glibc, libgcc and libstdc++ serve |
| ninja | `bin/ninja` → this machine's ninja |

Run dependencies and run_exports follow conda-forge's, so a package built against the channel
depends on what it would depend on there. Versions are what the variant pins; where the machine's
tool differs (gcc 12 standing in for gcc_linux-64 15), the build string and summary say so.
Each stand-in is a tiny rattler-build recipe whose script copies a staged tree (mostly symlinks to
this machine's files) into $PREFIX; rattler indexes the result. The channel only works on the
machine (and with the PyPI tree) it was made with.
"""
from __future__ import annotations

import argparse
import asyncio
import csv
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path

import yaml
from packaging.utils import canonicalize_name
from rattler.index import index_fs

from scripts import engine
from scripts.variants import PACKAGES, ROOT, Variant, VariantError, load

WORK = ROOT / ".cache" / "rehearsal"
CUDA_HOME = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
TARGET = "targets/x86_64-linux"
TRIPLET = "x86_64-conda-linux-gnu"
# What the recipes' host sections take from PyPI through the stand-ins besides torch's own closure.
PYPI_EXTRAS = ("pip", "setuptools")


class StandInError(RuntimeError):
    """This machine can't stand in for the variant (wrong Python, nvcc, missing tool, ...)."""


@dataclass(frozen=True)
class StandIn:
    """One conda package standing in for conda-forge's: its metadata and the tree it puts in $PREFIX."""

    name: str
    version: str
    build: str
    summary: str
    links: dict[str, str] = field(default_factory=dict)  # prefix path -> symlink target
    texts: dict[str, str] = field(default_factory=dict)  # prefix path -> file content
    depends: tuple[str, ...] = ()
    constrains: tuple[str, ...] = ()
    run_exports: dict[str, list[str]] = field(default_factory=dict)

    def recipe(self, stage: Path) -> dict:
        return {
            "package": {"name": self.name, "version": self.version},
            "build": {"number": 0, "string": self.build,
                      "dynamic_linking": {"binary_relocation": False},
                      "script": {"env": {"STAGE": str(stage)}, "content": 'cp -a "$STAGE/." "$PREFIX/"'}},
            "requirements": {"run": list(self.depends), "run_constraints": list(self.constrains),
                             "run_exports": self.run_exports},
            "about": {"summary": f"STAND-IN, never published: {self.summary}", "license": "LicenseRef-stand-in"},
        }

    def stage(self, where: Path) -> None:
        for rel, target in self.links.items():
            (where / rel).parent.mkdir(parents=True, exist_ok=True)
            (where / rel).symlink_to(target)
        for rel, text in self.texts.items():
            (where / rel).parent.mkdir(parents=True, exist_ok=True)
            (where / rel).write_text(text)
            if text.startswith("#!"):
                (where / rel).chmod(0o755)
        where.mkdir(parents=True, exist_ok=True)


# ---------------------------------------------------------------------------------------------
# This machine


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise StandInError(f"{' '.join(cmd)} failed: {exc}") from exc


def _tool(name: str) -> Path:
    found = shutil.which(name)
    if not found:
        raise StandInError(f"{name} is not on PATH; the stand-in channel wraps this machine's {name}")
    return Path(found)


@dataclass(frozen=True)
class Machine:
    python: Path  # the real interpreter binary behind any venv
    cuda_home: Path
    nvcc_version: str  # e.g. 13.0.88
    gcc_version: str

    @classmethod
    def detect(cls, cuda_home: Path) -> Machine:
        nvcc = cuda_home / "bin" / "nvcc"
        if not nvcc.exists():
            raise StandInError(f"no nvcc at {nvcc}; pass --cuda-home")
        found = re.search(r"release \d+\.\d+, V(\d+\.\d+\.\d+)", _run([str(nvcc), "--version"]))
        if not found:
            raise StandInError(f"cannot read the version from {nvcc} --version")
        gcc = _run([str(_tool("gcc")), "-dumpfullversion"]).strip()
        return cls(Path(sys._base_executable).resolve(), cuda_home, found[1], gcc)

    def check(self, v: Variant) -> None:
        here = f"{sys.version_info.major}.{sys.version_info.minor}"
        if here != v.python:
            raise StandInError(f"{v.name} needs Python {v.python}; this interpreter is {here}")
        nvcc_line = ".".join(self.nvcc_version.split(".")[:2])
        if nvcc_line != v.cuda:
            raise StandInError(f"{v.name} needs CUDA {v.cuda}; nvcc in {self.cuda_home} is {self.nvcc_version}")


# ---------------------------------------------------------------------------------------------
# The PyPI side: torch's CUDA build and everything it needs, pip-installed into one tree


@dataclass(frozen=True)
class Distribution:
    name: str
    version: str
    files: tuple[str, ...]  # relative to the tree, as RECORD lists them (scripts and data left out)

    @property
    def top_level(self) -> set[str]:
        return {f.split("/")[0] for f in self.files}


def pypi_tree(work: Path, downloads: Path, torch: str) -> Path:
    """pip-install torch==<torch> (+ pip, setuptools) into work/pypi; wheels are kept in `downloads`."""
    tree = work / "pypi"
    wanted = [f"torch=={torch}", *PYPI_EXTRAS]
    stamp = tree / ".standin-complete"
    if stamp.exists() and stamp.read_text() == "\n".join(wanted):
        return tree
    shutil.rmtree(tree, ignore_errors=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    for step in ([*pip, "download", "--quiet", "--no-cache-dir", "--dest", str(downloads), *wanted],
                 [*pip, "install", "--quiet", "--no-index", "--find-links", str(downloads), "--no-compile",
                  "--target", str(tree), *wanted]):
        if subprocess.run(step, check=False).returncode != 0:
            raise StandInError(f"pip {step[4]} of {', '.join(wanted)} failed (see pip's output above)")
    stamp.write_text("\n".join(wanted))
    return tree


def distributions(tree: Path) -> dict[str, Distribution]:
    found = {}
    for info in sorted(tree.glob("*.dist-info")):
        meta = Parser().parsestr((info / "METADATA").read_text(encoding="utf-8"))
        with (info / "RECORD").open(newline="", encoding="utf-8") as fh:
            rows = [row[0] for row in csv.reader(fh) if row]
        files = tuple(f for f in rows if not f.startswith(("..", "bin/")) and "__pycache__" not in f.split("/"))
        name = canonicalize_name(meta["Name"])
        found[name] = Distribution(name, meta["Version"], files)
    return found


def _torch_cuda(tree: Path) -> str | None:
    text = (tree / "torch" / "version.py").read_text()
    found = re.search(r"^cuda: .*?= ['\"]([\d.]+)['\"]", text, re.MULTILINE)
    return found[1] if found else None


# ---------------------------------------------------------------------------------------------
# The stand-ins


def _pin(version: str, places: int = 1) -> str:
    """conda-forge's run-export pin: >=version,<the next release at `places` (1: major, 2: minor)."""
    head = [int(p) for p in version.split(".")[:places]]
    head[-1] += 1
    return f">={version},<{'.'.join(map(str, head))}.0a0"


def _interpreter(v: Variant, m: Machine) -> list[StandIn]:
    full = ".".join(map(str, sys.version_info[:3]))
    cp = v.flavour.python_tag
    cfg = f"home = {m.python.parent}\ninclude-system-site-packages = false\nversion = {full}\n"
    return [
        StandIn("python", full, "standin_0_cpython", f"venv-style interpreter around {m.python}",
                {f"bin/python{v.python}": str(m.python), "bin/python3": f"python{v.python}",
                 "bin/python": f"python{v.python}"}, {"pyvenv.cfg": cfg},
                run_exports={"weak": [f"python_abi {v.python}.* *_{cp}"]}),
        StandIn("python_abi", v.python, f"8_{cp}", "Python ABI metapackage",
                constrains=(f"python {v.python}.* *_cpython",)),
    ]


def _python_packages(v: Variant, tree: Path, dists: dict[str, Distribution]) -> list[StandIn]:
    """pip, setuptools, triton: their own distributions; pytorch: torch and every other wheel it pulled in."""
    owners = {"pip": "pip", "setuptools": "setuptools", "triton": "triton"}
    missing = [name for name in (*owners, "torch") if name not in dists]
    if missing:
        raise StandInError(f"{tree} has no {', '.join(missing)}; it should hold torch and every wheel it needs")
    claimed: dict[str, str] = {}
    for dist in dists.values():
        package = owners.get(dist.name, "pytorch")
        for top in dist.top_level:
            if claimed.setdefault(top, package) != package:
                raise StandInError(f"{tree / top} belongs to both {claimed[top]} and {package}")

    def links(package: str) -> dict[str, str]:
        site = f"lib/python{v.python}/site-packages"
        return {f"{site}/{top}": str(tree / top) for top, owner in sorted(claimed.items()) if owner == package}

    py = (f"python {_pin(v.python, 2)}", f"python_abi {v.python}.* *_{v.flavour.python_tag}")
    tag = f"py{v.python.replace('.', '')}_0"
    where = f"pip-installed from PyPI into {tree}"
    out = [StandIn(name, dists[name].version, f"standin_{tag}", f"{name} {dists[name].version}, {where}",
                   links(name), depends=py) for name in owners]
    torch, triton, setuptools = (dists[n].version for n in ("torch", "triton", "setuptools"))
    return out + [
        StandIn("pytorch", torch, f"cuda{v.cuda.replace('.', '')}_standin_{tag}",
                f"torch {torch} (CUDA {v.cuda} build) and its PyPI dependencies (nvidia-*, sympy, ...), {where}",
                links("pytorch"),
                depends=(*py, f"triton =={triton}", f"setuptools {_pin(setuptools)}", f"cuda-version {_pin(v.cuda)}",
                         "__cuda"),
                run_exports={"weak": [f"pytorch {_pin(torch, 2)}"]}),
    ]


def _cuda_libraries(v: Variant, m: Machine, tree: Path, dists: dict[str, Distribution]) -> list[StandIn]:
    """cuda-version; cudart from the toolkit; cuBLAS, cuSPARSE, cuSOLVER from torch's nvidia-* wheels."""
    pin = f"cuda-version {_pin(v.cuda, 2)}"
    lib = next(d for d in (m.cuda_home / "lib64", m.cuda_home / "lib") if d.is_dir())
    headers = {f"{TARGET}/include/{p.name}": str(p) for p in sorted((m.cuda_home / "include").iterdir())}
    out = [
        StandIn("cuda-version", v.cuda, "standin_0", f"CUDA {v.cuda} metapackage",
                constrains=(f"__cuda >={v.cuda}", f"cudatoolkit {v.cuda}.*")),
        StandIn("cuda-cudart", m.nvcc_version, "standin_0", f"libcudart of the CUDA toolkit in {m.cuda_home}",
                {f"lib/{p.name}": str(p) for p in sorted(lib.glob("libcudart.so.*"))}, depends=(pin,)),
        StandIn("cuda-cudart-dev", m.nvcc_version, "standin_0", f"headers of the CUDA toolkit in {m.cuda_home}",
                {**headers, f"{TARGET}/lib/libcudart.so": str(lib / "libcudart.so"),
                 "lib/libcudart.so": str(lib / "libcudart.so")},
                depends=(pin, f"cuda-cudart =={m.nvcc_version}"),
                run_exports={"weak": [f"cuda-cudart {_pin(m.nvcc_version)}"]}),
    ]
    for name, wheel in (("libcublas", "nvidia-cublas"), ("libcusparse", "nvidia-cusparse"),
                        ("libcusolver", "nvidia-cusolver")):
        d = dists.get(wheel)
        if d is None:
            raise StandInError(f"torch's PyPI dependencies have no {wheel} wheel to take {name} from")
        libs = [f for f in d.files if "/lib/" in f and ".so" in f]
        heads = [f for f in d.files if "/include/" in f]
        where = f"{wheel} {d.version} in {tree}"
        out += [
            StandIn(name, d.version, "standin_0", f"libraries of {where}",
                    {f"lib/{Path(f).name}": str(tree / f) for f in libs}, depends=(pin,)),
            StandIn(f"{name}-dev", d.version, "standin_0", f"headers of {where}",
                    {**{f"{TARGET}/include/{f.split('/include/', 1)[1]}": str(tree / f) for f in heads},
                     **{f"lib/{re.sub(r'[.]so[.].*', '.so', Path(f).name)}": str(tree / f) for f in libs}},
                    depends=(pin, f"{name} =={d.version}"), run_exports={"weak": [f"{name} {_pin(d.version)}"]}),
        ]
    return out


_ACTIVATION = Path(__file__).with_name("standin_activation")
# conda-forge's tool names (x86_64-conda-linux-gnu-gcc, ...) -> this machine's tools.
_GCC_TOOLS = {"cc": "gcc", **{t: t for t in ("cpp", "gcc", "gcc-ar", "gcc-nm", "gcc-ranlib", "ar", "as", "ld", "nm",
                                            "objcopy", "objdump", "ranlib", "readelf", "strip")}}
_GXX_TOOLS = {"c++": "g++", "g++": "g++"}


def _activation(template: str, tools: dict[str, str] | None = None) -> str:
    """standin_activation/<template>, behind a header that finds the package's prefix and the flags' prefix."""
    body = (_ACTIVATION / template).read_text()
    body = body.replace("@TRIPLET@", TRIPLET).replace("@TARGET@", TARGET).replace("@TOOLS@", " ".join(tools or ()))
    return ("# STAND-IN (never published) for a conda-forge activation script: same variables, this machine's tools.\n"
            '_standin="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"\n'
            'if [ "${CONDA_BUILD:-0}" = "1" ]; then _p="${PREFIX}"; else _p="${CONDA_PREFIX}"; fi\n' + body)


def _tool_links(tools: dict[str, str]) -> dict[str, str]:
    return {f"bin/{TRIPLET}-{name}": str(_tool(tool)) for name, tool in tools.items()}


def _toolchain(v: Variant, m: Machine) -> list[StandIn]:
    """Compilers, sysroot and runtimes under the versions the variant pins; build strings name the real gcc."""
    gcc, stdlib = v.toolchain["c_compiler_version"], v.toolchain["c_stdlib_version"]
    real = f"gcc {m.gcc_version}"
    build = f"standin_gcc{m.gcc_version.replace('.', '_')}_0"
    nvcc = m.cuda_home / "bin" / "nvcc"
    ninja = _tool("ninja")
    return [
        StandIn("gcc_linux-64", gcc, build, f"{real} ({_tool('gcc')}) standing in for gcc {gcc}",
                _tool_links(_GCC_TOOLS),
                {"etc/conda/activate.d/activate-gcc_linux-64.sh": _activation("gcc.sh", _GCC_TOOLS)},
                depends=(f"sysroot_linux-64 {stdlib}.*",), run_exports={"strong": [f"libgcc >={gcc}"]}),
        StandIn("gxx_linux-64", gcc, build, f"g++ {m.gcc_version} ({_tool('g++')}) standing in for g++ {gcc}",
                _tool_links(_GXX_TOOLS),
                {"etc/conda/activate.d/activate-gxx_linux-64.sh": _activation("gxx.sh", _GXX_TOOLS)},
                depends=(f"gcc_linux-64 =={gcc} {build}",),
                run_exports={"strong": [f"libstdcxx >={gcc}", f"libgcc >={gcc}"]}),
        StandIn("sysroot_linux-64", stdlib, "standin_0", f"this machine's glibc ({_glibc()}) is the sysroot",
                run_exports={"strong": [f"__glibc >={stdlib},<3.0.a0"]}),
        StandIn("libgcc", gcc, build, f"this machine's libgcc_s ({real})"),
        StandIn("libstdcxx", gcc, build, f"this machine's libstdc++ ({real})"),
        # bin/nvcc is a wrapper, not a link: nvcc looks for nvcc.profile (and cicc) beside the path it was started
        # as. "~" sorts the activation last: it reads CXX, which the compiler activations set (as on conda-forge).
        StandIn("cuda-nvcc_linux-64", m.nvcc_version, "standin_0", f"nvcc {m.nvcc_version} of {m.cuda_home}",
                texts={"bin/nvcc": f'#!/bin/sh\nexec "{nvcc}" "$@"\n',
                       "etc/conda/activate.d/~cuda-nvcc_activate.sh": _activation("cuda-nvcc.sh")},
                run_exports={"strong": [f"cuda-version >={v.cuda},<{int(v.cuda.split('.')[0]) + 1}"]}),
        StandIn("ninja", _run([str(ninja), "--version"]).strip(), "standin_0", str(ninja), {"bin/ninja": str(ninja)}),
    ]


def _glibc() -> str:
    return _run(["ldd", "--version"]).splitlines()[0].split()[-1]


def standins(v: Variant, m: Machine, tree: Path) -> list[StandIn]:
    """Every package the recipes take from conda-forge for variant `v`, as stand-ins."""
    dists = distributions(tree)
    cuda = _torch_cuda(tree)
    if cuda != v.cuda:
        raise StandInError(f"torch {dists['torch'].version} from PyPI is a {'CUDA ' + cuda if cuda else 'CPU'} build; "
                           f"{v.name} needs CUDA {v.cuda}")
    if not dists["torch"].version.startswith(f"{v.torch}."):
        raise StandInError(f"the PyPI tree has torch {dists['torch'].version}; {v.name} needs {v.torch}")
    return [*_interpreter(v, m), *_python_packages(v, tree, dists), *_cuda_libraries(v, m, tree, dists),
            *_toolchain(v, m)]


# ---------------------------------------------------------------------------------------------
# Building the channel


def build_channel(packages: list[StandIn], channel: Path, work: Path) -> Path:
    """Build every stand-in with rattler-build and index them; `channel` is replaced only when all succeed."""
    scratch = work / "standin-build"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    out = scratch / "out"
    log = work / "standin-channel.log"
    with log.open("w") as fh:
        for pkg in packages:
            stage = scratch / "stage" / pkg.name
            pkg.stage(stage)
            recipe = scratch / "recipes" / pkg.name / "recipe.yaml"
            recipe.parent.mkdir(parents=True)
            recipe.write_text(yaml.safe_dump(pkg.recipe(stage), sort_keys=False))
            try:
                engine.build(str(recipe), "linux-64", str(out), {}, [], log=fh, test_strategy="skip",
                             include_recipe=False)
            except Exception as exc:
                raise StandInError(f"building stand-in {pkg.name}: {exc} (log: {log})") from exc
    partial = scratch / "channel"
    for sub in ("linux-64", "noarch"):
        (partial / sub).mkdir(parents=True)
        for conda in sorted((out / sub).glob("*.conda")):
            conda.replace(partial / sub / conda.name)
    built = sorted(c.name for c in partial.rglob("*.conda"))
    if len(built) != len(packages):
        raise StandInError(f"{len(packages)} stand-ins built into {len(built)} packages: {built} (log: {log})")
    asyncio.run(index_fs(partial))
    shutil.rmtree(channel, ignore_errors=True)
    channel.parent.mkdir(parents=True, exist_ok=True)
    partial.replace(channel)
    shutil.rmtree(scratch)
    return channel


def make(v: Variant, work: Path, downloads: Path, cuda_home: Path) -> tuple[Path, Path]:
    """The stand-in channel for variant `v` at work/channel, and the PyPI tree it links into (work/pypi)."""
    machine = Machine.detect(cuda_home)
    machine.check(v)
    tree = pypi_tree(work, downloads, v.torch_version)
    return build_channel(standins(v, machine, tree), work / "channel", work), tree


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.standin_channel", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--package", required=True, choices=PACKAGES)
    parser.add_argument("--variant", required=True, help="linux-64 variant, e.g. linux-sage3-pytorch211-cu130-python311")
    parser.add_argument("--work", type=Path, default=WORK, help="channel, PyPI tree, logs (default: .cache/rehearsal)")
    parser.add_argument("--downloads", type=Path, help="torch's wheels, kept between runs (default: WORK/wheels)")
    parser.add_argument("--cuda-home", type=Path, default=CUDA_HOME)
    args = parser.parse_args(argv)
    try:
        variant = load(args.package).named(args.variant, platform="linux-64")
        channel, _ = make(variant, args.work, args.downloads or args.work / "wheels", args.cuda_home)
    except (StandInError, VariantError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(channel.as_uri())
    return 0


if __name__ == "__main__":
    sys.exit(main())
