// The sm90 kernel's online softmax of a 128-key tile on INT32 scores: the row maxima (tile_max), and the exponent
// phase (tile_exp), which also packs P to e4m3 and applies O's deferred rescale.
#pragma once
#include <cstdint>

#include "common/params.h"
#include "common/quant.cuh"
#include "common/softmax.cuh"

namespace sage::sm90 {

// v[k] becomes max(v[k], v[k + W]), k < W: four of these (W = 8, 4, 2, 1) reduce 16 values in a tree of depth 4
// instead of a chain of 15 compares that wait on one another.
template <int W>
__device__ __forceinline__ void fold_max(int (&v)[16]) {
#pragma unroll
  for (int k = 0; k < W; ++k) v[k] = max(v[k], v[k + W]);
}

// The online softmax of a tile for this lane's rows g and g + 8 (a row's 128 scores live in the 4 lanes of a quad),
// in two phases. tile_max: the rows' maxima, the new running max m, the exponent shifts, and alpha, which rescales
// what was accumulated before the tile. The INT32 scores sc become P = exp2(sc * s - shift), stretched by 448 for
// e4m3 (s[h] = qs * ks[h]; ks[h]: the K scale of keys 64h..64h+63; qs >= 0: the Q scale times |sm_scale| * log2(e),
// quantize_q having negated Q for a negative sm_scale). A tile that needs no mask takes the row max on the integers
// of each K-scale period, scales it once, rounded down so that no score's exact product exceeds it, and each score
// is later dequantized and shifted in one FMA. P's peak is then 448 or a hair over, which e4m3 saturates to 448,
// and the sums count P as saturated: even at scores of 1e37, where the max's ulp is huge, the row stays normalized.
// Tiles at the end of the keys or on the causal diagonal (`masked`, warp-uniform) dequantize first and mask; their
// scores are then floats, kept in sc's registers as bits (one set of 64 registers live across the two phases).
// The branch holds no shuffle: ptxas serializes the warpgroup MMAs of a loop whose shuffles sit in a divergent path.
__device__ __forceinline__ void row_max(int (&sc)[64], const float (&s)[2], bool masked, int key0, int t, int row,
                                        const AttentionParams& p, float (&mx)[2]) {
  if (masked) {
    float x[16][4];
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) x[j][e] = static_cast<float>(sc[4 * j + e]) * s[j / 8];
    mask_scores<16>(x, key0, t, row, p);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = -INFINITY;
#pragma unroll
      for (int j = 0; j < 16; ++j) mx[i] = fmaxf(mx[i], fmaxf(x[j][2 * i], x[j][2 * i + 1]));
    }
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[4 * j + e] = __float_as_int(x[j][e]);
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        int v[16];
#pragma unroll
        for (int j = 0; j < 16; ++j) v[j] = sc[4 * (8 * h + j / 2) + 2 * i + j % 2];
        fold_max<8>(v), fold_max<4>(v), fold_max<2>(v), fold_max<1>(v);
        const float c = __fmul_rd(static_cast<float>(v[0]), s[h]);
        mx[i] = h == 0 ? c : fmaxf(mx[i], c);
      }
    }
  }
}

__device__ __forceinline__ void tile_max(int (&sc)[64], const float (&s)[2], bool masked, int key0, int t,
                                         int row, const AttentionParams& p, float (&m)[2], float (&shift)[2],
                                         float (&alpha)[2]) {
  float mx[2];
  row_max(sc, s, masked, key0, t, row, p, mx);
#pragma unroll
  for (int i = 0; i < 2; ++i) shift[i] = online_max<true>(mx[i], m[i], alpha[i]);
}

// Log2 units of room a speculative tile's shift leaves above the running max (the dual loop below): 1 measured 2-10 %
// slower at d64 (more tiles taken again), 3 the same as 2 (docs/decisions/0010-sm90-d64-dual-loop.md).
constexpr int kSpecRoom = 2;

// O's deferred update: alpha_prev, the factor of the tile whose P·V acc holds, brings o to that tile's shift.
template <int kOut>
__device__ __forceinline__ void update_o(float (&o)[kOut], const float (&alpha_prev)[2], const float (&acc)[kOut]) {
#pragma unroll
  for (int i = 0; i < kOut; ++i) o[i] = fmaf(o[i], alpha_prev[(i % 4) / 2], acc[i]);
}

// The exponent phase, one straight run of code so that ptxas can fill the exponent unit's issue gaps (8 cycles per warp
// instruction) with the rest: P = exp2(score * s - shift) packed to e4m3 into pa (the next P·V's A registers), O's
// deferred update (update_o; acc: the previous tile's P·V, complete, the caller waited for it), and where the LSE is
// asked for (kLse), l's fp32 sums of P (clamped at 448 as e4m3 saturates; a template parameter: even skipped at run
// time they cost 8-15 %; docs/decisions/0015-exponent-phase-straight-run.md). kDequantized: sc holds float scores,
// already dequantized (masked tiles); otherwise integers, converted and dequantized here.
template <bool kDequantized, bool kLse, int kOut, bool kUpdate = true>
__device__ __forceinline__ void tile_exp(const int (&sc)[64], const float (&s)[2],
                                         const float (&shift)[2], const float (&alpha)[2], const float (&alpha_prev)[2],
                                         const float (&acc)[kOut], float (&o)[kOut], float (&l)[2],
                                         uint32_t (&pa)[4][4]) {
  float y[16][4];
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = e / 2;
      y[j][e] = kDequantized ? exp2_approx(__int_as_float(sc[4 * j + e]) - shift[i])
                             : exp2_approx(fmaf(static_cast<float>(sc[4 * j + e]), s[j / 8], -shift[i]));
    }
  if constexpr (kUpdate) update_o(o, alpha_prev, acc);
  if constexpr (kLse) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < 16; ++j) sum += fminf(y[j][2 * i], 448.f) + fminf(y[j][2 * i + 1], 448.f);
      l[i] = l[i] * alpha[i] + sum;
    }
  }
  pack_p_e4m3<16>(y, pa);
}

}  // namespace sage::sm90
