"""nvcc builds the CUDA kernels for sm_100a and sm_120a, and the SASS holds the block-scaled FP4 MMAs.

No GPU needed. Each (source, arch) pair is compiled once per session into a temporary directory.
bindings.cpp is not covered here: it needs a CUDA build of torch (see README, "Building").
"""
import shutil
import subprocess
from pathlib import Path

import pytest

from sage3_tools import cuobjdump

CSRC = Path(__file__).resolve().parents[1] / "csrc"
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
