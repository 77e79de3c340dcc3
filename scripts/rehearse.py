"""`python -m scripts.rehearse` (`pixi run rehearse`): run both recipes for real, offline, on this machine.

No conda channel is reachable here, so a recipe that only renders never ran. This:

1. makes the stand-in channel (scripts/standin_channel.py: this machine's CPython, gcc and CUDA
   toolkit, and PyPI's CUDA build of torch, under conda-forge's names; never published) for one
   variant of each package, torch 2.11 + CUDA 13.0 + Python 3.11;
2. runs the build driver against it (`python -m scripts.build --channel file://…`) for each package,
   with TORCH_CUDA_ARCH_LIST=12.0 and MAX_JOBS set and CONDA_OVERRIDE_CUDA unset (the driver supplies
   it, as it must on any builder without a GPU driver): rattler-build solves the recipe unchanged,
   runs its build script (nvcc compiles sageattn3's CUDA kernels) and its package tests; the driver
   indexes the output channel and exports the wheels;
3. checks what came out: each package holds only its own modules, its build script saw the caller's
   TORCH_CUDA_ARCH_LIST and MAX_JOBS, and every CUDA extension holds device code for exactly that arch;
   the package and the wheel are named for that arch list (sm120 in the build string and the build tag),
   and both hold sageattention's compiled modules (_C_sm80, _C_sm89) with the MMA instructions their
   kernels are made of (KERNELS: INT8 IMMA in both, the e4m3 QMMA in _C_sm89);
   rattler installs each package from the output channel into a fresh prefix, where it and its
   extension modules import; each package carries its source tree's LICENSE; every torch symbol of each
   wheel's compiled modules is exported by the downloaded PyPI torch wheel (scripts.symbol_check); then the
   workflows' wheel check (scripts.wheel_check --cuda-torch) runs on each wheel: real pip installs PyPI's CUDA torch (from
   the downloaded wheels, no index) and the wheel into a fresh venv, which imports it, compiled modules
   included; its license files are in dist-info/licenses.

torch's wheels (~2.6 GB) and the PyPI tree installed from them stay under --work between runs; the
channels, packages and wheels are made fresh. Exits 1 when a step fails, naming it and its log.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from contextlib import contextmanager
from pathlib import Path

import rattler
import yaml
from rattler.package_streaming import extract
from rich.table import Table

from scripts import ci, standin_channel, symbol_check, wheel_check
from scripts.matrix import console as make_console
from scripts import variants
from scripts.variants import ROOT, Variant, VariantError, load

PROFILE = "pytorch211"
VARIANTS = {"sageattention": "linux-sage2-pytorch211-cu130-python311",
            "sageattn3": "linux-sage3-pytorch211-cu130-python311"}
ARCH = "12.0"  # one arch keeps the kernel build short; sageattn3 needs a Blackwell one
# Compiled modules a package must ship -> the SASS instructions (name -> regex) its kernels must contain:
# the int8 MMA (Q·K) in both families, the fp16 MMA (P·V) in sm80's, the e4m3 MMA (P·V) in sm89's.
KERNELS = {
    "sageattention": {
        "sageattention/_C_sm80": {"IMMA": r"\bIMMA\.", "HMMA": r"\bHMMA\."},
        "sageattention/_C_sm89": {"IMMA": r"\bIMMA\.", "QMMA e4m3": r"\bQMMA\.\S*E4M3"},
    },
}


class RehearsalError(RuntimeError):
    """A step failed; the message names it and where its log is."""


def chosen_variants() -> list[Variant]:
    # Built with TORCH_CUDA_ARCH_LIST=ARCH, so named for it: outputs of the variant's own list would not match.
    found = [load(package).named(name, PROFILE, "linux-64").with_arch_list(ARCH) for package, name in VARIANTS.items()]
    # One stand-in channel serves both builds: they must agree on everything it provides.
    if len({(v.torch_version, v.cuda, v.python, tuple(sorted(v.toolchain.items()))) for v in found}) != 1:
        raise RehearsalError(f"{' and '.join(VARIANTS.values())} differ in torch, CUDA, Python or toolchain")
    return found


def run_driver(v: Variant, channel: Path, dist: Path, env: dict[str, str]) -> tuple[Path, Path]:
    """The build driver for one variant; returns its .conda and wheel."""
    cmd = [sys.executable, "-m", "scripts.build", "--package", v.package, "--profile", PROFILE, "--variant", v.name,
           "--channel", channel.as_uri(), "--output", str(dist / "channel"), "--wheels", str(dist / "wheels"),
           "--index", str(dist / "index"), "--logs", str(dist / "logs")]
    if subprocess.run(cmd, env=env, cwd=ROOT, check=False).returncode != 0:
        raise RehearsalError(f"the build driver failed for {v.name}; log: {dist / 'logs' / v.name}.log")
    wheels, condas = ci.outputs(v, dist)
    if len(condas) != 1 or len(wheels) != 1:
        raise RehearsalError(f"{v.name}: expected one package and one wheel, found {condas} and {wheels}")
    return condas[0], wheels[0]


def site_files(extracted: Path, v: Variant) -> list[str]:
    """The package's files relative to site-packages."""
    site = f"lib/python{v.python}/site-packages/"
    paths = json.loads((extracted / "info" / "paths.json").read_text())["paths"]
    return [p["_path"][len(site):] for p in paths if p["_path"].startswith(site)]


