"""The stable-ABI build of the compiled modules, without a GPU: one family (sm80, for sm_80 alone: the quickest to
compile) built once per session against the installed torch (>= 2.10; a CPU build will do) is an abi3 wheel that
requires torch>=2.10, takes nothing of libtorch's C++ API and only the limited API of CPython, and loads and
registers its CUDA kernels under the installed torch and under PyPI's oldest and newest CUDA 13 torch; every
family's binding also compiles as the version-specific (ATen) build, and sm80's builds as one against PyPI's newest
CUDA torch, and loads and registers alike. sageattn3's test_sage3_cuda_compile.py checks
its own extension the same way (the helpers are shared: sageattention3_blackwell/tests/stable_abi_checks.py).
"""
import json
import re
import subprocess
import sys
from email.parser import Parser
from pathlib import Path
from zipfile import ZipFile

import pytest
import torch

import sageattention
from tests.build.source_tree import copy_sources

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "sageattention3_blackwell" / "tests"))
try:
    import stable_abi_checks
finally:
    sys.path.pop(0)

VERSION = sageattention.__version__
# What a module takes from CPython: the limited-API functions that make it and its two torch-free functions' answers.
LIMITED_API_USED = {"PyModule_Create2", "PyBool_FromLong"}


@pytest.fixture(scope="session")
def stable_wheel(tmp_path_factory) -> Path:
    src = copy_sources(tmp_path_factory.mktemp("sageattention_src"))
    return stable_abi_checks.build_wheel(src, tmp_path_factory.mktemp("sageattention_wheel"), "8.0",
                                         SAGE_BUILD_FAMILIES="sm80")


@pytest.fixture(scope="session")
def unpacked(stable_wheel, tmp_path_factory) -> Path:
    return stable_abi_checks.unpack(stable_wheel, tmp_path_factory.mktemp("sageattention_site"))


def test_stable_wheel_is_abi3_and_requires_torch_2_10(stable_wheel):
    assert stable_wheel.name == f"sageattention-{VERSION}-cp310-abi3-linux_x86_64.whl"
    with ZipFile(stable_wheel) as whl:
        assert [n for n in whl.namelist() if n.endswith(".so")] == ["sageattention/_C_sm80.abi3.so"]
        meta = Parser().parsestr(whl.read(f"sageattention-{VERSION}.dist-info/METADATA").decode())
    assert [r for r in meta.get_all("Requires-Dist") if re.match(r"torch\b", r)] == ["torch>=2.10"]


def test_stable_module_uses_only_the_c_shim_and_the_limited_api(unpacked):
    stable_abi_checks.check_stable_symbols(unpacked / "sageattention/_C_sm80.abi3.so", LIMITED_API_USED)


LOAD_AND_CALL = """
import json, sys, torch
from torch._subclasses.fake_tensor import FakeTensorMode
site = sys.argv[1]
sys.path.insert(0, site)
import sageattention
from sageattention import dispatch
found = {"torch": torch.__version__, "package": sageattention.__file__.startswith(site)}
ops = ("attention", "quantize")
has_kernel = lambda op: torch._C._dispatch_has_kernel_for_dispatch_key("sageattention_sm80::" + op, "CUDA")
found["before"] = [has_kernel(op) for op in ops]
module = dispatch.compiled_module("sm80")  # imports sageattention._C_sm80, which registers the kernels
found["after"] = [has_kernel(op) for op in ops]
found["fp8_f16_accum"] = module.FP8_F16_ACCUM
found["runs"] = module.runs_on_current_device()  # no GPU here
# The CUDA kernels called on CPU tensors: the boxed call reaches the binding's own checks.
cuda = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)
x = torch.zeros(1, 2, 8, 64, dtype=torch.float16)
errors = []
for op, args in (("attention", (False, True, 0, 0.125, 2, 1, True, False, True)),
                 ("quantize", (False, 2, 2, 1, True, False, 448.0))):
    try:
        getattr(torch.ops.sageattention_sm80, op).default.redispatch(cuda, x, x, x, *args)
    except RuntimeError as e:
        errors.append(str(e).splitlines()[0])
found["errors"] = errors
with FakeTensorMode():
    q = torch.empty(1, 8, 2, 64, dtype=torch.float16)
    out, lse = module.attention(q, q, q, True, False, 0, 0.125, 2, 1, True, False, True)
found["fake"] = [list(out.shape), list(lse.shape), str(lse.dtype)]
print(json.dumps(found))
"""


