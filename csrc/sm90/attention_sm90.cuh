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
#include <algorithm>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/convert.cuh"
#include "common/epilogue.cuh"
#include "common/launch.h"
#include "common/prepare.cuh"
#include "common/quant.cuh"
#include "common/softmax.cuh"
#include "sm90/hopper.cuh"
#include "sm90/wgmma_ops.cuh"

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
  // (session 38). The d64 kernels keep one buffer and the clamp: with the change, ptxas ordered their tile loops
  // differently, 3.6 % slower at d64 N1k and 1 % on CogVideoX.
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

// INT8-quantizes this thread's Q rows `row` and row + 8 of the item (rows of the m16n8k32 A layout: bytes 4t..4t+3
// and 16+4t..+3 of every 32) from the 16-bit copy q16 into q8 (rows of D bytes, swizzled as the Q·K^T descriptor
// reads them) and returns their scale. The arithmetic and the scale groups (sageattention/quant_groups.py: a
// thread's two rows, a warp's 16, the item's 128) are prepare()'s, so the INT8 values and scales are the same;
// `negate` stores -Q's (the INT8 range is symmetric), so that a negative sm_scale becomes a positive one and the
// scores keep their order (tile_max). red is the per-block exchange of this item's parity.
template <int D, typename T>
__device__ __forceinline__ float quantize_q(const uint8_t* q16, uint8_t* q8, int row, int t, int gran, bool negate,
                                            uint32_t* red) {
  // piece p: 4 elements of row `row` + 8 * (p / kHalf) at column 32 * (p / 2 % (D / 32)) + 16 * (p % 2) + 4t
  constexpr int kPieces = 4 * (D / 32), kHalf = kPieces / 2;
  auto piece_row = [&](int p) { return row + 8 * (p / kHalf); };
  auto piece_col = [&](int p) { return 32 * (p / 2 % (D / 32)) + 16 * (p % 2) + 4 * t; };
  // The group's largest magnitude, as bits: 16-bit floats order like their magnitude bits, inf and NaN above all
  // finite values (prepare()'s max in fp32 gives the same value, and NaN for a group holding inf or NaN).
  uint2 raw[kPieces];
  uint32_t m2 = 0;  // two 16-bit maxima
#pragma unroll
  for (int p = 0; p < kPieces; ++p) {
    const int c = piece_col(p);
    const int offset = (c / 64) * (kRows * 128) + swizzled<128>(piece_row(p), (c % 64) * 2);  // 64-column boxes
    raw[p] = *reinterpret_cast<const uint2*>(q16 + offset);
    m2 = __vmaxu2(__vmaxu2(m2, raw[p].x & 0x7fff7fffu), raw[p].y & 0x7fff7fffu);
  }
  uint32_t mbits = max(m2 & 0xffffu, m2 >> 16);
  // a thread's group spans its quad (per thread), its warp (per warp), or both consumer warpgroups (per block)
  const int widest = gran == kPerThread ? 2 : 16;
  for (int off = 1; off <= widest; off *= 2) mbits = max(mbits, __shfl_xor_sync(0xffffffffu, mbits, off));
  if (gran == kPerBlock) {
    const int warp = row / 16;  // 0..7 over both consumer warpgroups
    if (t == 0 && (row % 16) == 0) red[warp] = mbits;
    named_barrier(3, 256);
#pragma unroll
    for (int w = 0; w < 8; ++w) mbits = max(mbits, red[w]);
  }
  const uint16_t top = static_cast<uint16_t>(mbits);
  const float mx = mbits >= kInfBits<T> ? __int_as_float(0x7fffffff) : to_float(*reinterpret_cast<const T*>(&top));
  const float scale = int8_scale(mx);
  const float inv = (negate ? -1.f : 1.f) / scale;
#pragma unroll
  for (int p = 0; p < kPieces; ++p) {
    float v[4];
    to_floats<T>(raw[p], v);
    *reinterpret_cast<uint32_t*>(q8 + swizzled<D>(piece_row(p), piece_col(p))) = quantize4(v, inv);
  }
  fence_proxy_async();
  return scale;
}

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

