"""Rows whose PyPI torch has the pre-C++11 string ABI (variants/pypi.yaml, pre_cxx11_abi) are conda packages only.

Our packages are built against conda-forge's torch (C++11 ABI); PyPI's Linux x86_64 torch before 2.7 has the old
ABI (tests/distribution/test_symbol_check.py shows what that does to a module), so no wheel is exported for those
rows, CI expects none, and the install helper says why for such a torch.
"""
import json
import sys
import types

import pytest

from scripts import ci
from scripts.matrix import main as matrix_main
from scripts.variants import PACKAGES, load, no_wheel_reason
from scripts.wheel_export import ExportError, export
from tests.distribution.helpers import conda_package, fake_rattler_build, variant_for_this_python


def test_only_linux_x86_64_torch_26_rows_go_without_a_wheel():
    conda_only = {(v.package, v.platform, v.torch) for p in PACKAGES for v in load(p).variants if v.no_wheel}
    assert conda_only == {("sageattention", "linux-64", "2.6")}
    assert no_wheel_reason("linux-64", "2.6") and "pre-C++11" in no_wheel_reason("linux-64", "2.6")
    assert no_wheel_reason("linux-64", "2.7") is None and no_wheel_reason("win-64", "2.6") is None


def test_the_ci_matrix_names_no_wheel_for_them(capsys):
    assert matrix_main(["--package", "sageattention", "--profile", "pytorch26", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["platform"]: (r["wheel"] is None, bool(r["no_wheel"])) for r in rows} == {
        "linux-64": (True, True), "linux-aarch64": (False, False), "win-64": (False, False)}


@pytest.fixture
def torch26_conda(tmp_path):
    v = variant_for_this_python("sageattention", "2.6", "12.6")
    channel = tmp_path / "channel"
    (channel / "noarch").mkdir(parents=True)
    return v, conda_package(v, channel, marker="cu12.6torch2.6")


def test_the_exporter_refuses_them_and_ci_expects_no_wheel(torch26_conda, tmp_path):
    v, conda = torch26_conda
    with pytest.raises(ExportError, match=r"torch 2\.6 for linux-64 uses the pre-C\+\+11 C\+\+ ABI"):
        export(conda, tmp_path / "wheels")
    assert not (tmp_path / "wheels").exists() or not list((tmp_path / "wheels").iterdir())
    assert ci.build_problems(v, conda.parent.parent) == []
    stray = conda.parent.parent / v.wheel
    stray.write_bytes(b"")
    assert ci.build_problems(v, conda.parent.parent) == [
        f"found {v.wheel}, but this build gets no wheel: {v.no_wheel}"]


@pytest.mark.parametrize("platform, message", [
    ("linux", "error: torch 2.6.0+cu124 is built with the pre-C++11 C++ ABI"),
    ("win32", None),
])
def test_the_install_helper_turns_an_old_abi_torch_away_on_linux(monkeypatch, platform, message):
    from scripts import sage_install  # imports torch when asked: a stand-in here, and never at collection

    torch = types.SimpleNamespace(__version__="2.6.0+cu124", version=types.SimpleNamespace(cuda="12.4"),
                                  compiled_with_cxx11_abi=lambda: False)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(sys, "platform", platform)
    if message is None:
        assert sage_install.torch_flavour() == ("2.6.0+cu124", "2.6", "12")
        return
    with pytest.raises(SystemExit) as exc:
        sage_install.torch_flavour()
    assert str(exc.value).startswith(message)


def test_the_build_driver_builds_the_package_and_exports_no_wheel(torch26_conda, tmp_path, capsys, monkeypatch):
    from scripts import build

    v, conda = torch26_conda
    monkeypatch.setattr(build, "build_command", fake_rattler_build(conda))
    monkeypatch.setattr(build, "channel_problem", lambda channel: None)  # conda-forge is not reachable here
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    dist = tmp_path / "dist"
    assert build.main(["--package", "sageattention", "--profile", "pytorch26", "--platform", "linux-64",
                       "--variant", v.name, "--output", str(dist / "channel"), "--wheels", str(dist / "wheels"),
                       "--index", str(dist / "index"), "--logs", str(dist / "logs")]) == 0
    assert (dist / "channel" / "linux-64" / conda.name).exists()
    assert not list(dist.glob("wheels/*.whl")) and "none (conda only)" in capsys.readouterr().out
    assert ci.build_problems(v, dist) == []
