// Python module sageattention._C_sm90 and the CUDA kernels of torch.ops.sageattention_sm90.*: the shared binding
// (csrc/common/binding.h) over this family's kernels, INT8 Q·K^T, FP8 P·V (wgmma, TMA, sm_90a).
#include "common/binding.h"

SAGE_FAMILY_MODULE(sm90, true, true)