// The V statistics of this program's k-th item in shared memory. The producer copies them with the item's Q, into
// one of two slots per Q buffer (the call's workspace holds them 256-byte aligned, as the bulk copy needs 16). With
// b buffers, item k + 2b's copy waits for item k + b's last Q·K^T (its Q buffer's release), which comes after item
// k's epilogue read its slot; item k + b's waits for item k's last Q·K^T, which comes before. (Three slots for two
// buffers, k % 3, reordered the d128 tile loop.)
template <int D>
__device__ __forceinline__ float* item_v_stats(uint8_t* smem, int k) {
  return reinterpret_cast<float*>(smem + Layout<D>::kVStatsOff) + 2 * D * (k % Layout<D>::kVStatsSlots);
}

// Bytes of the head's V statistics the producer copies: V's scale [D], then its mean [D] where the call has one.
template <int D>
__device__ __forceinline__ uint32_t v_stats_bytes(const AttentionParams& p) {
  return (p.v_mean != nullptr ? 2 : 1) * D * 4;
}

// load_v_stats' values from that slot. (Its loop written once for both, over loader functions, changed the SASS of
// every kernel, the d64 dual loop's and the other families' included: ptxas ordered their tile loops differently.)
template <int D>
__device__ __forceinline__ VStats<D> v_stats_in_smem(const float* stats, bool has_mean, int t) {
  const uint32_t at = ptx::smem_addr(stats) + 8 * t;
  VStats<D> vs;
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    vs.scale[n] = ptx::lds_float2(at + 32 * n);
    vs.mean[n] = has_mean ? ptx::lds_float2(at + 4 * D + 32 * n) : float2{0.f, 0.f};
  }
  return vs;
}

// Issues S = Q·K^T of a tile (both operands in shared memory, by their descriptors) into sc and commits it.
template <int D>
__device__ __forceinline__ void qk_issue(int (&sc)[64], uint64_t q_desc, uint64_t k_desc) {
  wgmma_fence();  // orders this thread's writes of o, acc and pa before the MMAs that read them
#pragma unroll
  for (int kk = 0; kk < D / 32; ++kk)
    wgmma_s8_m64n128k32(sc, desc_at(q_desc, 32 * kk), desc_at(k_desc, 32 * kk), kk > 0);
  wgmma_commit();
}

// Issues d (+)= P·[V | 1] over a tile's 128 keys (four k32 steps, V^T and its rows of ones from the stage v_desc
// describes): columns D..D+7 of d get P's row sums. d is overwritten (the tile accumulator of two-level
// accumulation). Commits the group; the caller waits.
template <int D>
__device__ __forceinline__ void pv_issue(float (&d)[D / 2 + 4], const uint32_t (&a)[4][4], uint64_t v_desc) {
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const uint64_t desc = desc_at(v_desc, 32 * s);
    if constexpr (D == 128) wgmma_e4m3_m64n136k32(d, a[s], desc, s > 0);
    else wgmma_e4m3_m64n72k32(d, a[s], desc, s > 0);
  }
  wgmma_commit();
}

// v[k] becomes max(v[k], v[k + W]), k < W: four of these (W = 8, 4, 2, 1) reduce 16 values in a tree of depth 4
// instead of a chain of 15 compares that wait on one another.
template <int W>
__device__ __forceinline__ void fold_max(int (&v)[16]) {
#pragma unroll
  for (int k = 0; k < W; ++k) v[k] = max(v[k], v[k + W]);
}

