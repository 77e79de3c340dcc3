// Fused preparation of Q, K, V for the attention kernels, in two launches:
//   1. INT8 Q (per-block/warp/thread scales; unless the attention kernel quantizes Q itself), and per-chunk
//      statistics of K and V (K sums, V max/min/sums);
//   2. INT8 K minus its token mean, and V: FP8 e4m3 V^T (per-channel scale, optional mean, keys permuted into the
//      order the FP8 P·V MMA reads) or a padded 16-bit copy.
// Q, K and V are read from DRAM once by the quantizers; the statistics pass reads K and V once more.
// Arithmetic matches sageattention/reference.py operation for operation (fp32, x * (1 / s) with an IEEE reciprocal,
// round half away from zero), so the INT8 values are bit-exact given the same mean.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/params.h"
#include "common/ptx.cuh"

namespace sage {

constexpr int kPrepThreads = 256;
// fp32's least normal: the floor of every quantization scale (sageattention/quant_groups.py MIN_SCALE says why).
constexpr float kMinScale = 1.17549435e-38f;

template <typename T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<half>(half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

// The largest finite value of the 16-bit input type.
template <typename T>
constexpr float kMaxFinite = 65504.f;
template <>
constexpr float kMaxFinite<__nv_bfloat16> = 3.38953139e38f;
// The bits of +inf in the 16-bit input type: a magnitude's bits (x & 0x7fff) at least this are inf or NaN.
template <typename T>
constexpr uint32_t kInfBits = 0x7c00u;
template <>
constexpr uint32_t kInfBits<__nv_bfloat16> = 0x7f80u;

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

// The N 16-bit values held in raw (a uint2 or uint4), as floats.
template <typename T, typename Raw, int N>
__device__ __forceinline__ void to_floats(const Raw& raw, float (&out)[N]) {
  static_assert(sizeof(Raw) == 2 * N, "N 16-bit values");
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = to_float(e[i]);
}

template <typename T>
__device__ __forceinline__ void load8(const Strided& x, int b, int h, int n, int n_rows, int c0, int d, bool vec,
                                      float (&out)[8]) {
  to_floats<T>(load8_raw<T>(x, b, h, n, n_rows, c0, d, vec), out);
}

// Whether rows of x can be read 16 bytes at a time (aligned base and strides).
__device__ __forceinline__ bool vectorizable(const Strided& x) {
  return reinterpret_cast<uintptr_t>(x.ptr) % 16 == 0 && x.sb % 8 == 0 && x.sh % 8 == 0 && x.sn % 8 == 0;
}

__device__ __forceinline__ int8_t round_to_int8(float y) {
  // round half away from zero, like the reference (trunc(y +- 0.5)); NaN (a non-finite group) becomes 0, its scale
  // carries the NaN
  return static_cast<int8_t>(__float2int_rz(y + copysignf(0.5f, y)));
}

// A group's INT8 scale from its largest magnitude (NaN where the group holds inf or NaN): max / 127, 1 for an
// all-zero group, at least fp32's least normal; NaN stays NaN.
__device__ __forceinline__ float int8_scale(float group_max) {
  const float s = group_max / 127.f;
  return s == 0.f ? 1.f : s < kMinScale ? kMinScale : s;
}

// Four values times inv, rounded to INT8 and packed, the first in the lowest byte.
__device__ __forceinline__ uint32_t quantize4(const float* v, float inv) {
  uint32_t packed = 0;
#pragma unroll
  for (int e = 0; e < 4; ++e)
    packed |= static_cast<uint32_t>(static_cast<uint8_t>(round_to_int8(v[e] * inv))) << (8 * e);
  return packed;
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

// INT8-quantizes rows [row0, row0 + R) of head (b, h) into out (rows of d_pad bytes) and per-row scales.
template <typename T, int R, int DPAD>
__device__ void quantize_block(const Strided& x, int b, int h, int row0, int n_rows, int d, bool vec, bool is_q,
                               int gran, const float* mean, int8_t* out, float* scale_out) {
  constexpr int C = DPAD / 8;                  // 8-element chunks per row
  constexpr int kRowsPerPass = kPrepThreads / C;
  constexpr int kPasses = R / kRowsPerPass;
  __shared__ float row_max[R], row_bad[R], row_scale[R];
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
  for (int i = 0; i < kPasses; ++i) {
    const int r = t / C + i * kRowsPerPass;
    raw[i] = load8_raw<T>(x, b, h, row0 + r, n_rows, chunk * 8, d, vec);
    float v[8], mx = 0.f, bad = 0.f;
    values(i, v);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      mx = fmaxf(mx, fabsf(v[e]));
      bad += v[e] * 0.f;  // NaN when the element is NaN or infinite, like the reference's row_bad
    }
#pragma unroll
    for (int off = C / 2; off > 0; off /= 2) {
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      bad += __shfl_xor_sync(0xffffffffu, bad, off);
    }
    if (chunk == 0) {
      row_max[r] = mx;
      row_bad[r] = bad;
    }
  }
  // Row t's group: its max and its NaN/inf marker, combined across the group's rows by shuffles within a warp (R is
  // a multiple of 32: whole warps take part), then across warps through shared memory.
  __syncthreads();
  const int bits = group_bits<R>(is_q, gran);
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
    row_scale[t] = s;
    scale_out[row0 + t] = s;
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    const int r = t / C + i * kRowsPerPass;
    const float inv = 1.f / row_scale[r];
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

// Per-chunk statistics of head (b, hk): sums of K / nk, max/min/sums of V / nk over tokens [n0, n0 + len), per
// channel (the means' terms: the sum of bf16 K or V itself can overflow fp32 where the mean does not).
template <typename T, int DPAD>
__device__ void kv_statistics(const PrepareParams& p, int b, int hk, int chunk_idx) {
  constexpr int C = DPAD / 8, kRowsPerPass = kPrepThreads / C;
  __shared__ float red[8][kRedStride];
  const int t = threadIdx.x, chunk = t % C;
  const bool need_v = p.v_mode == kVFp8 || p.smooth_v;
  float ks[8], vmax[8], vmin[8], vs[8], x[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) ks[e] = vs[e] = 0.f, vmax[e] = -INFINITY, vmin[e] = INFINITY;
  const int n0 = chunk_idx * p.chunk_len, n1 = min(n0 + p.chunk_len, p.nk);
  const bool kvec = vectorizable(p.k);
  const bool vvec = vectorizable(p.v);
  const float inv_n = 1.f / p.nk;
#pragma unroll 2
  for (int n = n0 + t / C; n < n1; n += kRowsPerPass) {
    if (p.smooth_k) {
      load8<T>(p.k, b, hk, n, p.nk, chunk * 8, p.d, kvec, x);
#pragma unroll
      for (int e = 0; e < 8; ++e) ks[e] += x[e] * inv_n;
    }
    if (need_v) {
      load8<T>(p.v, b, hk, n, p.nk, chunk * 8, p.d, vvec, x);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        vmax[e] = fmaxf(vmax[e], x[e]), vmin[e] = fminf(vmin[e], x[e]), vs[e] += x[e] * inv_n;
    }
  }
  float* dst = p.partials + ((static_cast<int64_t>(b) * p.hk + hk) * p.n_chunks + chunk_idx) * 4 * DPAD;
  reduce_channels<DPAD, kSum>(red, ks, dst);
  reduce_channels<DPAD, kMax>(red, vmax, dst + DPAD);
  reduce_channels<DPAD, kMin>(red, vmin, dst + 2 * DPAD);
  reduce_channels<DPAD, kSum>(red, vs, dst + 3 * DPAD);
}

// Reduces the chunk statistics of head (b, hk) into shared memory: means of K and V, and the FP8 V scale.
// V's mean is kept only on channels where v - mean stays within V's type (a 16-bit P·V stores it there: fp16 V
// spanning +-65000 would overflow), as reference.usable_v_mean; other channels are not smoothed.
template <typename T, int DPAD>
__device__ void head_statistics(const PrepareParams& p, int b, int hk, float* k_mean, float* v_mean, float* v_scale) {
  const int c = threadIdx.x;
  if (c >= DPAD) return;
  const float* src = p.partials + (static_cast<int64_t>(b) * p.hk + hk) * p.n_chunks * 4 * DPAD;
  float ks = 0.f, vmax = -INFINITY, vmin = INFINITY, vs = 0.f;
#pragma unroll 4
  for (int i = 0; i < p.n_chunks; ++i) {
    const float* s = src + i * 4 * DPAD;
    ks += s[c], vmax = fmaxf(vmax, s[DPAD + c]), vmin = fminf(vmin, s[2 * DPAD + c]), vs += s[3 * DPAD + c];
  }
  k_mean[c] = p.smooth_k ? ks : 0.f;
  const float vm = p.smooth_v && fmaxf(vmax - vs, vs - vmin) <= kMaxFinite<T> ? vs : 0.f;
  v_mean[c] = vm;
  // max |v - mean| over tokens from the extremes (rounding is monotonic, so this equals the max of the rounded values)
  float s = fmaxf(vmax - vm, vm - vmin) / p.v_fp8_max;
  // empty or all-equal channels: 1, like the reference
  s = (c >= p.d || !(s > 0.f)) ? 1.f : s < kMinScale ? kMinScale : s;
  v_scale[c] = s;
}

// FP8 V^T of keys [n0, n0 + kKBlock) of head (b, hk), keys permuted within each 32-key group (kFp8KeySlot).
__device__ __forceinline__ int fp8_key_slot(int key) {
  const int r = key % 16;
  return (key / 16) * 16 + ((r % 8) / 2) * 4 + (r / 8) * 2 + r % 2;
}

// Thread t converts key t % 64 of the block, kChunks 8-channel chunks of it: a warp's 32 keys fill 32 consecutive
// bytes of a V^T row, so its byte stores into the transposed tile hit 8 words, not one bank 16 times.
template <typename T, int DPAD>
__device__ void v_to_fp8(const PrepareParams& p, int b, int hk, int n0, const float* mean, const float* scale) {
  constexpr int kChunks = DPAD / 8 * kKBlock / kPrepThreads;
  __shared__ __align__(16) uint8_t tile[DPAD][kKBlock];
  const int t = threadIdx.x, r = t % kKBlock;
  const bool vec = vectorizable(p.v);
  const bool live = n0 + r < p.nk;  // padded keys stay exactly 0 (a mean would make them nonzero)
  const int slot = fp8_key_slot(r % 32) + (r / 32) * 32;
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int chunk = t / kKBlock * kChunks + i;
    float x[8];
    load8<T>(p.v, b, hk, n0 + r, p.nk, chunk * 8, p.d, vec, x);
#pragma unroll
    for (int e = 0; e < 8; e += 2) {
      const int c = chunk * 8 + e;
      const float y0 = live ? (x[e] - mean[c]) * (1.f / scale[c]) : 0.f;
      const float y1 = live ? (x[e + 1] - mean[c + 1]) * (1.f / scale[c + 1]) : 0.f;
      const uint32_t two = ptx::e4m3x2(y0, y1);
      tile[c][slot] = static_cast<uint8_t>(two & 0xff);
      tile[c + 1][slot] = static_cast<uint8_t>(two >> 8);
    }
  }
  __syncthreads();
  uint8_t* dst = static_cast<uint8_t*>(p.v_out) + (static_cast<int64_t>(b) * p.hk + hk) * DPAD * p.nk_pad + n0;
  for (int u = t; u < DPAD * (kKBlock / 16); u += kPrepThreads) {
    const int c = u / (kKBlock / 16), part = u % (kKBlock / 16);
    *reinterpret_cast<uint4*>(dst + static_cast<int64_t>(c) * p.nk_pad + part * 16) =
        *reinterpret_cast<const uint4*>(&tile[c][part * 16]);
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

// Q blocks of launch 1 (none where the attention kernel quantizes Q itself).
__host__ __device__ inline int q_blocks(const PrepareParams& p) { return p.q_i8 == nullptr ? 0 : p.nq_pad / kQBlock; }

// Launch 1: Q blocks first, then statistics chunks.
template <typename T, int DPAD>
__global__ void __launch_bounds__(kPrepThreads) prepare_q_and_statistics(const PrepareParams p) {
  const int q_blocks = sage::q_blocks(p);
  int i = blockIdx.x;
  if (i < p.batch * p.hq * q_blocks) {
    const int blk = i % q_blocks, h = (i / q_blocks) % p.hq, b = i / (q_blocks * p.hq);
    const bool vec = vectorizable(p.q);
    const int64_t head = static_cast<int64_t>(b) * p.hq + h;
    quantize_block<T, kQBlock, DPAD>(p.q, b, h, blk * kQBlock, p.nq, p.d, vec, true, p.q_gran, nullptr,
                                     p.q_i8 + head * p.nq_pad * DPAD, p.q_scale + head * p.nq_pad);
    return;
  }
  i -= p.batch * p.hq * q_blocks;
  const int c = i % p.n_chunks, hk = (i / p.n_chunks) % p.hk, b = i / (p.n_chunks * p.hk);
  kv_statistics<T, DPAD>(p, b, hk, c);
}

// Launch 2: K blocks first, then V blocks (when V is rewritten: FP8 V^T in the sm89 family, 16-bit otherwise).
template <typename T, int DPAD, bool kFp8V>
__global__ void __launch_bounds__(kPrepThreads) prepare_k_and_v(const PrepareParams p) {
  __shared__ float k_mean[DPAD], v_mean[DPAD], v_scale[DPAD];
  const int k_blocks = p.nk_pad / kKBlock;
  const bool is_k = blockIdx.x < p.batch * p.hk * k_blocks;
  const int i = is_k ? blockIdx.x : blockIdx.x - p.batch * p.hk * k_blocks;
  const int blk = i % k_blocks, hk = (i / k_blocks) % p.hk, b = i / (k_blocks * p.hk);
  const int64_t head = static_cast<int64_t>(b) * p.hk + hk;
  head_statistics<T, DPAD>(p, b, hk, k_mean, v_mean, v_scale);
  __syncthreads();
  if (blk == 0 && threadIdx.x < DPAD) {  // one program per head publishes the head's statistics
    const int c = threadIdx.x;
    if (is_k) p.k_mean[head * DPAD + c] = k_mean[c];
    else {
      if (p.v_scale != nullptr) p.v_scale[head * DPAD + c] = v_scale[c];
      if (p.v_mean != nullptr) p.v_mean[head * DPAD + c] = v_mean[c];
    }
  }
  if (is_k) {
    const bool vec = vectorizable(p.k);
    quantize_block<T, kKBlock, DPAD>(p.k, b, hk, blk * kKBlock, p.nk, p.d, vec, false, p.k_gran, k_mean,
                                     p.k_i8 + head * p.nk_pad * DPAD, p.k_scale + head * p.nk_pad);
  } else if constexpr (kFp8V) {
    v_to_fp8<T, DPAD>(p, b, hk, blk * kKBlock, v_mean, v_scale);
  } else {
    v_to_16bit<T, DPAD>(p, b, hk, blk * kKBlock, v_mean);
  }
}

template <typename T, int DPAD, bool kFp8V>
void launch_prepare(const PrepareParams& p, cudaStream_t stream) {
  const int q_programs = p.batch * p.hq * q_blocks(p);
  const int stat_programs = p.batch * p.hk * p.n_chunks;
  prepare_q_and_statistics<T, DPAD><<<q_programs + stat_programs, kPrepThreads, 0, stream>>>(p);
  const int k_programs = p.batch * p.hk * (p.nk_pad / kKBlock);
  const int v_programs = p.v_mode == kVNone ? 0 : k_programs;
  prepare_k_and_v<T, DPAD, kFp8V><<<k_programs + v_programs, kPrepThreads, 0, stream>>>(p);
}

// kFp8V: the module's V rewrite (FP8 V^T needs sm89's e4m3 conversions; the sm80 family writes 16-bit V).
template <bool kFp8V>
void prepare_for_family(const PrepareParams& p, DType dtype, cudaStream_t stream) {
  const bool bf16 = dtype == kBF16;
  if (p.d_pad == 64) {
    bf16 ? launch_prepare<__nv_bfloat16, 64, kFp8V>(p, stream) : launch_prepare<half, 64, kFp8V>(p, stream);
  } else {
    bf16 ? launch_prepare<__nv_bfloat16, 128, kFp8V>(p, stream) : launch_prepare<half, 128, kFp8V>(p, stream);
  }
}

}  // namespace sage
