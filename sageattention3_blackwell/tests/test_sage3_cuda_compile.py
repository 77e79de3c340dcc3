"""nvcc builds the CUDA kernels for sm_100a and sm_120a, and the SASS holds the block-scaled FP4 MMAs; the whole
extension, built against libtorch's stable ABI, is an abi3 wheel that loads and registers its operators.

No GPU needed. Each (source, arch) pair is compiled once per session into a temporary directory. The stable-ABI
wheel is built once, for sm_120a, against the installed torch (>= 2.10; a CPU build of torch will do).
The version-specific build of bindings.cpp needs a CUDA build of torch (see README, "Building").
"""
import json
import re
import shutil
import subprocess
import sys
from email.parser import Parser
from pathlib import Path
from zipfile import ZipFile

import pytest
import torch

import stable_abi_checks
from sage3_tools import cuobjdump

PACKAGE = Path(__file__).resolve().parents[1]
CSRC = PACKAGE / "csrc"
# (source, arch) -> SASS that must appear: the FP4 tensor-core MMA, or the e2m1 / e4m3 conversions.
EXPECTED = {
    ("attention_sm120.cu", "120a"): ["OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X"],
    ("attention_sm100.cu", "100a"): ["UTCOMMA.4X"],
    ("quantize.cu", "120a"): ["F2FP.SATFINITE.E2M1.F32", "F2FP.SATFINITE.E4M3.F32"],
    ("quantize.cu", "100a"): ["F2FP.SATFINITE.E2M1.F32", "F2FP.SATFINITE.E4M3.F32"],
}


@pytest.fixture(scope="session")
def sass(tmp_path_factory):
    nvcc = shutil.which("nvcc")
    tool = cuobjdump()
    if nvcc is None or tool is None:
        pytest.skip(f"needs nvcc and cuobjdump (found nvcc={nvcc}, cuobjdump={tool})")
    out_dir = tmp_path_factory.mktemp("sage3_cubins")
    cache = {}

    def disassemble(source: str, arch: str) -> str:
        if (source, arch) not in cache:
            cubin = out_dir / f"{Path(source).stem}_{arch}.cubin"
            subprocess.run([nvcc, "-std=c++17", "-O3", f"-gencode=arch=compute_{arch},code=sm_{arch}", "-cubin",
                            "-o", str(cubin), str(CSRC / source)], check=True, capture_output=True, text=True)
            cache[source, arch] = subprocess.run([tool, "-sass", str(cubin)], check=True, capture_output=True,
                                                 text=True).stdout
        return cache[source, arch]

    return disassemble


@pytest.mark.parametrize("source, arch", sorted(EXPECTED))
def test_kernel_compiles_to_fp4_instructions(sass, source, arch):
    code = sass(source, arch)
    for instruction in EXPECTED[source, arch]:
        assert instruction in code, f"{instruction} missing from the sm_{arch} SASS of {source}"
    # Register arrays indexed at run time would spill to local memory (slow).
    assert "STL" not in code and "LDL" not in code


def test_attention_kernels_issue_one_mma_per_k64_step(sass):
    # head_dim 64 and 128 instantiations: QK^T needs D/64 MMAs per key block, PV one per n-tile group.
    assert sass("attention_sm100.cu", "100a").count("UTCOMMA.4X") == (1 + 1) + (2 + 1)
    assert sass("attention_sm120.cu", "120a").count("OMMA.SF.16864") == (8 * 1 + 8) + (8 * 2 + 16)


# --- The stable-ABI extension -------------------------------------------------------------------------------------

# What the extension may take from CPython: the limited-API function that creates its (empty) module.
LIMITED_API_USED = {"PyModule_Create2"}


@pytest.fixture(scope="session")
def stable_wheel(tmp_path_factory) -> Path:
    """The sageattn3 wheel, built from a copy of this package with SAGE_BUILD_CUDA=1 for sm_120a alone."""
    src = tmp_path_factory.mktemp("sage3_src")
    for name in ("setup.py", "build_rules.py", "build_support.py", "cuda_setup.py", "pyproject.toml", "README.md",
                 "LICENSE", "csrc", "sageattn3"):
        (shutil.copytree if (PACKAGE / name).is_dir() else shutil.copy)(PACKAGE / name, src / name)
    return stable_abi_checks.build_wheel(src, tmp_path_factory.mktemp("sage3_wheel"), "12.0")


@pytest.fixture(scope="session")
def unpacked(stable_wheel, tmp_path_factory) -> Path:
    return stable_abi_checks.unpack(stable_wheel, tmp_path_factory.mktemp("sage3_site"))


