"""Shared fixtures: a stand-in conda channel with our builds, the wheels exported from it, stand-in torch wheels.

scripts/ and tests.* are importable through tests/conftest.py, which puts the repository root on sys.path.
"""
import asyncio

import pytest
from rattler.index import index_fs

from scripts.wheel_export import export
from tests.distribution.helpers import (PY, conda_package, stub_conda, stub_torch, stub_wheel,
                                        variant_for_this_python)


@pytest.fixture(scope="session")
def channel(tmp_path_factory):
    """Our sageattn3 builds for torch 2.7/2.8 (CUDA 12.9) and 2.10 (CUDA 13.0), plus stand-ins for conda-forge."""
    root = tmp_path_factory.mktemp("chan")
    channel = root / "channel"
    (channel / "noarch").mkdir(parents=True)
    packages = {}
    for torch, cuda in (("2.7", "12.9"), ("2.8", "12.9"), ("2.10", "13.0")):
        v = variant_for_this_python("sageattn3", torch, cuda)
        packages[(torch, cuda)] = (v, conda_package(v, channel, marker=f"cu{cuda}torch{torch}"))
    for torch, cuda in (("2.7.1", "12.9"), ("2.8.0", "12.9"), ("2.10.0", "13.0")):
        # Like conda-forge's CUDA pytorch, it needs the virtual package __cuda (a driver, or CONDA_OVERRIDE_CUDA).
        stub_conda(channel, "pytorch", torch, f"cuda{cuda.replace('.', '')}_0",
                   depends=["__cuda", f"cuda-version >={cuda},<{int(cuda.split('.')[0]) + 1}", f"python {PY}.*"])
    for cuda in ("12.9", "13.0"):
        stub_conda(channel, "cuda-version", cuda, "h0", constrains=[f"__cuda >={cuda}"], subdir="noarch")
    stub_conda(channel, "python", f"{PY}.0", "h0_cpython")
    stub_conda(channel, "triton", "3.4.0", "h0")
    asyncio.run(index_fs(channel))
    return channel, packages


@pytest.fixture(scope="session")
def wheels(channel, tmp_path_factory):
    """One wheel per build in the channel (270.129, 280.129, 2100.130), all in one folder."""
    out = tmp_path_factory.mktemp("wheels")
    return {key: export(path, out) for key, (_, path) in channel[1].items()}


@pytest.fixture(scope="session")
def stubs(tmp_path_factory):
    """Stand-in torch and triton wheels for pip: both torch minors are on offer, so any torch upgrade would be visible."""
    out = tmp_path_factory.mktemp("stubs")
    stub_torch(out, "2.7.0")
    stub_torch(out, "2.8.0")
    stub_wheel(out, "triton", "3.4.0")
    return out
