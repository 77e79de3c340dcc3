"""The Triton kernel compiles for Blackwell (and Hopper) without a GPU, to the expected MMA instructions."""
import os
import subprocess
import sys

import pytest
import triton
from triton.backends.compiler import GPUTarget

from sage3_tools import cuobjdump, sass_mnemonics
from sageattn3 import triton_attn

SIGNATURE = dict(q_codes="*u8", q_scales="*fp8e4nv", k_codes="*u8", k_scales="*fp8e4nv", v_codes="*u8",
                 v_scales="*fp8e4nv", q_bias="*fp32", out="*fp32", lse="*fp32", heads="i32", kv_group="i32",
                 n_q_pad="i32", n_k="i32", n_k_pad="i32", scales="*fp32", causal_offset="i32")

# capability -> (NATIVE, instruction expected in the PTX, in the SASS)
TARGETS = {
    100: (True, "tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.scale_vec::4X", "UTCOMMA.4X"),
    120: (True, "mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3",
          "OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X"),
    90: (False, "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16", "HGMMA.64x64x16.F32"),
}


# Under TRITON_INTERPRET=1 (set for the whole process by the sageattention tests on CPU machines) kernels are
# interpreted functions that cannot be compiled, so the checks then run again in a clean child process.
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"


@pytest.mark.skipif(not INTERPRETING, reason="this process compiles directly")
def test_compile_checks_in_a_clean_process():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
                         env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "3 passed" in run.stdout


@pytest.mark.skipif(INTERPRETING, reason="kernels are interpreted here; test_compile_checks_in_a_clean_process runs this")
@pytest.mark.parametrize("capability", sorted(TARGETS))
def test_triton_kernel_compiles_to_block_scaled_mma(capability, tmp_path):
    native, ptx_instruction, sass_instruction = TARGETS[capability]
    constants = dict(HEAD_DIM=128, BLOCK_M=128, BLOCK_N=64, CAUSAL=True, HAS_BIAS=True, FP4_MAX=2688.0, NATIVE=native)
    signature = dict(SIGNATURE, **{name: "constexpr" for name in constants})
    kernel = triton.compile(triton.compiler.ASTSource(triton_attn._sage3_fwd, signature, constants),
                            target=GPUTarget("cuda", capability, 32), options=dict(num_warps=8, num_stages=2))
    assert ptx_instruction in kernel.asm["ptx"]
    if cuobjdump() is None:
        pytest.skip("no cuobjdump (CUDA toolkit or triton's bundled copy) to disassemble the cubin")
    assert sass_instruction in sass_mnemonics(kernel.asm["cubin"], tmp_path)
