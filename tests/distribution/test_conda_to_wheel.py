"""The whole chain on a local stand-in channel: assemble .conda → index → solve → install → wheel → pip."""
import asyncio
import hashlib
import json
import re
import stat
import time
import zipfile

import pytest
import rattler
from packaging.utils import parse_wheel_filename

from scripts.wheel_export import ExportError, export, site_packages_files
from scripts.wheel_check import problems
from scripts.wheel_names import Flavour
from scripts.variants import ROOT
from tests.distribution.helpers import PY, fresh_venv, pip, run_py

VIRTUAL = ["__unix=0=0", "__linux=6.1=0", "__glibc=2.36=0"]


def solve(channel, specs, cuda):
    virtual = [rattler.GenericVirtualPackage(rattler.PackageName(n), rattler.Version(v), rattler.BuildString(b))
               for n, v, b in (s.split("=") for s in VIRTUAL + [f"__cuda={cuda}=0"])]
    return asyncio.run(rattler.solve([rattler.Channel(channel.as_uri())], specs, platforms=["linux-64", "noarch"],
                                     virtual_packages=virtual))


def picked(records):
    """Build string of the sageattn3 record the solver chose."""
    return str(next(r for r in records if r.name.normalized == "sageattn3").build)


def test_index_lists_every_build(channel):
    repodata = json.loads((channel[0] / "linux-64" / "repodata.json").read_text())
    builds = sorted(p["build"].split("py")[0] for p in repodata["packages.conda"].values()
                    if p["name"] == "sageattn3")
    assert builds == ["cu129torch27", "cu129torch28", "cu130torch210"]


@pytest.mark.parametrize("torch", ["2.8", "2.7"])
def test_solver_picks_the_build_for_the_installed_torch(channel, torch):
    records = solve(channel[0], ["sageattn3", f"pytorch {torch}.*"], cuda="12.9")
    assert picked(records).startswith(f"cu129torch{torch.replace('.', '')}py")
    assert str(next(r for r in records if r.name.normalized == "pytorch").version).startswith(torch + ".")


def test_cuda_13_build_needs_a_cuda_13_driver(channel):
    with pytest.raises(Exception, match="cuda"):
        solve(channel[0], ["sageattn3", "pytorch 2.10.*"], cuda="12.9")
    assert picked(solve(channel[0], ["sageattn3", "pytorch 2.10.*"], cuda="13.0")).startswith("cu130torch210")


@pytest.mark.parametrize("override", [False, True])
def test_without_a_driver_the_solve_needs_conda_override_cuda(channel, monkeypatch, override):
    """rattler reads the driver's CUDA, or CONDA_OVERRIDE_CUDA, as conda, mamba and pixi do (docs/installing.md)."""
    monkeypatch.delenv("CONDA_OVERRIDE_CUDA", raising=False)
    if any(p.into_generic().name.normalized == "__cuda" for p in rattler.VirtualPackage.detect()):
        pytest.skip("this machine has an NVIDIA driver")
    if override:
        value = re.search(r"CONDA_OVERRIDE_CUDA=(\S+) conda install", (ROOT / "docs/installing.md").read_text()).group(1)
        monkeypatch.setenv("CONDA_OVERRIDE_CUDA", value)
    virtual = rattler.VirtualPackage.detect(rattler.VirtualPackageOverrides.from_env())

    def solve_for_torch_28():
        return asyncio.run(rattler.solve([rattler.Channel(channel[0].as_uri())], ["sageattn3", "pytorch 2.8.*"],
                                         platforms=["linux-64", "noarch"], virtual_packages=virtual))
    if override:
        assert picked(solve_for_torch_28()).startswith("cu129torch28py")
    else:
        with pytest.raises(Exception, match="__cuda"):
            solve_for_torch_28()


