// Fused preparation of Q, K, V for the attention kernels:
//   - quantize_q_blocks: INT8 Q blocks (per-block/warp/thread scales; not launched where the attention kernel
//     quantizes Q);
//   - prepare_kv, one launch of work units per K/V head: statistics chunks (K sums; V max/min/sums), the last of
//     which also finishes the head's statistics (K mean; V mean and scale), then the head's K blocks (INT8 K minus
//     its token mean) and V blocks (FP8 e4m3 V^T with a per-channel scale and optional mean, keys permuted into the
//     order the FP8 P·V MMA reads, or a padded 16-bit copy), which wait for those statistics.
// Programs take units in the order they start (a ticket from an atomic counter), and a head's quantization units
// come some heads after its statistics units (p.lag_heads): a waiting program waits only for programs that started
// before it and wait for nothing, so the launch cannot deadlock whatever the residency, and the quantization units
// reread K and V mostly from L2. The per-block functions read rows through a loader (global_rows here), so the sm90
// module's one-pass preparation of short heads (csrc/sm90/prepare.cu) runs them on rows held in shared memory.
// Arithmetic matches sageattention/reference.py operation for operation (fp32, x * (1 / s) with an IEEE reciprocal,
// round half to even), so the INT8 values are bit-exact given the same mean.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "common/convert.cuh"
#include "common/params.h"
#include "common/ptx.cuh"
#include "common/quant.cuh"

namespace sage {

constexpr int kPrepThreads = 256;

// Eight consecutive elements of row n of head (b, h) from column c0, as raw 16-bit values; columns >= d and
// rows >= n_rows are 0.
template <typename T>
__device__ __forceinline__ uint4 load8_raw(const Strided& x, int b, int h, int n, int n_rows, int c0, int d,
                                           bool vec) {
  uint4 raw = make_uint4(0u, 0u, 0u, 0u);
  if (n >= n_rows || c0 >= d) return raw;
  const T* row = static_cast<const T*>(x.ptr) + b * x.sb + h * x.sh + n * x.sn;
  if (vec && c0 + 8 <= d) return *reinterpret_cast<const uint4*>(row + c0);  // 16-byte aligned: one vector load
  T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i)
    if (c0 + i < d) e[i] = row[c0 + i];
  return raw;
}

template <typename T>
struct Packed;
template <>
struct Packed<half> {
  using type = __half2;
};
template <>
struct Packed<__nv_bfloat16> {
  using type = __nv_bfloat162;
};

// hi and lo become the element-wise max and min of themselves and raw, eight 16-bit values each, two per packed
// compare (exact). kKeepNan: a NaN element makes both NaN (otherwise the compares skip it).
template <typename T, bool kKeepNan>
__device__ __forceinline__ void widen_extremes(uint4& hi, uint4& lo, const uint4& raw) {
  using T2 = typename Packed<T>::type;
  const T2* r = reinterpret_cast<const T2*>(&raw);
  T2* h = reinterpret_cast<T2*>(&hi);
  T2* l = reinterpret_cast<T2*>(&lo);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    h[i] = kKeepNan ? __hmax2_nan(h[i], r[i]) : __hmax2(h[i], r[i]);
    l[i] = kKeepNan ? __hmin2_nan(l[i], r[i]) : __hmin2(l[i], r[i]);
  }
}

// Eight floats from 16-byte aligned (shared) memory.
__device__ __forceinline__ void load8f(const float* src, float (&out)[8]) {
  *reinterpret_cast<float4*>(out) = reinterpret_cast<const float4*>(src)[0];
  *reinterpret_cast<float4*>(out + 4) = reinterpret_cast<const float4*>(src)[1];
}

template <typename T>
__device__ __forceinline__ void load8(const Strided& x, int b, int h, int n, int n_rows, int c0, int d, bool vec,
                                      float (&out)[8]) {
  to_floats<T>(load8_raw<T>(x, b, h, n, n_rows, c0, d, vec), out);
}

// The scale groups of sageattention/quant_groups.py as the bits of a row index (r < R) that vary within a group:
// a Q block is one group, a Q warp group is 16 consecutive rows, a Q thread group rows {i, i + 8} of a warp's 16
// (bit 3); a K thread group keys with the same (r % 8) / 2 (all bits but 1 and 2), other K groups the whole block.
template <int R>
__device__ __forceinline__ int group_bits(bool is_q, int gran) {
  if (gran == kPerBlock) return R - 1;
  if (is_q) return gran == kPerWarp ? kWarpRows - 1 : 8;
  return gran == kPerThread ? (R - 1) & ~6 : R - 1;
}

