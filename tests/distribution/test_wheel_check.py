"""check-wheels: accepts exported wheels (and installs them), rejects inconsistent names and metadata."""
import shutil
import zipfile

from scripts.wheel_check import main, modules_to_import, problems


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
    assert any("does not pin torch==2.7.*" in p for p in found)
    assert any("WHEEL Build '280.129'" in p for p in found)


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
