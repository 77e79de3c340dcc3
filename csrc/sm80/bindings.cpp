// Python module sageattention._C_sm80 and the CUDA kernels of torch.ops.sageattention_sm80.*: the shared binding
// (csrc/common/binding.h) over this family's kernels, INT8 Q·K^T, 16-bit P·V (mma.sync, sm80+).
#include "common/binding.h"

SAGE_FAMILY_MODULE(sm80, false, false)
