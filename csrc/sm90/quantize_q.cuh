// Q quantized to INT8 inside the sm90 kernel, by the consumer warpgroups, from the 16-bit Q the producer copied.
#pragma once
#include <cstdint>

#include "common/convert.cuh"
#include "common/params.h"
#include "common/quant.cuh"
#include "sm90/hopper.cuh"
#include "sm90/traits.cuh"

namespace sage::sm90 {

// INT8-quantizes this thread's Q rows `row` and row + 8 of the item (rows of the m16n8k32 A layout: bytes 4t..4t+3
// and 16+4t..+3 of every 32) from the 16-bit copy q16 into q8 (rows of D bytes, swizzled as the Q·K^T descriptor
// reads them) and returns their scale. The arithmetic and the scale groups (sageattention/quant_groups.py: a
// thread's two rows, a warp's 16, the item's 128) are prepare()'s, so the INT8 values and scales are the same;
// `negate` stores -Q's (the INT8 range is symmetric), so that a negative sm_scale becomes a positive one and the
// scores keep their order (tile_max). red is the per-block exchange of this item's parity.
template <int D, typename T>
__device__ __forceinline__ float quantize_q(const uint8_t* q16, uint8_t* q8, int row, int t, int gran, bool negate,
                                            uint32_t* red) {
  // piece p: 4 elements of row `row` + 8 * (p / kHalf) at column 32 * (p / 2 % (D / 32)) + 16 * (p % 2) + 4t
  constexpr int kPieces = 4 * (D / 32), kHalf = kPieces / 2;
  auto piece_row = [&](int p) { return row + 8 * (p / kHalf); };
  auto piece_col = [&](int p) { return 32 * (p / 2 % (D / 32)) + 16 * (p % 2) + 4 * t; };
  // The group's largest magnitude, as bits: 16-bit floats order like their magnitude bits, inf and NaN above all
  // finite values (prepare()'s max in fp32 gives the same value, and NaN for a group holding inf or NaN).
  uint2 raw[kPieces];
  uint32_t m2 = 0;  // two 16-bit maxima
#pragma unroll
  for (int p = 0; p < kPieces; ++p) {
    const int c = piece_col(p);
    const int offset = (c / 64) * (kRows * 128) + swizzled<128>(piece_row(p), (c % 64) * 2);  // 64-column boxes
    raw[p] = *reinterpret_cast<const uint2*>(q16 + offset);
    m2 = __vmaxu2(__vmaxu2(m2, raw[p].x & 0x7fff7fffu), raw[p].y & 0x7fff7fffu);
  }
  uint32_t mbits = max(m2 & 0xffffu, m2 >> 16);
  // a thread's group spans its quad (per thread), its warp (per warp), or both consumer warpgroups (per block)
  const int widest = gran == kPerThread ? 2 : 16;
  for (int off = 1; off <= widest; off *= 2) mbits = max(mbits, __shfl_xor_sync(0xffffffffu, mbits, off));
  if (gran == kPerBlock) {
    const int warp = row / 16;  // 0..7 over both consumer warpgroups
    if (t == 0 && (row % 16) == 0) red[warp] = mbits;
    named_barrier(3, 256);
#pragma unroll
    for (int w = 0; w < 8; ++w) mbits = max(mbits, red[w]);
  }
  const uint16_t top = static_cast<uint16_t>(mbits);
  const float mx = mbits >= kInfBits<T> ? __int_as_float(0x7fffffff) : to_float(*reinterpret_cast<const T*>(&top));
  const float scale = int8_scale(mx);
  const float inv = (negate ? -1.f : 1.f) / scale;
#pragma unroll
  for (int p = 0; p < kPieces; ++p) {
    float v[4];
    to_floats<T>(raw[p], v);
    *reinterpret_cast<uint32_t*>(q8 + swizzled<D>(piece_row(p), piece_col(p))) = quantize4(v, inv);
  }
  fence_proxy_async();
  return scale;
}

}  // namespace sage::sm90
