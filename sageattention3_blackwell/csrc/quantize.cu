// NVFP4 quantization of contiguous rows: one thread per 16-element group.
#include <cstdint>
#include "nvfp4.cuh"

namespace sage3 {

__global__ void quantize_groups_kernel(const float* __restrict__ x, uint8_t* __restrict__ codes,
                                       uint8_t* __restrict__ scales, int64_t groups) {
  const int64_t group = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (group >= groups) return;
  const float4* src = reinterpret_cast<const float4*>(x + group * kGroup);
  float v[kGroup];
#pragma unroll
  for (int i = 0; i < kGroup / 4; ++i) {
    const float4 f = src[i];
    v[4 * i] = f.x; v[4 * i + 1] = f.y; v[4 * i + 2] = f.z; v[4 * i + 3] = f.w;
  }
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kGroup; ++i) amax = fabsf(v[i]) > amax || isnan(v[i]) ? fabsf(v[i]) : amax;  // NaN wins
  const uint8_t s = group_scale(amax);
  const float sv = scale_value(s);
  uint32_t word[2] = {0u, 0u};
#pragma unroll
  for (int i = 0; i < kGroup; i += 2) {
    word[i / 8] |= e2m1x2(scaled(v[i], sv), scaled(v[i + 1], sv)) << (4 * (i % 8));
  }
  reinterpret_cast<uint2*>(codes)[group] = make_uint2(word[0], word[1]);
  scales[group] = s;
}

void quantize_groups(const float* x, uint8_t* codes, uint8_t* scales, int64_t groups, cudaStream_t stream) {
  constexpr int threads = 256;
  const int64_t blocks = (groups + threads - 1) / threads;
  quantize_groups_kernel<<<unsigned(blocks), threads, 0, stream>>>(x, codes, scales, groups);
}

}  // namespace sage3