def test_install_export_and_pip_install(channel, stubs, tmp_path):
    records = solve(channel[0], ["sageattn3", "pytorch 2.8.*"], cuda="12.9")
    prefix = tmp_path / "prefix"
    asyncio.run(rattler.install(records, prefix, show_progress=False))
    installed = prefix / f"lib/python{PY}/site-packages/sageattn3/__init__.py"
    assert installed.read_text() == "FLAVOUR = 'cu12.9torch2.8'\n"
    assert list((prefix / "conda-meta").glob("sageattn3-1.0.0-cu129torch28*.json"))

    conda = next(path for (_, path) in channel[1].values() if picked(records) in path.name)
    wheel = export(conda, tmp_path / "wheels")
    name, version, build, _ = parse_wheel_filename(wheel.name)
    assert (str(name), str(version), build) == ("sageattn3", "1.0.0", (280, ".129"))
    tag = PY.replace(".", "")
    assert wheel.name.startswith(f"sageattn3-1.0.0-280.129-cp{tag}-cp{tag}-manylinux_2_")
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read("sageattn3-1.0.0.dist-info/METADATA").decode()
        info = zf.read("sageattn3-1.0.0.dist-info/WHEEL").decode()
        record = zf.read("sageattn3-1.0.0.dist-info/RECORD").decode()
        so = zf.read("sageattn3/_probe.so")
    assert "Requires-Dist: torch==2.8.*" in meta and "Requires-Dist: triton\n" in meta and f"Requires-Python: >={PY}," in meta
    assert "cuda" not in meta.lower().replace("cuda 12.8", "")
    assert "Build: 280.129" in info and "Root-Is-Purelib: false" in info
    assert "sageattn3/_probe.so,sha256=" in record
    assert b"/opt/conda-bld" not in so and b"$ORIGIN/../torch/lib" in so

    python = fresh_venv(tmp_path / "venv")
    proc = pip(python, "install", "--no-index", "-f", str(stubs), str(wheel))
    assert proc.returncode == 0, proc.stderr
    assert run_py(python, "import sageattn3; print(sageattn3.FLAVOUR)") == "cu12.9torch2.8"


def test_plain_platform_tag_and_local_version_options(channel, tmp_path):
    conda = channel[1][("2.7", "12.9")][1]
    wheel = export(conda, tmp_path, local_version=True, manylinux=False)
    tag = PY.replace(".", "")
    assert wheel.name == f"sageattn3-1.0.0+cu129torch2.7-270.129-cp{tag}-cp{tag}-linux_x86_64.whl"


def test_the_same_package_exports_to_the_same_bytes(channel, tmp_path, monkeypatch):
    conda = channel[1][("2.8", "12.9")][1]
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    first = export(conda, tmp_path / "first")
    later = time.time() + 86400  # a day later: neither the clock nor the extracted files' times may reach the wheel
    monkeypatch.setattr(time, "time", lambda: later)
    second = export(conda, tmp_path / "second")
    assert first.name == second.name
    assert hashlib.sha256(first.read_bytes()).hexdigest() == hashlib.sha256(second.read_bytes()).hexdigest()
    assert stat.S_IMODE(first.stat().st_mode) == 0o644
    with zipfile.ZipFile(first) as zf:
        entries = zf.infolist()
    assert {e.date_time for e in entries} == {(1980, 1, 1, 0, 0, 0)}
    assert {e.filename: e.external_attr >> 16 & 0o777 for e in entries if "/_probe" in e.filename or
            e.filename.endswith("__init__.py")} == {"sageattn3/_probe.so": 0o755, "sageattn3/__init__.py": 0o644}
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    with zipfile.ZipFile(export(conda, tmp_path / "epoch")) as zf:
        assert {e.date_time for e in zf.infolist()} == {time.gmtime(1700000000)[:6]}


def test_prefix_placeholders_are_refused(tmp_path):
    # An extracted package whose paths.json says a file embeds the build prefix.
    site = tmp_path / f"lib/python{PY}/site-packages/sageattn3"
    site.mkdir(parents=True)
    (site / "paths.txt").write_text("/opt/conda-bld/placehold_placehold/lib\n")
    (tmp_path / "info").mkdir()
    entry = {"_path": f"lib/python{PY}/site-packages/sageattn3/paths.txt", "path_type": "hardlink",
             "sha256": "0" * 64, "size_in_bytes": 1, "file_mode": "text",
             "prefix_placeholder": "/opt/conda-bld/placehold_placehold"}
    (tmp_path / "info" / "paths.json").write_text(json.dumps({"paths": [entry], "paths_version": 1}))
    with pytest.raises(ExportError, match="prefix placeholders.*sageattn3/paths.txt"):
        site_packages_files(tmp_path, "linux-64", Flavour("12.9", "2.8", PY))
    entry.pop("prefix_placeholder")
    entry.pop("file_mode")
    (tmp_path / "info" / "paths.json").write_text(json.dumps({"paths": [entry], "paths_version": 1}))
    assert list(site_packages_files(tmp_path, "linux-64", Flavour("12.9", "2.8", PY))) == ["sageattn3/paths.txt"]


