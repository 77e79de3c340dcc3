"""Which GPUs sageattention serves, and which compiled kernel family serves each.

The one table that the build (setup.py, through build_rules.py), dispatch and the variant checks read.
Plain data, no imports: setup.py loads this file by path, before torch or the package exist.

A kernel family is one extension module (`sageattention._C_<family>`) compiled from csrc/<family>/ plus the
shared csrc/ sources, only for the architectures whose instructions it uses, so mixed arch lists build.
"""

# Compute capability "major.minor" -> the compiled family sageattn's default path uses on it. Every listed
# arch is also served by the Triton kernels (INT8 tensor cores: sm80 and newer).
ARCH_FAMILY = {
    "8.0": "sm80",
    "8.6": "sm80",
    "8.7": "sm80",
    "8.9": "sm89",
    "9.0": "sm90",
    "10.0": "sm89",
    "10.3": "sm89",
    "12.0": "sm89",
    "12.1": "sm89",
}

# family -> what its kernels compute, the oldest arch with its instructions, and the oldest nvcc that has them.
FAMILIES = {
    # mma.sync m16n8k32 s8 (Q·K^T) and m16n8k16 f16/bf16 (P·V): PTX 7.0, sm_80.
    "sm80": {"pv": "fp16", "min_arch": "8.0", "min_cuda": "11.8"},
    # mma.sync m16n8k32 e4m3 with f32 accumulation (P·V): PTX 8.4 (CUDA 12.4), sm_89; "f16_accum": also the
    # f16-accumulating e4m3 MMA (pv_accum_dtype="fp32+fp16"), where nvcc has it (FP8_F16_ACCUM_MIN_CUDA).
    "sm89": {"pv": "fp8", "min_arch": "8.9", "min_cuda": "12.4", "f16_accum": True},
    # wgmma s8 (Q·K^T) and e4m3 (P·V), TMA, setmaxnreg: arch-specific sm_90a features, which run on 9.0 alone
    # ("only": compiled for exactly these archs, as sm_90a whatever suffix the arch list gives). Its P·V
    # accumulates two-level in fp32 whatever pv_accum_dtype asks.
    # "sdpa_below_keys": sageattn hands a call with fewer keys than this to SDPA, by (head_dim padded to 64 or 128,
    # causal): the crossovers that `python -m sageattention.bench.crossover` measured on an H100 (below them these
    # kernels ran more than 3 % slower than SDPA's own choice end to end: the quantization launches and the per-item
    # work do not pay off at short sequences; the runs and the rule for moving a threshold:
    # docs/decisions/0002-hopper-sdpa-crossovers.md).
    "sm90": {"pv": "fp8", "min_arch": "9.0", "min_cuda": "12.4", "only": ("9.0",), "suffix": "a",
             "sdpa_below_keys": {(64, False): 8192, (64, True): 16384, (128, False): 4096, (128, True): 5120}},
}

# Archs where `sageattn` keeps the Triton kernels although a compiled family runs there: datacenter Blackwell's
# Triton MMAs are its newer tensor-core path, while the sm89 family's mma.sync kernels are not (on Hopper they reached
# about a third of the Triton kernels' wgmma throughput: docs/decisions/0040-hopper-routes-to-sm90.md; not measured
# on Blackwell here). The named `_cuda` variants still run the compiled kernels there.
SAGEATTN_PREFERS_TRITON = ("10.0", "10.3")

# The f16-accumulating e4m3 MMA (pv_accum_dtype="fp32+fp16") arrived in PTX 8.7: built only by nvcc >= 12.8, for the
# families marked "f16_accum".
FP8_F16_ACCUM_MIN_CUDA = "12.8"


def version_tuple(text: str) -> tuple:
    """'8.9' -> (8, 9); also accepts '9.0a' and '12.0+PTX' spellings of TORCH_CUDA_ARCH_LIST."""
    base = text.removesuffix("+PTX").removesuffix("a").removesuffix("f")
    major, minor = base.split(".")
    return int(major), int(minor)


def supported_capabilities() -> frozenset:
    """{(8, 0), (8, 6), ...}: every GPU sageattention runs on."""
    return frozenset(version_tuple(a) for a in ARCH_FAMILY)
