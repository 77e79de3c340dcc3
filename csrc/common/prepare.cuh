// Fused preparation of Q, K, V for the attention kernels:
//   - quantize_q_blocks: INT8 Q blocks (per-block/warp/thread scales; not launched where the attention kernel
//     quantizes Q);
//   - prepare_kv, one launch of work units per K/V head: statistics chunks (K sums; V max/min/sums), the last of
//     which also finishes the head's statistics (K mean; V mean and scale), then the head's K blocks (INT8 K minus
//     its token mean) and V blocks (FP8 e4m3 V^T with a per-channel scale and optional mean, keys permuted into the
//     order the FP8 P·V MMA reads, or a padded 16-bit copy), which wait for those statistics.
// Programs take units in the order they start (a ticket from an atomic counter), and a head's quantization units
// come some heads after its statistics units (p.lag_heads): a waiting program waits only for programs that started
// before it and wait for nothing, so the launch cannot deadlock whatever the residency, and the quantization units
// reread K and V mostly from L2. The per-block functions (common/prepare/) read rows through a loader (global_rows),
// so the sm90 module's one-pass preparation of short heads (csrc/sm90/prepare.cu) runs them on rows held in shared
// memory.
// Arithmetic matches sageattention/reference.py operation for operation (fp32, x * (1 / s) with an IEEE reciprocal,
// round half to even), so the INT8 values are bit-exact given the same mean.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/params.h"
#include "common/prepare/quantize_block.cuh"
#include "common/prepare/rows.cuh"
#include "common/prepare/statistics.cuh"
#include "common/prepare/v_rewrite.cuh"
#include "common/ptx.cuh"
#include "common/sm_count.h"

namespace sage {

// Q blocks (none where the attention kernel quantizes Q itself).
__host__ __device__ inline int q_blocks(const PrepareParams& p) { return p.q_i8 == nullptr ? 0 : p.nq_pad / kQBlock; }

// Work units per K/V head: statistics chunks of K and of V, then K blocks and V blocks (when V is rewritten).
__host__ __device__ inline int stats_units(const PrepareParams& p) { return 2 * p.n_chunks; }
__host__ __device__ inline int quant_units(const PrepareParams& p) {
  return (p.nk_pad / kKBlock) * (p.v_mode == kVNone ? 1 : 2);
}

// p.counters: the ticket, then per head and tensor (K, V) its finished statistics chunks, set to n_chunks + 1 once
// the head's statistics are finished.
__device__ __forceinline__ int* stats_counter(const PrepareParams& p, int64_t head, bool of_v) {
  return p.counters + 1 + 2 * head + of_v;
}

// A K/V unit: statistics chunk `stats` of K then of V (quant < 0), or K block `quant` (< k_blocks), or a V block.
struct Unit {
  int head, stats, quant;
};
// Ticket order: the statistics of the first lag heads, then per head g the statistics of head g + lag and the
// quantization of head g. The lag gives a head's statistics time to finish before its quantization units start
// (which then rarely wait), while its K and V are still in L2.
__device__ __forceinline__ Unit kv_unit(const PrepareParams& p, int u) {
  const int s = stats_units(p), qu = quant_units(p), heads = p.batch * p.hk, lag = min(p.lag_heads, heads);
  if (u < lag * s) return {u / s, u % s, -1};
  u -= lag * s;
  if (u < (heads - lag) * (s + qu)) {
    const int g = u / (s + qu), r = u % (s + qu);
    return r < s ? Unit{g + lag, r, -1} : Unit{g, -1, r - s};
  }
  u -= (heads - lag) * (s + qu);
  return {heads - lag + u / qu, -1, u % qu};
}

// One statistics chunk; the head's last chunk of K (or V) to finish also finishes the head's statistics and marks
// them ready (its counter past n_chunks).
template <typename T, int DPAD>
__device__ void statistics_unit(const PrepareParams& p, int b, int hk, int stats) {
  __shared__ bool last;
  __shared__ float red[8][kRedStride];
  const bool of_v = stats >= p.n_chunks;
  const int64_t head = static_cast<int64_t>(b) * p.hk + hk;
  const int chunk = stats % p.n_chunks, n0 = chunk * p.chunk_len;
  kv_statistics<T, DPAD>(p, global_rows<T>(of_v ? p.v : p.k, b, hk, p.nk, p.d), n0,
                         statistics_needed(p, of_v) ? min(n0 + p.chunk_len, p.nk) : n0, of_v,
                         p.partials + (head * p.n_chunks + chunk) * 4 * DPAD, red);
  __syncthreads();  // every thread's partials are written before they are published
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(stats_counter(p, head, of_v), 1) == p.n_chunks - 1;
    __threadfence();  // the other chunks' partials, published before their increments, are visible after this one
  }
  __syncthreads();
  if (!last) return;
  const float* src = p.partials + head * p.n_chunks * 4 * DPAD + (of_v ? DPAD : 0) + threadIdx.x % DPAD;
  finish_statistics<T, DPAD>(
      p, of_v, p.n_chunks, [src](int i, int j) { return __ldcg(src + i * 4 * DPAD + j * DPAD); },
      [&](int c, float mean, float scale) { publish_statistics(p, head, of_v, c, mean, scale); });
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    ptx::store_release(stats_counter(p, head, of_v), p.n_chunks + 1);
  }
}

