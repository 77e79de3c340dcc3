// The sm90 attention kernel (sm_90a): INT8 Q·K^T and FP8 e4m3 P·V on warpgroup MMAs, K/V tiles by the bulk tensor
// copy engine, producer/consumer warp specialization.
//
// A program has three warpgroups and runs work items of 128 query rows of one head: warpgroup 0 is the producer
// (one thread issues the copies of each item's 16-bit Q and of its K and V^T tiles of 128 keys into a ring of kStages
// shared-memory stages; the warpgroup gives its registers up), warpgroups 1 and 2 are consumers of 64 rows each. A
// consumer first quantizes its Q rows to INT8 in shared memory (the scales stay in registers; no separate pass over
// Q). Per tile it runs S = Q·K^T (wgmma m64n128k32 s8, both operands in shared memory), the online softmax on S in
// registers, and O += P·V (wgmma m64nDk32 e4m3, P from registers, V^T in shared memory) overlapped with the next
// tile's softmax, then frees the stage.
// The accumulator layout per warp is that of mma.sync m16n8 (rows g and g + 8 of the warp's 16, columns 2t, 2t + 1
// of every 8-column slice) and the 8-bit A-register layout that of mma.sync m16n8k32, so prepare()'s quantization
// groups and FP8 key order (fp8_key_slot) serve this kernel unchanged (csrc/common/attention.cuh explains them).
#pragma once
#include <algorithm>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/attention.cuh"
#include "common/prepare.cuh"
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
  static constexpr int kQBytes = kRows * D;
  static constexpr int kKBytes = kKeys * D;
  static constexpr int kVBytes = D * kKeys;
  // each region starts 1024-aligned: a swizzle atom's pattern follows its address bits
  static constexpr int kQOff = 0;
  static constexpr int kKOff = kQOff + kQBytes;
  static constexpr int kVOff = kKOff + kStages * kKBytes;
  static constexpr int kQ16Off = kVOff + kStages * kVBytes;
  static constexpr int kBarOff = kQ16Off + kQ16Bytes;
  static constexpr int kRedOff = kBarOff + 256;  // per-block Q maxima: [item parity][8 warps]
  static constexpr int kSmem = kBarOff + 1024 + 1024;  // barriers, and slack to align the dynamic base to 1024
};

// Byte offset of (row, byte) in a tile of kRowBytes-long rows swizzled at that width (the copy engine's and the
// wgmma descriptors' pattern: 16-byte chunk bits 4.. XOR address bits 7..).
template <int kRowBytes>
__device__ __forceinline__ int swizzled(int row, int byte) {
  const int off = row * kRowBytes + byte;
  return off ^ (((off >> 7) & (kRowBytes / 16 - 1)) << 4);
}

// INT8-quantizes this thread's Q rows `row` and row + 8 of the item (rows of the m16n8k32 A layout: bytes 4t..4t+3
// and 16+4t..+3 of every 32) from the 16-bit copy q16 into q8 (rows of D bytes, swizzled as the Q·K^T descriptor
// reads them) and returns their scale. The arithmetic and the scale groups (sageattention/quant_groups.py: a
// thread's two rows, a warp's 16, the item's 128) are prepare()'s, so the INT8 values and scales are the same.
// red is the per-block exchange of this item's parity.
template <int D, typename T>
__device__ __forceinline__ float quantize_q(const uint8_t* q16, uint8_t* q8, int row, int t, int gran, uint32_t* red) {
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
  const float inv = 1.f / scale;
#pragma unroll
  for (int p = 0; p < kPieces; ++p) {
    float v[4];
    to_floats<T>(raw[p], v);
    *reinterpret_cast<uint32_t*>(q8 + swizzled<D>(piece_row(p), piece_col(p))) = quantize4(v, inv);
  }
  fence_proxy_async();
  return scale;
}