def has_cuda_sources(v: Variant) -> bool:
    """Whether the recipe's source tree has CUDA kernels of its own (nested packages not counted)."""
    for folder, dirs, files in os.walk(recipe_source(v)):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("build", "dist", "output")
                   and not (Path(folder) / d / "pyproject.toml").exists()]
        if any(f.endswith(".cu") for f in files):
            return True
    return False


def check_contents(v: Variant, extracted: Path, jobs: int, cuobjdump: Path) -> str:
    """Only the package's own modules; the caller's TORCH_CUDA_ARCH_LIST and MAX_JOBS reached the build script;
    every extension's device code is for exactly ARCH; a package with CUDA sources has some."""
    files = site_files(extracted, v)
    dist_info = f"{v.package}-{v.version}.dist-info"
    foreign = sorted({f.split("/")[0] for f in files} - {v.import_name, dist_info})
    if foreign:
        raise RehearsalError(f"{v.name}: the package ships {foreign} besides {v.import_name} and {dist_info}")
    rendered = yaml.safe_load((extracted / "info" / "recipe" / "rendered_recipe.yaml").read_text())
    env = rendered["recipe"]["build"]["script"]["env"]
    if (env.get("TORCH_CUDA_ARCH_LIST"), env.get("MAX_JOBS")) != (ARCH, str(jobs)):
        raise RehearsalError(f"{v.name}: the build script ran with {env}, "
                             f"not TORCH_CUDA_ARCH_LIST={ARCH} MAX_JOBS={jobs}")
    wanted = f"sm_{ARCH.replace('.', '')}"
    site = extracted / f"lib/python{v.python}/site-packages"
    found = {}
    for rel in (f for f in files if f.endswith(".so")):
        archs = device_archs(site / rel, cuobjdump)
        if archs:
            found[rel] = archs
    wrong = {rel: sorted(a) for rel, a in found.items() if a != {wanted}}
    if wrong:
        raise RehearsalError(f"{v.name}: device code for {wrong}, expected only {wanted} (TORCH_CUDA_ARCH_LIST={ARCH})")
    if has_cuda_sources(v) and not found:
        raise RehearsalError(f"{v.name}: the recipe's sources have CUDA kernels but the package holds no device code")
    return f"{v.import_name} + {dist_info}; " + (", ".join(f"{rel}: {wanted}" for rel in found) or "no device code")


def device_archs(binary: Path, cuobjdump: Path) -> set[str]:
    """The archs of the cubins in a binary, e.g. {"sm_120"} ("a"/"f" suffixes dropped)."""
    listing = subprocess.run([str(cuobjdump), "--list-elf", str(binary)], capture_output=True, text=True, check=False)
    return {re.sub(r"[af]$", "", a) for a in re.findall(r"\.(sm_\d+[af]?)\.cubin", listing.stdout)}


def check_kernels(package: str, site: Path, files: list[str], cuobjdump: Path) -> str:
    """Each compiled module KERNELS names is in `files` (relative to `site`) once, with device code for ARCH only
    and every instruction KERNELS lists in its SASS."""
    wanted = f"sm_{ARCH.replace('.', '')}"
    report = []
    for module, instructions in KERNELS.get(package, {}).items():
        matches = [f for f in files if f.startswith(f"{module}.") and f.endswith((".so", ".pyd"))]
        if len(matches) != 1:
            raise RehearsalError(f"{package}: expected one compiled {module.replace('/', '.')}, "
                                 f"found {matches or 'none'}")
        archs = device_archs(site / matches[0], cuobjdump)
        if archs != {wanted}:
            raise RehearsalError(f"{matches[0]}: device code for {sorted(archs) or 'no arch'}, expected only {wanted}")
        sass = subprocess.run([str(cuobjdump), "-sass", str(site / matches[0])], capture_output=True, text=True,
                              check=False).stdout
        counts = {name: len(re.findall(pattern, sass)) for name, pattern in instructions.items()}
        missing = [name for name, n in counts.items() if n == 0]
        if missing:
            raise RehearsalError(f"{matches[0]}: its {wanted} SASS has no {', no '.join(missing)}")
        report.append(f"{module.split('/')[-1]} {wanted}: " + ", ".join(f"{n}× {name}" for name, n in counts.items()))
    return "; ".join(report) or "none expected"


