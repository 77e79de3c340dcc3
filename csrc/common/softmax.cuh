// The online softmax's numerics shared by every attention kernel: scores in log2 units, exp2 on the MUFU unit,
// masking, the running max and the exponent shift (with FP8 P's stretch by 448). The lane layout is that of an
// mma.sync m16n8 accumulator (csrc/mma_sync/attention.cuh explains it): a row's scores live in the 4 lanes of a quad.
#pragma once
#include "common/params.h"

namespace sage {

// FP8 P = e4m3(p * 448): p in [0, 1] uses e4m3's whole range. The FP8 kernels fold the stretch into the exponent
// (p_shift<true>), so their P and row sums are both stretched and the epilogue's o / l is unstretched.
constexpr float kLog2PScale = 8.807354922057604f;  // log2(448)

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Scores a row must not see become -inf: keys past nk and, when causal, keys after the row's last one
// (row + causal_offset). x[j][e] is key key0 + 8j + 2t + (e & 1) of row `row` (e < 2) or row + 8. Callers run it only
// on tiles that reach the end or the diagonal (a warp-uniform test), so full tiles pay nothing; here each score is a
// compare and a select, no branch.
template <int J>
__device__ __forceinline__ void mask_scores(float (&x)[J][4], int key0, int t, int row, const AttentionParams& p) {
  int last[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) last[i] = p.causal ? min(p.nk - 1, row + 8 * i + p.causal_offset) : p.nk - 1;
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (key0 + 8 * j + 2 * t + (e & 1) > last[e / 2]) x[j][e] = -INFINITY;
}

// The exponent shift of P = exp2(x - shift) in a row whose max is m: m itself, or where kStretch (FP8 P·V takes
// P * 448) m - log2(448), one subtraction instead of a multiply per score. P's peak exp2(m - shift) must then stay
// <= 448, where e4m3 saturates: where m's ulp is coarse (|m| >= 2**20) the subtraction can round past log2(448)
// (ulp 1: to 9, ulp 16: to 16), and the shift steps one ulp back toward m. m - shift is exact there; finer ulps
// round by far less than the margin 8.85 - log2(448). m = -inf gives -inf. kRoom: scores may reach m + kRoom (log2
// units) and P still peaks at 448 (sm90's speculative tiles): the stretch is kRoom binades smaller.
template <bool kStretch, int kRoom = 0>
__device__ __forceinline__ float p_shift(float m) {
  if constexpr (!kStretch) return m;
  const float shift = m - (kLog2PScale - kRoom);
  return m - shift > 8.85f - kRoom ? __int_as_float(__float_as_int(shift) + (shift > 0.f ? 1 : -1)) : shift;
}

// The shift of a row whose running max is m; a row that has seen only masked keys keeps max -inf and is shifted as if
// 0, so that exp2 gives 0, not NaN.
template <bool kStretch, int kRoom = 0>
__device__ __forceinline__ float row_shift(float m) {
  return p_shift<kStretch, kRoom>(m == -INFINITY ? 0.f : m);
}

// The max over the quad of lanes holding a row.
__device__ __forceinline__ float quad_max(float x) {
#pragma unroll
  for (int off = 1; off < 4; off *= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}

// The online-softmax update of one row after a tile whose maximum in this lane is mx (combined here over the quad
// of lanes holding the row): m becomes the running max, alpha the factor that rescales what was accumulated before
// the tile (from the old shift to the new: both P's stretch and its rounding carry over), and the result is the
// tile's shift (p_shift).
template <bool kStretch>
__device__ __forceinline__ float online_max(float mx, float& m, float& alpha) {
  const float new_m = fmaxf(m, quad_max(mx));
  const float shift = row_shift<kStretch>(new_m);
  alpha = exp2_approx(p_shift<kStretch>(m) - shift);
  m = new_m;
  return shift;
}

}  // namespace sage
