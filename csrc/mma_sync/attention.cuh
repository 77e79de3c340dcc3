// The attention kernel of the sm80 and sm89 families (mma.sync): INT8 Q·K^T, online softmax, then P·V with
// 16-bit operands (sm80 family) or FP8 e4m3 operands (sm89 family).
//
// A program owns kWarps * 16 query rows of one head; warp w owns rows 16w..16w+15, i.e. one m16 MMA tile, whose
// Q fragments stay in registers. Key tiles of 64 keys stream through shared memory, double-buffered with cp.async.
// Fragment layouts (PTX ISA, mma.m16n8k32 / m16n8k16): lane = 4 * g + t holds rows g and g + 8 of the warp's tile
// and, in the score tile, key columns 2t and 2t + 1 of every 8-key slice. Every granularity gives rows g and g + 8
// of a warp one Q scale between them and columns 2t, 2t + 1 of all slices of a tile one K scale, so dequantizing a
// score tile costs one multiply per element.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/epilogue.cuh"
#include "common/launch.h"
#include "common/params.h"
#include "common/ptx.cuh"
#include "common/softmax.cuh"
#include "mma_sync/pv.cuh"
#include "mma_sync/traits.cuh"

namespace sage {

// One online-softmax step for a lane's two rows (g and g + 8) over J 8-key slices of a tile, the 4 lanes of a quad
// holding a row between them: x (scores in log2 units) becomes P = exp2(x - max) (times 448 where kStretch); m and
// l are the rows' running max and sum (of P as stretched); alpha as online_max.
template <int J, bool kStretch = false>
__device__ __forceinline__ void softmax_step(float (&x)[J][4], float (&m)[2], float (&l)[2], float (&alpha)[2]) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) mx[e / 2] = fmaxf(mx[e / 2], x[j][e]);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float shift = online_max<kStretch>(mx[i], m[i], alpha[i]);
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < J; ++j) {
      x[j][2 * i] = exp2_approx(x[j][2 * i] - shift);
      x[j][2 * i + 1] = exp2_approx(x[j][2 * i + 1] - shift);
      sum += x[j][2 * i] + x[j][2 * i + 1];
    }
    l[i] = l[i] * alpha[i] + sum;
  }
}

template <int D, int kWarps, int kMT, bool kFp8, typename T>
__global__ void __launch_bounds__(kWarps * 32) attention_kernel(const AttentionParams p) {
  using L = Tile<D, kWarps, kMT, kFp8, T>;
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* const q_smem = smem;
  uint8_t* const k_smem = smem + L::kQBytes;  // two stages
  uint8_t* const v_smem = k_smem + 2 * L::kKBytes;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int n_qblocks = (p.nq + L::kRows - 1) / L::kRows;
  // causal programs with the most key tiles start first
  const int qblock = p.causal ? n_qblocks - 1 - blockIdx.x : blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z, hk = h / (p.hq / p.hk);
  const int row0 = qblock * L::kRows;
  const int64_t q_head = static_cast<int64_t>(b) * p.hq + h, k_head = static_cast<int64_t>(b) * p.hk + hk;

  int n_tiles = (p.nk + kKBlock - 1) / kKBlock;
  if (p.causal) {
    const int last_key = row0 + L::kRows - 1 + p.causal_offset;  // the last key any row of the program sees
    n_tiles = last_key < 0 ? 0 : min(n_tiles, last_key / kKBlock + 1);
  }

  const int8_t* q_src = p.q_i8 + (q_head * p.nq_pad + row0) * D;
  const int8_t* k_src = p.k_i8 + k_head * p.nk_pad * D;
  auto load_kv = [&](int tile, int stage) {
    const uint32_t k_dst = ptx::smem_addr(k_smem + stage * L::kKBytes);
    for (int u = threadIdx.x; u < kKBlock * L::kQkChunks; u += L::kThreads) {
      const int r = u / L::kQkChunks, c = u % L::kQkChunks;
      ptx::cp_async16(k_dst + swizzle<L::kQkChunks>(r, c), k_src + (tile * kKBlock + r) * D + c * 16, 16);
    }
    const uint32_t v_dst = ptx::smem_addr(v_smem + stage * L::kVBytes);
    for (int u = threadIdx.x; u < L::kVRows * L::kVChunks; u += L::kThreads) {
      const int r = u / L::kVChunks, c = u % L::kVChunks;
      if constexpr (kFp8) {  // V^T row = channel r, keys of this tile
        const uint8_t* src = static_cast<const uint8_t*>(p.v.ptr) + (k_head * D + r) * p.nk_pad + tile * kKBlock + c * 16;
        ptx::cp_async16(v_dst + swizzle<L::kVChunks>(r, c), src, 16);
      } else {  // 16-bit V row = key; keys past the end are zero-filled, never read
        const int key = tile * kKBlock + r;
        const bool live = key < p.nk;
        const T* src = static_cast<const T*>(p.v.ptr) + b * p.v.sb + hk * p.v.sh + (live ? key : 0) * p.v.sn + c * 8;
        ptx::cp_async16(v_dst + swizzle<L::kVChunks>(r, c), src, live ? 16 : 0);
      }
    }
  };

  {  // Q tile and the first K/V tile
    const uint32_t q_dst = ptx::smem_addr(q_smem);
    for (int u = threadIdx.x; u < L::kRows * L::kQkChunks; u += L::kThreads) {
      const int r = u / L::kQkChunks, c = u % L::kQkChunks;
      ptx::cp_async16(q_dst + swizzle<L::kQkChunks>(r, c), q_src + r * D + c * 16, 16);
    }
    if (n_tiles > 0) load_kv(0, 0);
    ptx::cp_async_commit();
  }

  // this lane's rows: warp_row + 16 mt + g and + 8, for each m tile mt
  const int warp_row = row0 + warp * 16 * kMT + g;
  float qs[kMT][2];
  uint32_t qf[kMT][D / 32][4];
  float o[kMT][D / 8][4] = {};
  float m[kMT][2], l[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      qs[mt][i] = p.q_scale[q_head * p.nq_pad + warp_row + 16 * mt + 8 * i] * p.scale_log2;
      m[mt][i] = -INFINITY, l[mt][i] = 0.f;
    }
  }

  for (int tile = 0; tile < n_tiles; ++tile) {
    ptx::cp_async_wait<0>();
    __syncthreads();  // tile `tile` has landed, and every warp is done with the stage the next load overwrites
    if (tile == 0) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int kk = 0; kk < D / 32; ++kk) {
          const int r = warp * 16 * kMT + 16 * mt + lane % 8 + 8 * ((lane / 8) % 2), c = 2 * kk + lane / 16;
          ptx::ldmatrix_x4(qf[mt][kk], ptx::smem_addr(q_smem) + swizzle<L::kQkChunks>(r, c));
        }
      }
    }
    if (tile + 1 < n_tiles) load_kv(tile + 1, (tile + 1) & 1);
    ptx::cp_async_commit();
    const int key0 = tile * kKBlock;
    const float ks = p.k_scale[k_head * p.nk_pad + key0 + 2 * t];

    // S = Q·K^T (int32), 8 slices of 8 keys per m tile
    int s[kMT][8][4] = {};
    const uint32_t k_base = ptx::smem_addr(k_smem + (tile & 1) * L::kKBytes);