def check_wheel_kernels(v: Variant, wheel: Path, cuobjdump: Path) -> str:
    """check_kernels on the exported wheel's files."""
    with tempfile.TemporaryDirectory(prefix="sage-wheel-") as tmp, zipfile.ZipFile(wheel) as whl:
        whl.extractall(tmp)
        return check_kernels(v.package, Path(tmp), whl.namelist(), cuobjdump)


def recipe_source(v: Variant) -> Path:
    """The source tree the recipe builds (its source.path)."""
    return variants.recipe_source(v.recipe, ROOT)


def check_license(v: Variant, extracted: Path) -> str:
    """The package carries its source tree's LICENSE in info/licenses/ (the recipe's about.license_file)."""
    wanted = recipe_source(v) / "LICENSE"
    packaged = extracted / "info" / "licenses" / "LICENSE"
    if not packaged.is_file() or packaged.read_bytes() != wanted.read_bytes():
        raise RehearsalError(f"{v.name}: info/licenses/LICENSE is missing or differs from {wanted}")
    return f"info/licenses/LICENSE = {wanted.relative_to(ROOT)}"


def rattler_install_and_import(v: Variant, conda: Path, extracted: Path, channels: list[Path], prefix: Path) -> str:
    """rattler solves the package from the output + stand-in channels, installs it into `prefix`, and it imports."""
    index = json.loads((extracted / "info" / "index.json").read_text())
    spec = f"{index['name']} =={index['version']} {index['build']}"
    overrides = rattler.VirtualPackageOverrides.from_env()
    overrides.cuda = rattler.Override.string(v.cuda)  # no GPU driver here
    virtual = rattler.VirtualPackage.detect(overrides)
    records = asyncio.run(rattler.solve([rattler.Channel(c.as_uri()) for c in channels], [spec],
                                        platforms=[v.platform, "noarch"], virtual_packages=virtual))
    asyncio.run(rattler.install(records, prefix, show_progress=False))
    modules = wheel_check.modules_to_import(site_files(extracted, v))
    # From the prefix: from the checkout, `import sageattention` would find the sources, not the installed package.
    proc = subprocess.run([str(prefix / "bin" / "python"), "-c", "; ".join(f"import {m}" for m in modules)],
                          capture_output=True, text=True, check=False, cwd=prefix)
    if proc.returncode != 0:
        raise RehearsalError(f"{conda.name} installed by rattler into {prefix} does not import:\n{proc.stderr[-3000:]}")
    return f"{len(records)} packages; imported {', '.join(modules)}"


def check_symbols(wheel: Path, downloads: Path, v: Variant) -> str:
    """Every torch symbol of the wheel's compiled modules is exported by the PyPI torch wheel downloaded for the
    stand-in channel (the one the wheel requires)."""
    tag = f"cp{v.python.replace('.', '')}"
    (torch_wheel,) = sorted(downloads.glob(f"torch-{v.torch_version}-{tag}-{tag}-*.whl"))
    _, missing = symbol_check.check_wheel(wheel, torch_wheel)
    if missing:
        raise RehearsalError(f"{wheel.name}: torch symbols {torch_wheel.name} does not export: {missing}")
    return f"{wheel.name} against {torch_wheel.name}"


class Rehearsal:
    """Runs the steps in order, timing each; the first failure stops it."""

    def __init__(self, console):
        self.console = console
        self.table = Table(title="rehearsal")
        for col in ("step", "time", "result"):
            self.table.add_column(col)
        self.start = time.monotonic()

    @contextmanager
    def step(self, name: str):
        began = time.monotonic()
        outcome = {"result": "ok"}
        self.console.rule(name)
        try:
            yield outcome
        except Exception as exc:
            self.table.add_row(name, f"{time.monotonic() - began:.0f}s", f"FAILED: {exc}")
            raise
        self.table.add_row(name, f"{time.monotonic() - began:.0f}s", outcome["result"])

    def finish(self) -> None:
        self.table.add_row("total", f"{time.monotonic() - self.start:.0f}s", "")
        self.console.print(self.table)


