"""sageattention's extension cross-compiles for linux-aarch64 (GH200, GB200, DGX Spark are aarch64 machines).

One family and one arch, as far as this x86_64 machine goes: csrc/sm90's prepare.cu (device code) and its torch
binding, with the sources and nvcc flags build_rules.py plans for TORCH_CUDA_ARCH_LIST=9.0, compiled by nvcc
with Debian's aarch64 g++ as host compiler against the headers of PyPI's aarch64 CUDA torch wheel (downloaded
once into .cache/torch-wheels; only its include/ is extracted), and linked into a shared object. Then: readelf
says AArch64, every torch symbol it needs is exported by that torch wheel's libraries (scripts/symbol_check.py),
and its device code is sm_90a SASS with the instructions tests/sageattention/test_csrc_sass.py expects of it.

The toolkit's headers come from its x86_64-linux target folder (they are the same for every host; NVIDIA's
sbsa-linux cross package installs the same files) and Python's from this interpreter (pyconfig.h of another
LP64 Linux): enough to compile, never to run.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import build_rules
from scripts import symbol_check
from scripts.rehearse import device_archs

CROSS_CXX = "aarch64-linux-gnu-g++"
TORCH = "2.11.0"  # a CUDA 13.0 build on PyPI for aarch64, like this machine's nvcc
FAMILY, ARCH, SOURCES = "sm90", "9.0", ("prepare.cu", "bindings.cpp")
PY = f"{sys.version_info.major}.{sys.version_info.minor}"


def _nvcc(*args: str) -> str:
    return subprocess.run(["nvcc", *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def torch_wheel():
    """PyPI's aarch64 torch wheel and its extracted include/ (checked for the tools first: the wheel is 420 MB)."""
    missing = [tool for tool in (CROSS_CXX, "nvcc", "readelf") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (Debian: apt-get install g++-aarch64-linux-gnu; .ci/run does)")
    wheel = symbol_check.fetch_torch(f"torch=={TORCH}", PY, "aarch64")
    include = wheel.with_name(wheel.name.removesuffix(".whl"))
    symbol_check.extract(wheel, lambda name: name.startswith("torch/include/"), include)
    return wheel, include / "torch" / "include"


@pytest.fixture(scope="module")
def module(torch_wheel, tmp_path_factory):
    """The cross-compiled shared object."""
    (ext,) = build_rules.plan(ARCH, _nvcc("--version"), _nvcc("--list-gpu-arch"), families=FAMILY)
    _, include = torch_wheel
    out = tmp_path_factory.mktemp("aarch64")
    common = ["-ccbin", CROSS_CXX, "--target-directory", "x86_64-linux", "-std=c++17", "-Xcompiler", "-fPIC",
              *(f"-I{d}" for d in ext.include_dirs), f"-I{include}", f"-I{include / 'torch/csrc/api/include'}",
              f"-I{sysconfig.get_paths()['include']}", *(f"-D{name}={value}" for name, value in ext.macros),
              # what torch.utils.cpp_extension adds; PyPI's torch has the C++11 ABI since 2.7
              f"-DTORCH_EXTENSION_NAME={ext.name.rsplit('.', 1)[1]}", "-DTORCH_API_INCLUDE_EXTENSION_H",
              "-D_GLIBCXX_USE_CXX11_ABI=1"]
    objects = []
    for source in (s for s in ext.sources if Path(s).name in SOURCES):
        objects.append(out / f"{Path(source).stem}.o")
        flags = ext.nvcc_flags if source.endswith(".cu") else ["-O1"]
        subprocess.run(["nvcc", *common, *flags, "-c", str(build_rules.ROOT / source), "-o", str(objects[-1])],
                       check=True)
    assert len(objects) == len(SOURCES), ext.sources
    so = out / f"{ext.name.rsplit('.', 1)[1]}.so"
    subprocess.run([CROSS_CXX, "-shared", *map(str, objects), "-o", str(so)], check=True)
    return so


def test_it_is_an_aarch64_shared_object(module):
    header = subprocess.run(["readelf", "-h", str(module)], capture_output=True, text=True, check=True).stdout
    assert "AArch64" in header and "DYN (Shared object file)" in header


def test_pypis_aarch64_torch_exports_every_torch_symbol_it_needs(module, torch_wheel):
    wheel, _ = torch_wheel
    with zipfile.ZipFile(wheel) as zf:
        assert "torch/lib/libtorch_cuda.so" in zf.namelist(), f"{wheel.name} is not a CUDA build"
    needed = symbol_check.undefined_torch_symbols(module)
    assert len(needed) > 20  # the binding's calls into torch: the check below has something to find
    assert symbol_check.missing_symbols({module.name: module}, symbol_check.torch_exports(wheel)) == {}


def test_its_device_code_is_the_sm90a_sass_expected_of_prepare(module):
    # At test time: the kernel tests' module finds cuobjdump through Triton, which collection must not import.
    from sageattention.bench import sass_loops
    from tests.sageattention.test_csrc_sass import EXPECTED

    tool = sass_loops.cuobjdump()
    if tool is None:
        pytest.skip("needs cuobjdump")
    assert device_archs(module, Path(tool)) == {"sm_90"}  # sm_90a; device_archs drops the suffix
    sass = subprocess.run([str(tool), "-sass", str(module)], capture_output=True, text=True, check=True).stdout
    for instruction in EXPECTED[FAMILY, "prepare.cu"]["90a"]:
        assert instruction in sass
