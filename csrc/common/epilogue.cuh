// The attention epilogue shared by every kernel: a lane's rows of O normalized by their sums of P, V's FP8 scale
// undone and its mean added back, converted to the output's type and stored, with the LSE (store_rows; the sm90
// kernel's stage_rows uses its pieces).
#pragma once
#include <cstdint>

#include "common/convert.cuh"
#include "common/params.h"
#include "common/ptx.cuh"
#include "common/softmax.cuh"

namespace sage {

constexpr float kLn2 = 0.6931471805599453f;

// x clamped to [-bound, bound]; NaN stays NaN
__device__ __forceinline__ float clamp_keep_nan(float x, float bound) {
  return fabsf(x) > bound ? copysignf(bound, x) : x;
}

// Channels c, c + 1 packed (pack2), or c alone (the low half) where !both.
template <typename T>
__device__ __forceinline__ void store2(T* dst, uint32_t packed, bool both) {
  if (both) *reinterpret_cast<uint32_t*>(dst) = packed;
  else *reinterpret_cast<uint16_t*>(dst) = static_cast<uint16_t>(packed);
}

__device__ __forceinline__ float quad_sum(float x) {
#pragma unroll
  for (int off = 1; off < 4; off *= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

// A 4 x 4 transpose among a quad: lane t's v[n] becomes lane n's v[t] (two exchange rounds, 2 x 2 blocks first).
__device__ __forceinline__ void quad_transpose(uint32_t (&v)[4], int t) {
  const bool hi = t & 2, odd = t & 1;
  uint32_t a = __shfl_xor_sync(0xffffffffu, hi ? v[0] : v[2], 2);
  uint32_t b = __shfl_xor_sync(0xffffffffu, hi ? v[1] : v[3], 2);
  if (hi) v[0] = a, v[1] = b;
  else v[2] = a, v[3] = b;
  a = __shfl_xor_sync(0xffffffffu, odd ? v[0] : v[1], 1);
  b = __shfl_xor_sync(0xffffffffu, odd ? v[2] : v[3], 1);
  if (odd) v[0] = a, v[2] = b;
  else v[1] = a, v[3] = b;
}

// The V scale and mean of a lane's channels (slice n: channels 8n + 2t and 8n + 2t + 1), which both of its rows use.
// The arrays are d_pad long, so channels past d read padding. Loaded all at once, so that their L2 round trips
// overlap.
template <int D>
struct VStats {
  float2 scale[D / 8], mean[D / 8];
};

template <bool kFp8, int D>
__device__ __forceinline__ VStats<D> load_v_stats(const AttentionParams& p, int64_t k_head, int t) {
  VStats<D> vs;
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    const int64_t c = k_head * D + n * 8 + 2 * t;
    vs.scale[n] = kFp8 ? *reinterpret_cast<const float2*>(p.v_scale + c) : float2{1.f, 1.f};
    vs.mean[n] = p.v_mean != nullptr ? *reinterpret_cast<const float2*>(p.v_mean + c) : float2{0.f, 0.f};
  }
  return vs;
}

// 1 / a row's sum of P; 0 for a row without keys (its output 0 and its LSE -inf)
__device__ __forceinline__ float inverse_sum(float sum) { return sum > 0.f ? 1.f / sum : 0.f; }

// out_pair: a lane's two channels of one row (accumulators y0, y1; V's scale and mean of those channels), normalized
// by inv (1 / the row's sum, 0 for a row without keys), packed. Sums of P as the tensor cores added them (the sm90
// kernel's), of P as rounded to e4m3 as o is, make o / sum a weighted mean of quantized V, within +-v_max but for fp32
// rounding: there kSaturate lets only the conversion to T saturate (so that |V| near 65504 cannot round to inf in
// fp16: 3 instructions per value fewer). Otherwise, and always with l's sums of unrounded P, the mean is clamped to
// +-v_max.
template <bool kFp8, typename T, bool kSaturate>
__device__ __forceinline__ uint32_t out_pair(const AttentionParams& p, float y0, float y1, float inv, bool has_keys,
                                             float2 scale, float2 mean) {
  y0 *= inv, y1 *= inv;
  if constexpr (kFp8) {
    // Exact attention is a weighted mean of V, so |out| <= v_max quantized units per channel; e4m3's rounding
    // of P (up to 1/16) can carry the quantized mean past that, to inf in fp16 for |V| near 65504. Clamping to
    // the bound only moves it toward the exact value.
    if (!kSaturate) y0 = clamp_keep_nan(y0, p.v_max), y1 = clamp_keep_nan(y1, p.v_max);
    y0 *= scale.x, y1 *= scale.y;
  }
  if (has_keys) y0 += mean.x, y1 += mean.y;
  return kSaturate ? pack2_satfinite<T>(y0, y1) : pack2<T>(y0, y1);
}

// Row r's LSE from its running max m and its sum of exp2(x - p_shift(m)), lse_sum (its lane t == 0 stores it).
template <bool kFp8>
__device__ __forceinline__ void store_lse(const AttentionParams& p, int64_t q_head, int r, int t, float m,
                                          float lse_sum) {
  if (p.lse != nullptr && t == 0 && r < p.nq)
    p.lse[q_head * p.nq + r] = lse_sum > 0.f ? (p_shift<kFp8>(m) + __log2f(lse_sum)) * kLn2 : -INFINITY;
}

// The epilogue of a lane's rows `row` and row + 8 of the head: normalize the P·V accumulators o
// (the m16n8 layout: o[n][2i + e] is channel 8n + 2t + e of row + 8i), undo the FP8 V scale, add V's mean back, store
// rows < nq and channels < d in the caller's layout, and the LSE. kFp8: o and l are both in units of the stretched P,
// so o / l is already in V's quantized units. l is this lane's part of the row sums (summed over the quad here);
// `sums`, where given, are the whole sums that normalize o instead (the sm90 kernel's, from the tensor cores), and l
// then serves the LSE alone.
template <bool kFp8, int D, typename T, bool kSaturate = false>
__device__ __forceinline__ void store_rows(const AttentionParams& p, T* out, const VStats<D>& vs, int64_t q_head,
                                           int row, int t, const float (&o)[D / 8][4], const float (&m)[2],
                                           const float (&l)[2], const float* sums = nullptr) {
  // Whole rows of 16-byte aligned channels (the same for the whole call): the quad trades its values so that each
  // lane stores one 8-channel slice in 16 bytes, full 32-byte sectors instead of half ones, and a quarter of the store
  // instructions.
  const bool whole_rows = p.d == D && vectorizable(p.out_rows());
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float lse_sum = p.lse != nullptr || sums == nullptr ? quad_sum(l[i]) : 0.f;  // kFp8: stretched by 448
    const float sum = sums != nullptr ? sums[i] : lse_sum;
    const int r = row + 8 * i;
    const float inv = inverse_sum(sum);
    auto channels = [&](int n) {  // this lane's two channels of slice n, 8n + 2t and 8n + 2t + 1, packed
      return out_pair<kFp8, T, kSaturate>(p, o[n][2 * i], o[n][2 * i + 1], inv, sum > 0.f, vs.scale[n], vs.mean[n]);
    };
    if (whole_rows) {
#pragma unroll
      for (int k = 0; k < D / 32; ++k) {  // slices 4k..4k+3; lane t stores slice 4k + t
        uint32_t v[4];
#pragma unroll
        for (int n = 0; n < 4; ++n) v[n] = channels(4 * k + n);
        quad_transpose(v, t);
        if (r < p.nq) ptx::store16(out + r * p.o_sn + 8 * (4 * k + t), v);
      }
    } else if (r < p.nq) {
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        const int c = n * 8 + 2 * t;
        if (c < p.d) store2<T>(out + r * p.o_sn + c, channels(n), c + 1 < p.d);
      }
    }
    store_lse<kFp8>(p, q_head, r, t, m[i], lse_sum);  // sum is of exp2(x - shift), shift = p_shift(m)
  }
}

}  // namespace sage
