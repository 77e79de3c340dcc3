// The sm90 kernel's consumer warpgroups: per work item, Q quantized to INT8, the tile loop over the item's K/V tiles
// (S = Q·K^T, online softmax, O += P·V, software-pipelined), and the epilogue. Two tile loops: the single one of every
// kernel, and the d64 dual loop (two P·V buffers, speculative exponents; launch.cuh says where it runs). Both stay
// in this one function: as separate functions, each compiled to the same PTX instructions with other virtual register
// numbers, and ptxas then ordered the tile loops differently.
#pragma once
#include <cstdint>

#include "common/epilogue.cuh"
#include "common/params.h"
#include "common/ptx.cuh"
#include "common/softmax.cuh"
#include "sm90/epilogue.cuh"
#include "sm90/hopper.cuh"
#include "sm90/mma.cuh"
#include "sm90/quantize_q.cuh"
#include "sm90/softmax.cuh"
#include "sm90/tile_scheduler.cuh"
#include "sm90/traits.cuh"

namespace sage::sm90 {

// A consumer warpgroup (wg 1 or 2: 64 rows of each item) runs the program's items in turn. The K/V ring's position
// runs on across items, as the producer's does; q_full and q_empty are the Q buffers' barriers, full and empty the
// ring stages'.
template <int D, typename T, bool kLse, bool kDual>
__device__ __forceinline__ void consume(const AttentionParams& p, const CUtensorMap& out_map, uint8_t* smem,
                                        uint64_t* q_full, uint64_t* q_empty, uint64_t* full, uint64_t* empty,
                                        int n_items, int wg) {
  using L = Layout<D>;
  constexpr int kQ16Buffers = L::kQ16Buffers;
  constexpr bool kStagedVStats = !kDual;
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
      // (The loop below writes the same test inline. One shared function for both measured 2-3 % slower in this loop at
      // d64 16k and on CogVideoX: ptxas allocated its registers differently;
      // docs/decisions/0010-sm90-d64-dual-loop.md.)
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
      // slower at d128 (docs/decisions/0010-sm90-d64-dual-loop.md): compare its SASS after any change.)
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
        // releasing it as soon as it was read made persistent programs 4-10 % slower at every length,
        // docs/decisions/0008-sm90-buffer-release-timing.md: we think because the two consumer warpgroups then drift
        // apart across items.)
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
}  // namespace sage::sm90