// A loader of the 16-bit rows of one head: load(n, chunk) is chunk (8 elements) of row n, zero past the head's
// rows and columns (load8_raw from the caller's tensor, or a copy in shared memory).
template <typename T>
__device__ __forceinline__ auto global_rows(const Strided& x, int b, int h, int n_rows, int d) {
  const bool vec = vectorizable(x);
  return [&x, b, h, n_rows, d, vec](int n, int chunk) { return load8_raw<T>(x, b, h, n, n_rows, chunk * 8, d, vec); };
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

// FP8 V^T of keys [n0, n0 + kKBlock) of head (b, hk), keys permuted within each 32-key group (kFp8KeySlot).
__device__ __forceinline__ int fp8_key_slot(int key) {
  const int r = key % 16;
  return (key / 16) * 16 + ((r % 8) / 2) * 4 + (r / 8) * 2 + r % 2;
}

// Where byte `slot` of channel row `channel` of v_to_fp8's transposed tile lies: odd 8-channel chunks swap the
// 32-byte halves of their 64-byte rows.
__device__ __forceinline__ int tile_byte(int channel, int slot) { return slot ^ (channel & 8) * 4; }

// fp8_key_slot keeps keys 2i and 2i + 1 side by side, so a lane converts such a pair of keys in one 8-channel chunk
// and stores each channel's two e4m3 bytes as one 16-bit word of the transposed tile. A warp takes 16 pairs (32 keys)
// in two chunks, the chunk from the lane's lowest bit: each quarter warp's 16-byte reads of rows held in shared
// memory (128-byte swizzled rows) then fall on 8 different units. The two chunks' tile rows are 8 channels apart,
// on the same banks, so odd chunks store into the other half of the tile's rows (tile_byte) and the warp's stores
// do not conflict either. V's rows come from `load` (global_rows' form); ready() runs once the loads
// are issued and before mean and inv_scale (1 / V's scale per channel; both 16-byte aligned) are read. mean:
// subtracted where p.smooth_v (otherwise all zero).
template <typename T, int DPAD, typename Load, typename Ready>
__device__ void v_to_fp8(const PrepareParams& p, int b, int hk, int n0, Load load, const float* mean,
                         const float* inv_scale, Ready ready, uint8_t (*tile)[kKBlock]) {
  constexpr int C = DPAD / 8, kRounds = C / 8;  // a warp's (32 keys, 2 chunks) per round: 2 * C / 2 of them
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const int key = (warp % 2) * 32 + (lane / 2) * 2;  // and key + 1
  const int slot = fp8_key_slot(key % 32) + (key / 32) * 32;
  auto chunk_of = [&](int round) { return (warp / 2 + round * 4) * 2 + lane % 2; };
  uint4 raw[kRounds][2];
#pragma unroll
  for (int i = 0; i < kRounds; ++i)
    raw[i][0] = load(n0 + key, chunk_of(i)), raw[i][1] = load(n0 + key + 1, chunk_of(i));
  ready();
  // padded keys stay exactly 0 (a mean, or a NaN scale of a channel holding NaN, would make them nonzero)
  const uint32_t keep = n0 + key + 1 < p.nk ? 0xffffu : n0 + key < p.nk ? 0x00ffu : 0u;
  auto convert = [&](auto kMean) {
#pragma unroll
    for (int i = 0; i < kRounds; ++i) {
      const int chunk = chunk_of(i);
      float m[8], inv[8], x[2][8];
      load8f(inv_scale + chunk * 8, inv);
      if constexpr (decltype(kMean)::value) load8f(mean + chunk * 8, m);
      to_floats<T>(raw[i][0], x[0]);
      to_floats<T>(raw[i][1], x[1]);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float y[2];
#pragma unroll
        for (int k = 0; k < 2; ++k) y[k] = (decltype(kMean)::value ? x[k][e] - m[e] : x[k][e]) * inv[e];
        const int c = chunk * 8 + e;
        *reinterpret_cast<uint16_t*>(&tile[c][tile_byte(c, slot)]) =
            static_cast<uint16_t>(ptx::e4m3x2(y[0], y[1]) & keep);
      }
    }
  };
  if (p.smooth_v) convert(std::true_type{});
  else convert(std::false_type{});
  __syncthreads();
  uint8_t* dst = static_cast<uint8_t*>(p.v_out) + (static_cast<int64_t>(b) * p.hk + hk) * DPAD * p.nk_pad + n0;
  for (int u = t; u < DPAD * (kKBlock / 16); u += kPrepThreads) {
    const int c = u / (kKBlock / 16), part = u % (kKBlock / 16);
    *reinterpret_cast<uint4*>(dst + static_cast<int64_t>(c) * p.nk_pad + part * 16) =
        *reinterpret_cast<const uint4*>(&tile[c][tile_byte(c, part * 16)]);
  }
}

