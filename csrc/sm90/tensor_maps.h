// Tensor maps (the bulk tensor copy's descriptors) of the sm90 module's kernels, encoded on the host by the driver's
// encoder, fetched through the runtime: nothing links libcuda, so the module imports on machines without a driver.
#pragma once
#include <cuda.h>

#include "common/params.h"

namespace sage::sm90 {

// A contiguous byte tensor [outer, rows, inner] in boxes of box_rows x box_inner, swizzled at the box's width.
CUtensorMap byte_map(const void* base, uint64_t inner, uint64_t rows, uint64_t outer, uint32_t box_inner,
                     uint32_t box_rows);

// The rows of a caller's 16-bit [B, H, N, D] tensor x (16-byte aligned base and strides, as vectorizable() asks) in
// boxes of box_rows rows x 64 columns, 128-byte swizzled; elements past n and d read as zero.
CUtensorMap rows16_map(const Strided& x, int batch, int heads, int n, int d, uint32_t box_rows);

}  // namespace sage::sm90
