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
constexpr float kPRowMax = kE2m1Max * kE4m3Max;  // level-1 P scaling maps a row max here

// e4m3 scale byte for a group whose largest magnitude is amax (round to nearest even, saturating).
__device__ __forceinline__ uint8_t group_scale(float amax) {
  return __nv_cvt_float_to_fp8(fminf(__fdiv_rn(amax, kE2m1Max), kE4m3Max), __NV_SATFINITE, __NV_E4M3);
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

// Score s of (row, col) in base 2 (bias added, scaled by sm_scale * log2 e); -inf for padding keys
// and, when causal, keys past the query.
__device__ __forceinline__ float masked_score(const AttentionParams& p, float s, const float* bias, int row,
                                              int col) {
  const float x = (s + (bias ? bias[col] : 0.0f)) * p.scale_log2;
  return col >= p.n_k || (p.causal && col > row) ? -INFINITY : x;
}

// Level 1 of the P quantization: s1 maps the row max of a P tile onto 6 * 448.
__device__ __forceinline__ float p_row_scale(float p_max) { return p_max > 0.0f ? p_max / kPRowMax : 1.0f; }

// Natural-log logsumexp from the base-2 running max m and the sum l.
__device__ __forceinline__ float lse_natural(float m, float l) { return (m + log2f(l)) * 0.6931471805599453f; }

}  // namespace sage3
