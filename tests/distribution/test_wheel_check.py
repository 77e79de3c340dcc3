"""check-wheels: accepts exported wheels (and installs them), rejects inconsistent names and metadata."""
import shutil
import zipfile

from scripts.wheel_check import cuda_torch_step, main, modules_to_import, problems
from tests.distribution.helpers import stub_torch, stub_wheel


def test_exported_wheels_pass_and_install(wheels, stubs, capsys):
    assert main([str(wheels[("2.8", "12.9")]), "--no-index", "-f", str(stubs)]) == 0
    assert "installed and imported" in capsys.readouterr().out


def test_install_failure_is_reported(wheels, capsys):
    # No torch to be had offline: pip can't satisfy torch==2.8.*.
    assert main([str(wheels[("2.8", "12.9")]), "--no-index"]) == 1
    assert "install/import failed" in capsys.readouterr().out


def test_every_exported_wheel_is_consistent(wheels):
    assert {w.name: problems(w) for w in wheels.values()} == {w.name: [] for w in wheels.values()}


def renamed(wheel, tmp_path, new_name):
    target = tmp_path / new_name
    shutil.copy(wheel, target)
    return target


def test_bad_build_tag_and_mismatched_metadata(wheels, tmp_path):
    wheel = wheels[("2.8", "12.9")]
    no_tag = renamed(wheel, tmp_path, wheel.name.replace("-280.129", ""))
    assert problems(no_tag) == ["no build tag: expected <torch>0.<CUDA>, e.g. 280.129"]
    odd_tag = renamed(wheel, tmp_path, wheel.name.replace("280.129", "28.129"))
    assert "is not <torch major><torch minor>0." in problems(odd_tag)[0]
    other_torch = renamed(wheel, tmp_path, wheel.name.replace("280.129", "270.129"))
    found = problems(other_torch)
    assert any("does not require torch==2.7.*" in p for p in found)
    assert any("WHEEL Build '280.129'" in p for p in found)
    assert any("does not require torch>=2.8 " in p for p in problems(renamed(wheel, tmp_path, wheel.name.replace(
        "280.129", "280up.129"))))


def test_tampered_file_fails_the_record_check(wheels, tmp_path):
    wheel = wheels[("2.8", "12.9")]
    tampered = tmp_path / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tampered, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            dst.writestr(item, b"FLAVOUR = 'evil'\n" if item.filename == "sageattn3/__init__.py" else data)
    assert problems(tampered)[0].startswith("unreadable wheel:")


def test_extension_modules_are_imported_too():
    names = ["sageattn3/__init__.py", "sageattn3/_C.cpython-311-x86_64-linux-gnu.so", "sageattn3/_probe.so",
             "sageattn3/sub/_k.abi3.so", "other/_x.cp312-win_amd64.pyd", "sageattn3-1.0.0.dist-info/RECORD"]
    # A plain .so (a library, like the stub's _probe.so) is no module; extensions outside a package aren't imported.
    assert modules_to_import(names) == ["sageattn3", "sageattn3._C", "sageattn3.sub._k"]


def test_cuda_torch_mode_installs_torch_first_and_requires_a_cuda_build(wheels, stubs, tmp_path, capsys):
    wheel = wheels[("2.8", "12.9")]
    assert main([str(wheel), "--cuda-torch", "--no-index", "-f", str(stubs)]) == 0
    assert "installed and imported with torch 2.8.0 (CUDA 12.9)" in capsys.readouterr().out
    cpu = tmp_path / "cpu"
    stub_torch(cpu, "2.8.0", cuda=None)
    stub_wheel(cpu, "triton", "3.4.0")
    assert main([str(wheel), "--cuda-torch", "--no-index", "-f", str(cpu)]) == 1
    assert "torch 2.8.0 is a CPU build; this wheel needs a CUDA 12 build" in capsys.readouterr().err


def test_cuda_torch_comes_from_pytorchs_index_for_the_wheels_cuda_line(wheels):
    assert cuda_torch_step(wheels[("2.10", "13.0")], ["-f", "x"]) == \
        ["-f", "x", "--extra-index-url", "https://download.pytorch.org/whl/cu130", "torch==2.10.*"]
    assert cuda_torch_step(wheels[("2.8", "12.9")], ["--no-index"]) == ["--no-index", "torch==2.8.*"]


def test_the_import_is_of_the_installed_wheel_not_the_callers_folder(wheels, stubs, tmp_path, monkeypatch, capsys):
    # Run from a checkout, the sources (without their compiled modules) must not stand in for the installed wheel.
    (tmp_path / "sageattn3").mkdir()
    (tmp_path / "sageattn3/__init__.py").write_text("raise ImportError('the sources, not the installed wheel')\n")
    monkeypatch.chdir(tmp_path)
    assert main([str(wheels[("2.8", "12.9")]), "--no-index", "-f", str(stubs)]) == 0, capsys.readouterr().out


def test_exported_wheels_carry_the_license_and_one_without_is_flagged(wheels, tmp_path):
    wheel = wheels[("2.8", "12.9")]
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read("sageattn3-1.0.0.dist-info/METADATA").decode()
        assert "Metadata-Version: 2.4" in meta and "License-Expression: Apache-2.0" in meta
        assert "License-File: LICENSE" in meta and "Apache License" in zf.read(
            "sageattn3-1.0.0.dist-info/licenses/LICENSE").decode()
    stripped = tmp_path / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(stripped, "w") as dst:
        for item in src.infolist():
            if "/licenses/" not in item.filename and not item.filename.endswith("RECORD"):
                dst.writestr(item, src.read(item))
            elif item.filename.endswith("RECORD"):
                dst.writestr(item, "".join(line + "\n" for line in src.read(item).decode().splitlines()
                                           if "/licenses/" not in line))
    assert problems(stripped) == ["License-File LICENSE not in sageattn3-1.0.0.dist-info/licenses/"]
