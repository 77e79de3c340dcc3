"""Build rules for the sageattn3 CUDA extension, kept free of torch so tests can import them."""
from __future__ import annotations

import re

MIN_CUDA = (12, 8)
CUDA_TOO_OLD = "Sage3 is only supported on CUDA 12.8 and above"
# TORCH_CUDA_ARCH_LIST entry -> the arch-specific target the FP4 instructions need.
ARCHS = {"10.0": "100a", "12.0": "120a", "12.1": "121a"}
DEFAULT_ARCH_LIST = "10.0;12.0"
SOURCES = ["csrc/bindings.cpp", "csrc/quantize.cu", "csrc/attention_sm120.cu", "csrc/attention_sm100.cu"]


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
