// How prepare()'s programs read 16-bit rows: eight elements of a row at a time from the caller's strided tensor
// (global_rows, a loader the per-block functions take), and the packed compares and conversions on them.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/convert.cuh"
#include "common/params.h"

namespace sage {

// Threads of every preparation program (the per-block functions below and beside are written for it).
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

// A loader of the 16-bit rows of one head: load(n, chunk) is chunk (8 elements) of row n, zero past the head's
// rows and columns (load8_raw from the caller's tensor, or a copy in shared memory).
template <typename T>
__device__ __forceinline__ auto global_rows(const Strided& x, int b, int h, int n_rows, int d) {
  const bool vec = vectorizable(x);
  return [&x, b, h, n_rows, d, vec](int n, int chunk) { return load8_raw<T>(x, b, h, n, n_rows, chunk * 8, d, vec); };
}

}  // namespace sage
