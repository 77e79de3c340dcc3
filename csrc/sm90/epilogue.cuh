// The sm90 kernel's epilogue: an item's rows of O normalized and stored, through shared memory and bulk tensor
// stores where the output's rows are 16-byte aligned (stage_rows), else by common/epilogue.cuh's store_rows.
#pragma once
#include <cstdint>

#include "common/epilogue.cuh"
#include "common/params.h"
#include "common/ptx.cuh"
#include "sm90/hopper.cuh"
#include "sm90/tile_scheduler.cuh"
#include "sm90/traits.cuh"

namespace sage::sm90 {

// load_v_stats' values from that slot. (Its loop written once for both, over loader functions, changed the SASS of
// every kernel, the d64 dual loop's and the other families' included: ptxas ordered their tile loops differently.)
template <int D>
__device__ __forceinline__ VStats<D> v_stats_in_smem(const float* stats, bool has_mean, int t) {
  const uint32_t at = ptx::smem_addr(stats) + 8 * t;
  VStats<D> vs;
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    vs.scale[n] = ptx::lds_float2(at + 32 * n);
    vs.mean[n] = has_mean ? ptx::lds_float2(at + 4 * D + 32 * n) : float2{0.f, 0.f};
  }
  return vs;
}

// Whether a call's output rows are 16-byte aligned, so that the kernel stores them by bulk tensor copies (stage_rows;
// family.cu builds the output's tensor map where they are), else by store_rows' 4-byte stores.
__host__ __device__ inline bool bulk_store_out(const AttentionParams& p) {
  return vectorizable(p.out_rows());
}

// The epilogue where bulk_store_out: each lane's values (store_rows' arithmetic, the conversion saturating, which the
// tensor cores' row sums make safe: see store_rows) go into the warpgroup's rows of the staging buffer by stmatrix,
// in the 128-byte swizzled boxes of 64 columns the output's tensor map describes, and one thread stores the boxes,
// which clips rows past nq and channels past d. Against store_rows: no quad transposes and no per-row addressing or
// predicates. The thread waits for the stores to have read the buffer (bulk_wait_read) before the warpgroup's next
// epilogue writes it: at the next item's first barrier, and before the program exits.
template <int D, typename T>
__device__ __forceinline__ void stage_rows(const AttentionParams& p, const CUtensorMap* out_map, uint8_t* stage,
                                           const VStats<D>& vs, const Work& wk, int wg, int lane,
                                           const float (&o)[D / 8][4], const float (&m)[2], const float (&l)[2],
                                           const float (&sums)[2]) {
  const int t = lane % 4, warp = threadIdx.x % 128 / 32;
  float inv[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) inv[i] = inverse_sum(sums[i]);
  // stmatrix q stores slices 2q and 2q + 1 of both rows: matrix j is slice 2q + j / 2 of row g + 8 (j % 2), and lane
  // `lane` addresses row lane % 8 of matrix lane / 8
  const int srow = warp * 16 + 8 * (lane / 8 % 2) + lane % 8;
#pragma unroll
  for (int q = 0; q < D / 16; ++q) {
    uint32_t v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = j % 2, n = 2 * q + j / 2;
      v[j] = out_pair<true, T, true>(p, o[n][2 * i], o[n][2 * i + 1], inv[i], sums[i] > 0.f, vs.scale[n], vs.mean[n]);
    }
    const int slice = 2 * q + lane / 16;
    stmatrix_x4(ptx::smem_addr(stage + (slice / 8) * 64 * 128 + swizzled<128>(srow, (slice % 8) * 16)), v);
  }
  fence_proxy_async();  // the rows, visible to the copy engine
  named_barrier(wg, 128);
  if (threadIdx.x % 128 == 0) {
#pragma unroll
    for (int box = 0; box < D / 64; ++box)
      tma_store_4d(out_map, stage + box * 64 * 128, 64 * box, wk.row0 + 64 * (wg - 1), wk.h, wk.b);
    bulk_commit();
  }
  const int row = wk.row0 + (wg - 1) * 64 + warp * 16 + lane / 4;
#pragma unroll
  for (int i = 0; i < 2; ++i)
    store_lse<true>(p, wk.q_head, row + 8 * i, t, m[i], p.lse != nullptr ? quad_sum(l[i]) : 0.f);
}

}  // namespace sage::sm90
