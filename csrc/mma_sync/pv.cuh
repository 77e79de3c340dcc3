// P·V of one 64-key tile in the mma.sync kernel, 16-bit (sm80 family) or FP8 e4m3 (sm89 family), in the
// accumulation modes of params.h's PvAccum.
#pragma once
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/convert.cuh"
#include "common/params.h"
#include "common/ptx.cuh"
#include "common/quant.cuh"
#include "mma_sync/traits.cuh"

namespace sage {

// o += the fp16 accumulators of a tile (two f16x2 registers per m16n8 slice: rows g and g + 8).
template <int D, int kMT>
__device__ __forceinline__ void add_f16_accumulators(const uint32_t (&oh)[kMT][D / 8][2], float (&o)[kMT][D / 8][4]) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&oh[mt][n][0]));
      const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&oh[mt][n][1]));
      o[mt][n][0] += lo.x, o[mt][n][1] += lo.y, o[mt][n][2] += hi.x, o[mt][n][3] += hi.y;
    }
  }
}

// P·V of one 64-key tile with 16-bit operands, for the kMT m16 tiles of a warp: o += P (x, in T) · V (keys x
// channels in smem). Key steps are the outer loop, so consecutive MMAs feed independent accumulators.
template <int D, int kMT, typename T>
__device__ __forceinline__ void pv_16bit(const float (&x)[kMT][8][4], uint32_t v_base, int lane, int accum,
                                         float (&o)[kMT][D / 8][4]) {
  uint32_t a[kMT][4][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      a[mt][ks][0] = pack2<T>(x[mt][2 * ks][0], x[mt][2 * ks][1]);
      a[mt][ks][1] = pack2<T>(x[mt][2 * ks][2], x[mt][2 * ks][3]);
      a[mt][ks][2] = pack2<T>(x[mt][2 * ks + 1][0], x[mt][2 * ks + 1][1]);
      a[mt][ks][3] = pack2<T>(x[mt][2 * ks + 1][2], x[mt][2 * ks + 1][3]);
    }
  }
  // every MMA of the tile: mma(m tile, channel slice n, A fragment, B registers)
  auto each_mma = [&](auto&& mma) {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
#pragma unroll
      for (int nn = 0; nn < D / 16; ++nn) {
        uint32_t vb[4];
        const int r = ks * 16 + lane % 8 + 8 * ((lane / 8) % 2), c = 2 * nn + lane / 16;
        ptx::ldmatrix_x4_trans(vb, v_base + swizzle<D / 8>(r, c));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma(mt, 2 * nn, a[mt][ks], vb[0], vb[1]);
          mma(mt, 2 * nn + 1, a[mt][ks], vb[2], vb[3]);
        }
      }
    }
  };
  if constexpr (std::is_same_v<T, half>) {
    if (accum == kAccF16Inner) {  // the tile in fp16 accumulators, then into fp32
      uint32_t oh[kMT][D / 8][2] = {};
      each_mma([&](int mt, int n, const uint32_t(&af)[4], uint32_t b0, uint32_t b1) {
        ptx::mma_f16_f16acc(oh[mt][n], af, b0, b1);
      });
      bool overflow = false;
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int n = 0; n < D / 8; ++n)
#pragma unroll
          for (int i = 0; i < 2; ++i)
            overflow |= __hisinf(__low2half(*reinterpret_cast<const __half2*>(&oh[mt][n][i]))) ||
                        __hisinf(__high2half(*reinterpret_cast<const __half2*>(&oh[mt][n][i])));
      // a tile sum past 65504 (|V| in the thousands) is redone in fp32 below: never an overflow SDPA would not have
      if (!__any_sync(0xffffffffu, overflow)) {
        add_f16_accumulators<D, kMT>(oh, o);
        return;
      }
    }
  }
  each_mma([&](int mt, int n, const uint32_t(&af)[4], uint32_t b0, uint32_t b1) {
    ptx::mma_16bit<T>(o[mt][n], af, b0, b1);
  });
}

// P·V of one 64-key tile in FP8: P = e4m3(p * 448) in the key order of prepare()'s V^T (fp8_key_slot), V^T
// (channels x keys in smem). Slot 4t + i of a 32-key step holds key 2t + i % 2 of slice i / 2: exactly the two
// score columns this lane holds in each of two adjacent 8-key slices, so P needs no shuffle.
template <int D, int kMT>
__device__ __forceinline__ void pv_fp8(const float (&x)[kMT][8][4], uint32_t v_base, int lane, int accum,
                                       float (&o)[kMT][D / 8][4]) {
  uint32_t a[kMT][2][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) pack_p_e4m3<8>(x[mt], a[mt]);
  // every MMA of the tile: mma(m tile, channel slice n, A fragment, B registers)
  auto each_mma = [&](auto&& mma) {
#pragma unroll
    for (int s = 0; s < 2; ++s) {
#pragma unroll
      for (int nn = 0; nn < D / 16; ++nn) {
        uint32_t vb[4];
        const int r = nn * 16 + lane % 8 + 8 * (lane / 16), c = 2 * s + (lane / 8) % 2;
        ptx::ldmatrix_x4(vb, v_base + swizzle<kKBlock / 16>(r, c));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma(mt, 2 * nn, a[mt][s], vb[0], vb[1]);
          mma(mt, 2 * nn + 1, a[mt][s], vb[2], vb[3]);
        }
      }
    }
  };
#if defined(SAGE_FP8_F16_ACCUM)
  if (accum == kAccF16Inner) {  // V was scaled to +-2.25 so that 64 keys of p * 448 * v stay below 65504
    uint32_t oh[kMT][D / 8][2] = {};
    each_mma([&](int mt, int n, const uint32_t(&af)[4], uint32_t b0, uint32_t b1) {
      ptx::mma_e4m3_f16acc(oh[mt][n], af, b0, b1);
    });
    add_f16_accumulators<D, kMT>(oh, o);
    return;
  }
#endif
  if (accum == kAccF32) {  // straight into the running fp32 output
    each_mma([&](int mt, int n, const uint32_t(&af)[4], uint32_t b0, uint32_t b1) {
      ptx::mma_e4m3(o[mt][n], af, b0, b1);
    });
    return;
  }
  float acc[kMT][D / 8][4] = {};  // two-level: the tile in its own fp32 accumulators, then added
  each_mma([&](int mt, int n, const uint32_t(&af)[4], uint32_t b0, uint32_t b1) {
    ptx::mma_e4m3(acc[mt][n], af, b0, b1);
  });
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][n][e] += acc[mt][n][e];
}

}  // namespace sage
