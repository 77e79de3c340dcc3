// The entry points of an mma.sync family (sm80, sm89): pick the head_dim instantiation (compiled in
// csrc/<family>/attention_d*.cu), and say whether the device can run this module's kernels. csrc/<family>/family.cu
// binds them to params.h.
#pragma once
#include "mma_sync/attention.cuh"

namespace sage {

extern template void run_attention<64, false>(const AttentionParams&, DType, cudaStream_t);
extern template void run_attention<128, false>(const AttentionParams&, DType, cudaStream_t);
extern template void run_attention<64, true>(const AttentionParams&, DType, cudaStream_t);
extern template void run_attention<128, true>(const AttentionParams&, DType, cudaStream_t);

template <bool kFp8>
void run_family(const AttentionParams& p, DType dtype, int d_pad, cudaStream_t stream) {
  if (d_pad == 64) run_attention<64, kFp8>(p, dtype, stream);
  else run_attention<128, kFp8>(p, dtype, stream);
}

template <bool kFp8>
bool family_runs_on_current_device() {
  return has_device_code<attention_kernel<64, Shape<64>::kWarps, Shape<64>::kMTiles, kFp8, half>>();
}

}  // namespace sage
