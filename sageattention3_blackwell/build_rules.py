"""Build rules for the sageattn3 CUDA extension, kept free of torch so tests can import them."""
from __future__ import annotations

import re

MIN_CUDA = (12, 8)
CUDA_TOO_OLD = "Sage3 is only supported on CUDA 12.8 and above"
# TORCH_CUDA_ARCH_LIST entry -> the arch-specific target the FP4 instructions need.
ARCHS = {"10.0": "100a", "12.0": "120a", "12.1": "121a"}
DEFAULT_ARCH_LIST = "10.0;12.0"
SOURCES = ["csrc/bindings.cpp", "csrc/quantize.cu", "csrc/attention_sm120.cu", "csrc/attention_sm100.cu"]

# The stable-ABI build (csrc/torch_binding.h): libtorch's stable C ABI and CPython's limited API, so one binary
# serves every torch from STABLE_ABI_TORCH on and every CPython from LIMITED_API on (torch's BuildExtension
# defines Py_LIMITED_API as 3.10 from torch 2.9 on). Older torch gets the version-specific build, from TORCH_FLOOR.
STABLE_ABI_TORCH = (2, 10)
LIMITED_API = "cp310"
TORCH_FLOOR = "2.7"
STABLE_ABI_ENV = "SAGE_STABLE_ABI"
# Run requirements besides torch (pyproject.toml leaves them to setup.py: the torch floor depends on the build).
# Any Triton torch 2.7+ pins: dispatch.triton_mode says what each compiles per GPU (the compiled kernels come
# first on Blackwell); the exported wheels pin triton-windows to the torch's pair (variants/pypi.yaml).
REQUIREMENTS = ["triton>=3.2; sys_platform == 'linux'", "triton-windows>=3.2; sys_platform == 'win32'"]


def parse_nvcc_version(output: str) -> tuple:
    match = re.search(r"release (\d+)\.(\d+)", output)
    if not match:
        raise RuntimeError(f"cannot read the CUDA version from nvcc --version:\n{output}")
    return int(match.group(1)), int(match.group(2))


def check_cuda_version(version: tuple) -> None:
    if tuple(version) < MIN_CUDA:
        raise RuntimeError(CUDA_TOO_OLD)


def gencode_flags(arch_list: str | None) -> list:
    """TORCH_CUDA_ARCH_LIST ("10.0;12.0", "10.0a 12.0a", "12.0+PTX", ...) -> nvcc -gencode flags."""
    flags = []
    for entry in re.split(r"[;\s,]+", (arch_list or DEFAULT_ARCH_LIST).strip()):
        if not entry:
            continue
        base = entry.removesuffix("+PTX").removesuffix("a")
        if base not in ARCHS:
            raise ValueError(f"TORCH_CUDA_ARCH_LIST entry {entry!r} is not a Blackwell FP4 target; "
                             f"sageattn3 builds for {', '.join(ARCHS)} (also written with an 'a' suffix)")
        sm = ARCHS[base]
        flag = f"-gencode=arch=compute_{sm},code=sm_{sm}"
        if flag not in flags:
            flags.append(flag)
    if not flags:
        raise ValueError("TORCH_CUDA_ARCH_LIST names no architecture")
    return flags


def _torch_minor(version: str) -> tuple:
    match = re.match(r"(\d+)\.(\d+)", version)
    if not match:
        raise ValueError(f"cannot read a torch version from {version!r}")
    return int(match.group(1)), int(match.group(2))


def use_stable_abi(torch_version: str, setting: str | None) -> bool:
    """Whether to build against the stable ABI: SAGE_STABLE_ABI=1 or 0 says so; unset, from torch 2.10 on."""
    setting = (setting or "").strip()
    if setting not in ("", "0", "1"):
        raise ValueError(f"{STABLE_ABI_ENV}={setting!r}: use 1 (stable-ABI build) or 0 (version-specific build)")
    new_enough = _torch_minor(torch_version) >= STABLE_ABI_TORCH
    if setting == "1" and not new_enough:
        raise RuntimeError(f"{STABLE_ABI_ENV}=1 needs torch >= {_dotted(STABLE_ABI_TORCH)} to build against; "
                           f"found torch {torch_version}")
    return new_enough if setting == "" else setting == "1"


def stable_abi_macros() -> list:
    """The binding's stable-ABI switch, and the oldest torch it must load under (TORCH_TARGET_VERSION keeps newer
    stable APIs out of reach: torch/csrc/stable/version.h)."""
    major, minor = STABLE_ABI_TORCH
    return [("SAGE_STABLE_ABI", "1"), ("TORCH_TARGET_VERSION", f"0x{major:02x}{minor:02x}{0:012x}")]


def requirements(stable_abi: bool) -> list:
    """Requires-Dist: the stable-ABI build loads under every torch from STABLE_ABI_TORCH on."""
    floor = _dotted(STABLE_ABI_TORCH) if stable_abi else TORCH_FLOOR
    return [f"torch>={floor}", *REQUIREMENTS]


def _dotted(version: tuple) -> str:
    return ".".join(map(str, version))
