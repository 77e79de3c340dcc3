// Quantization arithmetic shared by prepare() and the attention kernels: INT8 scales and rounding (bit-exact with
// sageattention/reference.py), and P as FP8 e4m3 in the MMA's A-register layout.
#pragma once
#include <cstdint>

#include "common/ptx.cuh"

namespace sage {

// fp32's least normal: the floor of every quantization scale (sageattention/quant_groups.py MIN_SCALE says why).
constexpr float kMinScale = 1.17549435e-38f;

// y rounded to the nearest integer (ties to even, like torch.round) as the low byte of fl(y + 1.5 * 2^23): at that
// magnitude the ulp is 1, so the add itself rounds, and for |y| < 2^22 the low byte is the INT8 two's complement.
// One add instead of a conversion. A NaN y gives 0xff: only a non-finite element itself (quantize_block scales the
// rest of a non-finite group, which its NaN scale marks, by 0).
__device__ __forceinline__ uint32_t rounded_bits(float y) { return __float_as_uint(__fadd_rn(y, 12582912.f)); }

// A group's INT8 scale from its largest magnitude (NaN where the group holds inf or NaN): max / 127, 1 for an
// all-zero group, at least fp32's least normal; NaN stays NaN.
__device__ __forceinline__ float int8_scale(float group_max) {
  const float s = group_max / 127.f;
  return s == 0.f ? 1.f : s < kMinScale ? kMinScale : s;
}

// Four values times inv, rounded to INT8 and packed, the first in the lowest byte (x * inv rounded once, then to
// an integer: the reference's two steps).
__device__ __forceinline__ uint32_t quantize4(const float* v, float inv) {
  const uint32_t b0 = rounded_bits(__fmul_rn(v[0], inv)), b1 = rounded_bits(__fmul_rn(v[1], inv));
  const uint32_t b2 = rounded_bits(__fmul_rn(v[2], inv)), b3 = rounded_bits(__fmul_rn(v[3], inv));
  return __byte_perm(__byte_perm(b0, b1, 0x0040), __byte_perm(b2, b3, 0x0040), 0x5410);
}

// P of a tile (e4m3, already stretched by softmax_step<J, true> or sm90's tile_exp) in the 8-bit A-register layout
// of mma.sync m16n8k32, which wgmma's register A shares: a[s] is the k32 step s (keys 32s..32s+31, slices
// 4s..4s+3), register i holds row g (i even) or g + 8 (i odd) of its first or second 16 keys (i / 2).
template <int J>
__device__ __forceinline__ void pack_p_e4m3(const float (&x)[J][4], uint32_t (&a)[J / 4][4]) {
#pragma unroll
  for (int s = 0; s < J / 4; ++s) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int j = 4 * s + 2 * (i / 2), e = 2 * (i % 2);
      a[s][i] = ptx::e4m3x2(x[j][e], x[j][e + 1]) | (ptx::e4m3x2(x[j + 1][e], x[j + 1][e + 1]) << 16);
    }
  }
}

}  // namespace sage
