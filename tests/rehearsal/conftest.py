"""A stand-in channel made from a miniature PyPI tree and a fake CUDA toolkit (this machine's gcc and ninja).

scripts/ and tests.* are importable through tests/conftest.py, which puts the repository root on sys.path.
"""
from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
import rattler

from scripts import standin_channel
from scripts.rehearse import chosen_variants

# distribution -> files, as a pip --target install lays them out (RECORD paths relative to the tree).
DISTRIBUTIONS = {
    "torch-2.11.0": ["torch/__init__.py", "torch/version.py", "torchgen/__init__.py"],
    "triton-3.6.0": ["triton/__init__.py"],
    "pip-26.0": ["pip/__init__.py"],
    "setuptools-81.0.0": ["setuptools/__init__.py", "_distutils_hack/__init__.py", "distutils-precedence.pth"],
    "sympy-1.14.0": ["sympy/__init__.py", "isympy.py", "../../bin/isympy"],
    "nvidia_cublas-13.1.0.3": ["nvidia/cu13/include/cublas_v2.h", "nvidia/cu13/lib/libcublas.so.13"],
    "nvidia_cusparse-12.6.3.3": ["nvidia/cu13/include/cusparse.h", "nvidia/cu13/lib/libcusparse.so.12"],
    "nvidia_cusolver-12.0.4.66": ["nvidia/cu13/include/cusolverDn.h", "nvidia/cu13/lib/libcusolver.so.12"],
}


def pypi_tree(where: Path, torch_cuda: str | None = "13.0") -> Path:
    for dist, files in DISTRIBUTIONS.items():
        name, version = dist.rsplit("-", 1)
        info = where / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "RECORD").write_text("".join(f"{f},,\n" for f in [*files, f"{info.name}/RECORD"]))
        for f in files:
            if not f.startswith(".."):
                (where / f).parent.mkdir(parents=True, exist_ok=True)
                (where / f).write_text("STANDIN = True\n" if f.endswith(".py") else "")
    cuda = repr(torch_cuda)
    (where / "torch/version.py").write_text(f"__version__ = '2.11.0'\ncuda: Optional[str] = {cuda}\n")
    return where


def cuda_home(where: Path) -> Path:
    """A toolkit whose nvcc only answers --version, with a header and libcudart."""
    (where / "bin").mkdir(parents=True)
    (where / "bin/nvcc").write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    (where / "bin/nvcc").chmod(0o755)
    (where / "include").mkdir()
    (where / "include/cuda_runtime.h").write_text("")
    (where / "lib").mkdir()
    (where / "lib/libcudart.so.13").write_text("")
    (where / "lib/libcudart.so").symlink_to("libcudart.so.13")
    return where


@pytest.fixture(scope="session")
def variant():
    return chosen_variants()[1]  # sageattn3's; both share everything the stand-ins provide


@pytest.fixture(scope="session")
def standin(tmp_path_factory, variant):
    missing = [tool for tool in ("gcc", "g++", "ninja") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"the stand-in channel wraps this machine's {', '.join(missing)}")
    root = tmp_path_factory.mktemp("standin")
    tree = pypi_tree(root / "pypi")
    machine = standin_channel.Machine.detect(cuda_home(root / "cuda"))
    packages = standin_channel.standins(variant, machine, tree)
    channel = standin_channel.build_channel(packages, root / "channel", root)
    return channel, tree, packages


def solve(channel: Path, specs: list[str], cuda: str | None = "13.0"):
    overrides = rattler.VirtualPackageOverrides()
    if cuda:
        overrides.cuda = rattler.Override.string(cuda)
    virtual = [v for v in rattler.VirtualPackage.detect(overrides) if cuda or "Cuda" not in str(v)]
    return asyncio.run(rattler.solve([rattler.Channel(channel.as_uri())], specs, platforms=["linux-64", "noarch"],
                                     virtual_packages=virtual))


def install(channel: Path, specs: list[str], prefix: Path) -> Path:
    asyncio.run(rattler.install(solve(channel, specs), prefix, show_progress=False))
    return prefix
