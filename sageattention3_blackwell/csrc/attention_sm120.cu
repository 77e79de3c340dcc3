// NVFP4 attention for sm_120a/sm_121a: warp-level block-scaled MMA
//   mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3
// Each warp owns 16 query rows; a CTA of 4 warps owns 64. Operands are read straight from global
// memory (L1/L2 cached): a plain, correct-first kernel, not yet tuned.
//
// Fragment layout (PTX ISA, m16n8k64 e2m1), g = lane / 4, t = lane % 4:
//   A regs a0..a3: (row g, k 8t..8t+7), (row g+8, same k), (row g, k 32+8t..), (row g+8, k 32+8t..)
//   B regs b0, b1: (col g, k 8t..8t+7), (col g, k 32+8t..)
//   C/D c0..c3:    (row g, cols 2t, 2t+1), (row g+8, cols 2t, 2t+1)
//   scale-A (selector 0): lane with t == 0 gives row g, t == 1 gives row g+8; byte i = k 16i..16i+15
//   scale-B (selector 0): lane with t == 0 gives col g.
#include <cstdint>
#include "attention.h"
#include "nvfp4.cuh"

namespace sage3 {
namespace {

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 16;

#if defined(__CUDA_ARCH_FEAT_SM120_ALL) || defined(__CUDA_ARCH_FEAT_SM121_ALL)
#define SAGE3_SM120_MMA 1
#endif

__device__ __forceinline__ void mma_nvfp4(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                          uint32_t scale_a, uint32_t scale_b) {
#ifdef SAGE3_SM120_MMA
  asm volatile(
      "mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3}, %10, {0, 0}, %11, {0, 0};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(scale_a), "r"(scale_b));
#else
  __trap();  // compiled for another architecture; the host never launches it there
#endif
}

__device__ __forceinline__ uint32_t load_u32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Byte `t` of `word` from each of the 4 lanes of this quad, in lane order: turns per-thread
// bytes of P (2 codes of one n8 tile) into the 8 consecutive k codes an A register holds.
__device__ __forceinline__ uint32_t gather_quad_bytes(uint32_t word, int t) {
  uint32_t out = 0;
  const int base = (threadIdx.x & 31) & ~3;
#pragma unroll
  for (int src = 0; src < 4; ++src) {
    const uint32_t w = __shfl_sync(0xffffffffu, word, base + src);
    out |= ((w >> (8 * t)) & 0xffu) << (8 * src);
  }
  return out;
}

template <int D>
__global__ void __launch_bounds__(kWarps * 32) attention_kernel(const AttentionParams p) {
  constexpr int kSteps = D / 64;   // k64 MMA steps over head_dim
  constexpr int kNTiles = D / 8;   // n8 tiles of the output
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int bh = blockIdx.y;
  const int bkv = kv_head(p, bh);
  const int row0 = blockIdx.x * (kWarps * kRowsPerWarp) + (threadIdx.x >> 5) * kRowsPerWarp;
  const int rows[2] = {row0 + g, row0 + g + 8};

  uint32_t qa[kSteps][4], qs[kSteps];
  const uint8_t* q = p.q_codes + (int64_t(bh) * p.n_q_pad + row0) * (D / 2);
  const uint8_t* q_sc = p.q_scales + (int64_t(bh) * p.n_q_pad + row0 + g + (lane & 1) * 8) * (D / 16);
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    qa[s][0] = load_u32(q + g * (D / 2) + s * 32 + 4 * t);
    qa[s][1] = load_u32(q + (g + 8) * (D / 2) + s * 32 + 4 * t);
    qa[s][2] = load_u32(q + g * (D / 2) + s * 32 + 16 + 4 * t);
    qa[s][3] = load_u32(q + (g + 8) * (D / 2) + s * 32 + 16 + 4 * t);
    qs[s] = load_u32(q_sc + s * 4);
  }

  const float score_scale = p.scales[0];
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float acc[kNTiles][4] = {};
  const float* bias = bias_row(p, bh, row0);  // rows row0 .. row0 + 15 share one Q block
  const int end = p.causal ? min(p.n_k_pad, row0 + kRowsPerWarp + p.causal_offset) : p.n_k_pad;
  for (int start = 0; start < end; start += kKvTile) {
    // S = Q K^T for 16 rows x 64 keys: 8 n8 tiles.
    float s[8][4] = {};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int64_t key = int64_t(bkv) * p.n_k_pad + start + j * 8 + g;
#pragma unroll
      for (int st = 0; st < kSteps; ++st) {
        const uint8_t* k = p.k_codes + key * (D / 2) + st * 32 + 4 * t;
        mma_nvfp4(s[j], qa[st], load_u32(k), load_u32(k + 16), qs[st], load_u32(p.k_scales + key * (D / 16) + st * 4));
      }
    }
    // Scale, bias, mask; online softmax in base 2.
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j][e] = masked_score(p, score_scale, s[j][e], bias, rows[e >> 1], start + j * 8 + 2 * t + (e & 1));
        tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[j][e]);
      }
    float alpha[2], m_sub[2], s1[2], row_p_max[2] = {0.0f, 0.0f}, row_sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_new = fmaxf(m[h], quad_max(tile_max[h]));
      m_sub[h] = max_to_subtract(m_new);
      alpha[h] = exp2f(m[h] - m_sub[h]);
      m[h] = m_new;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pe = exp2f(s[j][e] - m_sub[e >> 1]);
        s[j][e] = pe;
        row_sum[e >> 1] += pe;
        row_p_max[e >> 1] = fmaxf(row_p_max[e >> 1], pe);
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[h] = l[h] * alpha[h] + quad_sum(row_sum[h]);
      s1[h] = p_row_scale(quad_max(row_p_max[h]));
    }

    // Level 2: NVFP4 per 16 keys (two n8 tiles), then repack into the A fragment of P.
    uint32_t words[2][2] = {}, p_scales[2] = {0u, 0u};  // [row half][keys 0-31 | 32-63]
