"""Shared fixtures: a stand-in conda channel with our builds, and the wheels exported from it."""
import asyncio
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# After the path fix: these import scripts/.
from rattler.index import index_fs

from scripts.wheel_export import export
from tests.distribution.helpers import PY, conda_package, stub_conda, variant_for_this_python


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
        stub_conda(channel, "pytorch", torch, f"cuda{cuda.replace('.', '')}_0",
                   depends=[f"cuda-version >={cuda},<{int(cuda.split('.')[0]) + 1}", f"python {PY}.*"])
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
