// Quantization kernels of this module (each family's module carries its own copy: modules load independently).
#include "common/prepare.cuh"

void sage::prepare_qkv(const PrepareParams& p, DType dtype, cudaStream_t stream) {
  prepare_for_family<true>(p, dtype, stream);
}
