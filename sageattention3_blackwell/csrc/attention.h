// Host-side interface of the sageattn3 CUDA kernels. Tensors follow sageattn3/prepare.py.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace sage3 {

struct AttentionParams {
  const uint8_t* q_codes;   // [B, H, n_q_pad, D/2]
  const uint8_t* q_scales;  // [B, H, n_q_pad, D/16]  e4m3
  const uint8_t* k_codes;   // [B, Hkv, n_k_pad, D/2]
  const uint8_t* k_scales;  // [B, Hkv, n_k_pad, D/16]
  const uint8_t* v_codes;   // [B, Hkv, D, n_k_pad/2]  (groups along tokens)
  const uint8_t* v_scales;  // [B, Hkv, D, n_k_pad/16]
  const float* q_bias;      // [B, H, n_q_pad/128, n_k_pad] or nullptr
  float* out;               // [B, H, n_q_pad, D]
  float* lse;               // [B, H, n_q_pad]
  const float* scales;      // [3] sageattn3/prepare.py kernel_scales: score scale (base 2), LSE factor, V scale
  int batch, heads, kv_group, n_q_pad, n_k, n_k_pad, head_dim;
  bool causal;
  int causal_offset;        // causal: query row i sees keys j <= i + causal_offset (0 top-left, Nk - Nq bottom-right)
};

constexpr int kQBlock = 128;  // Q-smoothing block (rows sharing one q_bias row)
constexpr int kKvTile = 64;   // keys per online-softmax step

void quantize_groups(const float* x, uint8_t* codes, uint8_t* scales, int64_t groups, cudaStream_t stream);
void attention_sm120(const AttentionParams& p, cudaStream_t stream);
void attention_sm100(const AttentionParams& p, cudaStream_t stream);

}  // namespace sage3
