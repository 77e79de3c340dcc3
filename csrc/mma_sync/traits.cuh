// The shapes of the mma.sync attention kernel (mma_sync/attention.cuh): warps and m16 tiles per program, the
// shared-memory tiles and their swizzle.
#pragma once
#include "common/params.h"

namespace sage {

// Program shape per head_dim: warps, and m16 tiles per warp (two tiles share each K/V fragment load, but at
// head_dim 128 their accumulators no longer fit in registers). SAGE_ATTN_WARPS/_MTILES override it, for A/B runs.
template <int D>
struct Shape {
#ifdef SAGE_ATTN_WARPS
  static constexpr int kWarps = SAGE_ATTN_WARPS, kMTiles = SAGE_ATTN_MTILES;
#else
  static constexpr int kWarps = D <= 64 ? 4 : 8, kMTiles = D <= 64 ? 2 : 1;
#endif
};

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of kChunks chunks per row, swizzled so that the
// 8 rows an ldmatrix reads at one chunk land in 8 different bank groups.
template <int kChunks>
__device__ __forceinline__ int swizzle(int row, int chunk) {
  static_assert(kChunks == 4 || kChunks >= 8, "rows of 64 bytes or of 128 bytes and more");
  if constexpr (kChunks >= 8) return (row * kChunks + (chunk ^ (row & 7))) * 16;
  else return (row * 4 + (chunk ^ ((row >> 1) & 3))) * 16;
}

// kFp8: P·V in e4m3 with V^T from prepare(); else 16-bit P·V in T (V's dtype). T is also the output's dtype.
// A warp owns kMT m16 tiles (16 * kMT query rows): K and V fragments loaded once serve all of them.
template <int D, int kWarps, int kMT, bool kFp8, typename T>
struct Tile {
  static constexpr int kRows = kWarps * 16 * kMT;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kQkChunks = D / 16;                     // 16-byte chunks per INT8 Q/K row
  static constexpr int kVChunks = kFp8 ? kKBlock / 16 : D / 8;  // per V^T row (64 keys) or 16-bit V row
  static constexpr int kVRows = kFp8 ? D : kKBlock;
  static constexpr int kQBytes = kRows * D;
  static constexpr int kKBytes = kKBlock * D;
  static constexpr int kVBytes = kVRows * kVChunks * 16;
  static constexpr int kSmem = kQBytes + 2 * (kKBytes + kVBytes);
};

}  // namespace sage
