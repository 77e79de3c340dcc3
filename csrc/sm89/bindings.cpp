// Python module sageattention._C_sm89 and the CUDA kernels of torch.ops.sageattention_sm89.*: the shared binding
// (csrc/common/binding.h) over this family's kernels, INT8 Q·K^T, FP8 P·V (mma.sync, sm89+).
#include "common/binding.h"

SAGE_FAMILY_MODULE(sm89, true, false)