// Padded 16-bit V (minus its mean) for 16-bit P·V when the caller's V cannot be read in place.
template <typename T, int DPAD>
__device__ void v_to_16bit(const PrepareParams& p, int b, int hk, int n0, const float* mean) {
  constexpr int C = DPAD / 8, kRowsPerPass = kPrepThreads / C;
  const int t = threadIdx.x, chunk = t % C;
  const bool vec = vectorizable(p.v);
  T* dst = static_cast<T*>(p.v_out) + (static_cast<int64_t>(b) * p.hk + hk) * p.nk_pad * DPAD;
  for (int r = t / C; r < kKBlock; r += kRowsPerPass) {
    float x[8];
    load8<T>(p.v, b, hk, n0 + r, p.nk, chunk * 8, p.d, vec, x);
    __align__(16) T y[8];
    const bool live = n0 + r < p.nk;
#pragma unroll
    for (int e = 0; e < 8; ++e) y[e] = static_cast<T>(live ? x[e] - mean[chunk * 8 + e] : 0.f);
    *reinterpret_cast<uint4*>(dst + static_cast<int64_t>(n0 + r) * DPAD + chunk * 8) = *reinterpret_cast<const uint4*>(y);
  }
}

// Q blocks (none where the attention kernel quantizes Q itself).
__host__ __device__ inline int q_blocks(const PrepareParams& p) { return p.q_i8 == nullptr ? 0 : p.nq_pad / kQBlock; }

// Work units per K/V head: statistics chunks of K and of V, then K blocks and V blocks (when V is rewritten).
__host__ __device__ inline int stats_units(const PrepareParams& p) { return 2 * p.n_chunks; }
__host__ __device__ inline int quant_units(const PrepareParams& p) {
  return (p.nk_pad / kKBlock) * (p.v_mode == kVNone ? 1 : 2);
}

// p.counters: the ticket, then per head and tensor (K, V) its finished statistics chunks, set to n_chunks + 1 once
// the head's statistics are finished.
__device__ __forceinline__ int* stats_counter(const PrepareParams& p, int64_t head, bool of_v) {
  return p.counters + 1 + 2 * head + of_v;
}

// A K/V unit: statistics chunk `stats` of K then of V (quant < 0), or K block `quant` (< k_blocks), or a V block.
struct Unit {
  int head, stats, quant;
};
// Ticket order: the statistics of the first lag heads, then per head g the statistics of head g + lag and the
// quantization of head g. The lag gives a head's statistics time to finish before its quantization units start
// (which then rarely wait), while its K and V are still in L2.
__device__ __forceinline__ Unit kv_unit(const PrepareParams& p, int u) {
  const int s = stats_units(p), qu = quant_units(p), heads = p.batch * p.hk, lag = min(p.lag_heads, heads);
  if (u < lag * s) return {u / s, u % s, -1};
  u -= lag * s;
  if (u < (heads - lag) * (s + qu)) {
    const int g = u / (s + qu), r = u % (s + qu);
    return r < s ? Unit{g + lag, r, -1} : Unit{g, -1, r - s};
  }
  u -= (heads - lag) * (s + qu);
  return {heads - lag + u / qu, -1, u % qu};
}

