"""Build of sageattn3. Metadata lives in pyproject.toml; this file only adds the CUDA extension.

The extension is built when torch with CUDA and nvcc are present (pip install --no-build-isolation).
SAGE_BUILD_CUDA=1 requires it (fails loudly otherwise), SAGE_BUILD_CUDA=0 skips it. Targets come
from TORCH_CUDA_ARCH_LIST (default "10.0;12.0"); MAX_JOBS limits parallel compile jobs. Neither a
GPU nor the network is needed.
"""
import os
import subprocess
import sys

from setuptools import setup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import build_rules  # noqa: E402


def _no_cuda(reason: str, forced: bool):
    if forced:
        raise RuntimeError(f"SAGE_BUILD_CUDA=1 but the CUDA extension cannot be built: {reason}")
    print(f"sageattn3: building without the CUDA extension ({reason})", file=sys.stderr)
    return {}


def cuda_build_args() -> dict:
    mode = os.environ.get("SAGE_BUILD_CUDA", "").strip()
    if mode == "0":
        return {}
    forced = mode == "1"
    try:  # torch only now: an isolated build has none, and needs none for the pure-Python package
        import torch
        from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension
    except ImportError:
        return _no_cuda("torch is not installed in the build environment (use --no-build-isolation)", forced)
    if torch.version.cuda is None:
        return _no_cuda(f"torch {torch.__version__} is a CPU build", forced)
    if CUDA_HOME is None:
        return _no_cuda("no CUDA toolkit (nvcc) found; set CUDA_HOME", forced)
    nvcc = os.path.join(CUDA_HOME, "bin", "nvcc")
    version_text = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    build_rules.check_cuda_version(build_rules.parse_nvcc_version(version_text))
    # Explicit -gencode flags also stop torch from adding its own (non-"a") targets. No -std flag: torch adds
    # the standard its own headers need (C++17 in older releases, C++20 in newer ones, whose headers
    # no longer build as C++17 everywhere) only when none is given.
    nvcc_flags = ["-O3", *build_rules.gencode_flags(os.environ.get("TORCH_CUDA_ARCH_LIST"))]
    cxx_flags = ["/O2"] if sys.platform == "win32" else ["-O3"]
    extension = CUDAExtension("sageattn3._C", build_rules.SOURCES,
                              extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags})
    return {"ext_modules": [extension], "cmdclass": {"build_ext": BuildExtension}}


setup(**cuda_build_args())
