// Tensor maps of the sm90 module (tensor_maps.h).
#include "sm90/tensor_maps.h"

#include <cudaTypedefs.h>

#include <stdexcept>
#include <string>

namespace sage::sm90 {

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

}  // namespace

CUtensorMap byte_map(const void* base, uint64_t inner, uint64_t rows, uint64_t outer, uint32_t box_inner,
                     uint32_t box_rows) {
  const cuuint64_t dims[3] = {inner, rows, outer};
  const cuuint64_t strides[2] = {inner, inner * rows};
  const cuuint32_t box[3] = {box_inner, box_rows, 1};
  return tiled_map(1, 3, base, dims, strides, box);
}

// A size-1 dimension's stride is never stepped, so any valid one (16 bytes) stands in.
CUtensorMap rows16_map(const Strided& x, int batch, int heads, int n, int d, uint32_t box_rows) {
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(d), static_cast<cuuint64_t>(n), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(batch)};
  auto bytes = [](int64_t stride, int size) { return static_cast<cuuint64_t>(size == 1 ? 8 : stride) * 2; };
  const cuuint64_t strides[3] = {bytes(x.sn, n), bytes(x.sh, heads), bytes(x.sb, batch)};
  const cuuint32_t box[4] = {64, box_rows, 1, 1};
  return tiled_map(2, 4, x.ptr, dims, strides, box);
}

}  // namespace sage::sm90