// One statistics chunk; the head's last chunk of K (or V) to finish also finishes the head's statistics and marks
// them ready (its counter past n_chunks).
template <typename T, int DPAD>
__device__ void statistics_unit(const PrepareParams& p, int b, int hk, int stats) {
  __shared__ bool last;
  __shared__ float red[8][kRedStride];
  const bool of_v = stats >= p.n_chunks;
  const int64_t head = static_cast<int64_t>(b) * p.hk + hk;
  const int chunk = stats % p.n_chunks, n0 = chunk * p.chunk_len;
  kv_statistics<T, DPAD>(p, global_rows<T>(of_v ? p.v : p.k, b, hk, p.nk, p.d), n0,
                         statistics_needed(p, of_v) ? min(n0 + p.chunk_len, p.nk) : n0, of_v,
                         p.partials + (head * p.n_chunks + chunk) * 4 * DPAD, red);
  __syncthreads();  // every thread's partials are written before they are published
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(stats_counter(p, head, of_v), 1) == p.n_chunks - 1;
    __threadfence();  // the other chunks' partials, published before their increments, are visible after this one
  }
  __syncthreads();
  if (!last) return;
  const float* src = p.partials + head * p.n_chunks * 4 * DPAD + (of_v ? DPAD : 0) + threadIdx.x % DPAD;
  finish_statistics<T, DPAD>(
      p, of_v, p.n_chunks, [src](int i, int j) { return __ldcg(src + i * 4 * DPAD + j * DPAD); },
      [&](int c, float mean, float scale) { publish_statistics(p, head, of_v, c, mean, scale); });
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    ptx::store_release(stats_counter(p, head, of_v), p.n_chunks + 1);
  }
}

// K block or V block `blk` of head (b, hk), once the head's statistics of that tensor are ready.
template <typename T, int DPAD, bool kFp8V>
__device__ void quantization_unit(const PrepareParams& p, int b, int hk, int quant) {
  __shared__ __align__(16) float mean[DPAD], inv_scale[DPAD];
  __shared__ __align__(16) uint8_t tile[DPAD][kKBlock];
  const int k_blocks = p.nk_pad / kKBlock;
  const bool of_v = quant >= k_blocks;
  const int blk = of_v ? quant - k_blocks : quant;
  const int64_t head = static_cast<int64_t>(b) * p.hk + hk;
  // the block's loads are issued first: they do not depend on the statistics, and they overlap the wait for them
  auto ready = [&] {
    if (threadIdx.x == 0) {
      const int* counter = stats_counter(p, head, of_v);
      while (ptx::load_acquire(counter) <= p.n_chunks) __nanosleep(100);
    }
    __syncthreads();
    const int c = threadIdx.x;
    if (c < DPAD) {
      const float* m = of_v ? p.v_mean : p.k_mean;
      mean[c] = m == nullptr ? 0.f : __ldcg(m + head * DPAD + c);
      inv_scale[c] = of_v && p.v_scale != nullptr ? 1.f / __ldcg(p.v_scale + head * DPAD + c) : 1.f;
    }
    __syncthreads();
  };
  if (!of_v) {
    quantize_block<T, kKBlock, DPAD>(global_rows<T>(p.k, b, hk, p.nk, p.d), blk * kKBlock, p.nk, false, p.k_gran,
                                     mean, p.k_i8 + head * p.nk_pad * DPAD, p.k_scale + head * p.nk_pad, ready);
  } else if constexpr (kFp8V) {
    v_to_fp8<T, DPAD>(p, b, hk, blk * kKBlock, global_rows<T>(p.v, b, hk, p.nk, p.d), mean, inv_scale, ready,
                      tile);
  } else {
    ready();
    v_to_16bit<T, DPAD>(p, b, hk, blk * kKBlock, mean);
  }
}

template <typename T, int DPAD>
__global__ void __launch_bounds__(kPrepThreads) quantize_q_blocks(const PrepareParams p) {
  const int n = q_blocks(p), i = blockIdx.x, blk = i % n, h = (i / n) % p.hq, b = i / (n * p.hq);
  const int64_t head = static_cast<int64_t>(b) * p.hq + h;
  quantize_block<T, kQBlock, DPAD>(global_rows<T>(p.q, b, h, p.nq, p.d), blk * kQBlock, p.nq, true, p.q_gran,
                                   nullptr, p.q_i8 + head * p.nq_pad * DPAD, p.q_scale + head * p.nq_pad, [] {});
}

