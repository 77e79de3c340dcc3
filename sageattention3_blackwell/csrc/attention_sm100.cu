// NVFP4 attention for sm_100a: 5th-generation tensor cores,
//   tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.scale_vec::4X
// One CTA of 128 threads owns 128 query rows; thread r owns row r, which is TMEM lane r, so the
// softmax and the two-level P quantization of a row happen inside one thread. Per 64-key tile:
//   1. K, V codes -> shared memory (canonical K-major layout, no swizzle); K, V scales -> TMEM
//   2. one thread issues S = Q K^T (tcgen05.mma into TMEM), committed to an mbarrier
//   3. every thread loads its S row (tcgen05.ld), runs the online softmax, quantizes P into
//      shared memory and its P scales into TMEM
//   4. one thread issues PV = P V; each thread folds its PV row into O = O * alpha + s1 * PV.
// A correct-first kernel (no TMA, no warp specialization, no double buffering). Not yet run on
// hardware: see README. Operand and scale placement follow the PTX ISA tcgen05 sections.
#include <cstdint>
#include "attention.h"
#include "nvfp4.cuh"

namespace sage3 {
namespace {

constexpr int kRows = 128;          // M of every MMA, = TMEM lanes = threads
constexpr int kTileBytes = 32;      // one K=64 slice of an e2m1 row

#if defined(__CUDA_ARCH_FEAT_SM100_ALL)
#define SAGE3_SM100_MMA 1
#endif

// Instruction descriptor for kind::mxf4nvf4 (PTX ISA "Instruction descriptor"): A and B e2m1
// (bits 7-9, 10-12), both K-major, ue4m3 scales (bit 23 clear), N>>3 at bits 17-22, M>>4 at 24-28.
__host__ __device__ constexpr uint32_t make_idesc(int m, int n) {
  return (1u << 7) | (1u << 10) | (uint32_t(n >> 3) << 17) | (uint32_t(m >> 4) << 24);
}
static_assert(make_idesc(128, 64) == 0x08100480u, "matches the descriptor Triton 3.6 emits for M=128, N=64");

// TMEM layout and the tcgen05 helpers, used only by the sm_100a kernel body (other targets compile a trap).
#ifdef SAGE3_SM100_MMA
constexpr int kTmemCols = 512;      // S: 64 columns, PV: up to 128, scales: a few
constexpr int kColS = 0, kColPV = 64, kColScales = 256;

// Shared-memory matrix descriptor, no swizzle, K-major: 8-row x 16-byte core matrices; LBO is the
// step between the two core matrices of a 32-byte row slice, SBO the step between 8-row groups.
constexpr int kLbo = 128, kSbo = 256;
__device__ __forceinline__ uint64_t smem_desc(const void* base) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(base));
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(kLbo >> 4) << 16) | (uint64_t(kSbo >> 4) << 32) |
         (1ull << 46);  // bits 46-48: descriptor version 1 (sm_100)
}

// Byte offset of (row, byte) of a [rows x 32 bytes] tile in the canonical layout above.
__device__ __forceinline__ int canonical_offset(int row, int byte) {
  return (row >> 3) * kSbo + (byte >> 4) * kLbo + (row & 7) * 16 + (byte & 15);
}

__device__ __forceinline__ uint32_t tmem_addr(uint32_t base, int lane, int col) {
  return base + (uint32_t(lane) << 16) + uint32_t(col);
}

__device__ __forceinline__ void mma(uint32_t d, uint64_t a, uint64_t b, uint32_t idesc, uint32_t sfa,
                                    uint32_t sfb, bool accumulate) {
  asm volatile(
      "{\n .reg .pred acc;\n setp.ne.u32 acc, %6, 0;\n"
      " tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.scale_vec::4X [%0], %1, %2, %3, [%4], [%5], acc;\n}"
      :: "r"(d), "l"(a), "l"(b), "r"(idesc), "r"(sfa), "r"(sfb), "r"(uint32_t(accumulate)));
}

__device__ __forceinline__ void commit(uint64_t* bar) {
  asm volatile("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%0];"
               :: "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))));
}

__device__ __forceinline__ void wait_phase(uint64_t* bar, uint32_t phase) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile(
      "{\n .reg .pred done;\n wait:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra wait;\n}" :: "r"(addr), "r"(phase));
  asm volatile("tcgen05.fence::after_thread_sync;");
}

// Each warp stores one 32-bit column for its 32 lanes.
__device__ __forceinline__ void tmem_store(uint32_t taddr, uint32_t value) {
  asm volatile("tcgen05.st.sync.aligned.32x32b.x1.b32 [%0], {%1};" :: "r"(taddr), "r"(value));
}