// K block or V block `blk` of head (b, hk), once the head's statistics of that tensor are ready.
template <typename T, int DPAD, bool kFp8V>
__device__ void quantization_unit(const PrepareParams& p, int b, int hk, int quant) {
  __shared__ __align__(16) float mean[DPAD], inv_scale[DPAD];
  __shared__ __align__(16) uint8_t tile[DPAD][kKBlock];
  const int k_blocks = p.nk_pad / kKBlock;
  const bool of_v = quant >= k_blocks;
  const int blk = of_v ? quant - k_blocks : quant;
  const int64_t head = static_cast<int64_t>(b) * p.hk + hk;
  // the block's loads are issued first: they do not depend on the statistics, and they overlap the wait for them
  auto ready = [&] {
    if (threadIdx.x == 0) {
      const int* counter = stats_counter(p, head, of_v);
      while (ptx::load_acquire(counter) <= p.n_chunks) __nanosleep(100);
    }
    __syncthreads();
    const int c = threadIdx.x;
    if (c < DPAD) {
      const float* m = of_v ? p.v_mean : p.k_mean;
      mean[c] = m == nullptr ? 0.f : __ldcg(m + head * DPAD + c);
      inv_scale[c] = of_v && p.v_scale != nullptr ? 1.f / __ldcg(p.v_scale + head * DPAD + c) : 1.f;
    }
    __syncthreads();
  };
  if (!of_v) {
    quantize_block<T, kKBlock, DPAD>(global_rows<T>(p.k, b, hk, p.nk, p.d), blk * kKBlock, p.nk, false, p.k_gran,
                                     mean, p.k_i8 + head * p.nk_pad * DPAD, p.k_scale + head * p.nk_pad, ready);
  } else if constexpr (kFp8V) {
    v_to_fp8<T, DPAD>(p, b, hk, blk * kKBlock, global_rows<T>(p.v, b, hk, p.nk, p.d), mean, inv_scale, ready,
                      tile);
  } else {
    ready();
    v_to_16bit<T, DPAD>(p, b, hk, blk * kKBlock, mean);
  }
}

template <typename T, int DPAD>
__global__ void __launch_bounds__(kPrepThreads) quantize_q_blocks(const PrepareParams p) {
  const int n = q_blocks(p), i = blockIdx.x, blk = i % n, h = (i / n) % p.hq, b = i / (n * p.hq);
  const int64_t head = static_cast<int64_t>(b) * p.hq + h;
  quantize_block<T, kQBlock, DPAD>(global_rows<T>(p.q, b, h, p.nq, p.d), blk * kQBlock, p.nq, true, p.q_gran,
                                   nullptr, p.q_i8 + head * p.nq_pad * DPAD, p.q_scale + head * p.nq_pad, [] {});
}