#pragma unroll
    for (int grp = 0; grp < 4; ++grp)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float v[4];
        float amax = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          v[i] = __fdiv_rn(s[2 * grp + i / 2][2 * h + (i & 1)], s1[h]);
          amax = fmaxf(amax, v[i]);
        }
        const uint8_t sc = group_scale(quad_max(amax));
        const float sv = scale_value(sc);
        p_scales[h] |= uint32_t(sc) << (8 * grp);
#pragma unroll
        for (int tile = 0; tile < 2; ++tile) {
          const int j = 2 * grp + tile;
          words[h][j / 4] |= e2m1x2(scaled(v[2 * tile], sv), scaled(v[2 * tile + 1], sv)) << (8 * (j % 4));
        }
      }
    const uint32_t pa[4] = {gather_quad_bytes(words[0][0], t), gather_quad_bytes(words[1][0], t),
                            gather_quad_bytes(words[0][1], t), gather_quad_bytes(words[1][1], t)};
    const uint32_t pa_scale = p_scales[lane & 1];

    // O = O * alpha + s1 * (P V): V^T rows are channels, packed along tokens.
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      const int64_t ch = int64_t(bkv) * D + nt * 8 + g;
      const uint8_t* v = p.v_codes + ch * (p.n_k_pad / 2) + start / 2 + 4 * t;
      float pv[4] = {};
      mma_nvfp4(pv, pa, load_u32(v), load_u32(v + 16), pa_scale,
                load_u32(p.v_scales + ch * (p.n_k_pad / 16) + start / 16));
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[nt][e] = acc[nt][e] * alpha[e >> 1] + pv[e] * s1[e >> 1];
    }
  }

  const float lse_factor = p.scales[1], v_scale = p.scales[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = int64_t(bh) * p.n_q_pad + rows[h];
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      *reinterpret_cast<float2*>(p.out + row * D + nt * 8 + 2 * t) =
          make_float2(finish_output(acc[nt][2 * h], l[h], v_scale), finish_output(acc[nt][2 * h + 1], l[h], v_scale));
    }
    if (t == 0) p.lse[row] = lse_natural(m[h], l[h], lse_factor);
  }
}

}  // namespace

void attention_sm120(const AttentionParams& p, cudaStream_t stream) {
  const dim3 grid(p.n_q_pad / (kWarps * kRowsPerWarp), p.batch * p.heads);
  if (p.head_dim == 64) {
    attention_kernel<64><<<grid, kWarps * 32, 0, stream>>>(p);
  } else {
    attention_kernel<128><<<grid, kWarps * 32, 0, stream>>>(p);
  }
}

}  // namespace sage3