def _load_and_call(unpacked: Path, env: dict) -> dict:
    run = subprocess.run([sys.executable, "-s", "-c", LOAD_AND_CALL, str(unpacked)], capture_output=True, text=True,
                         env=env, cwd=unpacked)
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.splitlines()[-1])
    assert found["package"] and found["before"] == [False, False] and found["after"] == [True, True]
    assert found["fp8_f16_accum"] is False and found["runs"] is False
    assert found["errors"] == ["q must be a CUDA tensor"] * 2
    assert found["fake"] == [[1, 8, 2, 64], [1, 2, 8], "torch.float32"]
    return found


def test_stable_module_loads_and_registers_its_kernels(unpacked):
    assert _load_and_call(unpacked, stable_abi_checks.toolkit_env())["torch"] == torch.__version__


@pytest.mark.parametrize("version", stable_abi_checks.CUDA13_TORCH)
def test_stable_module_loads_under_cuda_torch_from_pypi(unpacked, version):
    found = _load_and_call(unpacked, stable_abi_checks.pypi_torch_env(version))
    assert found["torch"].split("+")[0] == version


@pytest.mark.parametrize("family", [f for f in sageattention.archs.FAMILIES if f != "sm80"])
def test_the_other_families_bindings_compile_against_aten_too(family):
    """The same source is the version-specific build (torch < 2.10, or SAGE_STABLE_ABI=0); sm80's is built below."""
    stable_abi_checks.compile_against_aten(ROOT / "csrc" / family / "bindings.cpp", ROOT / "csrc")


@pytest.mark.parametrize("version", stable_abi_checks.CUDA13_TORCH)
@pytest.mark.parametrize("source", ["csrc/sm90/bindings.cpp", "sageattention3_blackwell/csrc/bindings.cpp"])
def test_stable_bindings_compile_against_each_torchs_headers(source, version):
    """Built against the oldest and the newest torch PyPI serves for CUDA 13, not only the installed one."""
    stable_abi_checks.compile_stable(ROOT / source, version, ROOT / "csrc")


@pytest.fixture(scope="session")
def version_specific(tmp_path_factory) -> Path:
    """The version-specific build of the same family from the same sources, against PyPI's newest CUDA torch (a CPU
    torch lacks the CUDA headers it includes)."""
    newest = stable_abi_checks.torch_alone(stable_abi_checks.CUDA13_TORCH[-1], tmp_path_factory.mktemp("torch"))
    wheel = stable_abi_checks.build_wheel(copy_sources(tmp_path_factory.mktemp("sageattention_src")),
                                          tmp_path_factory.mktemp("aten_wheel"), "8.0", SAGE_BUILD_FAMILIES="sm80",
                                          SAGE_STABLE_ABI="0", PYTHONPATH=str(newest))
    return stable_abi_checks.unpack(wheel, tmp_path_factory.mktemp("aten_site"))


def test_version_specific_module_from_the_same_sources(version_specific):
    (module,) = (version_specific / "sageattention").glob("_C_*.so")
    assert module.name.startswith("_C_sm80.cpython-")
    meta = Parser().parsestr(next(version_specific.glob("*.dist-info/METADATA")).read_text())
    assert [r for r in meta.get_all("Requires-Dist") if re.match(r"torch\b", r)] == ["torch>=2.6"]
    version = stable_abi_checks.CUDA13_TORCH[-1]
    assert _load_and_call(version_specific, stable_abi_checks.pypi_torch_env(version))["torch"].startswith(version)