#pragma unroll
    for (int kk = 0; kk < D / 32; ++kk) {
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        uint32_t kb[4];
        const int r = jj * 16 + (lane / 16) * 8 + lane % 8, c = 2 * kk + (lane / 8) % 2;
        ptx::ldmatrix_x4(kb, k_base + swizzle<L::kQkChunks>(r, c));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          ptx::mma_s8(s[mt][2 * jj], qf[mt][kk], kb[0], kb[1]);
          ptx::mma_s8(s[mt][2 * jj + 1], qf[mt][kk], kb[2], kb[3]);
        }
      }
    }

    // scores in log2 units, masked; online softmax per row
    const bool needs_mask = key0 + kKBlock > p.nk || (p.causal && key0 + kKBlock - 1 > row0 + p.causal_offset);
    float x[kMT][8][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) x[mt][j][e] = static_cast<float>(s[mt][j][e]) * (qs[mt][e / 2] * ks);
      if (needs_mask) mask_scores<8>(x[mt], key0, t, warp_row + 16 * mt, p);
      float alpha[2];
      softmax_step<8, kFp8>(x[mt], m[mt], l[mt], alpha);
#pragma unroll
      for (int n = 0; n < D / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mt][n][e] *= alpha[e / 2];
    }

    const uint32_t v_base = ptx::smem_addr(v_smem + (tile & 1) * L::kVBytes);
    if constexpr (kFp8) pv_fp8<D, kMT>(x, v_base, lane, p.pv_accum, o);
    else pv_16bit<D, kMT, T>(x, v_base, lane, p.pv_accum, o);
  }

  T* out = static_cast<T*>(p.out) + b * p.o_sb + h * p.o_sh;
  const VStats<D> vs = load_v_stats<kFp8, D>(p, k_head, t);
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
    store_rows<kFp8, D, T>(p, out, vs, q_head, warp_row + 16 * mt, t, o[mt], m[mt], l[mt]);
}

// Launches the kernel for head_dim D (the padded one) and the caller's dtype.
template <int D, bool kFp8, typename T>
void launch_attention(const AttentionParams& p, cudaStream_t stream) {
  using L = Tile<D, Shape<D>::kWarps, Shape<D>::kMTiles, kFp8, T>;
  constexpr auto kernel = attention_kernel<D, Shape<D>::kWarps, Shape<D>::kMTiles, kFp8, T>;
  raise_dynamic_smem<kernel>(L::kSmem);
  const dim3 grid((p.nq + L::kRows - 1) / L::kRows, p.hq, p.batch);
  kernel<<<grid, L::kThreads, L::kSmem, stream>>>(p);
}

template <int D, bool kFp8>
void run_attention(const AttentionParams& p, DType dtype, cudaStream_t stream) {
  if (dtype == kBF16) launch_attention<D, kFp8, __nv_bfloat16>(p, stream);
  else launch_attention<D, kFp8, half>(p, stream);
}

}  // namespace sage
