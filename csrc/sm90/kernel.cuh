// The sm90 attention kernel (sm_90a): INT8 Q·K^T and FP8 e4m3 P·V on warpgroup MMAs, K/V tiles by the bulk tensor
// copy engine, producer/consumer warp specialization.
//
// A program has three warpgroups and runs work items of 128 query rows of one head: warpgroup 0 is the producer
// (one thread issues the copies of each item's 16-bit Q and of its K and V^T tiles of 128 keys into a ring of kStages
// shared-memory stages; the warpgroup gives its registers up), warpgroups 1 and 2 are consumers of 64 rows each. A
// consumer first quantizes its Q rows to INT8 in shared memory (the scales stay in registers; no separate pass over
// Q). Per tile it runs S = Q·K^T (wgmma m64n128k32 s8, both operands in shared memory), the online softmax on S in
// registers, and O += P·V (wgmma m64n(D+8)k32 e4m3, P from registers, V^T in shared memory) overlapped with the next
// tile's softmax, then frees the stage. Each V^T stage is followed by 8 rows of ones, so the P·V's last 8 columns
// are P's row sums: the tensor cores add them up (no adds in the softmax), from P as rounded to e4m3, as O is.
// The accumulator layout per warp is that of mma.sync m16n8 (rows g and g + 8 of the warp's 16, columns 2t, 2t + 1
// of every 8-column slice) and the 8-bit A-register layout that of mma.sync m16n8k32, so prepare()'s quantization
// groups and FP8 key order (fp8_key_slot) serve this kernel unchanged (csrc/mma_sync/attention.cuh explains them).
// The epilogue writes a warpgroup's rows into shared memory by stmatrix, and one thread stores them by the copy engine
// (stage_rows), where the output's rows are 16-byte aligned.
#pragma once
#include <cstdint>

#include "common/params.h"
#include "sm90/hopper.cuh"
#include "sm90/mainloop.cuh"
#include "sm90/producer.cuh"
#include "sm90/tile_scheduler.cuh"
#include "sm90/traits.cuh"

namespace sage::sm90 {

// Two-level accumulation: each tile's P·V goes to a fresh fp32 accumulator that is added to o (upstream's
// "fp32+fp32"; the tensor cores' FP8 accumulation keeps fewer bits than fp32 across many tiles). Every accumulation
// mode runs it: with P·V straight into o, ptxas serialized the warpgroup MMAs once o also held the row sums (C7514).
// Persistent: a program runs several items (program_item); the K/V ring and its barrier phases run on across items,
// so the producer loads the next item's Q and first tiles while the consumers finish the current one.
// kLse: the call asks for the LSE (p.lse), which needs fp32 row sums besides the tensor cores' (tile_exp).
// kDual: the tile loop with two P·V buffers and speculative exponents (below; launch_for says where it runs).
template <int D, typename T, bool kLse, bool kDual>
__global__ void __launch_bounds__(kThreads, 1)
    attention_sm90_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                          const __grid_constant__ CUtensorMap v_map, const AttentionParams p,
                          const __grid_constant__ CUtensorMap out_map) {  // (last: the others keep their offsets)
  using L = Layout<D>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* const smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* const full = reinterpret_cast<uint64_t*>(smem + L::kBarOff);  // stage s holds tile data
  uint64_t* const empty = full + L::kStages;                              // stage s may be overwritten
  constexpr int kQ16Buffers = L::kQ16Buffers;
  uint64_t* const q_full = empty + L::kStages;     // [buffer]: its item's 16-bit Q (and V statistics) arrived
  uint64_t* const q_empty = q_full + kQ16Buffers;  // [buffer]: the consumers are done with its Q
  const int n_items = work_items(p);
  // Each item's V statistics (scale, mean) are copied into shared memory with its Q, for the epilogue, where global
  // loads had their L2 latency exposed once per item (d64 N1k +4 %). Not in the dual loop's kernel: there ptxas
  // ordered the loop differently and CogVideoX ran 2 % slower; it loads them from global memory
  // (docs/decisions/0011-sm90-v-stats-staged-with-q.md).
  constexpr bool kStagedVStats = !kDual;

  if (threadIdx.x == 0) {
    for (int s = 0; s < L::kStages; ++s) mbar_init(&full[s], 1), mbar_init(&empty[s], 2 * 128);
    for (int b = 0; b < kQ16Buffers; ++b) mbar_init(&q_full[b], 1), mbar_init(&q_empty[b], 2 * 128);
    mbar_init_fence();
  }
  // the rows of ones after each V^T stage (the copy engine never writes them), seen by the tensor cores' proxy
  constexpr int kOnesWords = 8 * kKeys / 4;  // 8 rows of kKeys e4m3 bytes, written 4 at a time
  for (int i = threadIdx.x; i < L::kStages * kOnesWords; i += kThreads)
    reinterpret_cast<uint32_t*>(smem + L::kVOff + (i / kOnesWords) * L::kVStage + L::kVBytes)[i % kOnesWords] =
        0x38383838u;  // e4m3 1.0 in each byte
  fence_proxy_async();
  __syncthreads();

  const int wg = threadIdx.x / 128;
  if (wg == 0) {  // producer
    regs_dec<kProducerRegs>();
    if (threadIdx.x != 0) return;
    produce<D, kStagedVStats>(q_map, k_map, v_map, p, smem, full, empty, q_full, q_empty, n_items);
    return;
  }

  regs_inc<kConsumerRegs>();
  consume<D, T, kLse, kDual>(p, out_map, smem, q_full, q_empty, full, empty, n_items, wg);
}

}  // namespace sage::sm90
