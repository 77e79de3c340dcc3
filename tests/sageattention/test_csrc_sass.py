"""nvcc compiles the kernels of csrc/ for each family's archs, and their SASS holds the instructions they exist for.

No GPU and no torch headers needed: the kernel sources are torch-free (only csrc/<family>/bindings.cpp includes
torch; the rehearsal builds the whole extension). Each (source, arch) is compiled once per test run to a cubin.
On sm_90 the e4m3 mma.sync has no native instruction: nvcc lowers it to f16 HMMA (which is why Hopper needs its
own wgmma kernel); sm_89 and sm_120 run it as QMMA. The sm90 family is compiled for sm_90a alone.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sageattention.bench import sass_loops

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"
IMMA = "IMMA.16832.S8.S8"
QMMA_F32, QMMA_F16 = "QMMA.16832.F32.E4M3.E4M3", "QMMA.16832.F16.E4M3.E4M3"
IGMMA = "IGMMA.64x128x32.S8.S8"
HOPPER = ["UTMALDG.3D", "USETMAXREG.DEALLOC", "USETMAXREG.TRY_ALLOC"]
# the software pipeline: a tile's scores are awaited while the previous tile's P·V is still in flight
PIPELINED = "WARPGROUP.DEPBAR.LE gsb0, 0x1"
# (family, source) -> {arch: instructions its SASS must hold}
EXPECTED = {
    ("sm80", "attention_d64.cu"): {a: [IMMA, "HMMA.16816.F32", "HMMA.16816.F32.BF16", "HMMA.16816.F16"]
                                   for a in ("80", "89", "90a", "120a")},
    ("sm80", "attention_d128.cu"): {a: [IMMA, "HMMA.16816.F32", "HMMA.16816.F32.BF16"] for a in ("80", "120a")},
    ("sm89", "attention_d64.cu"): {"89": [IMMA, QMMA_F32, QMMA_F16], "120a": [IMMA, QMMA_F32, QMMA_F16],
                                   "90a": [IMMA, "HMMA.16816.F32"]},
    ("sm89", "attention_d128.cu"): {a: [IMMA, QMMA_F32, QMMA_F16] for a in ("89", "120a")},
    ("sm89", "prepare.cu"): {a: ["F2FP.SATFINITE.E4M3.F32"] for a in ("89", "120a")},
    ("sm80", "prepare.cu"): {"80": ["F2FP.PACK_AB", "F2FP.BF16.PACK_AB"]},
    ("sm80", "family.cu"): {"80": [IMMA]},
    ("sm89", "family.cu"): {"89": [QMMA_F32]},
    # sm_90a: warpgroup MMAs (IGMMA s8, QGMMA e4m3 at head_dim + 8 columns: the row sums), bulk tensor copies, the
    # registers handed between warpgroups, P·V overlapping the next tile's softmax
    ("sm90", "attention_d64.cu"): {"90a": [IGMMA, "QGMMA.64x72x32.F32.E4M3.E4M3", *HOPPER, PIPELINED]},
    ("sm90", "attention_d128.cu"): {"90a": [IGMMA, "QGMMA.64x136x32.F32.E4M3.E4M3", *HOPPER, PIPELINED]},
    # short K/V heads in one pass: each cluster program's rows by bulk tensor copies, statistics exchanged across the
    # cluster between its barriers
    ("sm90", "prepare.cu"): {"90a": ["F2FP.SATFINITE.E4M3.F32", "UTMALDG.4D", "UCGABAR_ARV", "UCGABAR_WAIT"]},
    ("sm90", "family.cu"): {"90a": [IGMMA]},
    ("sm90", "tensor_maps.cu"): {"90a": []},  # host code only
}
CASES = [(family, source, arch) for (family, source), archs in sorted(EXPECTED.items()) for arch in archs]


@pytest.fixture(scope="session")
def sass(tmp_path_factory):
    nvcc, tool = shutil.which("nvcc"), sass_loops.cuobjdump()
    if nvcc is None or tool is None:
        pytest.skip(f"needs nvcc and cuobjdump (found nvcc={nvcc}, cuobjdump={tool})")
    out_dir = tmp_path_factory.mktemp("csrc_cubins")
    cache = {}

    def disassemble(family: str, source: str, arch: str) -> str:
        if (family, source, arch) not in cache:
            cache[family, source, arch] = sass_loops.compile_sass(ROOT, family, source, sass_loops.target_of(arch),
                                                                  out_dir, nvcc, tool)
        return cache[family, source, arch]

    return disassemble


# Attention kernels that may touch local memory: the sm89 family on sm_90, where the FP8 MMA's emulation through
# f16 needs a few more registers than there are (a few bytes; sageattn runs the Triton kernels on Hopper).
SPILLS_ALLOWED = {("sm89", "90a")}


@pytest.mark.parametrize("family, source, arch", CASES)
def test_kernels_compile_to_their_instructions(sass, family, source, arch):
    code = sass(family, source, arch)
    for instruction in EXPECTED[family, source][arch]:
        assert instruction in code, f"{instruction} missing from the sm_{arch} SASS of csrc/{family}/{source}"
    if PIPELINED in EXPECTED[family, source][arch]:
        # in every kernel of the file: where ptxas serializes the warpgroup MMAs (its C7514/C7520 notes) each one
        # is awaited at once, and the softmax no longer overlaps the P·V
        kernels = code.split("Function :")[1:]
        assert kernels and all(PIPELINED in k for k in kernels), f"a kernel of csrc/{family}/{source} is not pipelined"
    if source.startswith("attention") and (family, arch) not in SPILLS_ALLOWED:
        # register arrays indexed at run time, or too many registers, would go to local memory (slow)
        assert "STL" not in code and "LDL" not in code, f"local memory in csrc/{family}/{source} for sm_{arch}"


# Kernels whose aligned output rows leave through shared memory: stmatrix, then bulk tensor stores (stage_rows)
BULK_STORE = {("sm90", "attention_d64.cu"): 64, ("sm90", "attention_d128.cu"): 128}  # -> head_dim


@pytest.mark.parametrize("family, source, arch", [case for case in CASES if case[1].startswith("attention_")])
def test_outputs_are_stored_in_16_byte_pieces(sass, family, source, arch):
    """store_rows writes a whole 8-channel slice per lane with one 16-byte store (full 32-byte sectors and a quarter of
    the store instructions: docs/decisions/0014-sixteen-byte-output-stores.md); nvcc had split the same store, written
    as a uint4, into four 32-bit ones. The sm90 kernels store aligned rows by the copy engine instead
    (docs/decisions/0013-sm90-bulk-tensor-epilogue.md): d / 16 stmatrix.x4 per thread (its
    2 x d / 4 values), a warpgroup's d / 64 boxes of 64 columns, and the wait for their reads at each item's start and
    before the program exits (the staging rows are written again)."""
    for kernel in sass(family, source, arch).split("Function :")[1:]:
        name, d = kernel.split()[0], BULK_STORE.get((family, source))
        if d:
            assert kernel.count("STSM.16.M88.4") == d // 16, f"{name}: not {d // 16} stmatrix.x4 per thread"
            assert kernel.count("UTMASTG.4D") == d // 64, f"{name}: not {d // 64} bulk tensor stores"
            assert kernel.count("DEPBAR.LE SB0, 0x0") == 2, f"{name}: the stores' reads are not awaited twice"
        else:
            assert "STG.E.128" in kernel, f"{name}: no 16-byte store in csrc/{family}/{source} for sm_{arch}"


def test_every_kernel_source_is_covered():
    sources = {(p.parent.name, p.name) for p in CSRC.glob("*/*.cu")}
    assert sources == set(EXPECTED), "add the new or renamed csrc/ sources to EXPECTED"


def test_only_the_bindings_include_torch():
    for path in CSRC.rglob("*"):
        if path.suffix in (".cu", ".cuh", ".h", ".cpp"):
            text = path.read_text()  # torch_binding.h: torch's stable ABI or ATen, for both packages' bindings
            includes_torch = any(name in text for name in ("torch/extension.h", "<ATen/", "<torch/", "torch_binding.h"))
            assert includes_torch == (path.name in ("binding.h",)), f"{path.relative_to(ROOT)}"


def test_generated_wgmma_header_is_current(tmp_path):
    """csrc/sm90/wgmma_ops.cuh is what csrc/sm90/gen_wgmma.py writes (edit the generator, not the header)."""
    fresh = tmp_path / "wgmma_ops.cuh"
    subprocess.run([sys.executable, str(CSRC / "sm90" / "gen_wgmma.py"), str(fresh)], check=True)
    assert fresh.read_text() == (CSRC / "sm90" / "wgmma_ops.cuh").read_text(), \
        "wgmma_ops.cuh is stale: rerun csrc/sm90/gen_wgmma.py and commit it"


@pytest.mark.parametrize("source", ["attention_d64.cu", "attention_d128.cu"])
def test_sm90_exponents_share_their_issue_slots(sass, source):
    """The exponent unit takes a warp's MUFU.EX2 every 8 cycles: ptxas fills those gaps only with work in the same
    straight run of code, which holds O's update and P's packing (docs/decisions/0015-exponent-phase-straight-run.md).
    A long run of back-to-back MUFU.EX2 (53-59 without them) means the gaps went idle again."""
    for kernel in sass("sm90", source, "90a").split("Function :")[1:]:
        opcodes = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?(\S+)", kernel)
        longest = max(len(run) for run in "".join("x" if op == "MUFU.EX2" else " " for op in opcodes).split(" "))
        assert longest <= 8, f"{kernel.split()[0]}: {longest} MUFU.EX2 in a row in csrc/sm90/{source}"


def test_sm90_d64_dual_loop_takes_maxima_in_the_exponent_run(sass):
    """The d64 dual loop (csrc/sm90/mainloop.cuh, kDual): two P·V accumulator sets, and a speculative tile's row
    maxima (VIMNMX3 on the INT32 scores) in the same straight run as its exponents, off the chain from S to P."""
    kernels = {k.split()[0]: k for k in sass("sm90", "attention_d64.cu", "90a").split("Function :")[1:]}
    dual = [name for name in kernels if "Lb0ELb1E" in name]  # <64, T, kLse = false, kDual = true>
    assert len(dual) == 2, f"one dual kernel per dtype expected, got {sorted(kernels)}"
    for name in dual:
        code = kernels[name]
        assert len(set(re.findall(r"QGMMA\.\S+ (R\d+),", code))) == 2, f"{name}: not two P·V accumulator sets"
        runs = re.split(r"\b(?:BRA|BSSY|BSYNC|EXIT)\b", code)
        assert any(run.count("MUFU.EX2") >= 32 and run.count("VIMNMX3") >= 8 for run in runs), \
            f"{name}: no run holding both a tile's exponents and its row maxima"
    assert "Lb0ELb1E" not in sass("sm90", "attention_d128.cu", "90a"), "a dual kernel at d128 (no registers for it)"


@pytest.mark.parametrize("source", ["attention_d64.cu", "attention_d128.cu"])
def test_sm90_tile_loop_reaches_its_mma_quickly(sass, source):
    """Every instruction between the tile loop's top and its first Q·K^T lies on the chain from one tile's exponent run
    to the next tile's scores: the ring position steps by one and descriptors are offsets of precomputed ones (not
    a division by the stage count and 64-bit descriptor arithmetic per tile, 55-86 instructions: 42-48 measured
    2.5-4.5 % faster at d128, docs/decisions/0016-sm90-short-loop-top.md). ptxas hoists a few uniform descriptor moves
    into it in the d128 LSE kernel (kLse, the third template argument): up to 56 there."""
    for name, code in sass_loops.kernels(sass("sm90", source, "90a")).items():
        # the innermost loop holding the MMAs: the tile loop
        top, end = min(sass_loops.loops(code), key=lambda loop: loop[1] - loop[0])
        first_mma = next(i for i in range(top, end) if "IGMMA" in code[i][1])
        limit = 56 if "Lb1ELb0E" in name else 48
        assert first_mma - top <= limit, f"{name}: {first_mma - top} instructions before the first IGMMA"