// Issues d (+)= P·V over a tile's 128 keys (four k32 steps, V^T from the stage at v_smem); `fresh` overwrites d
// (the tile accumulator of two-level accumulation) instead of adding to it. The caller commits and waits.
template <int D>
__device__ __forceinline__ void pv_issue(float (&d)[D / 2], const uint32_t (&a)[4][4], uint32_t v_smem, bool fresh) {
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const uint64_t desc = smem_desc<128>(v_smem + 32 * s);
    if constexpr (D == 128) wgmma_e4m3_m64n128k32(d, a[s], desc, !fresh || s > 0);
    else wgmma_e4m3_m64n64k32(d, a[s], desc, !fresh || s > 0);
  }
}

// A work item: 128 query rows of one head. Items are numbered query block fastest, so the programs running at
// once share a head's K and V in L2; causal items run their longest (last) query block first.
struct Work {
  int row0, h, b, n_tiles;
  int q_head, kv_head;  // b * hq + h (the LSE's head) and b * hk + h's K/V head (the K/V maps' outer coordinate)
};

__device__ __forceinline__ Work work_item(int w, const AttentionParams& p) {
  const int n_qblocks = (p.nq + kRows - 1) / kRows;
  const int qblock = p.causal ? n_qblocks - 1 - w % n_qblocks : w % n_qblocks;
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

// kTwoLevel: each tile's P·V goes to a fresh fp32 accumulator that is added to o (upstream's "fp32+fp32"; the tensor
// cores' FP8 accumulation keeps fewer bits than fp32 across many tiles); otherwise P·V accumulates in o directly.
// Persistent: program i runs items i, i + gridDim.x, ...; the K/V ring and its barrier phases run on across items,
// so the producer loads the next item's Q and first tiles while the consumers finish the current one.
template <int D, typename T, bool kTwoLevel>
__global__ void __launch_bounds__(kThreads, 1)
    attention_sm90_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                          const __grid_constant__ CUtensorMap v_map, const AttentionParams p) {
  using L = Layout<D>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* const smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* const full = reinterpret_cast<uint64_t*>(smem + L::kBarOff);  // stage s holds tile data
  uint64_t* const empty = full + L::kStages;                              // stage s may be overwritten
  uint64_t* const q_full = empty + L::kStages;                            // 16-bit Q of the current item arrived
  uint64_t* const q_empty = q_full + 1;                                   // the consumers are done with it
  const int n_items = work_items(p);

  if (threadIdx.x == 0) {
    for (int s = 0; s < L::kStages; ++s) mbar_init(&full[s], 1), mbar_init(&empty[s], 2 * 128);
    mbar_init(q_full, 1), mbar_init(q_empty, 2 * 128);
    mbar_init_fence();
  }
  __syncthreads();

  const int wg = threadIdx.x / 128;
  if (wg == 0) {  // producer
    regs_dec<kProducerRegs>();
    if (threadIdx.x != 0) return;
    int ring = 0;  // tiles loaded so far: stage ring % kStages, in its round ring / kStages
    for (int w = blockIdx.x, k = 0; w < n_items; w += gridDim.x, ++k) {
      const Work wk = work_item(w, p);
      if (k > 0) mbar_wait(q_empty, (k - 1) & 1);
      mbar_arrive_expect_tx(q_full, L::kQ16Bytes);
#pragma unroll
      for (int box = 0; box < D / 64; ++box)
        tma_load_4d(smem + L::kQ16Off + box * kRows * 128, &q_map, 64 * box, wk.row0, wk.h, wk.b, q_full);
      for (int tile = 0; tile < wk.n_tiles; ++tile, ++ring) {
        const int s = ring % L::kStages, round = ring / L::kStages;
        if (round > 0) mbar_wait(&empty[s], (round - 1) & 1);
        mbar_arrive_expect_tx(&full[s], L::kKBytes + L::kVBytes);
        tma_load_3d(smem + L::kKOff + s * L::kKBytes, &k_map, 0, tile * kKeys, wk.kv_head, &full[s]);
        tma_load_3d(smem + L::kVOff + s * L::kVBytes, &v_map, tile * kKeys, 0, wk.kv_head, &full[s]);
      }
    }
    return;
  }

  regs_inc<kConsumerRegs>();
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int wrow = (wg - 1) * 64 + (threadIdx.x % 128) / 32 * 16 + g;  // this lane's rows: wrow and wrow + 8
  const uint32_t q_smem = ptx::smem_addr(smem + L::kQOff + (wg - 1) * 64 * D);
  auto v_smem = [&](int stage) { return ptx::smem_addr(smem + L::kVOff + stage * L::kVBytes); };
  float acc[kTwoLevel ? D / 2 : 1];  // two-level: the previous tile's P·V until it is added to o
  uint32_t pa[4][4];                 // the previous tile's P, read by its P·V while this tile's softmax runs
  int ring = 0;                      // tiles consumed so far, as the producer counts them

  for (int w = blockIdx.x, k = 0; w < n_items; w += gridDim.x, ++k) {
    const Work wk = work_item(w, p);
    const int row0 = wk.row0;
    const int64_t q_head = wk.q_head, k_head = wk.kv_head;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    float o[D / 8][4] = {};  // the m16n8 layout: channels 8n + 2t + {0, 1} of rows g and g + 8
    float(&o_flat)[D / 2] = reinterpret_cast<float(&)[D / 2]>(o);
    auto issue_pv = [&](int stage) {  // the previous tile's P·V, in flight until finish_pv
      if constexpr (kTwoLevel) pv_issue<D>(acc, pa, v_smem(stage), true);
      else pv_issue<D>(o_flat, pa, v_smem(stage), false);
      wgmma_commit();
    };
    auto finish_pv = [&](int stage) {  // waits for it, frees its stage, and (two-level) adds it to o
      wgmma_wait<0>();
      mbar_arrive(&empty[stage]);  // this thread's MMAs of the stage have completed
      if constexpr (kTwoLevel) {
#pragma unroll
        for (int i = 0; i < D / 2; ++i) o_flat[i] += acc[i];
      }
    };
    // K scales of a tile's two 64-key quantization periods (keys past nk_pad are masked), loaded a tile ahead
    auto load_ks = [&](int tile, float (&ks)[2]) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int key = tile * kKeys + 64 * half + 2 * t;
        ks[half] = key < p.nk_pad ? p.k_scale[k_head * p.nk_pad + key] : 0.f;
      }
    };
    float ks_next[2];
    load_ks(0, ks_next);
    mbar_wait(q_full, k & 1);
    // this warpgroup's INT8 Q rows are free: its last item's MMAs have all completed
    const float qs = quantize_q<D, T>(smem + L::kQ16Off, smem + L::kQOff, wrow, t, p.q_gran,
                                      reinterpret_cast<uint32_t*>(smem + L::kRedOff) + 8 * (k & 1)) *
                     p.scale_log2;
    named_barrier(wg, 128);  // the warpgroup's rows are all written before its MMAs read them
    if (wk.n_tiles == 0) mbar_arrive(q_empty);

    // Software pipeline: the tensor cores run tile j - 1's P·V while this warpgroup runs tile j's softmax.
    for (int tile = 0; tile < wk.n_tiles; ++tile) {
      const int s = (ring + tile) % L::kStages, prev = (ring + tile + L::kStages - 1) % L::kStages;
      const int key0 = tile * kKeys;
      const float ks[2] = {ks_next[0], ks_next[1]};
      if (tile + 1 < wk.n_tiles) load_ks(tile + 1, ks_next);
      mbar_wait(&full[s], ((ring + tile) / L::kStages) & 1);

      int sc[64];
      const uint32_t k_smem = ptx::smem_addr(smem + L::kKOff + s * L::kKBytes);
      wgmma_fence();  // orders this thread's writes of o, acc and pa before the MMAs that read them
#pragma unroll
      for (int kk = 0; kk < D / 32; ++kk)
        wgmma_s8_m64n128k32(sc, smem_desc<D>(q_smem + 32 * kk), smem_desc<D>(k_smem + 32 * kk), kk > 0);
      wgmma_commit();
      if (tile > 0) {
        issue_pv(prev);
        wgmma_wait<1>();  // S of this tile (committed first) is complete; P·V of the previous tile may still run
      } else {
        wgmma_wait<0>();
      }
      // Q·K^T of the item's last tile is done: the producer may load the next item's Q. (Releasing the 16-bit Q as
      // soon as it is read made persistent programs 4-10 % slower at every length, session 17: we think because
      // the two consumer warpgroups then drift apart across items, which shortens the K/V ring's effective lead.)
      if (tile == wk.n_tiles - 1) mbar_arrive(q_empty);

      const bool needs_mask =
          key0 + kKeys > p.nk || (p.causal && key0 + kKeys - 1 > row0 + wrow - g + p.causal_offset);
      // scores in log2 units, masked; online softmax per row (a row's 128 scores live in the 4 lanes of a quad).
      // (Fusing the dequantization into the exp2's FMA, with the max taken on the raw scores, breaks at huge scores:
      // the rounded max then differs from the fused product by up to half its ulp, so P's peak leaves [0, 448].)
      float x[16][4], alpha[2];
#pragma unroll
      for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) x[j][e] = static_cast<float>(sc[4 * j + e]) * (qs * ks[j / 8]);
      if (needs_mask) mask_scores<16>(x, key0, t, row0 + wrow, p);
      softmax_step<16, true, D == 64 ? 4 : 1>(x, m, l, alpha);

      if (tile > 0) {  // tile 0: o is still zero
        finish_pv(prev);
        // once the row maxima settle (long sequences) alpha is exactly 1 for the whole warp: skip the multiplies
        if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
          for (int i = 0; i < D / 2; ++i) o_flat[i] *= alpha[(i % 4) / 2];
        }
      }
      pack_p_e4m3<16>(x, pa);
    }
    if (wk.n_tiles > 0) {  // the last tile's P·V
      const int last = (ring + wk.n_tiles - 1) % L::kStages;
      wgmma_fence();
      issue_pv(last);
      finish_pv(last);
    }
    ring += wk.n_tiles;

    store_rows<true, D, T>(p, static_cast<T*>(p.out) + wk.b * p.o_sb + wk.h * p.o_sh, k_head, q_head, row0 + wrow, t,
                           o, m, l);
  }
}

