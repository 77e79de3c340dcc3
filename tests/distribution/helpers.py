"""Throwaway packages for the distribution tests: staged conda packages, stub wheels and fresh venvs."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import venv
from email.message import Message
from pathlib import Path

from rattler_build import assemble_package
from wheel.wheelfile import WheelFile

from scripts.render import render
from scripts.standin_channel import _pin
from scripts.variants import ROOT, Variant, load

PY = f"{sys.version_info.major}.{sys.version_info.minor}"


def variant_for_this_python(package: str, torch: str, cuda: str) -> Variant:
    """A linux-64 variant of the real matrix, moved to this interpreter's Python so pip can install it."""
    base = next(v for v in load(package).variants
                if v.platform == "linux-64" and v.torch == torch and v.cuda == cuda)
    return dataclasses.replace(base, python=PY)


def conda_package(variant: Variant, channel: Path, marker: str, rpath: str = "/opt/conda-bld/host_prefix/lib") -> Path:
    """Assemble a .conda the way a build of our recipe would lay it out, with the recipe's own build string.

    Run dependencies are the rendered recipe's plus the pins its host packages export
    (pytorch and cuda-version export a pin to the minor they were built with).
    """
    rendered = render([variant])[variant]["recipe"]
    staged = channel.parent / f"stage-{rendered['build']['string']}"
    site = staged / f"lib/python{variant.python}/site-packages/{variant.import_name}"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text(f"FLAVOUR = {marker!r}\n")
    # A real ELF, with an RPATH into the build prefix as conda-build leaves it.
    src = staged / "probe.c"
    src.write_text("int sage_probe(void) { return 42; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(site / "_probe.so"), str(src),
                    f"-Wl,-rpath,{rpath}:$ORIGIN/../../.."], check=True)
    src.unlink()
    exported = [f"pytorch {_pin(variant.torch, 2)}", f"cuda-version {_pin(variant.cuda)}",
                f"python {_pin(variant.python, 2)}"]
    out = assemble_package(name=variant.package, version=variant.version, target_platform="linux-64",
                           build_string=rendered["build"]["string"], output_dir=channel / "linux-64",
                           files_dir=staged, depends=rendered["requirements"]["run"] + exported,
                           summary=rendered["about"]["summary"], license=rendered["about"]["license"],
                           license_files=[ROOT / "LICENSE"])
    return out.path


def stub_conda(channel: Path, name: str, version: str, build: str, depends=(), constrains=(), subdir="linux-64") -> None:
    """An empty conda package standing in for a conda-forge one."""
    empty = channel.parent / f"empty-{name}-{version}-{build}"
    empty.mkdir()
    (empty / "STUB").write_text("stand-in package for tests\n")
    assemble_package(name=name, version=version, target_platform=subdir, build_string=build,
                     output_dir=channel / subdir, files_dir=empty, depends=list(depends), constrains=list(constrains))


def stub_wheel(out: Path, name: str, version: str, body: str = "", *, tag: str = "py3-none-any", build: str = "",
               requires_python: str = "") -> Path:
    """A wheel named `name` holding one module (e.g. a stand-in torch that only knows its version); `tag`, `build`
    and `requires_python` make it look like a wheel for one interpreter and torch."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}-{version}{'-' + build if build else ''}-{tag}.whl"
    meta = Message()
    meta["Metadata-Version"] = "2.1"
    meta["Name"] = name
    meta["Version"] = version
    if requires_python:
        meta["Requires-Python"] = requires_python
    info = Message()
    info["Wheel-Version"] = "1.0"
    info["Generator"] = "tests"
    info["Root-Is-Purelib"] = str(tag == "py3-none-any").lower()
    info["Tag"] = tag
    if build:
        info["Build"] = build
    with WheelFile(path, "w") as whl:
        whl.writestr(f"{name}/__init__.py", body or f"__version__ = {version!r}\n")
        whl.writestr(f"{name}-{version}.dist-info/METADATA", meta.as_string())
        whl.writestr(f"{name}-{version}.dist-info/WHEEL", info.as_string())
    return path


def simple_index(root: Path, wheels: list[Path]) -> Path:
    """A PEP 503 index of `wheels` in root (a stand-in for PyPI): root/<project>/index.html beside the files."""
    for wheel in wheels:
        project = root / wheel.name.split("-")[0].replace("_", "-").lower()
        project.mkdir(parents=True, exist_ok=True)
        shutil.copy(wheel, project)
        links = "".join(f'<a href="{f.name}">{f.name}</a>\n' for f in sorted(project.glob("*.whl")))
        (project / "index.html").write_text(f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n")
    return root


@contextlib.contextmanager
def http_server(root: Path):
    """`python -m http.server` serving root on 127.0.0.1 (a free port); yields its URL."""
    proc = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory",
                             str(root)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        port = re.search(r" port (\d+) ", proc.stdout.readline()).group(1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def stub_torch(out: Path, version: str, cuda: str | None = "12.9", cxx11_abi: bool = True) -> Path:
    """A stand-in torch wheel that knows its version, CUDA line (torch.version.cuda; None: a CPU build) and C++ ABI."""
    return stub_wheel(out, "torch", version, f"__version__ = {version!r}\n\n\nclass version:\n    cuda = {cuda!r}\n\n\n"
                      f"def compiled_with_cxx11_abi():\n    return {cxx11_abi!r}\n")


def fresh_venv(where: Path) -> Path:
    """A new venv without system site-packages; returns its python."""
    venv.EnvBuilder(with_pip=True).create(where)
    return where / "bin" / "python"


def pip(python: Path, *args: str) -> subprocess.CompletedProcess:
    # No user or site pip.conf: only the find-links the test names.
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    env = {k: v for k, v in env.items() if not k.startswith("PIP_") or k == "PIP_CONFIG_FILE"}
    return subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", *args],
                          capture_output=True, text=True, env=env, check=False)


def run_py(python: Path, code: str) -> str:
    # Outside the checkout and without PYTHONPATH, so its sources can't stand in for what the venv installed.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=env, cwd=python.parent,
                          check=True).stdout.strip()


def fake_rattler_build(package: Path):
    """A stand-in for scripts.build.build_command: the "build" drops `package` where rattler-build would write it,
    mode 0600 as rattler-build does."""
    def command(variant, scratch, channels):
        code = ("import shutil, sys, pathlib; d = pathlib.Path(sys.argv[2]) / 'linux-64'; d.mkdir(); "
                "pathlib.Path(shutil.copy(sys.argv[1], d)).chmod(0o600)")
        return [sys.executable, "-c", code, str(package), str(scratch)]
    return command
