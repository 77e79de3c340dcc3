// Instantiation: the sm90 kernel, head_dim 64 (padded).
#include "sm90/launch.cuh"

template void sage::sm90::run_attention_sm90<64>(const TensorMaps&, const AttentionParams&, DType, cudaStream_t);