// Resident programs per SM that prepare_kv is compiled for (its registers per thread follow). Preparation is
// latency-bound, so more programs in flight help: six on Hopper, whose 228 KB of shared memory holds them (40
// registers, a few bytes spilled; eight spilled hundreds and were slower, docs/benchmarks.md session 21); four
// elsewhere, where 100 KB of shared memory per SM holds no more (sm80 unmeasured).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && __CUDA_ARCH__ < 1000
constexpr int kPrepProgramsPerSm = 6;
#else
constexpr int kPrepProgramsPerSm = 4;
#endif

// K and V: statistics and quantization units in ticket order.
template <typename T, int DPAD, bool kFp8V>
__global__ void __launch_bounds__(kPrepThreads, kPrepProgramsPerSm) prepare_kv(const PrepareParams p) {
  __shared__ int ticket;
  if (threadIdx.x == 0) ticket = atomicAdd(p.counters, 1);
  __syncthreads();
  const Unit unit = kv_unit(p, ticket);
  const int b = unit.head / p.hk, hk = unit.head % p.hk;
  if (unit.quant < 0) statistics_unit<T, DPAD>(p, b, hk, unit.stats);
  else quantization_unit<T, DPAD, kFp8V>(p, b, hk, unit.quant);
}

// The current device's SM count (kept per device: the launches ask on every call).
inline int current_sm_count() {
  static int kept[64] = {};
  int device = 0, n = 0;
  cudaGetDevice(&device);
  int& sms = device < 64 ? kept[device] : n;
  if (sms == 0) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  return sms;
}

// The K/V preparation a family tries before prepare_kv (launch_kv returns whether it took the call; where it does,
// it counts its prepared heads in p.kv_ready): none here; the sm90 module brings one (csrc/sm90/prepare.cu).
struct NoKvFirst {
  template <typename T, int DPAD>
  static bool launch_kv(const PrepareParams&, cudaStream_t) { return false; }
};

// Returns whether the K/V preparation counts its prepared heads in p.kv_ready (KvFirst's does; prepare_kv, which takes
// long heads, where the attention kernel has little to overlap with it, does not).
template <typename T, int DPAD, bool kFp8V, typename KvFirst>
bool launch_prepare(const PrepareParams& params, cudaStream_t stream) {
  if (q_blocks(params) > 0)
    quantize_q_blocks<T, DPAD><<<params.batch * params.hq * q_blocks(params), kPrepThreads, 0, stream>>>(params);
  const int* sync_end = params.kv_ready + params.batch * params.hk + 1;  // kv_ready follows counters
  cudaMemsetAsync(params.counters, 0, (sync_end - params.counters) * sizeof(int), stream);
  if (KvFirst::template launch_kv<T, DPAD>(params, stream)) return true;
  static int per_sm = 0;  // resident programs per SM (the same on every device this module runs on)
  if (per_sm == 0) cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, prepare_kv<T, DPAD, kFp8V>, kPrepThreads, 0);
  const int sms = current_sm_count();
  PrepareParams p = params;
  // A statistics unit lasts about chunk_len / kKBlock quantization units. A lag of half the units the resident
  // programs run meanwhile measured best on an H100 (B16 H16 N1k d128: 158 us against 195 at a quarter, where more
  // programs wait, and 162 at a whole, where fewer rereads hit L2; docs/benchmarks.md, session 19).
  const float lag_units = 0.5f * sms * per_sm * (p.chunk_len / kKBlock);
  p.lag_heads = max(1, static_cast<int>(ceilf(lag_units / (stats_units(p) + quant_units(p)))));
  prepare_kv<T, DPAD, kFp8V><<<p.batch * p.hk * (stats_units(p) + quant_units(p)), kPrepThreads, 0, stream>>>(p);
  return false;
}

// kFp8V: the module's V rewrite (FP8 V^T needs sm89's e4m3 conversions; the sm80 family writes 16-bit V).
template <bool kFp8V, typename KvFirst = NoKvFirst>
bool prepare_for_family(const PrepareParams& p, DType dtype, cudaStream_t stream) {
  const bool bf16 = dtype == kBF16;
  if (p.d_pad == 64) {
    return bf16 ? launch_prepare<__nv_bfloat16, 64, kFp8V, KvFirst>(p, stream)
                : launch_prepare<half, 64, kFp8V, KvFirst>(p, stream);
  }
  return bf16 ? launch_prepare<__nv_bfloat16, 128, kFp8V, KvFirst>(p, stream)
              : launch_prepare<half, 128, kFp8V, KvFirst>(p, stream);
}

}  // namespace sage