// The tensor maps of a call (family.cu builds them): the caller's 16-bit Q [B, Hq, nq, d] in boxes of 128 rows x 64
// columns, INT8 K [B * Hk, nk_pad, D] in boxes of 128 rows, FP8 V^T [B * Hk, D, nk_pad] in boxes of 128 keys;
// innermost dimension first, as the copy engine numbers them.
struct TensorMaps {
  CUtensorMap q, k, v;
};

template <int D, typename T, bool kTwoLevel>
void launch_attention_sm90(const TensorMaps& maps, const AttentionParams& p, cudaStream_t stream) {
  constexpr auto kernel = attention_sm90_kernel<D, T, kTwoLevel>;
  raise_dynamic_smem<kernel>(Layout<D>::kSmem);
  // One program per SM, each running several items (all items take equally long). Causal items differ in length:
  // one program each, so the hardware hands the next item to whichever SM frees first.
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const int items = work_items(p);
  const int grid = p.causal ? items : std::min(items, sms);
  kernel<<<grid, kThreads, Layout<D>::kSmem, stream>>>(maps.q, maps.k, maps.v, p);
}

// One instantiation per padded head_dim (attention_d64.cu, attention_d128.cu).
template <int D>
void run_attention_sm90(const TensorMaps& maps, const AttentionParams& p, DType dtype, cudaStream_t stream) {
  const bool two_level = p.pv_accum != kAccF32;  // kAccF16Inner, which this kernel lacks, runs two-level
  if (dtype == kBF16) {
    if (two_level) launch_attention_sm90<D, __nv_bfloat16, true>(maps, p, stream);
    else launch_attention_sm90<D, __nv_bfloat16, false>(maps, p, stream);
  } else {
    if (two_level) launch_attention_sm90<D, half, true>(maps, p, stream);
    else launch_attention_sm90<D, half, false>(maps, p, stream);
  }
}

}  // namespace sage::sm90
