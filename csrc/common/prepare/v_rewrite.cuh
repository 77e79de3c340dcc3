// V rewritten for the attention kernels: FP8 e4m3 V^T with its keys in the order the FP8 P·V MMA reads them, or a
// padded 16-bit copy.
#pragma once
#include <cstdint>
#include <type_traits>

#include "common/convert.cuh"
#include "common/params.h"
#include "common/prepare/rows.cuh"
#include "common/ptx.cuh"

namespace sage {

// FP8 V^T of keys [n0, n0 + kKBlock) of head (b, hk), keys permuted within each 32-key group (kFp8KeySlot).
__device__ __forceinline__ int fp8_key_slot(int key) {
  const int r = key % 16;
  return (key / 16) * 16 + ((r % 8) / 2) * 4 + (r / 8) * 2 + r % 2;
}

// Where byte `slot` of channel row `channel` of v_to_fp8's transposed tile lies: odd 8-channel chunks swap the
// 32-byte halves of their 64-byte rows.
__device__ __forceinline__ int tile_byte(int channel, int slot) { return slot ^ (channel & 8) * 4; }

// fp8_key_slot keeps keys 2i and 2i + 1 side by side, so a lane converts such a pair of keys in one 8-channel chunk
// and stores each channel's two e4m3 bytes as one 16-bit word of the transposed tile. A warp takes 16 pairs (32 keys)
// in two chunks, the chunk from the lane's lowest bit: each quarter warp's 16-byte reads of rows held in shared
// memory (128-byte swizzled rows) then fall on 8 different units. The two chunks' tile rows are 8 channels apart,
// on the same banks, so odd chunks store into the other half of the tile's rows (tile_byte) and the warp's stores
// do not conflict either. V's rows come from `load` (global_rows' form); ready() runs once the loads
// are issued and before mean and inv_scale (1 / V's scale per channel; both 16-byte aligned) are read. mean:
// subtracted where p.smooth_v (otherwise all zero).
template <typename T, int DPAD, typename Load, typename Ready>
__device__ void v_to_fp8(const PrepareParams& p, int b, int hk, int n0, Load load, const float* mean,
                         const float* inv_scale, Ready ready, uint8_t (*tile)[kKBlock]) {
  constexpr int C = DPAD / 8, kRounds = C / 8;  // a warp's (32 keys, 2 chunks) per round: 2 * C / 2 of them
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const int key = (warp % 2) * 32 + (lane / 2) * 2;  // and key + 1
  const int slot = fp8_key_slot(key % 32) + (key / 32) * 32;
  auto chunk_of = [&](int round) { return (warp / 2 + round * 4) * 2 + lane % 2; };
  uint4 raw[kRounds][2];
#pragma unroll
  for (int i = 0; i < kRounds; ++i)
    raw[i][0] = load(n0 + key, chunk_of(i)), raw[i][1] = load(n0 + key + 1, chunk_of(i));
  ready();
  // padded keys stay exactly 0 (a mean, or a NaN scale of a channel holding NaN, would make them nonzero)
  const uint32_t keep = n0 + key + 1 < p.nk ? 0xffffu : n0 + key < p.nk ? 0x00ffu : 0u;
  auto convert = [&](auto kMean) {
#pragma unroll
    for (int i = 0; i < kRounds; ++i) {
      const int chunk = chunk_of(i);
      float m[8], inv[8], x[2][8];
      load8f(inv_scale + chunk * 8, inv);
      if constexpr (decltype(kMean)::value) load8f(mean + chunk * 8, m);
      to_floats<T>(raw[i][0], x[0]);
      to_floats<T>(raw[i][1], x[1]);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float y[2];
#pragma unroll
        for (int k = 0; k < 2; ++k) y[k] = (decltype(kMean)::value ? x[k][e] - m[e] : x[k][e]) * inv[e];
        const int c = chunk * 8 + e;
        *reinterpret_cast<uint16_t*>(&tile[c][tile_byte(c, slot)]) =
            static_cast<uint16_t>(ptx::e4m3x2(y[0], y[1]) & keep);
      }
    }
  };
  if (p.smooth_v) convert(std::true_type{});
  else convert(std::false_type{});
  __syncthreads();
  uint8_t* dst = static_cast<uint8_t*>(p.v_out) + (static_cast<int64_t>(b) * p.hk + hk) * DPAD * p.nk_pad + n0;
  for (int u = t; u < DPAD * (kKBlock / 16); u += kPrepThreads) {
    const int c = u / (kKBlock / 16), part = u % (kKBlock / 16);
    *reinterpret_cast<uint4*>(dst + static_cast<int64_t>(c) * p.nk_pad + part * 16) =
        *reinterpret_cast<const uint4*>(&tile[c][tile_byte(c, part * 16)]);
  }
}

// Padded 16-bit V (minus its mean) for 16-bit P·V when the caller's V cannot be read in place.
template <typename T, int DPAD>
__device__ void v_to_16bit(const PrepareParams& p, int b, int hk, int n0, const float* mean) {
  constexpr int C = DPAD / 8, kRowsPerPass = kPrepThreads / C;
  const int t = threadIdx.x, chunk = t % C;
  const bool vec = vectorizable(p.v);
  T* dst = static_cast<T*>(p.v_out) + (static_cast<int64_t>(b) * p.hk + hk) * p.nk_pad * DPAD;
  for (int r = t / C; r < kKBlock; r += kRowsPerPass) {
    float x[8];
    load8<T>(p.v, b, hk, n0 + r, p.nk, chunk * 8, p.d, vec, x);
    __align__(16) T y[8];
    const bool live = n0 + r < p.nk;
#pragma unroll
    for (int e = 0; e < 8; ++e) y[e] = static_cast<T>(live ? x[e] - mean[chunk * 8 + e] : 0.f);
    *reinterpret_cast<uint4*>(dst + static_cast<int64_t>(n0 + r) * DPAD + chunk * 8) = *reinterpret_cast<const uint4*>(y);
  }
}

}  // namespace sage
