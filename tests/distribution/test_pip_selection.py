"""Real pip against our wheels: one flat release folder can't pick by torch; the published indexes, through the
install helper exactly as docs/installing.md runs it, install the build for the installed torch and leave torch
alone, and the helper names the torches we build for when none matches."""
import json
import os
import re
import shutil
import subprocess

import pytest

from scripts.index_pages import write_indexes
from scripts.variants import ROOT
from tests.distribution.helpers import fresh_venv, pip, run_py, stub_torch, stub_wheel

FLAVOUR = "import sageattn3, torch; print(sageattn3.FLAVOUR, torch.__version__)"
# The installed torch (version, torch.version.cuda) -> the build the helper must pick. PyPI's torch 2.7 is a
# CUDA 12.6 build and its 2.8 one CUDA 12.8: both take our CUDA 12.9 builds (one index per CUDA major).
PAIRS = [("2.7.0", "12.6", "cu12.9torch2.7"), ("2.8.0", "12.8", "cu12.9torch2.8"), ("2.10.0", "13.0", "cu13.0torch2.10")]


def docs_command() -> list[str]:
    """The helper's command line as docs/installing.md gives it for sageattn3."""
    text = (ROOT / "docs" / "installing.md").read_text()
    return re.search(r"^(python sage_install\.py sageattn3)\b", text, re.MULTILINE).group(1).split()


@pytest.fixture(scope="module")
def release(wheels, tmp_path_factory):
    """A local copy of a flat release folder (several build tags) and of the indexes published for it."""
    root = tmp_path_factory.mktemp("release")
    flat = root / "v1.0.0-sage3"
    flat.mkdir()
    for wheel in wheels.values():
        shutil.copy(wheel, flat)
    site = root / "site"
    write_indexes({w: w.as_uri() for w in flat.glob("*.whl")}, site, site_url=site.as_uri())
    return flat, site


@pytest.fixture(scope="module")
def torches(tmp_path_factory):
    """What the user's index offers: every torch below (so pip could swap it) and triton; nothing from the network."""
    out = tmp_path_factory.mktemp("torches")
    for version, cuda, _ in PAIRS:
        stub_torch(out, version, cuda)
    stub_torch(out, "2.6.0", "12.6")
    stub_wheel(out, "triton", "3.4.0")
    return out


def venv_with_torch(where, torches, version):
    python = fresh_venv(where)
    assert pip(python, "install", "--no-index", "-f", str(torches), f"torch=={version}", "triton").returncode == 0
    return python


def run_helper(python, site, torches, *extra):
    """docs_command() in the venv, run from the published site; pip's own index is the local one (offline)."""
    cmd = [str(python), str(site / "sage_install.py"), *docs_command()[2:], *extra]
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": (torches / "no-index").as_uri(),
           "PIP_FIND_LINKS": str(torches), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)


def test_indexes_group_wheels_by_cuda_major_and_torch(release):
    flat, site = release
    assert json.loads((site / "indexes.json").read_text()) == {"cu12-torch2.7": {"sageattn3": ["1.0.0"]}, "cu12-torch2.8": {"sageattn3": ["1.0.0"]},
                       "cu13-torch2.10": {"sageattn3": ["1.0.0"]}}
    page = (site / "cu12-torch2.8" / "simple" / "sageattn3" / "index.html").read_text()
    (wheel,) = [w for w in flat.glob("*.whl") if "-280.129-" in w.name]
    assert f'href="{wheel.as_uri()}#sha256=' in page and 'data-requires-python="&gt;=' in page
    assert "-270.129-" not in page and "-2100.130-" not in page
    assert 'href="sageattn3/"' in (site / "cu12-torch2.8" / "simple" / "index.html").read_text()
    assert f"SITE = {site.as_uri()!r}" in (site / "sage_install.py").read_text()


def test_one_flat_folder_only_offers_pip_the_highest_build_tag(release, torches, tmp_path):
    python = venv_with_torch(tmp_path / "venv", torches, "2.7.0")
    # pip keeps one file per version (the highest build tag, 2100.130) and never tries the 270.129 build
    # that fits the installed torch: offline it fails, and where another torch is on offer it swaps torch.
    proc = pip(python, "install", "--no-index", "-f", str(release[0]), "sageattn3")
    assert proc.returncode != 0 and "torch==2.10.*" in proc.stderr
    proc = pip(python, "install", "--no-index", "-f", str(release[0]), "-f", str(torches), "sageattn3")
    assert proc.returncode == 0, proc.stderr
    assert run_py(python, FLAVOUR) == "cu13.0torch2.10 2.10.0"


@pytest.mark.parametrize("torch, cuda, flavour", PAIRS)
def test_the_helper_installs_the_build_for_the_installed_torch(release, torches, tmp_path, torch, cuda, flavour):
    python = venv_with_torch(tmp_path / "venv", torches, torch)
    proc = run_helper(python, release[1], torches)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    index = f"cu{cuda.split('.')[0]}-torch{torch.rsplit('.', 1)[0]}"
    assert f"pip install sageattn3==1.0.0 --extra-index-url {release[1].as_uri()}/{index}/simple" in proc.stdout
    assert run_py(python, FLAVOUR) == f"{flavour} {torch}"  # the matching wheel, the same torch


@pytest.mark.parametrize("torch, cuda, message", [
    ("2.6.0", "12.6", "error: no sageattn3 wheels for torch 2.6 with CUDA 12.x; sageattn3 is built for torch 2.7 "
                      "with CUDA 12.x, torch 2.8 with CUDA 12.x, torch 2.10 with CUDA 13.x"),
    ("2.8.0", None, "error: torch 2.8.0 is a CPU build; our wheels need a CUDA build of torch"),
])
def test_without_a_matching_build_the_helper_says_what_we_build_for(release, tmp_path, torch, cuda, message):
    out = tmp_path / "torch"
    stub_torch(out, torch, cuda)
    python = fresh_venv(tmp_path / "venv")
    assert pip(python, "install", "--no-index", "-f", str(out), "torch").returncode == 0
    proc = run_helper(python, release[1], out)
    assert proc.returncode == 1 and proc.stderr.strip() == message
    assert run_py(python, "import importlib.util; print(importlib.util.find_spec('sageattn3'))") == "None"