def test_files_outside_site_packages_are_refused(tmp_path):
    (tmp_path / "info").mkdir()
    entry = {"_path": "bin/tool", "path_type": "hardlink", "sha256": "0" * 64, "size_in_bytes": 1}
    (tmp_path / "info" / "paths.json").write_text(json.dumps({"paths": [entry], "paths_version": 1}))
    with pytest.raises(ExportError, match="bin/tool lies outside lib/python"):
        site_packages_files(tmp_path, "linux-64", Flavour("12.9", "2.8", PY))


def _export_assembled(tmp_path, platform: str, site_packages: str, build: str, depends: list[str]):
    """A minimal sageattention 2.2.0 conda package for `platform`, exported: (wheel, its METADATA, its WHEEL)."""
    staged = tmp_path / "staged" / site_packages / "sageattention"
    staged.mkdir(parents=True)
    (staged / "__init__.py").write_text("")
    from rattler_build import assemble_package
    out = assemble_package(name="sageattention", version="2.2.0", target_platform=platform, build_string=build,
                           output_dir=tmp_path / "chan", files_dir=tmp_path / "staged", depends=depends,
                           license_files=[ROOT / "LICENSE"])
    wheel = export(out.path, tmp_path / "wheels", manylinux=False)
    with zipfile.ZipFile(wheel) as zf:
        assert "sageattention/__init__.py" in zf.namelist()
        return (wheel, *(zf.read(f"sageattention-2.2.0.dist-info/{f}").decode() for f in ("METADATA", "WHEEL")))


def _requires(meta: str) -> list[str]:
    return [line.split(": ", 1)[1] for line in meta.splitlines() if line.startswith("Requires-Dist")]


def test_windows_package_exports_a_win_amd64_wheel_with_triton_windows(tmp_path):
    wheel, meta, _ = _export_assembled(tmp_path, "win-64", "Lib/site-packages", "cu128torch28py312h0123abc_0",
                                       ["python >=3.12,<3.13.0a0", "pytorch * cuda*", "pytorch >=2.8,<2.9.0a0",
                                        "cuda-version >=12.8,<13"])
    assert wheel.name == "sageattention-2.2.0-280.128-cp312-cp312-win_amd64.whl"
    assert _requires(meta) == ["torch==2.8.*", "triton-windows==3.4.*"]  # the Triton torch 2.8 pins on Linux


def test_a_stable_abi_package_exports_an_abi3_wheel_for_torch_and_up(tmp_path):
    wheel, meta, info = _export_assembled(tmp_path, "linux-64", "lib/python3.12/site-packages",
                                          "cu130torch210uppy312h0123abc_0",
                                          ["python >=3.12,<3.13.0a0", "pytorch >=2.10", "cuda-version >=13,<14"])
    assert wheel.name == "sageattention-2.2.0-2100up.130-cp310-abi3-linux_x86_64.whl"
    assert _requires(meta) == ["torch>=2.10"]
    assert "Tag: cp310-abi3-linux_x86_64" in info.splitlines()
    assert problems(wheel) == []


def test_every_windows_wheel_asks_for_the_triton_its_torch_pairs_with():
    from scripts.variants import load
    from scripts.wheel_export import _wheel_requires
    pins = {v.torch: _wheel_requires(v.package, v.platform, v.flavour)
            for package in ("sageattention", "sageattn3") for v in load(package).variants if v.platform == "win-64"}
    assert pins["2.7"] == ["triton-windows==3.3.*"] and pins["2.10"] == ["triton-windows==3.6.*"]
    assert all(len(p) == 1 and p[0].startswith("triton-windows==3.") for p in pins.values()), pins
