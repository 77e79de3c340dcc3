"""The build driver: errors before building, failed variants leave nothing in the channel, success indexes and exports."""
import asyncio
import json
import shutil

import pytest
from rattler.index import index_fs

from scripts import build
from scripts.variants import VARIANTS_DIR, load
from tests.distribution.helpers import fake_rattler_build


def driver(tmp_path, *args):
    out = tmp_path / "dist"
    return build.main(["--output", str(out / "channel"), "--wheels", str(out / "wheels"),
                       "--index", str(out / "index"), "--logs", str(out / "logs"), *args])


def test_unknown_profile_fails_before_anything_is_built(tmp_path, capsys):
    assert driver(tmp_path, "--package", "sageattn3", "--profile", "nightly") == 2
    assert "unknown profile 'nightly'" in capsys.readouterr().err
    assert not (tmp_path / "dist").exists()


def test_sage3_below_cuda_128_fails_before_anything_is_built(tmp_path, capsys, monkeypatch):
    root = shutil.copytree(VARIANTS_DIR, tmp_path / "variants")
    text = (root / "sageattn3.yaml").read_text()
    (root / "sageattn3.yaml").write_text(text.replace('cuda: "12.9.1"', 'cuda: "12.6.1"'))
    monkeypatch.setattr(build, "load", lambda package: load(package, root))
    assert driver(tmp_path, "--package", "sageattn3") == 2
    assert "Sage3 is only supported on CUDA 12.8 and above" in capsys.readouterr().err
    assert not (tmp_path / "dist").exists()


def test_dry_run_shows_the_plan(tmp_path, capsys):
    assert driver(tmp_path, "--package", "sageattention", "--profile", "stable", "--dry-run") == 0
    out = capsys.readouterr().out
    assert out.count("linux-sage2-pytorch2") == 3 and "sageattention-2.2.0-280.129-cp312-cp312-linux_x86_64.whl" in out
    assert not (tmp_path / "dist").exists()


def test_failed_build_is_reported_with_its_log_and_leaves_no_package(tmp_path, capsys, monkeypatch):
    empty = tmp_path / "standin"
    for sub in ("noarch", "linux-64"):
        (empty / sub).mkdir(parents=True)
    asyncio.run(index_fs(empty))
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.setattr(build.shutil, "which", lambda name: None)  # the py-rattler-build engine path
    assert driver(tmp_path, "--package", "sageattn3", "--channel", empty.as_uri()) == 1
    log = tmp_path / "dist/logs/linux-sage3-pytorch28-cu129-python312.log"
    assert "Failed to resolve dependencies" in log.read_text()
    assert "cuda-nvcc_linux-64 12.9.*" in log.read_text()  # the engine's own log, not just the exception
    assert "FAILED" in capsys.readouterr().out
    channel = tmp_path / "dist/channel"
    assert list(channel.rglob("*.conda")) == [] and list(channel.glob(".build-*")) == []
    assert json.loads((channel / "noarch/repodata.json").read_text())["packages.conda"] == {}
    assert "| linux-sage3-pytorch28-cu129-python312 | FAILED (exit 1) | log: `" in summary.read_text()


def test_successful_build_lands_indexed_with_wheel_and_page(tmp_path, capsys, monkeypatch, channel):
    prebuilt = channel[1][("2.8", "12.9")][1]  # a package laid out like a recipe build, Python = this one's
    monkeypatch.setattr(build, "build_command", fake_rattler_build(prebuilt))
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    assert driver(tmp_path, "--package", "sageattn3") == 0
    dist = tmp_path / "dist"
    repodata = json.loads((dist / "channel/linux-64/repodata.json").read_text())
    assert list(repodata["packages.conda"]) == [prebuilt.name]
    (wheel,) = (dist / "wheels").glob("*.whl")
    assert wheel.name.startswith("sageattn3-1.0.0-280.129-")
    assert wheel.name in (dist / "index/cu12-torch2.8/simple/sageattn3/index.html").read_text()
    assert "ok" in capsys.readouterr().out


@pytest.mark.parametrize("cli", [None, "/usr/bin/rattler-build"])
def test_build_command_forwards_channels(tmp_path, monkeypatch, cli):
    monkeypatch.setattr(build.shutil, "which", lambda name: cli)
    v = load("sageattn3").select("default", "linux-64")[0]
    cmd = build.build_command(v, tmp_path, ["file:///srv/standin", "conda-forge"])
    if cli:
        assert cmd[:2] == [cli, "build"] and cmd[-4:] == ["-c", "file:///srv/standin", "-c", "conda-forge"]
        assert "variant.yaml" in cmd[cmd.index("-m") + 1]
    else:
        assert json.loads(cmd[-1]) == ["file:///srv/standin", "conda-forge"]
        assert json.loads(cmd[-2])["cuda_compiler_version"] == "12.9"


def test_conda_override_cuda_defaults_to_the_variants_cuda(monkeypatch):
    # conda-forge's CUDA pytorch needs __cuda, which a builder without an NVIDIA driver doesn't have.
    v = load("sageattn3").select("default", "linux-64")[0]
    monkeypatch.delenv("CONDA_OVERRIDE_CUDA", raising=False)
    assert build.build_env(v)["CONDA_OVERRIDE_CUDA"] == "12.9"
    monkeypatch.setenv("CONDA_OVERRIDE_CUDA", "13.1")
    assert build.build_env(v)["CONDA_OVERRIDE_CUDA"] == "13.1"