// 32 consecutive fp32 columns of this thread's lane.
__device__ __forceinline__ void tmem_load32(uint32_t taddr, float (&v)[32]) {
  uint32_t r[32];
  asm volatile(
      "tcgen05.ld.sync.aligned.32x32b.x32.b32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, "
      "%15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, [%32];"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]), "=r"(r[4]), "=r"(r[5]), "=r"(r[6]), "=r"(r[7]),
        "=r"(r[8]), "=r"(r[9]), "=r"(r[10]), "=r"(r[11]), "=r"(r[12]), "=r"(r[13]), "=r"(r[14]), "=r"(r[15]),
        "=r"(r[16]), "=r"(r[17]), "=r"(r[18]), "=r"(r[19]), "=r"(r[20]), "=r"(r[21]), "=r"(r[22]), "=r"(r[23]),
        "=r"(r[24]), "=r"(r[25]), "=r"(r[26]), "=r"(r[27]), "=r"(r[28]), "=r"(r[29]), "=r"(r[30]), "=r"(r[31])
      : "r"(taddr));
  asm volatile("tcgen05.wait::ld.sync.aligned;");
#pragma unroll
  for (int i = 0; i < 32; ++i) v[i] = __uint_as_float(r[i]);
}

// Make this thread's shared-memory and TMEM writes visible to the tensor cores, then sync.
__device__ __forceinline__ void publish_operands() {
  asm volatile("tcgen05.wait::st.sync.aligned;");
  asm volatile("fence.proxy.async.shared::cta;");
  asm volatile("tcgen05.fence::before_thread_sync;");
  __syncthreads();
  asm volatile("tcgen05.fence::after_thread_sync;");
}
#endif

template <int D>
struct Smem {
  uint8_t q[D / 64][kRows * kTileBytes];
  uint8_t k[D / 64][kKvTile * kTileBytes];
  uint8_t p[kRows * kTileBytes];
  uint8_t v[D * kTileBytes];
  alignas(8) uint64_t bar;
  uint32_t tmem_base;
};

template <int D>
__global__ void __launch_bounds__(kRows, 1) attention_kernel(const AttentionParams p) {
#ifdef SAGE3_SM100_MMA
  constexpr int kSteps = D / 64;
  // TMEM scale columns: one per operand slice; each cell holds the 4 e4m3 scales of a 64-wide K slice.
  constexpr int kColSfQ = kColScales, kColSfK = kColScales + kSteps, kColSfP = kColScales + 2 * kSteps;
  constexpr int kColSfV = kColSfP + 1;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  Smem<D>& sm = *reinterpret_cast<Smem<D>*>(smem_raw);
  const int r = threadIdx.x, warp = r >> 5;
  const int bh = blockIdx.y;
  const int bkv = kv_head(p, bh);
  const int row = blockIdx.x * kRows + r;
  const int64_t q_row = int64_t(bh) * p.n_q_pad + row;

  if (warp == 0) {
    asm volatile("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], %1;"
                 :: "r"(static_cast<uint32_t>(__cvta_generic_to_shared(&sm.tmem_base))), "n"(kTmemCols));
    asm volatile("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;");
  }
  if (r == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;"
                 :: "r"(static_cast<uint32_t>(__cvta_generic_to_shared(&sm.bar))));
  }
  asm volatile("tcgen05.fence::before_thread_sync;");
  __syncthreads();
  asm volatile("tcgen05.fence::after_thread_sync;");
  const uint32_t tmem = sm.tmem_base;
  const uint32_t lane_base = tmem_addr(tmem, warp * 32, 0);

  // Q row r and its scales stay resident for the whole pass.
  for (int s = 0; s < kSteps; ++s) {
    for (int byte = 0; byte < kTileBytes; ++byte)
      sm.q[s][canonical_offset(r, byte)] = p.q_codes[q_row * (D / 2) + s * kTileBytes + byte];
    tmem_store(lane_base + kColSfQ + s,
               *reinterpret_cast<const uint32_t*>(p.q_scales + q_row * (D / 16) + s * 4));
  }

  const float score_scale = p.scales[0];
  float m = -INFINITY, l = 0.0f, acc[D];
