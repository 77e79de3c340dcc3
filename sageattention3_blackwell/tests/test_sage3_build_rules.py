"""Build rules of the CUDA extension (CUDA >= 12.8, Blackwell targets), and an import without it."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("sage3_build_rules", ROOT / "build_rules.py")
build_rules = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build_rules)


@pytest.mark.parametrize("version", [(12, 6), (12, 0), (11, 8)])
def test_cuda_older_than_12_8_fails_with_the_exact_message(version):
    with pytest.raises(RuntimeError) as err:
        build_rules.check_cuda_version(version)
    assert str(err.value) == "Sage3 is only supported on CUDA 12.8 and above"


@pytest.mark.parametrize("version", [(12, 8), (12, 9), (13, 0)])
def test_cuda_12_8_and_newer_pass(version):
    build_rules.check_cuda_version(version)


def test_nvcc_version_is_parsed():
    text = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 12.8, V12.8.93\n"
    assert build_rules.parse_nvcc_version(text) == (12, 8)


@pytest.mark.parametrize("arch_list, expected", [
    ("10.0;12.0", ["100a", "120a"]),
    ("10.0a;12.0a", ["100a", "120a"]),
    ("10.0a 12.0+PTX 12.1", ["100a", "120a", "121a"]),
    (None, ["100a", "120a"]),
    ("12.0;12.0a", ["120a"]),
])
def test_arch_list_maps_to_arch_specific_targets(arch_list, expected):
    assert build_rules.gencode_flags(arch_list) == [f"-gencode=arch=compute_{a},code=sm_{a}" for a in expected]


def test_non_blackwell_arch_is_rejected():
    with pytest.raises(ValueError, match="not a Blackwell FP4 target"):
        build_rules.gencode_flags("9.0;10.0")


def test_sources_exist():
    assert all((ROOT / source).is_file() for source in build_rules.SOURCES)


def test_package_imports_without_gpu_or_extension():
    code = "import sageattn3, importlib.util; print(sageattn3.__version__, importlib.util.find_spec('sageattn3._C'))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.split()[0] == "1.0.0"


@pytest.mark.parametrize("torch_version, setting, stable", [
    ("2.10.0", None, True), ("2.14.1+cu130", "", True), ("2.13.0+cpu", "0", False), ("2.9.1", None, False),
    ("2.8.0", "0", False), ("2.11.0", "1", True),
])
def test_stable_abi_from_torch_2_10_unless_asked_otherwise(torch_version, setting, stable):
    assert build_rules.use_stable_abi(torch_version, setting) is stable


def test_stable_abi_refused_below_torch_2_10_and_bad_settings():
    with pytest.raises(RuntimeError, match="needs torch >= 2.10"):
        build_rules.use_stable_abi("2.9.1", "1")
    with pytest.raises(ValueError, match="use 1 .* or 0"):
        build_rules.use_stable_abi("2.11.0", "yes")


def test_stable_abi_targets_torch_2_10_and_requires_it():
    # torch/csrc/stable/version.h: TORCH_VERSION_2_10_0 is ((2 << 56) | (10 << 48)).
    assert int(dict(build_rules.stable_abi_macros())["TORCH_TARGET_VERSION"], 16) == (2 << 56) | (10 << 48)
    assert build_rules.requirements(stable_abi=True)[0] == "torch>=2.10"
    assert build_rules.requirements(stable_abi=False)[0] == "torch>=2.7"