// The online softmax of a tile for this lane's rows g and g + 8 (a row's 128 scores live in the 4 lanes of a quad),
// in two phases. tile_max: the rows' maxima, the new running max m, the exponent shifts, and alpha, which rescales
// what was accumulated before the tile. The INT32 scores sc become P = exp2(sc * s - shift), stretched by 448 for
// e4m3 (s[h] = qs * ks[h]; ks[h]: the K scale of keys 64h..64h+63; qs >= 0: the Q scale times |sm_scale| * log2(e),
// quantize_q having negated Q for a negative sm_scale). A tile that needs no mask takes the row max on the integers
// of each K-scale period, scales it once, rounded down so that no score's exact product exceeds it, and each score
// is later dequantized and shifted in one FMA. P's peak is then 448 or a hair over, which e4m3 saturates to 448,
// and the sums count P as saturated: even at scores of 1e37, where the max's ulp is huge, the row stays normalized.
// Tiles at the end of the keys or on the causal diagonal (`masked`, warp-uniform) dequantize first and mask; their
// scores are then floats, kept in sc's registers as bits (one set of 64 registers live across the two phases).
// The branch holds no shuffle: ptxas serializes the warpgroup MMAs of a loop whose shuffles sit in a divergent path.
__device__ __forceinline__ void row_max(int (&sc)[64], const float (&s)[2], bool masked, int key0, int t, int row,
                                        const AttentionParams& p, float (&mx)[2]) {
  if (masked) {
    float x[16][4];
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) x[j][e] = static_cast<float>(sc[4 * j + e]) * s[j / 8];
    mask_scores<16>(x, key0, t, row, p);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = -INFINITY;
#pragma unroll
      for (int j = 0; j < 16; ++j) mx[i] = fmaxf(mx[i], fmaxf(x[j][2 * i], x[j][2 * i + 1]));
    }
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[4 * j + e] = __float_as_int(x[j][e]);
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        int v[16];
#pragma unroll
        for (int j = 0; j < 16; ++j) v[j] = sc[4 * (8 * h + j / 2) + 2 * i + j % 2];
        fold_max<8>(v), fold_max<4>(v), fold_max<2>(v), fold_max<1>(v);
        const float c = __fmul_rd(static_cast<float>(v[0]), s[h]);
        mx[i] = h == 0 ? c : fmaxf(mx[i], c);
      }
    }
  }
}

__device__ __forceinline__ void tile_max(int (&sc)[64], const float (&s)[2], bool masked, int key0, int t,
                                         int row, const AttentionParams& p, float (&m)[2], float (&shift)[2],
                                         float (&alpha)[2]) {
  float mx[2];
  row_max(sc, s, masked, key0, t, row, p, mx);
#pragma unroll
  for (int i = 0; i < 2; ++i) shift[i] = online_max<true>(mx[i], m[i], alpha[i]);
}

// Log2 units of room a speculative tile's shift leaves above the running max (the dual loop below): 1 measured 2-10 %
// slower at d64 (more tiles taken again), 3 the same as 2 (session 27).
constexpr int kSpecRoom = 2;

// O's deferred update: alpha_prev, the factor of the tile whose P·V acc holds, brings o to that tile's shift.
template <int kOut>
__device__ __forceinline__ void update_o(float (&o)[kOut], const float (&alpha_prev)[2], const float (&acc)[kOut]) {
#pragma unroll
  for (int i = 0; i < kOut; ++i) o[i] = fmaf(o[i], alpha_prev[(i % 4) / 2], acc[i]);
}

// The exponent phase, one straight run of code so that ptxas can fill the exponent unit's issue gaps (8 cycles per
// warp instruction) with the rest: P = exp2(score * s - shift) packed to e4m3 into pa (the next P·V's A registers),
// O's deferred update (update_o; acc: the previous tile's P·V, complete, the caller waited for it), and where the
// LSE is asked for (kLse), l's fp32 sums of P (clamped at 448 as e4m3 saturates; even skipped at run time they cost
// 8-15 %, session 18). kDequantized: sc holds float scores, already dequantized (masked tiles); otherwise integers,
// converted and dequantized here.
template <bool kDequantized, bool kLse, int kOut, bool kUpdate = true>
__device__ __forceinline__ void tile_exp(const int (&sc)[64], const float (&s)[2],
                                         const float (&shift)[2], const float (&alpha)[2], const float (&alpha_prev)[2],
                                         const float (&acc)[kOut], float (&o)[kOut], float (&l)[2],
                                         uint32_t (&pa)[4][4]) {
  float y[16][4];
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = e / 2;
      y[j][e] = kDequantized ? exp2_approx(__int_as_float(sc[4 * j + e]) - shift[i])
                             : exp2_approx(fmaf(static_cast<float>(sc[4 * j + e]), s[j / 8], -shift[i]));
    }
  if constexpr (kUpdate) update_o(o, alpha_prev, acc);
  if constexpr (kLse) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < 16; ++j) sum += fminf(y[j][2 * i], 448.f) + fminf(y[j][2 * i + 1], 448.f);
      l[i] = l[i] * alpha[i] + sum;
    }
  }
  pack_p_e4m3<16>(y, pa);
}

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