def test_stable_wheel_is_abi3_and_requires_torch_2_10(stable_wheel):
    assert stable_wheel.name == "sageattn3-1.0.0-cp310-abi3-linux_x86_64.whl"
    with ZipFile(stable_wheel) as whl:
        assert "sageattn3/_C.abi3.so" in whl.namelist()
        meta = Parser().parsestr(whl.read("sageattn3-1.0.0.dist-info/METADATA").decode())
    torch_requirements = [r for r in meta.get_all("Requires-Dist") if re.match(r"torch\b", r)]
    assert torch_requirements == ["torch>=2.10"]


def test_stable_extension_uses_only_the_c_shim_and_the_limited_api(unpacked):
    library = unpacked / "sageattn3/_C.abi3.so"
    stable_abi_checks.check_stable_symbols(library, LIMITED_API_USED)
    tool = cuobjdump()
    if tool:  # device code for exactly the arch asked for (cuobjdump names sm_120a's cubins sm_120)
        elf = subprocess.run([tool, "--list-elf", str(library)], capture_output=True, text=True, check=True).stdout
        assert set(re.findall(r"sm_\d+\w*", elf)) == {"sm_120"}


LOAD_AND_CALL = """
import ctypes, json, os, sys, torch
from torch._subclasses.fake_tensor import FakeTensorMode
library, site = sys.argv[1:]
found = {"torch": torch.__version__}
try:  # what csrc/torch_binding.h looks up at run time for the current CUDA stream
    found["stream_fn"] = hasattr(ctypes.CDLL("libtorch_cuda.so", mode=os.RTLD_NOLOAD | os.RTLD_LAZY),
                                 "aoti_torch_get_current_cuda_stream")
except OSError:  # a CPU build of torch
    found["stream_fn"] = None
has_kernel = lambda op: torch._C._dispatch_has_kernel_for_dispatch_key("sageattn3::" + op, "CUDA")
sys.path.insert(0, site)
from sageattn3 import ops  # the schemas and fakes
found["before"] = [has_kernel("quantize"), has_kernel("attention")]
torch.ops.load_library(library)
found["after"] = [has_kernel("quantize"), has_kernel("attention")]
import sageattn3._C  # by name, as sageattn3.dispatch loads it
found["module"] = sageattn3._C.__file__ == library
# The CUDA kernels called on CPU tensors: the boxed call reaches the binding's own checks.
cuda = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)
x = torch.zeros(4, 32)
errors = []
for call in (lambda: torch.ops.sageattn3.quantize.default.redispatch(cuda, x),
             lambda: torch.ops.sageattn3.attention.default.redispatch(cuda, *[x] * 6, None, 0, x, False, 0)):
    try:
        call()
    except RuntimeError as e:
        errors.append(str(e))
found["errors"] = errors
with FakeTensorMode():
    codes, scales = torch.ops.sageattn3.quantize(torch.empty(2, 64))
found["fake"] = [list(codes.shape), str(scales.dtype)]
print(json.dumps(found))
"""


def _load_and_call(unpacked: Path, env: dict) -> dict:
    library = str(unpacked / "sageattn3/_C.abi3.so")
    run = subprocess.run([sys.executable, "-s", "-c", LOAD_AND_CALL, library, str(unpacked)], capture_output=True,
                         text=True, env=env, cwd=unpacked)
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.splitlines()[-1])
    assert found["before"] == [False, False] and found["after"] == [True, True] and found["module"]
    assert [e.splitlines()[0] for e in found["errors"]] == ["x must be a contiguous CUDA tensor",
                                                            "q_codes must be a CUDA tensor"]
    assert found["fake"] == [[2, 32], "torch.float8_e4m3fn"]
    return found


def test_stable_extension_loads_and_registers_its_kernels(unpacked):
    found = _load_and_call(unpacked, stable_abi_checks.toolkit_env())
    assert found["torch"] == torch.__version__
    assert found["stream_fn"] is (None if torch.version.cuda is None else True)


@pytest.mark.parametrize("version", stable_abi_checks.CUDA13_TORCH)
def test_stable_extension_loads_under_cuda_torch_from_pypi(unpacked, version):
    found = _load_and_call(unpacked, stable_abi_checks.pypi_torch_env(version))
    assert found["torch"].split("+")[0] == version and found["stream_fn"] is True


def test_binding_compiles_against_aten_too():
    """bindings.cpp as the version-specific build compiles it (torch_binding.h's ATen side)."""
    stable_abi_checks.compile_against_aten(CSRC / "bindings.cpp")