def rehearse(args: argparse.Namespace, r: Rehearsal) -> None:
    variants = chosen_variants()
    base = variants[0]
    dist = args.work / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    with r.step(f"stand-in channel for torch {base.torch_version} + CUDA {base.cuda} + Python {base.python}") as s:
        channel, tree = standin_channel.make(base, args.work, args.downloads, args.cuda_home)
        s["result"] = f"{channel} (log: {args.work / 'standin-channel.log'})"
    # No CONDA_OVERRIDE_CUDA: the driver must supply it for a builder without a GPU driver.
    env = {**os.environ, "TORCH_CUDA_ARCH_LIST": ARCH, "MAX_JOBS": str(args.jobs)}
    env.pop("CONDA_OVERRIDE_CUDA", None)
    built = {}
    for v in variants:
        with r.step(f"rattler-build {v.recipe} ({v.name})") as s:
            built[v] = run_driver(v, channel, dist, env)
            s["result"] = f"{built[v][0].name}, {built[v][1].name}"
    cuobjdump = Path(shutil.which("cuobjdump") or tree / "triton" / "backends" / "nvidia" / "bin" / "cuobjdump")
    if not cuobjdump.exists():
        raise RehearsalError(f"no cuobjdump on PATH nor at {cuobjdump} (triton's copy) to list the device code")
    with tempfile.TemporaryDirectory(prefix="sage-rehearse-", dir=args.work) as tmp:
        for v, (conda, _) in built.items():
            extracted = Path(tmp) / v.package
            extract(conda, extracted)
            with r.step(f"{v.package}: package contents, build script env, CUDA archs") as s:
                s["result"] = check_contents(v, extracted, args.jobs, cuobjdump)
            if v.package in KERNELS:
                with r.step(f"{v.package}: compiled modules and their SASS in the package") as s:
                    site = extracted / f"lib/python{v.python}/site-packages"
                    s["result"] = check_kernels(v.package, site, site_files(extracted, v), cuobjdump)
            with r.step(f"{v.package}: license in the package") as s:
                s["result"] = check_license(v, extracted)
            with r.step(f"{v.package}: rattler install into a fresh prefix, import") as s:
                prefix = Path(tmp) / f"{v.package}-prefix"
                s["result"] = rattler_install_and_import(v, conda, extracted, [dist / "channel", channel], prefix)
    for v, (_, wheel) in built.items():
        if v.package in KERNELS:
            with r.step(f"{v.package}: compiled modules and their SASS in the wheel") as s:
                s["result"] = check_wheel_kernels(v, wheel, cuobjdump)
        with r.step(f"{v.package}: symbol closure against PyPI's torch wheel (scripts.symbol_check)") as s:
            s["result"] = check_symbols(wheel, args.downloads, v)
        with r.step(f"{v.package}: the workflows' wheel check: CUDA torch, pip install, import") as s:
            # The workflows' check (CUDA torch first, then the wheel and its compiled modules), offline: torch's
            # CUDA wheels from PyPI stand in for PyTorch's index.
            if wheel_check.main([str(wheel), "--cuda-torch", "--no-index", "--find-links", str(args.downloads)]) != 0:
                raise RehearsalError(f"{wheel.name} failed scripts.wheel_check (table above)")
            s["result"] = wheel.name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.rehearse", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=standin_channel.WORK,
                        help="stand-in channel, PyPI tree, packages and wheels (default: .cache/rehearsal)")
    parser.add_argument("--downloads", type=Path, help="torch's wheels, kept between runs (default: WORK/wheels)")
    parser.add_argument("--cuda-home", type=Path, default=standin_channel.CUDA_HOME)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="MAX_JOBS for the kernel build")
    args = parser.parse_args(argv)
    args.work = args.work.resolve()
    args.downloads = (args.downloads or args.work / "wheels").resolve()
    console = make_console()
    r = Rehearsal(console)
    try:
        rehearse(args, r)
    except (RehearsalError, standin_channel.StandInError, VariantError) as exc:
        r.finish()
        make_console(stderr=True).print(f"rehearsal failed: {exc}", style="red", markup=False, highlight=False)
        return 1
    except BaseException:
        r.finish()
        raise
    r.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
