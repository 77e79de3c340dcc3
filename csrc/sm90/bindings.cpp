// Python module sageattention._C_sm90: the shared binding (csrc/common/binding.h) over this family's kernels.
#include "common/binding.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  sage::binding::define_module<true, true>(m, "sageattention kernels: INT8 Q·K^T, FP8 P·V (wgmma, TMA, sm_90a)");
}
