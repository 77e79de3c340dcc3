// The sm80 family's entry points (16-bit P·V).
#include "mma_sync/family.cuh"

void sage::attention_pv16(const AttentionParams& p, DType dtype, int d_pad, cudaStream_t stream) {
  run_family<false>(p, dtype, d_pad, stream);
}

bool sage::module_runs_on_current_device() { return family_runs_on_current_device<false>(); }
