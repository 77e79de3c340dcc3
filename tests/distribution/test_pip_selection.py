"""Real pip against our wheels: build tags alone can't pick by torch; the per-variant pages can."""
import pytest

from scripts.index_pages import write_pages
from tests.distribution.helpers import fresh_venv, pip, run_py

FLAVOUR = "import sageattn3, torch; print(sageattn3.FLAVOUR, torch.__version__)"


def venv_with_torch(where, stubs, torch):
    python = fresh_venv(where)
    assert pip(python, "install", "--no-index", "-f", str(stubs), f"torch=={torch}").returncode == 0
    return python


def test_pages_group_wheels_by_cuda_and_torch(wheels, tmp_path):
    pages = write_pages(list(wheels.values()), tmp_path)
    assert {name: [w.name.split("-")[2] for w in ws] for name, ws in pages.items()} == \
        {"cu129-torch2.7": ["270.129"], "cu129-torch2.8": ["280.129"], "cu130-torch2.10": ["2100.130"]}
    page = (tmp_path / "cu129-torch2.7" / "index.html").read_text()
    assert wheels[("2.7", "12.9")].name in page and "#sha256=" in page
    assert wheels[("2.8", "12.9")].name not in page
    assert 'href="cu129-torch2.7/"' in (tmp_path / "index.html").read_text()


def test_one_flat_folder_only_offers_pip_the_highest_build_tag(wheels, stubs, tmp_path):
    python = venv_with_torch(tmp_path / "venv", stubs, "2.7.0")
    folder = wheels[("2.7", "12.9")].parent
    proc = pip(python, "install", "--no-index", "-f", str(folder), "-f", str(stubs), "sageattn3")
    # pip keeps one file per version (the highest build tag, 2100.130) and never tries the
    # 270.129 build that would fit the installed torch.
    assert proc.returncode != 0
    assert "torch==2.10.*" in proc.stderr
    assert run_py(python, "import torch; print(torch.__version__)") == "2.7.0"


@pytest.mark.parametrize("torch,page", [("2.7.0", "cu129-torch2.7"), ("2.8.0", "cu129-torch2.8")])
def test_variant_page_picks_the_build_for_the_installed_torch(wheels, stubs, tmp_path, torch, page):
    index = tmp_path / "index"
    write_pages(list(wheels.values()), index)
    python = venv_with_torch(tmp_path / "venv", stubs, torch)
    proc = pip(python, "install", "--no-index", "-f", str(index / page), "-f", str(stubs), "sageattn3")
    assert proc.returncode == 0, proc.stderr
    assert run_py(python, FLAVOUR) == f"cu12.9torch{torch[:3]} {torch}"
