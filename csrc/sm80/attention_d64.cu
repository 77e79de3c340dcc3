// Instantiation: 16-bit P·V attention, head_dim 64 (padded).
#include "mma_sync/attention.cuh"

template void sage::run_attention<64, false>(const sage::AttentionParams&, sage::DType, cudaStream_t);