// Whether a call's output rows are 16-byte aligned, so that the kernel stores them by bulk tensor copies (stage_rows;
// family.cu builds the output's tensor map where they are), else by store_rows' 4-byte stores.
__host__ __device__ inline bool bulk_store_out(const AttentionParams& p) {
  return vectorizable(p.out_rows());
}

// The epilogue where bulk_store_out: each lane's values (store_rows' arithmetic, the conversion saturating, which the
// tensor cores' row sums make safe: see store_rows) go into the warpgroup's rows of the staging buffer by stmatrix,
// in the 128-byte swizzled boxes of 64 columns the output's tensor map describes, and one thread stores the boxes,
// which clips rows past nq and channels past d. Against store_rows: no quad transposes and no per-row addressing or
// predicates. The thread waits for the stores to have read the buffer (bulk_wait_read) before the warpgroup's next
// epilogue writes it: at the next item's first barrier, and before the program exits.
template <int D, typename T>
__device__ __forceinline__ void stage_rows(const AttentionParams& p, const CUtensorMap* out_map, uint8_t* stage,
                                           const VStats<D>& vs, const Work& wk, int wg, int lane,
                                           const float (&o)[D / 8][4], const float (&m)[2], const float (&l)[2],
                                           const float (&sums)[2]) {
  const int t = lane % 4, warp = threadIdx.x % 128 / 32;
  float inv[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) inv[i] = inverse_sum(sums[i]);
  // stmatrix q stores slices 2q and 2q + 1 of both rows: matrix j is slice 2q + j / 2 of row g + 8 (j % 2), and lane
  // `lane` addresses row lane % 8 of matrix lane / 8
  const int srow = warp * 16 + 8 * (lane / 8 % 2) + lane % 8;
#pragma unroll
  for (int q = 0; q < D / 16; ++q) {
    uint32_t v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = j % 2, n = 2 * q + j / 2;
      v[j] = out_pair<true, T, true>(p, o[n][2 * i], o[n][2 * i + 1], inv[i], sums[i] > 0.f, vs.scale[n], vs.mean[n]);
    }
    const int slice = 2 * q + lane / 16;
    stmatrix_x4(ptx::smem_addr(stage + (slice / 8) * 64 * 128 + swizzled<128>(srow, (slice % 8) * 16)), v);
  }
  fence_proxy_async();  // the rows, visible to the copy engine
  named_barrier(wg, 128);
  if (threadIdx.x % 128 == 0) {
#pragma unroll
    for (int box = 0; box < D / 64; ++box)
      tma_store_4d(out_map, stage + box * 64 * 128, 64 * box, wk.row0 + 64 * (wg - 1), wk.h, wk.b);
    bulk_commit();
  }
  const int row = wk.row0 + (wg - 1) * 64 + warp * 16 + lane / 4;
