"""sageattention/bench/sass_loops.py: SASS parsed into kernels and their MMA loops, loops compared as same, renamed or reordered;
and, where nvcc and cuobjdump are present, the whole path from two sources to a verdict. No GPU."""
from __future__ import annotations

import shutil

import pytest

from sageattention.bench import sass_loops

SASS = """
	code for sm_80
		Function : _Z6kernelPiS_i
	.headerflags	@"EF_CUDA_VIRTUAL_SM(EF_CUDA_SM80)"
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   ISETP.GE.AND P0, PT, R2, 0x1, PT ;
        /*0020*/              @!P0 BRA 0x90 ;
        /*0030*/                   LDG.E R4, [R2.64] ;
        /*0040*/                   IMMA.16832.S8.S8 R8, R4.ROW, R6.COL, R8 ;
        /*0050*/                   IADD3 R3, R3, 0x1, RZ ;
        /*0060*/                   ISETP.GE.AND P1, PT, R3, R5, PT ;
        /*0070*/              @!P1 BRA 0x30 ;
        /*0080*/                   IADD3 R9, R9, 0x1, RZ ;
        /*0090*/                   IADD3 R10, R10, -0x1, RZ ;
        /*00a0*/                   ISETP.NE.AND P2, PT, R10, RZ, PT ;
        /*00b0*/               @P2 BRA 0x80 ;
        /*00c0*/                   EXIT ;
		Function : _Z5otherv
        /*0000*/                   EXIT ;
"""


def test_kernels_and_their_mma_loops():
    """Every Function's instructions by address; a loop is a branch back to an earlier address, counted only where it
    holds an MMA (the loop at 0x80 holds none; the branch at 0x20 goes forward)."""
    found = sass_loops.kernels(SASS)
    assert list(found) == ["_Z6kernelPiS_i", "_Z5otherv"]
    code = found["_Z6kernelPiS_i"]
    assert code[0] == (0x0, "MOV R1, c[0x0][0x28]") and len(code) == 13
    assert sass_loops.loops(code) == [(3, 7)]
    assert sass_loops.loops(found["_Z5otherv"]) == []


def test_loops_compare_as_same_renamed_or_reordered():
    body = sass_loops.kernels(SASS)["_Z6kernelPiS_i"][3:8]
    moved = [(a + 0x100, op.replace("0x30", "0x130")) for a, op in body]  # the loop elsewhere: its branch target too
    renamed = [(a, op.replace("R8", "R12").replace("P1", "P3")) for a, op in body]
    swapped = [body[0], body[2], body[1], *body[3:]]
    grown = [*body[:2], (0x48, "FMUL R20, R20, R21"), *body[2:]]
    assert sass_loops.compare_loop(body, moved) == ("same", 1.0)
    assert sass_loops.compare_loop(body, renamed) == ("renamed", 1.0)
    kind, common = sass_loops.compare_loop(body, swapped)
    assert kind == "reordered" and 0.5 < common < 1.0
    assert sass_loops.compare_loop(body, grown)[0] == "reordered"


def test_compare_pairs_kernels_and_reports_each_loop():
    changed = SASS.replace("IADD3 R3, R3, 0x1, RZ", "IADD3 R3, R3, 0x2, RZ")
    assert [r["status"] for r in sass_loops.compare(SASS, SASS)] == ["identical", "identical"]
    row = next(r for r in sass_loops.compare(SASS, changed) if r["kernel"] == "_Z6kernelPiS_i")
    assert row["status"] == "differs" and [l["kind"] for l in row["loops"]] == ["reordered"]
    assert row["loops"][0]["size"] == 5 and row["loops"][0]["growth"] == 0
    renamed = SASS.replace("_Z5otherv", "_Z5otherb")
    statuses = {r["kernel"]: r["status"] for r in sass_loops.compare(SASS, renamed)}
    assert statuses["_Z5otherv"] == "only in base" and statuses["_Z5otherb"] == "only in new"
    paired = sass_loops.compare(SASS, renamed, key=lambda name: name.replace("otherb", "otherv"))
    assert [r["status"] for r in paired] == ["identical", "identical"]


@pytest.mark.skipif(shutil.which("c++filt") is None, reason="needs c++filt")
def test_readable_names_pair_a_template_parameter_added_with_a_default():
    old = "\t\tFunction : _ZN4sage4sm9021attention_sm90_kernelILi128E6__halfLb1ELb0EEEvi\n"
    new = "\t\tFunction : _ZN4sage4sm9021attention_sm90_kernelILi128E6__halfLb1ELb0ELb0EEEvi\n"
    names = sass_loops.readable(old) | sass_loops.readable(new)
    assert set(names.values()) == {"attention_sm90_kernel<128, __half, true>"}


MMA_LOOP = r"""
__global__ void kernel(const int* a, int* out, int n) {
  int acc[4] = {0, 0, 0, 0};
  for (int i = 0; i < n; ++i) {
    int x = a[i * blockDim.x + threadIdx.x]STEP;
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%4,%4,%4}, {%4,%4}, {%0,%1,%2,%3};"
                 : "+r"(acc[0]), "+r"(acc[1]), "+r"(acc[2]), "+r"(acc[3]) : "r"(x));
  }
  out[threadIdx.x] = acc[0] + acc[1] + acc[2] + acc[3];
}
"""


def test_sources_compiled_and_compared(tmp_path):
    """nvcc and cuobjdump on two trees holding a loop of mma.sync: the same source compares identical; one more
    multiply in the loop makes that loop differ."""
    nvcc, tool = shutil.which("nvcc"), sass_loops.cuobjdump()
    if nvcc is None or tool is None:
        pytest.skip(f"needs nvcc and cuobjdump (found nvcc={nvcc}, cuobjdump={tool})")
    sass = {}
    for name, step in (("base", ""), ("same", ""), ("changed", " * 3")):
        root = tmp_path / name
        (root / "csrc" / "sm80").mkdir(parents=True)
        (root / "csrc" / "sm80" / "kernel.cu").write_text(MMA_LOOP.replace("STEP", step))
        sass[name] = sass_loops.compile_sass(root, "sm80", "kernel.cu", sass_loops.native_target("sm80"), root, nvcc,
                                             tool)
    assert [r["status"] for r in sass_loops.compare(sass["base"], sass["same"])] == ["identical"]
    (row,) = sass_loops.compare(sass["base"], sass["changed"])
    assert row["status"] == "differs" and row["loops"] and row["loops"][0]["kind"] != "same"
