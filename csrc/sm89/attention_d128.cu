// Instantiation: FP8 P·V attention, head_dim 128 (padded).
#include "mma_sync/attention.cuh"

template void sage::run_attention<128, true>(const sage::AttentionParams&, sage::DType, cudaStream_t);