#pragma unroll
  for (int i = 0; i < 2; ++i)
    store_lse<true>(p, wk.q_head, row + 8 * i, t, m[i], p.lse != nullptr ? quad_sum(l[i]) : 0.f);
}

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
                          const __grid_constant__ CUtensorMap out_map) {  // (after p: p's offsets as before)
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
  // loads had their L2 latency exposed once per item (d64 N1k +4 %, session 36). Not in the dual loop's kernel: there
  // ptxas ordered the loop differently and CogVideoX ran 2 % slower; it loads them as before.
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
    return;
  }

  regs_inc<kConsumerRegs>();
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int wrow = (wg - 1) * 64 + (threadIdx.x % 128) / 32 * 16 + g;  // this lane's rows: wrow and wrow + 8
  constexpr int kOut = D / 2 + 4;     // P·[V | 1] accumulators per thread: D / 8 + 1 slices of 4
  float acc[kOut];                    // the previous tile's P·V until it is added to o
  uint32_t pa[4][4];                 // the previous tile's P, read by its P·V while this tile's maxima are taken
  RingPos<L::kStages> pos;           // the next tile's, as the producer counts them
  const uint64_t q_desc = smem_desc<D>(ptx::smem_addr(smem + L::kQOff + (wg - 1) * 64 * D));
  const uint64_t k_desc0 = smem_desc<D>(ptx::smem_addr(smem + L::kKOff));
  const uint64_t v_desc0 = smem_desc<128>(ptx::smem_addr(smem + L::kVOff));
  auto k_desc = [&](int stage) { return desc_at(k_desc0, stage * L::kKBytes); };
  auto v_desc = [&](int stage) { return desc_at(v_desc0, stage * L::kVStage); };

  for (int k = 0, w = program_item(0, p); w < n_items; w = program_item(++k, p)) {
    const Work wk = work_item(w, p);
    const int row0 = wk.row0;
    const int64_t q_head = wk.q_head, k_head = wk.kv_head;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // l: the LSE's sums (tile_exp)
    // the m16n8 layout: channels 8n + 2t + {0, 1} of rows g and g + 8; slice D / 8 holds the rows' sums of P
    float o[D / 8 + 1][4] = {};
    float(&o_flat)[kOut] = reinterpret_cast<float(&)[kOut]>(o);
    float alpha_prev[2] = {0.f, 0.f};  // the last softmax's alpha, applied to o with that tile's P·V
#pragma unroll
    for (int i = 0; i < kOut; ++i) acc[i] = 0.f;  // tile 0's update adds nothing
    // K scales of a tile's two 64-key quantization periods (periods past nk_pad, a multiple of 64, are masked),
    // loaded a tile ahead. A 32-bit index: 2^31 keys are 256 GiB of 16-bit K even at head_dim 64.
    const int k_scale0 = wk.kv_head * p.nk_pad + 2 * t;
    auto load_ks = [&](int tile, float (&ks)[2]) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int key0 = tile * kKeys + 64 * half;
        ks[half] = key0 < p.nk_pad ? p.k_scale[k_scale0 + key0] : 0.f;
      }
    };
    float ks_next[2];
    const int buffer = k % kQ16Buffers;  // the item's 16-bit Q buffer and its barriers
    mbar_wait(&q_full[buffer], (k / kQ16Buffers) & 1);
    load_ks(0, ks_next);  // (after Q: the producer loads Q once the head's K/V are prepared)
    // this warpgroup's INT8 Q rows are free: its last item's MMAs have all completed
    const float qs = quantize_q<D, T>(smem + L::kQ16Off + buffer * L::kQ16Bytes, smem + L::kQOff, wrow, t,
                                      p.q_gran, p.scale_log2 < 0.f,
                                      reinterpret_cast<uint32_t*>(smem + L::kRedOff) + 8 * (k & 1)) *
                     fabsf(p.scale_log2);
    // (and the warpgroup's last output stores have read its staging rows before its next epilogue writes them)
    if (threadIdx.x % 128 == 0) bulk_wait_read<0>();
    named_barrier(wg, 128);  // the warpgroup's rows are all written before its MMAs read them
    // Arrived on once the item's last Q·K^T is done: the buffer's next item may then load its Q.
    uint64_t* const q_done = &q_empty[buffer];
    if (wk.n_tiles == 0) mbar_arrive(q_done);

    if constexpr (kDual) {
      // The dual loop. In the loop below, one P·V buffer makes tile j's exponent run wait for tile j - 1's P·V (the
      // run adds it to o and overwrites its P), so the row maxima are taken meanwhile, on the chain from S to P.
      // Here tile j's run adds tile j - 2's P·V (acc_add, complete) to o and packs P into the other buffer (pa_new)
      // while tile j - 1's P·V (acc_pv, pa_pv) runs; and after the item's first tile, a tile that needs no mask
      // takes its exponents speculatively, with the shift of the rows' running max plus kSpecRoom, and its row
      // maxima in the same run. A warp where a row went past that room takes the tile's exponents again with the
      // new max (the INT32 scores are still there). The buffers alternate by tile parity, the loop unrolled by two
      // so that each keeps its registers.
      static_assert(!kLse, "the LSE's sums would spill: LSE calls take the loop below");
      // Tile `tile`'s S = Q·K^T issued into sc once its stage (pos) has arrived (sf: its dequantization factors),
      // then the previous tile's P·V (from pa_pv into acc_pv; none at tile 0), and the wait for S, leaving that P·V
      // running.
      auto start_tile = [&](int tile, int(&sc)[64], float(&sf)[2], float(&acc_pv)[kOut], uint32_t(&pa_pv)[4][4]) {
        sf[0] = qs * ks_next[0], sf[1] = qs * ks_next[1];
        if (tile + 1 < wk.n_tiles) load_ks(tile + 1, ks_next);
        mbar_wait(&full[pos.stage], pos.parity);
        qk_issue<D>(sc, q_desc, k_desc(pos.stage));
        if (tile > 0) {
          pv_issue<D>(acc_pv, pa_pv, v_desc(pos.previous_stage()));
          wgmma_wait<1>();  // S of this tile (committed first) is complete; P·V of the previous tile may still run
        } else {
          wgmma_wait<0>();
        }
        if (tile == wk.n_tiles - 1) mbar_arrive(q_done);  // (as in the loop below)
      };
      // The previous tile's P·V has completed: its stage is free, its accumulators final.
      auto previous_pv_done = [&](int tile) {
        wgmma_wait<0>();
        if (tile > 0) mbar_arrive(&empty[pos.previous_stage()]);
      };
      // (The loop below writes the same test inline. One shared function for both measured 2-3 % slower in this
      // loop at d64 16k and on CogVideoX, session 29: ptxas allocated its registers differently.)
      auto needs_mask = [&](int tile) {
        const int key0 = tile * kKeys;
        return key0 + kKeys > p.nk || (p.causal && key0 + kKeys - 1 > row0 + wrow - g + p.causal_offset);
      };
      // The item's last tile's P·V, run and awaited.
      auto last_pv = [&](float (&acc_last)[kOut], uint32_t (&pa_last)[4][4]) {
        wgmma_fence();
        pv_issue<D>(acc_last, pa_last, v_desc(pos.previous_stage()));
        previous_pv_done(wk.n_tiles);
      };
      float acc2[kOut];
      uint32_t pa2[4][4];
#pragma unroll
      for (int i = 0; i < kOut; ++i) acc2[i] = 0.f;
      float alpha_prev2[2] = {0.f, 0.f};             // alpha of the tile whose P·V acc_add holds
      float last_shift[2] = {-INFINITY, -INFINITY};  // the shift of the last tile's P
      auto step = [&](int tile, float(&acc_pv)[kOut], float(&acc_add)[kOut], uint32_t(&pa_pv)[4][4],
                      uint32_t(&pa_new)[4][4]) {
        int sc[64];
        float sf[2], shift[2], alpha[2], mx[2];
        start_tile(tile, sc, sf, acc_pv, pa_pv);
        const bool masked = needs_mask(tile), spec = tile > 0 && !masked;
        if (spec) {
#pragma unroll
          for (int i = 0; i < 2; ++i) shift[i] = row_shift<true, kSpecRoom>(m[i]);
          tile_exp<false, false>(sc, sf, shift, alpha, alpha_prev2, acc_add, o_flat, l, pa_new);
          row_max(sc, sf, false, tile * kKeys, t, row0 + wrow, p, mx);  // in the same run, for ptxas to interleave
        } else {
          row_max(sc, sf, masked, tile * kKeys, t, row0 + wrow, p, mx);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) mx[i] = quad_max(mx[i]);
        const bool again = !spec || __any_sync(0xffffffffu, mx[0] > m[0] + kSpecRoom || mx[1] > m[1] + kSpecRoom);
#pragma unroll
        for (int i = 0; i < 2; ++i) m[i] = fmaxf(m[i], mx[i]);
        if (again) {
#pragma unroll
          for (int i = 0; i < 2; ++i) shift[i] = row_shift<true>(m[i]);
          if (spec) tile_exp<false, false, kOut, false>(sc, sf, shift, alpha, alpha_prev2, acc_add, o_flat, l, pa_new);
          else if (masked) tile_exp<true, false>(sc, sf, shift, alpha, alpha_prev2, acc_add, o_flat, l, pa_new);
          else tile_exp<false, false>(sc, sf, shift, alpha, alpha_prev2, acc_add, o_flat, l, pa_new);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          alpha[i] = exp2_approx(last_shift[i] - shift[i]), last_shift[i] = shift[i];
          alpha_prev2[i] = alpha_prev[i], alpha_prev[i] = alpha[i];
        }
        previous_pv_done(tile);
        pos.advance();
      };
      int tile = 0;
      for (; tile + 1 < wk.n_tiles; tile += 2) {
        step(tile, acc2, acc, pa2, pa);
        step(tile + 1, acc, acc2, pa, pa2);
      }
      if (tile < wk.n_tiles) {  // an odd count: the last tile is even
        step(tile, acc2, acc, pa2, pa);
        last_pv(acc, pa);
        update_o(o_flat, alpha_prev2, acc2);
        update_o(o_flat, alpha_prev, acc);
      } else if (wk.n_tiles > 0) {
        last_pv(acc2, pa2);
        update_o(o_flat, alpha_prev2, acc);
        update_o(o_flat, alpha_prev, acc2);
      }
    } else {
    // (Written with the dual loop's lambdas, this loop compiled to the same instructions in another order, 4-6 %
    // slower at d128, session 27: its SASS is the one from before the dual loop; compare it after any change.)
    // Software pipeline: the tensor cores run tile j - 1's P·V after tile j's Q·K^T, while this warpgroup takes
    // tile j's row maxima; the exponent run then adds that P·V to o.
    for (int tile = 0; tile < wk.n_tiles; ++tile) {
      const int s = pos.stage;
      const int key0 = tile * kKeys;
      const float ks[2] = {ks_next[0], ks_next[1]};
      if (tile + 1 < wk.n_tiles) load_ks(tile + 1, ks_next);
      mbar_wait(&full[s], pos.parity);

      int sc[64];
      qk_issue<D>(sc, q_desc, k_desc(s));
      if (tile > 0) {
        pv_issue<D>(acc, pa, v_desc(pos.previous_stage()));  // in flight until the exponent run
        wgmma_wait<1>();  // S of this tile (committed first) is complete; P·V of the previous tile may still run
      } else {
        wgmma_wait<0>();
      }
      // Q·K^T of the item's last tile is done: the producer may load the buffer's next item's Q. (With one buffer,
      // releasing it as soon as it was read made persistent programs 4-10 % slower at every length, session 17: we
      // think because the two consumer warpgroups then drift apart across items.)
      if (tile == wk.n_tiles - 1) mbar_arrive(q_done);
      const bool needs_mask =
          key0 + kKeys > p.nk || (p.causal && key0 + kKeys - 1 > row0 + wrow - g + p.causal_offset);
      const float sf[2] = {qs * ks[0], qs * ks[1]};
      float shift[2], alpha[2];
      tile_max(sc, sf, needs_mask, key0, t, row0 + wrow, p, m, shift, alpha);
      wgmma_wait<0>();  // the previous tile's P·V (none at tile 0) has completed: its stage is free, acc is final
      if (tile > 0) mbar_arrive(&empty[pos.previous_stage()]);
      if (needs_mask) tile_exp<true, kLse>(sc, sf, shift, alpha, alpha_prev, acc, o_flat, l, pa);
      else tile_exp<false, kLse>(sc, sf, shift, alpha, alpha_prev, acc, o_flat, l, pa);
      alpha_prev[0] = alpha[0], alpha_prev[1] = alpha[1];
      pos.advance();
    }
    if (wk.n_tiles > 0) {  // the last tile's P·V
      wgmma_fence();
      pv_issue<D>(acc, pa, v_desc(pos.previous_stage()));
      wgmma_wait<0>();
      mbar_arrive(&empty[pos.previous_stage()]);
      update_o(o_flat, alpha_prev, acc);
    }
    }
    VStats<D> vs;
    if constexpr (kStagedVStats) {
      vs = v_stats_in_smem<D>(item_v_stats<D>(smem, k), p.v_mean != nullptr, t);
    } else {
      vs = load_v_stats<true, D>(p, k_head, t);  // the d64 dual loop's kernel: global loads after the last P·V
    }

    const float sums[2] = {o[D / 8][0], o[D / 8][2]};  // every lane of the quad holds its rows' whole sums
    const auto& o_rows = reinterpret_cast<const float(&)[D / 8][4]>(o);
    if (bulk_store_out(p))
      stage_rows<D, T>(p, &out_map, smem + L::kOutOff + (wg - 1) * 64 * D * 2, vs, wk, wg, lane, o_rows, m, l, sums);
    else
      store_rows<true, D, T, L::kAhead>(p, static_cast<T*>(p.out) + wk.b * p.o_sb + wk.h * p.o_sh, vs, q_head,
                                        row0 + wrow, t, o_rows, m, l, sums);
  }
  if (threadIdx.x % 128 == 0) bulk_wait_read<0>();  // the staging buffer outlives the stores' reads
}

