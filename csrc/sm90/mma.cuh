// The sm90 kernel's two warpgroup MMAs of a tile: S = Q·K^T (INT8) and P·[V | 1] (FP8 e4m3).
#pragma once
#include <cstdint>

#include "sm90/hopper.cuh"
#include "sm90/wgmma_ops.cuh"

namespace sage::sm90 {

// Issues S = Q·K^T of a tile (both operands in shared memory, by their descriptors) into sc and commits it.
template <int D>
__device__ __forceinline__ void qk_issue(int (&sc)[64], uint64_t q_desc, uint64_t k_desc) {
  wgmma_fence();  // orders this thread's writes of o, acc and pa before the MMAs that read them
#pragma unroll
  for (int kk = 0; kk < D / 32; ++kk)
    wgmma_s8_m64n128k32(sc, desc_at(q_desc, 32 * kk), desc_at(k_desc, 32 * kk), kk > 0);
  wgmma_commit();
}

// Issues d (+)= P·[V | 1] over a tile's 128 keys (four k32 steps, V^T and its rows of ones from the stage v_desc
// describes): columns D..D+7 of d get P's row sums. d is overwritten (the tile accumulator of two-level
// accumulation). Commits the group; the caller waits.
template <int D>
__device__ __forceinline__ void pv_issue(float (&d)[D / 2 + 4], const uint32_t (&a)[4][4], uint64_t v_desc) {
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const uint64_t desc = desc_at(v_desc, 32 * s);
    if constexpr (D == 128) wgmma_e4m3_m64n136k32(d, a[s], desc, s > 0);
    else wgmma_e4m3_m64n72k32(d, a[s], desc, s > 0);
  }
  wgmma_commit();
}

}  // namespace sage::sm90
