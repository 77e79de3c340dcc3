// Per-channel statistics of a K or V head (K's mean; V's mean and FP8 scale): partial sums and extremes over chunks
// of tokens, combined in a fixed order.
#pragma once
#include <cstdint>

#include "common/convert.cuh"
#include "common/params.h"
#include "common/prepare/rows.cuh"

namespace sage {

enum Reduce { kSum, kMax, kMin };

// Combines x[8] (this thread's channels chunk*8..+7) over the threads that hold the same chunk, in a fixed order,
// and stores one value per channel. red is channel-major with 8 floats of padding per row, so that both the writes
// (consecutive threads) and the reads (8 channels x 4 threads per warp) spread over the banks.
constexpr int kRedStride = kPrepThreads + 8;
template <int DPAD, Reduce kOp>
__device__ void reduce_channels(float (*red)[kRedStride], const float (&x)[8], float* dst) {
  constexpr int C = DPAD / 8;
  const int t = threadIdx.x;
  __syncthreads();
#pragma unroll
  for (int e = 0; e < 8; ++e) red[e][t] = x[e];
  __syncthreads();
  if (t < DPAD) {
    float acc = kOp == kMax ? -INFINITY : kOp == kMin ? INFINITY : 0.f;
#pragma unroll 4
    for (int j = t / 8; j < kPrepThreads; j += C) {
      const float y = red[t % 8][j];
      acc = kOp == kMax ? fmaxf(acc, y) : kOp == kMin ? fminf(acc, y) : acc + y;
    }
    dst[t] = acc;
  }
}

// Whether the statistics of K (of_v false) or V are needed at all.
__host__ __device__ inline bool statistics_needed(const PrepareParams& p, bool of_v) {
  return of_v ? p.v_mode == kVFp8 || p.smooth_v : p.smooth_k;
}

// Per-channel statistics of one head's tokens [n0, n1), read by `load`, into dst (4 x DPAD floats: K sums, V max,
// V min, V sums): sums of K / nk (of_v false), or max/min/sums of V / nk (the means' terms: the sum of bf16 K or V
// itself can overflow fp32 where the mean does not). V's sums serve only its mean (smooth_v): without it they are
// not taken (finish_statistics reads them only for smooth_v), and V's pass is two packed 16-bit compares per pair
// of elements (a test per row: one loop per kind of unit spilled at prepare_kv's 40 registers). K and V are separate
// units: either alone keeps few accumulators, so the launch keeps many programs per SM. red: reduce_channels' shared scratch.
template <typename T, int DPAD, typename Load>
__device__ void kv_statistics(const PrepareParams& p, Load load, int n0, int n1, bool of_v, float* dst,
                              float (*red)[kRedStride]) {
  constexpr int C = DPAD / 8, kRowsPerPass = kPrepThreads / C;
  const int t = threadIdx.x, chunk = t % C;
  const uint32_t inf = kInfBits<T> * 0x10001u;
  float sum[8], mx[8], mn[8];
  uint4 hi = make_uint4(inf | 0x80008000u, inf | 0x80008000u, inf | 0x80008000u, inf | 0x80008000u);
  uint4 lo = make_uint4(inf, inf, inf, inf);
#pragma unroll
  for (int e = 0; e < 8; ++e) sum[e] = 0.f;
  const float inv_n = 1.f / p.nk;
  const bool sums = !of_v || p.smooth_v;
#pragma unroll 4
  for (int n = n0 + t / C; n < n1; n += kRowsPerPass) {
    const uint4 raw = load(n, chunk);
    if (sums) {
      float y[8];
      to_floats<T>(raw, y);
#pragma unroll
      for (int e = 0; e < 8; ++e) sum[e] += y[e] * inv_n;
    }
    if (of_v) widen_extremes<T, false>(hi, lo, raw);
  }
  if (!of_v) return reduce_channels<DPAD, kSum>(red, sum, dst);
  to_floats<T>(hi, mx);
  to_floats<T>(lo, mn);
  reduce_channels<DPAD, kMax>(red, mx, dst + DPAD);
  reduce_channels<DPAD, kMin>(red, mn, dst + 2 * DPAD);
  if (sums) reduce_channels<DPAD, kSum>(red, sum, dst + 3 * DPAD);
}

// One head's statistics from its partials (n_parts of them; part(i, j) is value j of partial i at this thread's
// channel: K's sum, or V's max, min and sum): K's mean, or V's mean and FP8 scale, handed to store(c, mean, scale)
// by thread c < DPAD. Each channel's partials are combined in a fixed order (the threads sharing a channel
// take every kParts-th partial, then one of them adds the parts in order), so the result does not depend on
// scheduling. V's mean is kept only on channels where v - mean stays within V's type (a 16-bit P·V stores it there:
// fp16 V spanning +-65000 would overflow), as reference.usable_v_mean; other channels are not smoothed.
template <typename T, int DPAD, typename Part, typename Store>
__device__ void finish_statistics(const PrepareParams& p, bool of_v, int n_parts, Part part, Store store) {
  constexpr int kParts = kPrepThreads / DPAD;
  __shared__ float parts[3][kPrepThreads];
  const int t = threadIdx.x, c = t % DPAD;
  float sum = 0.f, mx = -INFINITY, mn = INFINITY;
#pragma unroll 4
  for (int i = t / DPAD; i < n_parts; i += kParts) {
    if (of_v) mx = fmaxf(mx, part(i, 0)), mn = fminf(mn, part(i, 1)), sum += part(i, 2);
    else sum += part(i, 0);
  }
  parts[0][t] = sum, parts[1][t] = mx, parts[2][t] = mn;
  __syncthreads();
  if (t >= DPAD) return;
#pragma unroll
  for (int i = 1; i < kParts; ++i)
    sum += parts[0][t + i * DPAD], mx = fmaxf(mx, parts[1][t + i * DPAD]), mn = fminf(mn, parts[2][t + i * DPAD]);
  if (!of_v) return store(c, p.smooth_k ? sum : 0.f, 1.f);
  const float vm = p.smooth_v && fmaxf(mx - sum, sum - mn) <= kMaxFinite<T> ? sum : 0.f;
  // max |v - mean| over tokens from the extremes (rounding is monotonic, so this equals the max of the rounded values)
  const float scale = fmaxf(mx - vm, vm - mn) / p.v_fp8_max;
  // empty or all-equal channels: 1, like the reference
  store(c, vm, (c >= p.d || !(scale > 0.f)) ? 1.f : scale < kMinScale ? kMinScale : scale);
}

// Channel c's finished statistics of a head into p.k_mean, or p.v_mean and p.v_scale (those the call has).
__device__ __forceinline__ void publish_statistics(const PrepareParams& p, int64_t head, bool of_v, int c, float mean,
                                                   float scale) {
  const int64_t i = head * p.d_pad + c;
  if (!of_v) p.k_mean[i] = mean;
  if (of_v && p.v_mean != nullptr) p.v_mean[i] = mean;
  if (of_v && p.v_scale != nullptr) p.v_scale[i] = scale;
}

}  // namespace sage
