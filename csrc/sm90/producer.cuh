// The sm90 kernel's producer warpgroup: the bulk tensor copies of each item's Q and of its K and V^T tiles.
#pragma once
#include <cstdint>

#include "common/params.h"
#include "common/ptx.cuh"
#include "sm90/hopper.cuh"
#include "sm90/tile_scheduler.cuh"
#include "sm90/traits.cuh"

namespace sage::sm90 {

// Blocks until K/V head `head`'s intermediates are all written, where the call counts them (the preparation then
// runs ahead of this kernel, which may start before it ends: launch_attention_sm90). Returns whether every head is
// written, after which the caller stops asking: each acquire empties the SM's L1, which cost 0.3-0.5 % at long
// sequences when asked per item.
__device__ __forceinline__ bool wait_kv_ready(const AttentionParams& p, int head) {
  if (p.kv_ready == nullptr) return true;
  const int heads = p.batch * p.hk;
  const bool all = ptx::load_acquire(p.kv_ready + heads) == heads;
  if (!all) {
    const int want = kv_ready_count(p.nk_pad);
    while (ptx::load_acquire(p.kv_ready + head) < want) __nanosleep(256);
  }
  fence_proxy_async_global();  // the copy engine's reads of them come after
  return all;
}

// Bytes of the head's V statistics the producer copies: V's scale [D], then its mean [D] where the call has one.
template <int D>
__device__ __forceinline__ uint32_t v_stats_bytes(const AttentionParams& p) {
  return (p.v_mean != nullptr ? 2 : 1) * D * 4;
}

// The producer: one thread of warpgroup 0 copies each of the program's items' 16-bit Q (and, where kStagedVStats,
// the head's V statistics) into the item's Q buffer once the consumers are done with that buffer, then the item's
// K and V^T tiles into the ring's stages as they come free. It waits for a K/V head's preparation before its first
// item of the head (wait_kv_ready).
template <int D, bool kStagedVStats>
__device__ __forceinline__ void produce(const CUtensorMap& q_map, const CUtensorMap& k_map, const CUtensorMap& v_map,
                                        const AttentionParams& p, uint8_t* smem, uint64_t* full, uint64_t* empty,
                                        uint64_t* q_full, uint64_t* q_empty, int n_items) {
  using L = Layout<D>;
  constexpr int kQ16Buffers = L::kQ16Buffers;
  RingPos<L::kStages> pos;  // the next tile's
  int ready_head = -1;      // the last K/V head found prepared
  bool all_ready = false;   // every head is
  for (int k = 0, w = program_item(0, p); w < n_items; w = program_item(++k, p)) {
    const Work wk = work_item(w, p);
    // before the item's Q: the consumers read the head's K scales once Q has arrived
    if (!all_ready && wk.kv_head != ready_head) all_ready = wait_kv_ready(p, wk.kv_head), ready_head = wk.kv_head;
    const int b = k % kQ16Buffers;  // once the buffer's previous item is done with it
    if (k >= kQ16Buffers) mbar_wait(&q_empty[b], (k / kQ16Buffers - 1) & 1);
    mbar_arrive_expect_tx(&q_full[b], L::kQ16Bytes + (kStagedVStats ? v_stats_bytes<D>(p) : 0));
#pragma unroll
    for (int box = 0; box < D / 64; ++box)
      tma_load_4d(smem + L::kQ16Off + b * L::kQ16Bytes + box * kRows * 128, &q_map, 64 * box, wk.row0, wk.h, wk.b,
                  &q_full[b]);
    if constexpr (kStagedVStats) {  // the head's V statistics with Q, for the item's epilogue
      float* const v_stats = item_v_stats<D>(smem, k);
      bulk_load(v_stats, p.v_scale + static_cast<int64_t>(wk.kv_head) * D, D * 4, &q_full[b]);
      if (p.v_mean != nullptr)
        bulk_load(v_stats + D, p.v_mean + static_cast<int64_t>(wk.kv_head) * D, D * 4, &q_full[b]);
    }
    for (int tile = 0; tile < wk.n_tiles; ++tile, pos.advance()) {
      const int s = pos.stage;
      mbar_wait(&empty[s], pos.parity ^ 1);
      mbar_arrive_expect_tx(&full[s], L::kKBytes + L::kVBytes);
      tma_load_3d(smem + L::kKOff + s * L::kKBytes, &k_map, 0, tile * kKeys, wk.kv_head, &full[s]);
      tma_load_3d(smem + L::kVOff + s * L::kVStage, &v_map, tile * kKeys, 0, wk.kv_head, &full[s]);
    }
  }
}

}  // namespace sage::sm90
