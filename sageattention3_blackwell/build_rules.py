"""Build rules of sageattn3's CUDA extension, torch-free so CPU tests import them (setup.py applies them).

One module, `sageattn3._C`, compiled for the archs of TORCH_CUDA_ARCH_LIST as the arch-specific targets that the
FP4 instructions need (sageattn3/archs.py), by an nvcc of at least archs.MIN_CUDA.
"""
from __future__ import annotations

from pathlib import Path

import build_support as support
from build_support import BuildConfigError, Extension, Target

ROOT = Path(__file__).resolve().parent
# By path: importing the package would import torch, which an isolated build lacks.
archs = support.load_by_path(ROOT / "sageattn3" / "archs.py", "_sageattn3_archs")
SOURCES = ["csrc/bindings.cpp", "csrc/quantize.cu", "csrc/attention_sm120.cu", "csrc/attention_sm100.cu"]
CUDA_TOO_OLD = f"Sage3 is only supported on CUDA {archs.MIN_CUDA} and above"

# The version-specific build's torch floor (the stable-ABI build's is build_support.STABLE_ABI_TORCH), and the run
# requirements besides torch (pyproject.toml leaves them to setup.py: the torch floor depends on the build).
TORCH_FLOOR = "2.7"
# Any Triton torch 2.7+ pins: dispatch.triton_mode says what each compiles per GPU (the compiled kernels come
# first on Blackwell); the exported wheels pin triton-windows to the torch's pair (variants/pypi.yaml).
REQUIREMENTS = ["triton>=3.2; sys_platform == 'linux'", "triton-windows>=3.2; sys_platform == 'win32'"]


def check_cuda_version(version: tuple[int, int]) -> None:
    if tuple(version) < tuple(int(n) for n in archs.MIN_CUDA.split(".")):
        raise BuildConfigError(CUDA_TOO_OLD)


def targets(arch_list: str) -> list[Target]:
    """TORCH_CUDA_ARCH_LIST -> the arch-specific targets, whatever suffix or +PTX the list gives, without repeats."""
    chosen = [Target(t.arch, archs.ARCH_SUFFIX) for t in support.parse_arch_list(arch_list, archs.ARCH_KERNEL,
                                                                                 "sageattn3")]
    return list(dict.fromkeys(chosen))


def plan(arch_list: str | None, nvcc_version_output: str, nvcc_arch_output: str) -> list[Extension]:
    """The extension for TORCH_CUDA_ARCH_LIST (None or empty: every arch of archs.py that nvcc supports)."""
    nvcc = support.parse_nvcc_version(nvcc_version_output)
    check_cuda_version(nvcc)
    nvcc_archs = support.parse_nvcc_archs(nvcc_arch_output)
    chosen = targets(arch_list or support.default_arch_list(archs.ARCH_KERNEL, nvcc_archs))
    support.check_nvcc_archs(chosen, nvcc, nvcc_archs)
    return [Extension("sageattn3._C", SOURCES, ["-O3", *(flag for t in chosen for flag in t.gencode())])]
