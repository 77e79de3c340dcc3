"""Both packages build from source (`pip install --no-build-isolation`, pure Python: SAGE_BUILD_CUDA=0) with
exactly the setuptools their pyproject.toml declares as the floor; the wheel is downloaded once into .cache/."""
import os
import re
import shutil
import subprocess
import sys
import venv

import pytest

from scripts.variants import ROOT
from tests.distribution.helpers import run_py

PACKAGES = {"sageattention": ROOT, "sageattn3": ROOT / "sageattention3_blackwell"}
# What each package's sdist holds for a pure-Python build (MANIFEST.in), relative to its folder; sageattention's
# build rules use the build support that lives in sageattn3's folder.
SOURCES = ("pyproject.toml", "setup.py", "build_rules.py", "build_support.py", "cuda_setup.py", "README.md", "LICENSE",
           "MANIFEST.in", "sageattention3_blackwell/build_support.py", "sageattention3_blackwell/cuda_setup.py")


def floor(source) -> str:
    (found,) = re.findall(r'"setuptools>=([\d.]+)"', (source / "pyproject.toml").read_text())
    return found


@pytest.fixture(scope="module")
def venv_at_floor(tmp_path_factory):
    (version,) = {floor(source) for source in PACKAGES.values()}  # one floor for both packages
    cache = ROOT / ".cache" / "setuptools-floor"
    if not list(cache.glob(f"setuptools-{version}-*.whl")):
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--timeout", "30",
                        "-d", str(cache), f"setuptools=={version}"], check=True, capture_output=True)
    where = tmp_path_factory.mktemp("floor") / "venv"
    venv.create(where)  # no pip of its own (faster): this Python's pip works on it through --python
    python = where / "bin" / "python"
    assert pip_for(python, "install", "--no-index", "-f", str(cache), f"setuptools=={version}").returncode == 0
    return python, version


def pip_for(python, *args, **env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check", *args],
                          capture_output=True, text=True, env={**clean, "PIP_CONFIG_FILE": os.devnull, **env}, check=False)


@pytest.mark.parametrize("package", PACKAGES)
def test_source_build_with_exactly_the_setuptools_floor(venv_at_floor, tmp_path, package):
    python, version = venv_at_floor
    source = PACKAGES[package]
    copy = tmp_path / package  # a copy: an in-tree build leaves build/ and *.egg-info behind
    copy.mkdir()
    for name in SOURCES:
        if (source / name).exists():
            (copy / name).parent.mkdir(exist_ok=True)
            shutil.copy(source / name, copy / name)
    shutil.copytree(source / package, copy / package, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    proc = pip_for(python, "install", "--no-index", "--no-build-isolation", "--no-deps", str(copy), SAGE_BUILD_CUDA="0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    meta = run_py(python, f"import importlib.metadata as m; d = m.distribution({package!r}); "
                          "print(m.version('setuptools'), d.version, d.metadata['License-Expression'])")
    (ours,) = re.findall(r'^__version__ = "(.+)"$', (source / package / "__init__.py").read_text(), re.MULTILINE)
    assert meta.split() == [version, ours, "Apache-2.0"]
