"""The release's pages job: pip indexes for the wheels of every release, linked to the releases' downloads."""
import json

import pytest

from scripts import ci, wheel_export
from scripts.ci import CIError
from scripts.variants import ROOT
from scripts.wheel_names import Flavour
from tests.ci.stand_ins import python_tool

# A stand-in `gh`: `release list` prints the tags under $FAKE_GH_STORE, `release download TAG --dir D` copies them.
FAKE_GH = """\
import os, shutil, sys
from pathlib import Path
store = Path(os.environ["FAKE_GH_STORE"])
args = sys.argv[1:]
if args[:2] == ["release", "list"]:
    print("\\n".join(sorted(p.name for p in store.iterdir())))
elif args[:2] == ["release", "download"]:
    target = Path(args[args.index("--dir") + 1])
    target.mkdir(parents=True)
    for wheel in (store / args[2]).glob("*.whl"):
        shutil.copy(wheel, target)
else:
    sys.exit(f"unexpected: {args}")
"""


def release_wheel(store, tag, flavour, platform):
    init = store / "__init__.py"
    init.write_text("")
    (store / tag).mkdir(parents=True, exist_ok=True)
    return wheel_export._write(store / tag, {"name": "sageattn3"}, {}, flavour, "1.0.0", {"sageattn3/__init__.py": init},
                               platform, [f"torch=={flavour.torch}.*"], {"LICENSE": ROOT / "LICENSE"})


@pytest.fixture
def gh(tmp_path, monkeypatch):
    script = python_tool(tmp_path, "gh", FAKE_GH)
    store = tmp_path / "releases"
    store.mkdir()
    monkeypatch.setenv("FAKE_GH_STORE", str(store))
    monkeypatch.setenv("GITHUB_REPOSITORY", "owner/repo")
    return str(script), store


def test_pages_index_every_releases_wheels_with_their_download_urls(gh, tmp_path):
    path, store = gh
    linux = release_wheel(store, "v1.0.0-sage3", Flavour("12.9", "2.8", "3.12"), "linux_x86_64")
    windows = release_wheel(store, "v1.0.0-sage3", Flavour("12.8", "2.8", "3.12"), "win_amd64")
    release_wheel(store, "v1.0.0-sage3", Flavour("13.0", "2.10", "3.12"), "linux_x86_64")
    (store / "nightly").mkdir()  # not a release tag: skipped
    site = tmp_path / "site"
    listing = ci.pages(site, "https://owner.github.io/repo", gh=path)
    assert listing == {"cu12-torch2.8": {"sageattn3": ["1.0.0"]}, "cu13-torch2.10": {"sageattn3": ["1.0.0"]}}
    page = (site / "cu12-torch2.8/simple/sageattn3/index.html").read_text()
    for wheel in (linux, windows):  # one index per CUDA major: both platforms' torch 2.8 builds
        assert f'href="https://github.com/owner/repo/releases/download/v1.0.0-sage3/{wheel.name}#sha256=' in page
    assert json.loads((site / "indexes.json").read_text()) == listing
    assert "SITE = 'https://owner.github.io/repo'" in (site / "sage_install.py").read_text()


def test_pages_without_any_released_wheel_stop(gh, tmp_path):
    path, store = gh
    (store / "v2.2.0").mkdir()
    with pytest.raises(CIError, match="no release holds wheels"):
        ci.pages(tmp_path / "site", "https://owner.github.io/repo", gh=path)
