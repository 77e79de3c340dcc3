// The sm90 family's entry points: the tensor maps of a call, the head_dim instantiation, and whether the device runs
// this module. The tensor-map encoder is the driver's, fetched through the runtime: nothing links libcuda, so the
// module imports on machines without a driver.
#include <cudaTypedefs.h>

#include <stdexcept>
#include <string>

#include "sm90/attention_sm90.cuh"

namespace sage::sm90 {

extern template void run_attention_sm90<64>(const TensorMaps&, const AttentionParams&, DType, cudaStream_t);
extern template void run_attention_sm90<128>(const TensorMaps&, const AttentionParams&, DType, cudaStream_t);

namespace {

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault,
                                                             &found);
#else
    const cudaError_t err = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &ptr, cudaEnableDefault, &found);
#endif
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || ptr == nullptr)
      throw std::runtime_error("sageattention sm90: the CUDA driver has no cuTensorMapEncodeTiled (needs a driver "
                               "for CUDA 12 or newer)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

// A tensor map of 1- or 2-byte elements, `rank` dimensions (innermost first; strides in bytes of dimensions
// 1..rank-1), read in boxes of `box` elements, swizzled at the box's inner width (64 or 128 bytes, the rows the kernel
// expects); out-of-range elements read as zero.
CUtensorMap tiled_map(int elem_bytes, int rank, const void* base, const cuuint64_t* dims, const cuuint64_t* strides,
                      const cuuint32_t* box) {
  CUtensorMap map{};
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type = elem_bytes == 2 ? CU_TENSOR_MAP_DATA_TYPE_UINT16 : CU_TENSOR_MAP_DATA_TYPE_UINT8;
  const CUresult res = encoder()(&map, type, rank, const_cast<void*>(base), dims, strides, box, unit,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE,
                                 box[0] * elem_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (res != CUDA_SUCCESS)
    throw std::runtime_error("sageattention sm90: cuTensorMapEncodeTiled failed with CUresult " + std::to_string(res));
  return map;
}

// A contiguous byte tensor [outer, rows, inner] in boxes of box_rows x box_inner.
CUtensorMap byte_map(const void* base, uint64_t inner, uint64_t rows, uint64_t outer, uint32_t box_inner,
                     uint32_t box_rows) {
  const cuuint64_t dims[3] = {inner, rows, outer};
  const cuuint64_t strides[2] = {inner, inner * rows};
  const cuuint32_t box[3] = {box_inner, box_rows, 1};
  return tiled_map(1, 3, base, dims, strides, box);
}

// The caller's 16-bit Q [B, Hq, nq, d] (16-byte aligned strides: the binding copies Q where they are not) in boxes
// of 128 rows x 64 columns. A size-1 dimension's stride is never stepped, so any valid one (16 bytes) stands in.
CUtensorMap q16_map(const AttentionParams& p) {
  const Strided& q = p.q16;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(p.d), static_cast<cuuint64_t>(p.nq),
                              static_cast<cuuint64_t>(p.hq), static_cast<cuuint64_t>(p.batch)};
  auto bytes = [](int64_t stride, int size) { return static_cast<cuuint64_t>(size == 1 ? 8 : stride) * 2; };
  const cuuint64_t strides[3] = {bytes(q.sn, p.nq), bytes(q.sh, p.hq), bytes(q.sb, p.batch)};
  const cuuint32_t box[4] = {64, kRows, 1, 1};
  return tiled_map(2, 4, q.ptr, dims, strides, box);
}

TensorMaps tensor_maps(const AttentionParams& p, int d_pad) {
  const uint32_t d = static_cast<uint32_t>(d_pad);
  return {q16_map(p), byte_map(p.k_i8, d, p.nk_pad, static_cast<uint64_t>(p.batch) * p.hk, d, kKeys),
          byte_map(p.v.ptr, p.nk_pad, d, static_cast<uint64_t>(p.batch) * p.hk, kKeys, d)};
}

}  // namespace
}  // namespace sage::sm90

// FP8 P·V on warpgroup MMAs, two-level accumulation whatever pv_accum asks (at least its precision).
void sage::attention_pv8(const AttentionParams& p, DType dtype, int d_pad, cudaStream_t stream) {
  const sm90::TensorMaps maps = sm90::tensor_maps(p, d_pad);
  if (d_pad == 64) sm90::run_attention_sm90<64>(maps, p, dtype, stream);
  else sm90::run_attention_sm90<128>(maps, p, dtype, stream);
}

bool sage::module_runs_on_current_device() { return has_device_code<sm90::attention_sm90_kernel<64, half, false>>(); }