#pragma unroll
  for (int i = 0; i < D; ++i) acc[i] = 0.0f;
  const float* bias = bias_row(p, bh, row);
  const int end = p.causal ? min(p.n_k_pad, int(blockIdx.x + 1) * kRows + p.causal_offset) : p.n_k_pad;
  uint32_t phase = 0;
  for (int start = 0; start < end; start += kKvTile) {
    // 1. K codes (threads 0-63: one key each) and V^T codes (one channel per thread), their scales.
    const int key = r % kKvTile;
    const int64_t k_row = int64_t(bkv) * p.n_k_pad + start + key;
    for (int s = 0; s < kSteps; ++s) {
      if (r < kKvTile)
        for (int byte = 0; byte < kTileBytes; ++byte)
          sm.k[s][canonical_offset(key, byte)] = p.k_codes[k_row * (D / 2) + s * kTileBytes + byte];
      // Lanes 64-127 repeat keys 0-63; the MMA reads the scales of its N=64 rows only.
      tmem_store(lane_base + kColSfK + s, *reinterpret_cast<const uint32_t*>(p.k_scales + k_row * (D / 16) + s * 4));
    }
    const int ch = r % D;
    const int64_t v_row = int64_t(bkv) * D + ch;
    if (r < D)
      for (int byte = 0; byte < kTileBytes; ++byte)
        sm.v[canonical_offset(ch, byte)] = p.v_codes[v_row * (p.n_k_pad / 2) + start / 2 + byte];
    tmem_store(lane_base + kColSfV, *reinterpret_cast<const uint32_t*>(p.v_scales + v_row * (p.n_k_pad / 16) + start / 16));
    publish_operands();

    // 2. S = Q K^T.
    if (r == 0) {
      for (int s = 0; s < kSteps; ++s)
        mma(tmem + kColS, smem_desc(sm.q[s]), smem_desc(sm.k[s]), make_idesc(kRows, kKvTile),
            tmem + kColSfQ + s, tmem + kColSfK + s, s > 0);
      commit(&sm.bar);
    }
    wait_phase(&sm.bar, phase);
    phase ^= 1;

    // 3. Online softmax and two-level P quantization of row r.
    float sv[kKvTile], tile_max = -INFINITY;
    tmem_load32(lane_base + kColS, *reinterpret_cast<float(*)[32]>(sv));
    tmem_load32(lane_base + kColS + 32, *reinterpret_cast<float(*)[32]>(sv + 32));
#pragma unroll
    for (int j = 0; j < kKvTile; ++j) {
      sv[j] = masked_score(p, score_scale, sv[j], bias, row, start + j);
      tile_max = fmaxf(tile_max, sv[j]);
    }
    const float m_new = fmaxf(m, tile_max), m_sub = max_to_subtract(m_new), alpha = exp2f(m - m_sub);
    float row_sum = 0.0f, p_max = 0.0f;
#pragma unroll
    for (int j = 0; j < kKvTile; ++j) {
      sv[j] = exp2f(sv[j] - m_sub);
      row_sum += sv[j];
      p_max = fmaxf(p_max, sv[j]);
    }
    m = m_new;
    l = l * alpha + row_sum;
    const float s1 = p_row_scale(p_max);
    uint32_t p_scales = 0;
#pragma unroll
    for (int grp = 0; grp < kKvTile / kGroup; ++grp) {
      float amax = 0.0f;
#pragma unroll
      for (int i = 0; i < kGroup; ++i) {
        sv[grp * kGroup + i] = __fdiv_rn(sv[grp * kGroup + i], s1);
        amax = fmaxf(amax, sv[grp * kGroup + i]);
      }
      const uint8_t sc = group_scale(amax);
      const float scv = scale_value(sc);
      p_scales |= uint32_t(sc) << (8 * grp);
#pragma unroll
      for (int i = 0; i < kGroup; i += 2) {
        const int j = grp * kGroup + i;
        sm.p[canonical_offset(r, j / 2)] = uint8_t(e2m1x2(scaled(sv[j], scv), scaled(sv[j + 1], scv)));
      }
    }
    tmem_store(lane_base + kColSfP, p_scales);
    publish_operands();

    // 4. PV = P V, folded into the register accumulator.
    if (r == 0) {
      mma(tmem + kColPV, smem_desc(sm.p), smem_desc(sm.v), make_idesc(kRows, D), tmem + kColSfP, tmem + kColSfV,
          false);
      commit(&sm.bar);
    }
    wait_phase(&sm.bar, phase);
    phase ^= 1;
#pragma unroll
    for (int c = 0; c < D; c += 32) {
      float pv[32];
      tmem_load32(lane_base + kColPV + c, pv);
#pragma unroll
      for (int i = 0; i < 32; ++i) acc[c + i] = acc[c + i] * alpha + pv[i] * s1;
    }
    __syncthreads();  // shared tiles are rewritten by the next step
  }

  float* out = p.out + q_row * D;
  const float v_scale = p.scales[2];
#pragma unroll
  for (int i = 0; i < D; i += 4) {
    *reinterpret_cast<float4*>(out + i) = make_float4(finish_output(acc[i], l, v_scale),
                                                      finish_output(acc[i + 1], l, v_scale),
                                                      finish_output(acc[i + 2], l, v_scale),
                                                      finish_output(acc[i + 3], l, v_scale));
  }
  p.lse[q_row] = lse_natural(m, l, p.scales[1]);

  asm volatile("tcgen05.fence::before_thread_sync;");
  __syncthreads();
  if (warp == 0) {
    asm volatile("tcgen05.dealloc.cta_group::1.sync.aligned.b32 %0, %1;" :: "r"(tmem), "n"(kTmemCols));
  }
#else
  __trap();  // compiled for another architecture; the host never launches it there
#endif
}

// Under the 48 KiB a launch may ask for without opting in (cudaFuncAttributeMaxDynamicSharedMemorySize).
static_assert(sizeof(Smem<128>) <= 48 * 1024, "a larger tile needs cudaFuncSetAttribute before the launch");

template <int D>
void launch(const AttentionParams& p, cudaStream_t stream) {
  attention_kernel<D><<<dim3(p.n_q_pad / kRows, p.batch * p.heads), kRows, sizeof(Smem<D>), stream>>>(p);
}

}  // namespace

void attention_sm100(const AttentionParams& p, cudaStream_t stream) {
  if (p.head_dim == 64) {
    launch<64>(p, stream);
  } else {
    launch<128>(p, stream);
  }
}

}  // namespace sage3