// Resident programs per SM that prepare_kv is compiled for (its registers per thread follow). Preparation is
// latency-bound, so more programs in flight help: six on Hopper, whose 228 KB of shared memory holds them (40
// registers, a few bytes spilled; eight spilled hundreds and were slower:
// docs/decisions/0005-prepare-register-budget.md); four elsewhere, where 100 KB of shared memory per SM holds no more
// (sm80 unmeasured).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && __CUDA_ARCH__ < 1000
constexpr int kPrepProgramsPerSm = 6;
#else
constexpr int kPrepProgramsPerSm = 4;
#endif

// K and V: statistics and quantization units in ticket order.
template <typename T, int DPAD, bool kFp8V>
__global__ void __launch_bounds__(kPrepThreads, kPrepProgramsPerSm) prepare_kv(const PrepareParams p) {
  __shared__ int ticket;
  if (threadIdx.x == 0) ticket = atomicAdd(p.counters, 1);
  __syncthreads();
  const Unit unit = kv_unit(p, ticket);
  const int b = unit.head / p.hk, hk = unit.head % p.hk;
  if (unit.quant < 0) statistics_unit<T, DPAD>(p, b, hk, unit.stats);
  else quantization_unit<T, DPAD, kFp8V>(p, b, hk, unit.quant);
}

// The K/V preparation a family tries before prepare_kv (launch_kv returns whether it took the call; where it does,
// it counts its prepared heads in p.kv_ready): none here; the sm90 module brings one (csrc/sm90/prepare.cu).
struct NoKvFirst {
  template <typename T, int DPAD>
  static bool launch_kv(const PrepareParams&, cudaStream_t) { return false; }
};

// Returns whether the K/V preparation counts its prepared heads in p.kv_ready (KvFirst's does; prepare_kv, which takes
// long heads, where the attention kernel has little to overlap with it, does not).
template <typename T, int DPAD, bool kFp8V, typename KvFirst>
bool launch_prepare(const PrepareParams& params, cudaStream_t stream) {
  if (q_blocks(params) > 0)
    quantize_q_blocks<T, DPAD><<<params.batch * params.hq * q_blocks(params), kPrepThreads, 0, stream>>>(params);
  const int* sync_end = params.kv_ready + params.batch * params.hk + 1;  // kv_ready follows counters
  cudaMemsetAsync(params.counters, 0, (sync_end - params.counters) * sizeof(int), stream);
  if (KvFirst::template launch_kv<T, DPAD>(params, stream)) return true;
  static int per_sm = 0;  // resident programs per SM (the same on every device this module runs on)
  if (per_sm == 0) cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, prepare_kv<T, DPAD, kFp8V>, kPrepThreads, 0);
  const int sms = current_sm_count();
  PrepareParams p = params;
  // A statistics unit lasts about chunk_len / kKBlock quantization units. A lag of half the units the resident programs
  // run meanwhile measured best on an H100 (B16 H16 N1k d128: 158 us against 195 at a quarter, where more programs
  // wait, and 162 at a whole, where fewer rereads hit L2; docs/decisions/0004-prepare-one-launch-programs-per-sm.md).
  const float lag_units = 0.5f * sms * per_sm * (p.chunk_len / kKBlock);
  p.lag_heads = max(1, static_cast<int>(ceilf(lag_units / (stats_units(p) + quant_units(p)))));
  prepare_kv<T, DPAD, kFp8V><<<p.batch * p.hk * (stats_units(p) + quant_units(p)), kPrepThreads, 0, stream>>>(p);
  return false;
}

// kFp8V: the module's V rewrite (FP8 V^T needs sm89's e4m3 conversions; the sm80 family writes 16-bit V).
template <bool kFp8V, typename KvFirst = NoKvFirst>
bool prepare_for_family(const PrepareParams& p, DType dtype, cudaStream_t stream) {
  const bool bf16 = dtype == kBF16;
  if (p.d_pad == 64) {
    return bf16 ? launch_prepare<__nv_bfloat16, 64, kFp8V, KvFirst>(p, stream)
                : launch_prepare<half, 64, kFp8V, KvFirst>(p, stream);
  }
  return bf16 ? launch_prepare<__nv_bfloat16, 128, kFp8V, KvFirst>(p, stream)
              : launch_prepare<half, 128, kFp8V, KvFirst>(p, stream);
}

}  // namespace sage
