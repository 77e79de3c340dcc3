// The sm90 kernel's work: items of 128 query rows of one head, the order they are numbered in, and how the
// persistent programs (one per SM) take them.
#pragma once
#include <algorithm>

#include "common/params.h"
#include "common/sm_count.h"
#include "sm90/traits.cuh"

namespace sage::sm90 {

// A work item: 128 query rows of one head. Items are numbered query block fastest, so the programs running at
// once share a head's K and V in L2. Causal items differ in length: a head's query blocks are numbered longest and
// shortest alternately (the last block, the first, the last but one, ...), so that two consecutive items, which
// one program runs (program_item), add up to about the same number of tiles in every pair.
struct Work {
  int row0, h, b, n_tiles;
  int q_head, kv_head;  // b * hq + h (the LSE's head) and b * hk + h's K/V head (the K/V maps' outer coordinate)
};

__device__ __forceinline__ Work work_item(int w, const AttentionParams& p) {
  const int n_qblocks = (p.nq + kRows - 1) / kRows;
  const int slot = w % n_qblocks;
  const int qblock = p.causal ? (slot % 2 == 0 ? n_qblocks - 1 - slot / 2 : slot / 2) : slot;
  const int h = w / n_qblocks % p.hq, b = w / n_qblocks / p.hq;
  Work wk{qblock * kRows, h, b, (p.nk + kKeys - 1) / kKeys, b * p.hq + h, b * p.hk + h / (p.hq / p.hk)};
  if (p.causal) {
    const int last_key = wk.row0 + kRows - 1 + p.causal_offset;  // the last key any row of the item sees
    wk.n_tiles = last_key < 0 ? 0 : min(wk.n_tiles, last_key / kKeys + 1);
  }
  return wk;
}

__host__ __device__ inline int work_items(const AttentionParams& p) {
  return (p.nq + kRows - 1) / kRows * p.hq * p.batch;
}

// The k-th item of this program: programs are persistent and take items round-robin, non-causal ones one at a time
// (all equally long), causal ones two at a time, a long and a short one, so that the programs' shares are even.
__device__ __forceinline__ int program_item(int k, const AttentionParams& p) {
  return p.causal ? 2 * (blockIdx.x + k / 2 * gridDim.x) + k % 2 : blockIdx.x + k * gridDim.x;
}

// Programs of a launch: one per SM, or one per item (per pair of causal items) where there are fewer.
inline int program_count(const AttentionParams& p) {
  const int items = work_items(p);
  return std::min(p.causal ? (items + 1) / 2 : items, current_sm_count());
}

}  // namespace sage::sm90
