// The sm90 kernel's shapes: work items of 128 query rows, tiles of 128 keys, three warpgroups (one producer, two
// consumers) and their register split, and the layout of its dynamic shared memory.
#pragma once
#include <cstdint>

namespace sage::sm90 {

constexpr int kRows = 128;        // query rows per work item
constexpr int kKeys = 128;        // keys per tile
constexpr int kThreads = 384;     // producer warpgroup + two consumer warpgroups
constexpr int kProducerRegs = 24, kConsumerRegs = 240;  // 128 * 24 + 256 * 240 <= 64 K registers

template <int D>
struct Layout {
  static constexpr int kStages = 3;  // tiles in flight: the one computed on, the one whose P·V runs, the next
  static constexpr int kQ16Bytes = kRows * D * 2;  // 16-bit Q as copied, in boxes of 64 columns (128-byte rows)
  // d128 loads each item's 16-bit Q during the item before (two buffers, taken by items in turn), and its epilogue
  // saturates the conversion to 16 bits instead of clamping (store_rows; stage_rows always does): +1.3-1.8 % at d128
  // (docs/decisions/0012-sm90-d128-two-q-buffers.md). The d64 kernels keep one buffer and the clamp: with the change,
  // ptxas ordered their tile loops differently, 3.6 % slower at d64 N1k and 1 % on CogVideoX.
  static constexpr bool kAhead = D == 128;
  static constexpr int kQ16Buffers = kAhead ? 2 : 1;
  static constexpr int kQBytes = kRows * D;
  static constexpr int kKBytes = kKeys * D;
  static constexpr int kVBytes = D * kKeys;                  // V^T as copied
  static constexpr int kVStage = kVBytes + 8 * kKeys;        // and 8 rows of ones (e4m3 1.0) after it
  // each region starts 1024-aligned: a swizzle atom's pattern follows its address bits
  static constexpr int kQOff = 0;
  static constexpr int kKOff = kQOff + kQBytes;
  static constexpr int kVOff = kKOff + kStages * kKBytes;
  static constexpr int kQ16Off = kVOff + kStages * kVStage;
  // the output's staging rows (stage_rows): each consumer warpgroup's 64 rows in boxes of 64 columns
  static constexpr int kOutOff = kQ16Off + kQ16Buffers * kQ16Bytes;
  static constexpr int kBarOff = kOutOff + kRows * D * 2;
  static constexpr int kRedOff = kBarOff + 256;  // per-block Q maxima: [item parity][8 warps]
  static constexpr int kVStatsOff = kBarOff + 512;  // the item's V scale and mean: [slot][2][D] fp32
  static constexpr int kVStatsSlots = 2 * kQ16Buffers;  // item_v_stats
  static constexpr int kSmem = kVStatsOff + kVStatsSlots * 2 * D * 4 + 1024;  // and slack to align the base to 1024
};

// The V statistics of this program's k-th item in shared memory. The producer copies them with the item's Q, into
// one of two slots per Q buffer (the call's workspace holds them 256-byte aligned, as the bulk copy needs 16). With
// b buffers, item k + 2b's copy waits for item k + b's last Q·K^T (its Q buffer's release), which comes after item
// k's epilogue read its slot; item k + b's waits for item k's last Q·K^T, which comes before. (Three slots for two
// buffers, k % 3, reordered the d128 tile loop.)
template <int D>
__device__ __forceinline__ float* item_v_stats(uint8_t* smem, int k) {
  return reinterpret_cast<float*>(smem + Layout<D>::kVStatsOff) + 2 * D * (k % Layout<D>::kVStatsSlots);
}

}  // namespace sage::sm90
