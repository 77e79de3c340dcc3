// Conversions between fp32 and the callers' 16-bit types (half, __nv_bfloat16), shared by the quantizers and the
// attention kernels' epilogues.
#pragma once
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace sage {

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

// The N 16-bit values held in raw (a uint2 or uint4), as floats, one conversion each.
template <typename T, typename Raw, int N>
__device__ __forceinline__ void to_floats_each(const Raw& raw, float (&out)[N]) {
  static_assert(sizeof(Raw) == 2 * N, "N 16-bit values");
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = to_float(e[i]);
}

// The same, bf16 a 32-bit word at a time: a bf16 is the top half of its fp32, so one shift or mask per element
// (element by element, the compiler extracts the upper element before shifting it).
template <typename T, typename Raw, int N>
__device__ __forceinline__ void to_floats(const Raw& raw, float (&out)[N]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    static_assert(sizeof(Raw) == 2 * N, "N 16-bit values");
    const uint32_t* w = reinterpret_cast<const uint32_t*>(&raw);
#pragma unroll
    for (int i = 0; i < N / 2; ++i)
      out[2 * i] = __uint_as_float(w[i] << 16), out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  } else {
    to_floats_each<T>(raw, out);
  }
}

template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<half>(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// pack2, with values past T's largest finite one saturated to it (NaN stays NaN): one conversion instruction.
template <typename T>
__device__ __forceinline__ uint32_t pack2_satfinite(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2_satfinite<half>(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
template <>
__device__ __forceinline__ uint32_t pack2_satfinite<__nv_bfloat16>(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.satfinite.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

}  // namespace sage
