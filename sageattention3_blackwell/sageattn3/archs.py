"""Which GPUs sageattn3's compiled kernels serve, and what building them needs.

The one table that the build (setup.py, through build_rules.py), dispatch and the variant checks
(variants/sageattn3.yaml, tests/distribution/test_archs.py) read. Plain data, no imports: setup.py loads this file
by path, before torch or the package exist.
"""

# Compute capability "major.minor" -> the compiled kernel that runs there (csrc/attention_<kernel>.cu). Their FP4
# block-scaled MMAs are arch-specific features: each arch is compiled as sm_<arch>a (ARCH_SUFFIX) whatever suffix
# TORCH_CUDA_ARCH_LIST gives, and without PTX, which no other GPU could run. `a` code runs on exactly its arch, so
# 12.1 gets its own sm_121a (nvcc >= 12.9, variants/toolchain.yaml); the kernels' guards test the arch-specific
# macros (__CUDA_ARCH_FEAT_SM1xx_ALL), which a family target (sm_120f) does not define.
ARCH_KERNEL = {
    "10.0": "sm100",  # tcgen05
    "12.0": "sm120",  # mma.sync block-scaled
    "12.1": "sm120",
}
ARCH_SUFFIX = "a"

# The oldest nvcc with these instructions (CUDA 12.8: sm_100a and sm_120a).
MIN_CUDA = "12.8"
