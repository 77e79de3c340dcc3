// The sm89 family's entry points (FP8 P·V).
#include "mma_sync/family.cuh"

void sage::attention_pv8(const AttentionParams& p, DType dtype, int d_pad, cudaStream_t stream) {
  run_family<true>(p, dtype, d_pad, stream);
}

bool sage::module_runs_on_current_device() { return family_runs_on_current_device<true>(); }
