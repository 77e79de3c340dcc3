"""The symbol-closure check (scripts/symbol_check.py) catches a module built with the other C++ string ABI.

A tiny extension that calls TORCH_CHECK with a std::string message is compiled against the installed torch's
headers with each ABI. Built with the C++11 ABI (conda-forge's and ours), it needs
c10::detail::torchCheckFail(..., std::__cxx11::basic_string const&): PyPI's torch 2.6 (pre-C++11 ABI, its real
wheel, downloaded once into .cache/torch-wheels) lacks it, the installed torch has it. Built with the old ABI it
is the other way round.
"""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from email.message import Message
from pathlib import Path

import pytest
from wheel.wheelfile import WheelFile

from scripts import symbol_check

SOURCE = """
#include <string>
#include <c10/util/Exception.h>
extern "C" int sage_probe(int n) {
  TORCH_CHECK(n > 0, std::string("n must be positive, got ") + std::to_string(n));
  return n;
}
"""
PY = f"{sys.version_info.major}.{sys.version_info.minor}"
NEW_ABI_CHECK_FAIL = "_ZN3c106detail14torchCheckFailEPKcS2_jRKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE"


@pytest.fixture(scope="module")
def installed_torch():
    """The installed torch's folder (its headers and libraries; found, not imported: tooling tests run without it)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("needs an installed torch for its headers and libraries")
    return Path(spec.submodule_search_locations[0])


@pytest.fixture(scope="module")
def probes(installed_torch, tmp_path_factory):
    """abi (1: C++11, 0: pre-C++11) -> the compiled probe module."""
    if shutil.which("g++") is None:
        pytest.skip("needs g++ to compile the probe extension")
    include = installed_torch / "include"
    out = tmp_path_factory.mktemp("probe")
    (out / "probe.cpp").write_text(SOURCE)
    built = {}
    for abi in (1, 0):
        built[abi] = out / f"probe_abi{abi}.so"
        subprocess.run(["g++", "-shared", "-fPIC", "-O1", "-std=c++17", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
                        f"-I{include}", str(out / "probe.cpp"), "-o", str(built[abi])],
                       check=True)
    return built


@pytest.fixture(scope="module")
def torch26():
    """PyPI's torch 2.6.0 wheel for this Python on x86_64 (~770 MB, downloaded once and cached)."""
    return symbol_check.fetch_torch("torch==2.6.0", PY, "x86_64")


@pytest.fixture(scope="module")
def installed_exports(installed_torch):
    return {s for path in (installed_torch / "lib").glob("lib*.so*")
            if symbol_check.TORCH_LIBRARY.match(f"torch/lib/{path.name}") for s in symbol_check.exported_symbols(path)}


def test_the_probe_needs_torchs_check_failure_function(probes):
    needed = symbol_check.undefined_torch_symbols(probes[1])
    assert NEW_ABI_CHECK_FAIL in needed
    assert not any("__cxx11" in s for s in symbol_check.undefined_torch_symbols(probes[0]))
    assert "sage_probe" not in needed  # its own, defined


def test_a_cxx11_abi_module_fails_against_pypi_torch_26(probes, torch26):
    missing = symbol_check.missing_symbols({"probe.so": probes[1]}, symbol_check.torch_exports(torch26))
    assert missing == {"probe.so": [NEW_ABI_CHECK_FAIL]}
    assert symbol_check.missing_symbols({"probe.so": probes[0]}, symbol_check.torch_exports(torch26)) == {}


def test_a_cxx11_abi_module_passes_against_a_cxx11_abi_torch(probes, installed_exports):
    assert NEW_ABI_CHECK_FAIL in installed_exports  # the installed torch has the C++11 ABI
    assert symbol_check.missing_symbols({"probe.so": probes[1]}, installed_exports) == {}
    assert list(symbol_check.missing_symbols({"probe.so": probes[0]}, installed_exports)) == ["probe.so"]


def _wheel(out: Path, module: Path, requires: str) -> Path:
    tag = f"cp{PY.replace('.', '')}"
    path = out / f"sageprobe-1.0-260.126-{tag}-{tag}-linux_x86_64.whl"
    meta = Message()
    meta["Metadata-Version"] = "2.1"
    meta["Name"] = "sageprobe"
    meta["Version"] = "1.0"
    meta["Requires-Dist"] = requires
    with WheelFile(path, "w") as whl:
        whl.write(module, f"sageprobe/_C.cpython-{tag[2:]}-x86_64-linux-gnu.so")
        whl.writestr("sageprobe-1.0.dist-info/METADATA", meta.as_string())
    return path


def test_the_command_reads_the_wheels_torch_and_names_the_missing_symbol(probes, torch26, tmp_path, capsys):
    wheel = _wheel(tmp_path, probes[1], "torch==2.6.*")
    assert symbol_check.wheel_target(wheel) == ("torch==2.6.*", PY, "x86_64")
    assert symbol_check.main([str(wheel), "--torch-wheel", str(torch26)]) == 1
    err = capsys.readouterr().err
    assert "sageprobe/_C" in err and "torchCheckFail" in err and torch26.name in err
    (tmp_path / "old").mkdir()
    old_abi = _wheel(tmp_path / "old", probes[0], "torch==2.6.*")
    assert symbol_check.main([str(old_abi), "--torch-wheel", str(torch26)]) == 0
    # --torch: against another torch than the one it requires (here the same exact version, from the cache)
    assert symbol_check.main([str(wheel), "--torch", "2.6.0"]) == 1 and symbol_check.main([str(old_abi), "--torch", "2.6.0"]) == 0


def test_a_wheel_for_another_os_is_refused(tmp_path):
    path = tmp_path / "x-1.0-cp311-cp311-win_amd64.whl"
    with pytest.raises(symbol_check.SymbolCheckError, match="not Linux"):
        symbol_check.wheel_target(path)


def test_the_rehearsal_checks_its_wheels_against_the_torch_wheel_it_downloaded(probes, torch26, tmp_path):
    from scripts.rehearse import RehearsalError, check_symbols
    from tests.distribution.helpers import variant_for_this_python

    v = variant_for_this_python("sageattention", "2.6", "12.6")  # torch 2.6.0, this Python: torch26's file name
    (tmp_path / "old").mkdir()
    assert check_symbols(_wheel(tmp_path / "old", probes[0], "torch==2.6.*"), torch26.parent, v).endswith(torch26.name)
    with pytest.raises(RehearsalError, match="torchCheckFail"):
        check_symbols(_wheel(tmp_path, probes[1], "torch==2.6.*"), torch26.parent, v)