// The tensor maps of a call (family.cu builds them): the caller's 16-bit Q [B, Hq, nq, d] in boxes of 128 rows x 64
// columns, INT8 K [B * Hk, nk_pad, D] in boxes of 128 rows, FP8 V^T [B * Hk, D, nk_pad] in boxes of 128 keys, and
// where the kernel stores by it (bulk_store_out), the output [B, Hq, nq, d] in boxes of 64 rows x 64 columns;
// innermost dimension first, as the copy engine numbers them.
struct TensorMaps {
  CUtensorMap q, k, v, out;
};

// Where the call counts its prepared K/V heads (p.kv_ready), the kernel is launched as a programmatic dependent of the
// preparation, the launch ahead of it: its programs start on the SMs the preparation's last wave leaves free, and each
// waits only for the heads it reads (wait_kv_ready). Where the runtime refuses that, an ordinary launch.
template <int D, typename T, bool kLse, bool kDual>
void launch_attention_sm90(const TensorMaps& maps, const AttentionParams& p, cudaStream_t stream) {
  constexpr auto kernel = attention_sm90_kernel<D, T, kLse, kDual>;
  raise_dynamic_smem<kernel>(Layout<D>::kSmem);
  if (p.kv_ready != nullptr) {
    cudaLaunchAttribute dependent{};
    dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    dependent.val.programmaticStreamSerializationAllowed = 1;
    if (launch_with_attribute(dependent, dim3(program_count(p)), dim3(kThreads), Layout<D>::kSmem, stream, kernel,
                              maps.q, maps.k, maps.v, p, maps.out))
      return;
  }
  kernel<<<program_count(p), kThreads, Layout<D>::kSmem, stream>>>(maps.q, maps.k, maps.v, p, maps.out);
}

// One instantiation per padded head_dim (attention_d64.cu, attention_d128.cu). Every p.pv_accum runs two-level
// (at least the precision asked for). The dual loop (speculative exponents, two P·V buffers) runs at d64 from
// kDualMinKeys keys on, where it measured faster (session 27: +4 % at 16k keys, the same at 4k, 4 % slower at 1k);
// d128 has no registers for a second P·V buffer, and the LSE sums would spill.
constexpr int kDualMinKeys = 4096;

template <int D, typename T>
void launch_for(const TensorMaps& maps, const AttentionParams& p, cudaStream_t stream) {
  if (p.lse != nullptr) return launch_attention_sm90<D, T, true, false>(maps, p, stream);
  if constexpr (D == 64) {
    if (p.nk >= kDualMinKeys) return launch_attention_sm90<D, T, false, true>(maps, p, stream);
  }
  launch_attention_sm90<D, T, false, false>(maps, p, stream);
}

template <int D>
void run_attention_sm90(const TensorMaps& maps, const AttentionParams& p, DType dtype, cudaStream_t stream) {
  if (dtype == kBF16) launch_for<D, __nv_bfloat16>(maps, p, stream);
  else launch_for<D, half>(maps, p, stream);
}

}  // namespace sage::sm90
