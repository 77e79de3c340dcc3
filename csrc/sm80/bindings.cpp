// Python module sageattention._C_sm80: the shared binding (csrc/common/binding.h) over this family's kernels.
#include "common/binding.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  sage::binding::define_module<false>(m,
                                     "sageattention kernels: INT8 Q·K^T, 16-bit P·V (mma.sync, sm80+)");
}
