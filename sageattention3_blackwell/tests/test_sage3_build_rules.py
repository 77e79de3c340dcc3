"""Build rules of the CUDA extension (CUDA >= archs.MIN_CUDA, Blackwell targets), and an import without it.
The arch-list parser and the nvcc answers are build_support.py's, shared with sageattention (tests/build)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # as setup.py does: build_rules imports build_support from its folder
from build_support import BuildConfigError, load_by_path  # noqa: E402

build_rules = load_by_path(ROOT / "build_rules.py", "sage3_build_rules")  # sageattention's is `build_rules`
sys.path.remove(str(ROOT))

NVCC_13_0_ARCHS = "compute_80\ncompute_90\ncompute_100\ncompute_103\ncompute_120\ncompute_121\n"
NVCC_12_8_ARCHS = "compute_80\ncompute_90\ncompute_100\ncompute_101\ncompute_120\n"


def release(version: str) -> str:
    return f"nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release {version}, V{version}.93\n"


def gencodes(arch_list, version="13.0", listing=NVCC_13_0_ARCHS):
    (extension,) = build_rules.plan(arch_list, release(version), listing)
    assert extension.name == "sageattn3._C" and extension.sources == build_rules.SOURCES
    return [re.fullmatch(r"-gencode=arch=compute_(\w+),code=sm_\1", f)[1] for f in extension.nvcc_flags if f != "-O3"]


@pytest.mark.parametrize("version", ["12.6", "12.0", "11.8"])
def test_cuda_older_than_12_8_fails_with_the_exact_message(version):
    with pytest.raises(BuildConfigError) as err:
        build_rules.plan("10.0", release(version), NVCC_12_8_ARCHS)
    assert str(err.value) == "Sage3 is only supported on CUDA 12.8 and above"


@pytest.mark.parametrize("version", ["12.8", "12.9", "13.0"])
def test_cuda_12_8_and_newer_pass(version):
    assert gencodes("10.0;12.0", version) == ["100a", "120a"]


@pytest.mark.parametrize("arch_list, expected", [
    ("10.0;12.0", ["100a", "120a"]),
    ("10.0a;12.0f", ["100a", "120a"]),
    ("10.0a 12.0+PTX 12.1", ["100a", "120a", "121a"]),
    ("12.0;12.0a", ["120a"]),
    (None, ["100a", "120a", "121a"]),  # every arch of archs.py that nvcc targets
])
def test_arch_list_maps_to_arch_specific_targets_without_ptx(arch_list, expected):
    assert gencodes(arch_list) == expected


def test_default_arch_list_is_what_this_nvcc_targets():
    assert gencodes(None, "12.8", NVCC_12_8_ARCHS) == ["100a", "120a"]


def test_non_blackwell_arch_is_rejected():
    with pytest.raises(BuildConfigError, match="entry '9.0' is not supported; sageattn3 builds for 10.0, 12.0, 12.1"):
        gencodes("9.0;10.0")


def test_an_arch_nvcc_lacks_is_rejected():
    with pytest.raises(BuildConfigError, match="nvcc 12.8 cannot compile for 12.1"):
        gencodes("12.1", "12.8", NVCC_12_8_ARCHS)


def test_every_kernel_source_is_built():
    assert sorted(build_rules.SOURCES) == sorted(p.relative_to(ROOT).as_posix()
                                                 for ext in ("*.cu", "*.cpp") for p in (ROOT / "csrc").glob(ext))


def test_package_imports_without_gpu_or_extension():
    code = "import sageattn3, importlib.util; print(sageattn3.__version__, importlib.util.find_spec('sageattn3._C'))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.split() == [re.search(r'__version__ = "(.+)"', (ROOT / "sageattn3/__init__.py").read_text())[1],
                                  "None"]


def test_version_specific_build_requires_torch_2_7_and_triton():
    assert build_rules.TORCH_FLOOR == "2.7" and "triton>=3.2; sys_platform == 'linux'" in build_rules.REQUIREMENTS
