"""setup.py without torch (an isolated build, or CI): SAGE_BUILD_CUDA's modes, and what the sdist and wheel hold.

Each build runs setuptools' PEP 517 backend in a child process on a copy of the sources, with torch made
unimportable so that the outcome does not depend on the machine (a CUDA torch would start a real build).
"""
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.build.source_tree import SUPPORT, copy_sources

ROOT = Path(__file__).resolve().parents[2]
BACKEND = """
import sys
sys.modules["torch"] = None  # `import torch` raises ImportError, as in an isolated build
from setuptools import build_meta
kind, out = sys.argv[1:]
print("BUILT " + getattr(build_meta, "build_" + kind)(out))
"""


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return copy_sources(tmp_path_factory.mktemp("source"))


def build(tree: Path, kind: str, out: Path, mode: str | None):
    env = {k: v for k, v in os.environ.items() if k not in ("SAGE_BUILD_CUDA", "PYTHONPATH")}
    if mode is not None:
        env["SAGE_BUILD_CUDA"] = mode
    out.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-c", BACKEND, kind, str(out)], cwd=tree, env=env, capture_output=True,
                          text=True, check=False)


def test_unset_without_torch_builds_pure_python_and_says_why(tree, tmp_path):
    proc = build(tree, "wheel", tmp_path, None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sageattention: building without the CUDA extensions, Triton kernels only (torch is not installed" \
        in proc.stderr
    names = zipfile.ZipFile(tmp_path / proc.stdout.split("BUILT ")[-1].strip()).namelist()
    # build_rules.py and setup.py build the package; they are not modules of it.
    version = re.search(r'__version__ = "(.+)"', (ROOT / "sageattention/__init__.py").read_text())[1]
    assert {n.split("/")[0] for n in names} == {"sageattention", f"sageattention-{version}.dist-info"}
    assert "sageattention/archs.py" in names and not [n for n in names if n.endswith((".so", ".pyd"))]
    # setup.py writes the run requirements: without the stable-ABI extensions, the version-specific torch floor
    metadata = zipfile.ZipFile(tmp_path / proc.stdout.split("BUILT ")[-1].strip()).read(
        f"sageattention-{version}.dist-info/METADATA").decode()
    assert "Requires-Dist: torch>=2.6\n" in metadata and "Requires-Dist: triton>=3.2" in metadata


def test_off_builds_pure_python_without_looking_for_torch(tree, tmp_path):
    proc = build(tree, "wheel", tmp_path, "0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "building without the CUDA extensions" not in proc.stderr


def test_on_without_torch_fails_loudly(tree, tmp_path):
    proc = build(tree, "wheel", tmp_path, "1")
    assert proc.returncode != 0
    assert "SAGE_BUILD_CUDA=1 but the CUDA extensions cannot be built: torch is not installed" in proc.stderr


def test_an_unknown_mode_is_refused(tree, tmp_path):
    proc = build(tree, "wheel", tmp_path, "yes")
    assert proc.returncode != 0 and "SAGE_BUILD_CUDA='yes': use 1" in proc.stderr


def test_sdist_carries_what_the_extension_build_needs(tree, tmp_path):
    proc = build(tree, "sdist", tmp_path, "0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    with tarfile.open(tmp_path / proc.stdout.split("BUILT ")[-1].strip()) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    kernels = {p.relative_to(ROOT).as_posix() for p in (ROOT / "csrc").rglob("*")
               if p.suffix in (".cu", ".cuh", ".cpp", ".h")}
    assert kernels, "csrc/ has no kernel sources"
    assert {"setup.py", "build_rules.py", *SUPPORT, "pyproject.toml", "sageattention/archs.py"} | kernels <= names


def test_sageattn3_sdist_carries_the_shared_build_support(tmp_path):
    """sageattn3 is built from its folder alone (its sdist, its recipe): the build support it shares with
    sageattention is in that folder, goes into its sdist, and setup.py runs from the unpacked sdist."""
    source = shutil.copytree(ROOT / "sageattention3_blackwell", tmp_path / "source",
                             ignore=shutil.ignore_patterns("__pycache__", "*.so", "build", "*.egg-info", "tests"))
    proc = build(source, "sdist", tmp_path / "sdist", None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with tarfile.open(tmp_path / "sdist" / proc.stdout.split("BUILT ")[-1].strip()) as sdist:
        sdist.extractall(tmp_path / "unpacked", filter="data")
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    assert {"setup.py", "build_rules.py", "build_support.py", "cuda_setup.py", "sageattn3/archs.py"} <= \
        {p.relative_to(unpacked).as_posix() for p in unpacked.rglob("*")}
    proc = build(unpacked, "wheel", tmp_path / "wheel", None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sageattn3: building without the CUDA extensions, Triton kernels only (torch is not installed" in proc.stderr
