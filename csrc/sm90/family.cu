// The sm90 family's entry points: the tensor maps of a call, the head_dim instantiation, and whether the device runs
// this module.
#include "sm90/launch.cuh"
#include "sm90/tensor_maps.h"

namespace sage::sm90 {

extern template void run_attention_sm90<64>(const TensorMaps&, const AttentionParams&, DType, cudaStream_t);
extern template void run_attention_sm90<128>(const TensorMaps&, const AttentionParams&, DType, cudaStream_t);

namespace {

TensorMaps tensor_maps(const AttentionParams& p, int d_pad) {
  const uint32_t d = static_cast<uint32_t>(d_pad);
  // the caller's 16-bit Q (16-byte aligned strides: the binding copies Q where they are not)
  TensorMaps maps{rows16_map(p.q16, p.batch, p.hq, p.nq, p.d, kRows),
                  byte_map(p.k_i8, d, p.nk_pad, static_cast<uint64_t>(p.batch) * p.hk, d, kKeys),
                  byte_map(p.v.ptr, p.nk_pad, d, static_cast<uint64_t>(p.batch) * p.hk, kKeys, d),
                  {}};
  if (bulk_store_out(p))  // the kernels' output, stored by the copy engine
    maps.out = rows16_map(p.out_rows(), p.batch, p.hq, p.nq, p.d, kRows / 2);
  return maps;
}

}  // namespace
}  // namespace sage::sm90

// FP8 P·V on warpgroup MMAs, two-level accumulation whatever pv_accum asks (at least its precision).
void sage::attention_pv8(const AttentionParams& p, DType dtype, int d_pad, cudaStream_t stream) {
  const sm90::TensorMaps maps = sm90::tensor_maps(p, d_pad);
  if (d_pad == 64) sm90::run_attention_sm90<64>(maps, p, dtype, stream);
  else sm90::run_attention_sm90<128>(maps, p, dtype, stream);
}

bool sage::module_runs_on_current_device() { return has_device_code<sm90::attention_sm90_kernel<64, half, false, false>>(); }
