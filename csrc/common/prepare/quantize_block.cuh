// INT8 quantization of a block of Q or K rows in the scale groups of sageattention/quant_groups.py.
#pragma once
#include <cstdint>

#include "common/convert.cuh"
#include "common/params.h"
#include "common/prepare/rows.cuh"
#include "common/quant.cuh"

namespace sage {

// The scale groups of sageattention/quant_groups.py as the bits of a row index (r < R) that vary within a group:
// a Q block is one group, a Q warp group is 16 consecutive rows, a Q thread group rows {i, i + 8} of a warp's 16
// (bit 3); a K thread group keys with the same (r % 8) / 2 (all bits but 1 and 2), other K groups the whole block.
template <int R>
__device__ __forceinline__ int group_bits(bool is_q, int gran) {
  if (gran == kPerBlock) return R - 1;
  if (is_q) return gran == kPerWarp ? kWarpRows - 1 : 8;
  return gran == kPerThread ? (R - 1) & ~6 : R - 1;
}

// INT8-quantizes rows [row0, row0 + R) of a head, read by `load`, into out (rows of d_pad bytes) and per-row
// scales. ready() runs once the block's loads are issued and before mean is read (it may wait for the mean).
template <typename T, int R, int DPAD, typename Load, typename Ready>
__device__ void quantize_block(Load load, int row0, int n_rows, bool is_q, int gran, const float* mean, int8_t* out,
                               float* scale_out, Ready ready) {
  constexpr int C = DPAD / 8;                  // 8-element chunks per row
  constexpr int kRowsPerPass = kPrepThreads / C;
  constexpr int kPasses = R / kRowsPerPass;
  __shared__ float row_max[R], row_bad[R], row_inv[R];  // row_inv: 1 / the row's scale, taken once per row
  const int t = threadIdx.x, chunk = t % C;
  uint4 raw[kPasses];  // the block stays in registers between the two passes, as 16-bit values (half the registers)
  // x (minus the mean on real rows; padding rows stay 0, outside every group's max), recomputed identically per pass
  auto values = [&](int i, float (&v)[8]) {
    to_floats<T>(raw[i], v);
    if (mean != nullptr && row0 + t / C + i * kRowsPerPass < n_rows) {
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] -= mean[chunk * 8 + e];
    }
  };
#pragma unroll
  for (int i = 0; i < kPasses; ++i)
    raw[i] = load(row0 + t / C + i * kRowsPerPass, chunk);
  ready();
  // Pass 1: each row's largest |x| and its non-finite marker (NaN when an element is NaN or infinite, like the
  // reference's row_bad), the row's chunks combined by shuffles.
  auto combine_chunks = [](float& mx, float& bad) {
#pragma unroll
    for (int off = C / 2; off > 0; off /= 2) {
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      bad += __shfl_xor_sync(0xffffffffu, bad, off);
    }
  };
  const int bits = group_bits<R>(is_q, gran);
  constexpr int kPassBits = (R - 1) & ~(kRowsPerPass - 1);  // the row bits that tell a thread's passes apart
  if (kPasses >= 4 && (bits & kPassBits) == kPassBits) {
    // All of this thread's rows are in one group (every K grouping at head_dim 128; Q per block), so only their
    // largest |x| matters, and it comes from each channel's extremes over them, taken on the 16-bit values (two per
    // packed compare, NaN kept): fl(x - m) is monotonic in x, so max |fl(x - m)| = max(fl(hi - m), fl(m - lo)).
    // Fewer passes do not pay for the per-channel step. Padding rows (a suffix of the passes) stay out.
    float mx = 0.f, bad = 0.f;
    if (row0 + t / C < n_rows) {
      uint4 hi = raw[0], lo = raw[0];
#pragma unroll
      for (int i = 1; i < kPasses; ++i) {
        if (row0 + t / C + i * kRowsPerPass >= n_rows) break;
        widen_extremes<T, true>(hi, lo, raw[i]);
      }
      float h[8], l[8];  // element by element: to_floats' bf16 words spill here in prepare_kv's 40 registers
      to_floats_each<T>(hi, h);
      to_floats_each<T>(lo, l);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float m = mean != nullptr ? mean[chunk * 8 + e] : 0.f, above = h[e] - m, below = m - l[e];
        mx = fmaxf(mx, fmaxf(above, below));
        bad += above * 0.f + below * 0.f;  // NaN where an extreme (so some element) is NaN or infinite
      }
    }
    combine_chunks(mx, bad);
    if (chunk == 0) {
#pragma unroll
      for (int i = 0; i < kPasses; ++i) row_max[t / C + i * kRowsPerPass] = mx, row_bad[t / C + i * kRowsPerPass] = bad;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int r = t / C + i * kRowsPerPass;
      float v[8], mx = 0.f, bad = 0.f;
      values(i, v);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        mx = fmaxf(mx, fabsf(v[e]));
        bad += v[e] * 0.f;
      }
      combine_chunks(mx, bad);
      if (chunk == 0) row_max[r] = mx, row_bad[r] = bad;
    }
  }
  // Row t's group: its max and its NaN/inf marker, combined across the group's rows by shuffles within a warp (R is
  // a multiple of 32: whole warps take part), then across warps through shared memory.
  __syncthreads();
  float gmax = 0.f, gbad = 0.f;
  if (t < R) {
    gmax = row_max[t], gbad = row_bad[t];
#pragma unroll
    for (int bit = 1; bit < 32; bit *= 2) {
      if (bits & bit) {
        gmax = fmaxf(gmax, __shfl_xor_sync(0xffffffffu, gmax, bit));
        gbad += __shfl_xor_sync(0xffffffffu, gbad, bit);
      }
    }
  }
  if (bits >= 32) {  // block-uniform
    __syncthreads();  // every lane has read its row before any is overwritten
    if (t < R) row_max[t] = gmax, row_bad[t] = gbad;
    __syncthreads();
    if (t < R) {
      gmax = 0.f, gbad = 0.f;
      for (int w = 0; w < R / 32; ++w) {  // the warps whose rows differ from t's only in the group's bits
        const int j = w * 32 + t % 32;
        if (((w ^ t / 32) & ~(bits >> 5)) == 0) gmax = fmaxf(gmax, row_max[j]), gbad += row_bad[j];
      }
    }
  }
  if (t < R) {
    const float s = int8_scale(gmax + gbad);  // gbad: 0, or NaN for a non-finite group
    row_inv[t] = isnan(s) ? 0.f : 1.f / s;  // a NaN group's finite elements and padding quantize to 0, not NaN's byte
    scale_out[row0 + t] = s;
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    const int r = t / C + i * kRowsPerPass;
    const float inv = row_inv[r];
    float v[8];
    values(i, v);
    *reinterpret_cast<uint2*>(out + static_cast<int64_t>(row0 + r) * DPAD + chunk * 8) =
        make_uint2(quantize4(v, inv), quantize4(v + 4, inv));
  }
}

}  // namespace sage
