// Quantization kernels of this module (each family's module carries its own copy: modules load independently).
#include "common/prepare.cuh"

bool sage::prepare_qkv(const PrepareParams& p, DType dtype, cudaStream_t stream) {
  return prepare_for_family<true>(p, dtype, stream);
}
