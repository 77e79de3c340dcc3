// Device helpers shared by the sageattn3 kernels: e2m1 codes, e4m3 group scales, quad reductions,
// and the per-score steps both attention kernels (sm_100a, sm_120a) take the same way.
#pragma once
#include <cstdint>
#include <cuda_fp8.h>
#include "attention.h"

namespace sage3 {

constexpr int kGroup = 16;              // elements per e4m3 scale
constexpr float kE2m1Max = 6.0f;
constexpr float kE4m3Max = 448.0f;
constexpr float kFp4Max = kE2m1Max * kE4m3Max;   // the largest NVFP4 magnitude; level-1 P scaling maps a row max here

// e4m3 scale byte for a group whose largest magnitude is amax (round to nearest even, saturating).
// A NaN amax gives the NaN scale (fminf would drop it), as nvfp4.group_scales in PyTorch.
__device__ __forceinline__ uint8_t group_scale(float amax) {
  const float s = __fdiv_rn(amax, kE2m1Max);
  return __nv_cvt_float_to_fp8(s > kE4m3Max ? kE4m3Max : s, __NV_SATFINITE, __NV_E4M3);
}

__device__ __forceinline__ float scale_value(uint8_t s) {
  return float(__nv_fp8_e4m3(__nv_fp8_storage_t(s)));
}

// Two values already divided by their scale -> one byte of e2m1 codes, `first` in the low nibble.
// Division is IEEE (__fdiv_rn) at the call sites so the codes match the PyTorch reference.
__device__ __forceinline__ uint32_t e2m1x2(float first, float second) {
  uint32_t out;
  asm("{\n .reg .b8 pair;\n cvt.rn.satfinite.e2m1x2.f32 pair, %1, %2;\n cvt.u32.u8 %0, pair;\n}"
      : "=r"(out) : "f"(second), "f"(first));  // PTX puts its first source operand in the upper nibble
  return out;
}

__device__ __forceinline__ float scaled(float x, float scale) {
  return scale > 0.0f ? __fdiv_rn(x, scale) : 0.0f;
}

// Reductions over the 4 lanes of a quad (the lanes sharing a row in mma fragments).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// K/V head read by flattened (batch, query head) index bh: H / Hkv query heads share one.
__device__ __forceinline__ int kv_head(const AttentionParams& p, int bh) {
  return (bh / p.heads) * (p.heads / p.kv_group) + (bh % p.heads) / p.kv_group;
}

// The q_bias row (Q-smoothing correction over all keys) of query `row`, or nullptr without one.
__device__ __forceinline__ const float* bias_row(const AttentionParams& p, int bh, int row) {
  return p.q_bias ? p.q_bias + (int64_t(bh) * (p.n_q_pad / kQBlock) + row / kQBlock) * p.n_k_pad : nullptr;
}

// Score s of (row, col) in base 2 (bias added, times the score scale); -inf for padding keys and,
// when causal, keys past the query's diagonal.
__device__ __forceinline__ float masked_score(const AttentionParams& p, float score_scale, float s,
                                              const float* bias, int row, int col) {
  const float x = (s + (bias ? bias[col] : 0.0f)) * score_scale;
  return col >= p.n_k || (p.causal && col > row + p.causal_offset) ? -INFINITY : x;
}

// The running max to subtract: 0 while a row has seen no visible key (m = -inf), so that exponents
// are exp2(-inf) = 0 rather than exp2(-inf - -inf) = NaN.
__device__ __forceinline__ float max_to_subtract(float m) { return m == -INFINITY ? 0.0f : m; }

// Level 1 of the P quantization: s1 maps the row max of a P tile onto 6 * 448.
__device__ __forceinline__ float p_row_scale(float p_max) { return p_max > 0.0f ? p_max / kFp4Max : 1.0f; }

// Natural-log logsumexp from the base-2 running max m (in capped units, times lse_factor) and the sum l.
__device__ __forceinline__ float lse_natural(float m, float l, float lse_factor) {
  return (m * lse_factor + log2f(l)) * 0.6931471805599453f;
}

// One output element: 0 for a row without visible keys (l = 0); else acc / l clamped to V's range
// (a convex combination of V rows stays within 6 * 448 in normalized units, P's rounding may not),
// NaN kept, times V's tensor scale. As sageattn3/reference.py.
__device__ __forceinline__ float finish_output(float acc, float l, float v_scale) {
  if (l == 0.0f) return 0.0f;
  const float o = acc / l;
  return (o > kFp4Max ? kFp4Max : o < -kFp4Max ? -kFp4Max : o) * v_scale;
}

}  // namespace sage3
