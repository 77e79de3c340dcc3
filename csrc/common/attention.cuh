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
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/launch.h"
#include "common/params.h"
#include "common/ptx.cuh"

namespace sage {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
// FP8 P = e4m3(p * 448): p in [0, 1] uses e4m3's whole range. The FP8 kernels fold the stretch into the exponent
// (softmax_step<J, true>), so their P and row sums l are both stretched and the epilogue's o / l is unstretched.
constexpr float kLog2PScale = 8.807354922057604f;  // log2(448)
// Program shape per head_dim: warps, and m16 tiles per warp (two tiles share each K/V fragment load, but at
// head_dim 128 their accumulators no longer fit in registers). SAGE_ATTN_WARPS/_MTILES override it, for A/B runs.
template <int D>
struct Shape {
#ifdef SAGE_ATTN_WARPS
  static constexpr int kWarps = SAGE_ATTN_WARPS, kMTiles = SAGE_ATTN_MTILES;
#else
  static constexpr int kWarps = D <= 64 ? 4 : 8, kMTiles = D <= 64 ? 2 : 1;
#endif
};

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of kChunks chunks per row, swizzled so that the
// 8 rows an ldmatrix reads at one chunk land in 8 different bank groups.
template <int kChunks>
__device__ __forceinline__ int swizzle(int row, int chunk) {
  static_assert(kChunks == 4 || kChunks >= 8, "rows of 64 bytes or of 128 bytes and more");
  if constexpr (kChunks >= 8) return (row * kChunks + (chunk ^ (row & 7))) * 16;
  else return (row * 4 + (chunk ^ ((row >> 1) & 3))) * 16;
}

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<half>(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// pack2, with values past T's largest finite one saturated to it (NaN stays NaN): one conversion instruction.
template <typename T>
__device__ __forceinline__ uint32_t pack2_satfinite(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2_satfinite<half>(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
template <>
__device__ __forceinline__ uint32_t pack2_satfinite<__nv_bfloat16>(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.satfinite.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// x clamped to [-bound, bound]; NaN stays NaN
__device__ __forceinline__ float clamp_keep_nan(float x, float bound) {
  return fabsf(x) > bound ? copysignf(bound, x) : x;
}

// Channels c, c + 1 packed (pack2), or c alone (the low half) where !both.
template <typename T>
__device__ __forceinline__ void store2(T* dst, uint32_t packed, bool both) {
  if (both) *reinterpret_cast<uint32_t*>(dst) = packed;
  else *reinterpret_cast<uint16_t*>(dst) = static_cast<uint16_t>(packed);
}

// o += the fp16 accumulators of a tile (two f16x2 registers per m16n8 slice: rows g and g + 8).
template <int D, int kMT>
__device__ __forceinline__ void add_f16_accumulators(const uint32_t (&oh)[kMT][D / 8][2], float (&o)[kMT][D / 8][4]) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&oh[mt][n][0]));
      const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&oh[mt][n][1]));
      o[mt][n][0] += lo.x, o[mt][n][1] += lo.y, o[mt][n][2] += hi.x, o[mt][n][3] += hi.y;
    }
  }
}

// P·V of one 64-key tile with 16-bit operands, for the kMT m16 tiles of a warp: o += P (x, in T) · V (keys x
// channels in smem). Key steps are the outer loop, so consecutive MMAs feed independent accumulators.
template <int D, int kMT, typename T>
__device__ __forceinline__ void pv_16bit(const float (&x)[kMT][8][4], uint32_t v_base, int lane, int accum,
                                         float (&o)[kMT][D / 8][4]) {
  uint32_t a[kMT][4][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      a[mt][ks][0] = pack2<T>(x[mt][2 * ks][0], x[mt][2 * ks][1]);
      a[mt][ks][1] = pack2<T>(x[mt][2 * ks][2], x[mt][2 * ks][3]);
      a[mt][ks][2] = pack2<T>(x[mt][2 * ks + 1][0], x[mt][2 * ks + 1][1]);
      a[mt][ks][3] = pack2<T>(x[mt][2 * ks + 1][2], x[mt][2 * ks + 1][3]);
    }
  }
  // every MMA of the tile: mma(m tile, channel slice n, A fragment, B registers)
  auto each_mma = [&](auto&& mma) {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
#pragma unroll
      for (int nn = 0; nn < D / 16; ++nn) {
        uint32_t vb[4];
        const int r = ks * 16 + lane % 8 + 8 * ((lane / 8) % 2), c = 2 * nn + lane / 16;
        ptx::ldmatrix_x4_trans(vb, v_base + swizzle<D / 8>(r, c));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma(mt, 2 * nn, a[mt][ks], vb[0], vb[1]);
          mma(mt, 2 * nn + 1, a[mt][ks], vb[2], vb[3]);
        }
      }
    }
  };
  if constexpr (std::is_same_v<T, half>) {
    if (accum == kAccF16Inner) {  // the tile in fp16 accumulators, then into fp32
      uint32_t oh[kMT][D / 8][2] = {};
      each_mma([&](int mt, int n, const uint32_t(&af)[4], uint32_t b0, uint32_t b1) {
        ptx::mma_f16_f16acc(oh[mt][n], af, b0, b1);
      });
      bool overflow = false;
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int n = 0; n < D / 8; ++n)
#pragma unroll
          for (int i = 0; i < 2; ++i)
            overflow |= __hisinf(__low2half(*reinterpret_cast<const __half2*>(&oh[mt][n][i]))) ||
                        __hisinf(__high2half(*reinterpret_cast<const __half2*>(&oh[mt][n][i])));
      // a tile sum past 65504 (|V| in the thousands) is redone in fp32 below: never an overflow SDPA would not have
      if (!__any_sync(0xffffffffu, overflow)) {
        add_f16_accumulators<D, kMT>(oh, o);
        return;
      }
    }
  }
  each_mma([&](int mt, int n, const uint32_t(&af)[4], uint32_t b0, uint32_t b1) {
    ptx::mma_16bit<T>(o[mt][n], af, b0, b1);
  });
}

// P of a tile (e4m3, already stretched by softmax_step<J, true> or sm90's tile_exp) in the 8-bit A-register layout
// of mma.sync m16n8k32, which wgmma's register A shares: a[s] is the k32 step s (keys 32s..32s+31, slices
// 4s..4s+3), register i holds row g (i even) or g + 8 (i odd) of its first or second 16 keys (i / 2).
template <int J>
__device__ __forceinline__ void pack_p_e4m3(const float (&x)[J][4], uint32_t (&a)[J / 4][4]) {
#pragma unroll
  for (int s = 0; s < J / 4; ++s) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int j = 4 * s + 2 * (i / 2), e = 2 * (i % 2);
      a[s][i] = ptx::e4m3x2(x[j][e], x[j][e + 1]) | (ptx::e4m3x2(x[j + 1][e], x[j + 1][e + 1]) << 16);
    }
  }
}

// P·V of one 64-key tile in FP8: P = e4m3(p * 448) in the key order of prepare()'s V^T (fp8_key_slot), V^T
// (channels x keys in smem). Slot 4t + i of a 32-key step holds key 2t + i % 2 of slice i / 2: exactly the two
// score columns this lane holds in each of two adjacent 8-key slices, so P needs no shuffle.
template <int D, int kMT>
__device__ __forceinline__ void pv_fp8(const float (&x)[kMT][8][4], uint32_t v_base, int lane, int accum,
                                       float (&o)[kMT][D / 8][4]) {
  uint32_t a[kMT][2][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) pack_p_e4m3<8>(x[mt], a[mt]);
  // every MMA of the tile: mma(m tile, channel slice n, A fragment, B registers)
  auto each_mma = [&](auto&& mma) {
#pragma unroll
    for (int s = 0; s < 2; ++s) {
#pragma unroll
      for (int nn = 0; nn < D / 16; ++nn) {
        uint32_t vb[4];
        const int r = nn * 16 + lane % 8 + 8 * (lane / 16), c = 2 * s + (lane / 8) % 2;
        ptx::ldmatrix_x4(vb, v_base + swizzle<kKBlock / 16>(r, c));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma(mt, 2 * nn, a[mt][s], vb[0], vb[1]);
          mma(mt, 2 * nn + 1, a[mt][s], vb[2], vb[3]);
        }
      }
    }
  };
#if defined(SAGE_FP8_F16_ACCUM)
  if (accum == kAccF16Inner) {  // V was scaled to +-2.25 so that 64 keys of p * 448 * v stay below 65504
    uint32_t oh[kMT][D / 8][2] = {};
    each_mma([&](int mt, int n, const uint32_t(&af)[4], uint32_t b0, uint32_t b1) {
      ptx::mma_e4m3_f16acc(oh[mt][n], af, b0, b1);
    });
    add_f16_accumulators<D, kMT>(oh, o);
    return;
  }
#endif
  if (accum == kAccF32) {  // straight into the running fp32 output
    each_mma([&](int mt, int n, const uint32_t(&af)[4], uint32_t b0, uint32_t b1) {
      ptx::mma_e4m3(o[mt][n], af, b0, b1);
    });
    return;
  }
  float acc[kMT][D / 8][4] = {};  // two-level: the tile in its own fp32 accumulators, then added
  each_mma([&](int mt, int n, const uint32_t(&af)[4], uint32_t b0, uint32_t b1) {
    ptx::mma_e4m3(acc[mt][n], af, b0, b1);
  });
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][n][e] += acc[mt][n][e];
}

// Scores a row must not see become -inf: keys past nk and, when causal, keys after the row's last one
// (row + causal_offset). x[j][e] is key key0 + 8j + 2t + (e & 1) of row `row` (e < 2) or row + 8. Callers run it only
// on tiles that reach the end or the diagonal (a warp-uniform test), so full tiles pay nothing; here each score is a
// compare and a select, no branch.
template <int J>
__device__ __forceinline__ void mask_scores(float (&x)[J][4], int key0, int t, int row, const AttentionParams& p) {
  int last[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) last[i] = p.causal ? min(p.nk - 1, row + 8 * i + p.causal_offset) : p.nk - 1;
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (key0 + 8 * j + 2 * t + (e & 1) > last[e / 2]) x[j][e] = -INFINITY;
}

// The exponent shift of P = exp2(x - shift) in a row whose max is m: m itself, or where kStretch (FP8 P·V takes
// P * 448) m - log2(448), one subtraction instead of a multiply per score. P's peak exp2(m - shift) must then stay
// <= 448, where e4m3 saturates: where m's ulp is coarse (|m| >= 2**20) the subtraction can round past log2(448)
// (ulp 1: to 9, ulp 16: to 16), and the shift steps one ulp back toward m. m - shift is exact there; finer ulps
// round by far less than the margin 8.85 - log2(448). m = -inf gives -inf. kRoom: scores may reach m + kRoom (log2
// units) and P still peaks at 448 (sm90's speculative tiles): the stretch is kRoom binades smaller.
template <bool kStretch, int kRoom = 0>
__device__ __forceinline__ float p_shift(float m) {
  if constexpr (!kStretch) return m;
  const float shift = m - (kLog2PScale - kRoom);
  return m - shift > 8.85f - kRoom ? __int_as_float(__float_as_int(shift) + (shift > 0.f ? 1 : -1)) : shift;
}

// The shift of a row whose running max is m; a row that has seen only masked keys keeps max -inf and is shifted as if
// 0, so that exp2 gives 0, not NaN.
template <bool kStretch, int kRoom = 0>
__device__ __forceinline__ float row_shift(float m) {
  return p_shift<kStretch, kRoom>(m == -INFINITY ? 0.f : m);
}

// The max over the quad of lanes holding a row.
__device__ __forceinline__ float quad_max(float x) {
#pragma unroll
  for (int off = 1; off < 4; off *= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}

// The online-softmax update of one row after a tile whose maximum in this lane is mx (combined here over the quad
// of lanes holding the row): m becomes the running max, alpha the factor that rescales what was accumulated before
// the tile (from the old shift to the new: both P's stretch and its rounding carry over), and the result is the
// tile's shift (p_shift).
template <bool kStretch>
__device__ __forceinline__ float online_max(float mx, float& m, float& alpha) {
  const float new_m = fmaxf(m, quad_max(mx));
  const float shift = row_shift<kStretch>(new_m);
  alpha = exp2_approx(p_shift<kStretch>(m) - shift);
  m = new_m;
  return shift;
}

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

__device__ __forceinline__ float quad_sum(float x) {
#pragma unroll
  for (int off = 1; off < 4; off *= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

// The epilogue of a lane's rows `row` and row + 8 of the head: normalize the P·V accumulators o
// (the m16n8 layout: o[n][2i + e] is channel 8n + 2t + e of row + 8i), undo the FP8 V scale, add V's mean back, store
// rows < nq and channels < d in the caller's layout, and the LSE. kFp8: o and l are both in units of the stretched P,
// so o / l is already in V's quantized units. l is this lane's part of the row sums (summed over the quad here);
// `sums`, where given, are the whole sums that normalize o instead (the sm90 kernel's, from the tensor cores), and l
// then serves the LSE alone.
// A 4 x 4 transpose among a quad: lane t's v[n] becomes lane n's v[t] (two exchange rounds, 2 x 2 blocks first).
__device__ __forceinline__ void quad_transpose(uint32_t (&v)[4], int t) {
  const bool hi = t & 2, odd = t & 1;
  uint32_t a = __shfl_xor_sync(0xffffffffu, hi ? v[0] : v[2], 2);
  uint32_t b = __shfl_xor_sync(0xffffffffu, hi ? v[1] : v[3], 2);
  if (hi) v[0] = a, v[1] = b;
  else v[2] = a, v[3] = b;
  a = __shfl_xor_sync(0xffffffffu, odd ? v[0] : v[1], 1);
  b = __shfl_xor_sync(0xffffffffu, odd ? v[2] : v[3], 1);
  if (odd) v[0] = a, v[2] = b;
  else v[1] = a, v[3] = b;
}

// The V scale and mean of a lane's channels (slice n: channels 8n + 2t and 8n + 2t + 1), which both of its rows use.
// The arrays are d_pad long, so channels past d read padding. Loaded all at once, so that their L2 round trips
// overlap.
template <int D>
struct VStats {
  float2 scale[D / 8], mean[D / 8];
};

template <bool kFp8, int D>
__device__ __forceinline__ VStats<D> load_v_stats(const AttentionParams& p, int64_t k_head, int t) {
  VStats<D> vs;
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    const int64_t c = k_head * D + n * 8 + 2 * t;
    vs.scale[n] = kFp8 ? *reinterpret_cast<const float2*>(p.v_scale + c) : float2{1.f, 1.f};
    vs.mean[n] = p.v_mean != nullptr ? *reinterpret_cast<const float2*>(p.v_mean + c) : float2{0.f, 0.f};
  }
  return vs;
}

// sums: the rows' sums of P as the tensor cores added them (the sm90 kernel), of P as rounded to e4m3, as o is. Then
// o / sum is a weighted mean of quantized V, within +-v_max but for fp32 rounding, and with kSaturate, only the
// conversion to T saturates (so that |V| near 65504 cannot round to inf in fp16: 3 instructions per value fewer);
// otherwise, and always with l's sums of unrounded P, the mean is clamped to +-v_max.
// 1 / a row's sum of P; 0 for a row without keys (its output 0 and its LSE -inf)
__device__ __forceinline__ float inverse_sum(float sum) { return sum > 0.f ? 1.f / sum : 0.f; }

// out_pair: a lane's two channels of one row (accumulators y0, y1; V's scale and mean of those channels), normalized
// by inv (1 / the row's sum, 0 for a row without keys), packed.
template <bool kFp8, typename T, bool kSaturate>
__device__ __forceinline__ uint32_t out_pair(const AttentionParams& p, float y0, float y1, float inv, bool has_keys,
                                             float2 scale, float2 mean) {
  y0 *= inv, y1 *= inv;
  if constexpr (kFp8) {
    // Exact attention is a weighted mean of V, so |out| <= v_max quantized units per channel; e4m3's rounding
    // of P (up to 1/16) can carry the quantized mean past that, to inf in fp16 for |V| near 65504. Clamping to
    // the bound only moves it toward the exact value.
    if (!kSaturate) y0 = clamp_keep_nan(y0, p.v_max), y1 = clamp_keep_nan(y1, p.v_max);
    y0 *= scale.x, y1 *= scale.y;
  }
  if (has_keys) y0 += mean.x, y1 += mean.y;
  return kSaturate ? pack2_satfinite<T>(y0, y1) : pack2<T>(y0, y1);
}

// Row r's LSE from its running max m and its sum of exp2(x - p_shift(m)), lse_sum (its lane t == 0 stores it).
template <bool kFp8>
__device__ __forceinline__ void store_lse(const AttentionParams& p, int64_t q_head, int r, int t, float m,
                                          float lse_sum) {
  if (p.lse != nullptr && t == 0 && r < p.nq)
    p.lse[q_head * p.nq + r] = lse_sum > 0.f ? (p_shift<kFp8>(m) + __log2f(lse_sum)) * kLn2 : -INFINITY;
}

template <bool kFp8, int D, typename T, bool kSaturate = false>
__device__ __forceinline__ void store_rows(const AttentionParams& p, T* out, const VStats<D>& vs, int64_t q_head,
                                           int row, int t, const float (&o)[D / 8][4], const float (&m)[2],
                                           const float (&l)[2], const float* sums = nullptr) {
  // Whole rows of 16-byte aligned channels (the same for the whole call): the quad trades its values so that each
  // lane stores one 8-channel slice in 16 bytes, full 32-byte sectors instead of half ones, and a quarter of the store
  // instructions.
  const bool whole_rows = p.d == D && vectorizable(p.out_rows());
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float lse_sum = p.lse != nullptr || sums == nullptr ? quad_sum(l[i]) : 0.f;  // kFp8: stretched by 448
    const float sum = sums != nullptr ? sums[i] : lse_sum;
    const int r = row + 8 * i;
    const float inv = inverse_sum(sum);
    auto channels = [&](int n) {  // this lane's two channels of slice n, 8n + 2t and 8n + 2t + 1, packed
      return out_pair<kFp8, T, kSaturate>(p, o[n][2 * i], o[n][2 * i + 1], inv, sum > 0.f, vs.scale[n], vs.mean[n]);
    };
    if (whole_rows) {
#pragma unroll
      for (int k = 0; k < D / 32; ++k) {  // slices 4k..4k+3; lane t stores slice 4k + t
        uint32_t v[4];
#pragma unroll
        for (int n = 0; n < 4; ++n) v[n] = channels(4 * k + n);
        quad_transpose(v, t);
        if (r < p.nq) ptx::store16(out + r * p.o_sn + 8 * (4 * k + t), v);
      }
    } else if (r < p.nq) {
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        const int c = n * 8 + 2 * t;
        if (c < p.d) store2<T>(out + r * p.o_sn + c, channels(n), c + 1 < p.d);
      }
    }
    store_lse<kFp8>(p, q_head, r, t, m[i], lse_sum);  // sum is of exp2(x - shift), shift = p_shift(m)
  }
}

// kFp8: P·V in e4m3 with V^T from prepare(); else 16-bit P·V in T (V's dtype). T is also the output's dtype.
// A warp owns kMT m16 tiles (16 * kMT query rows): K and V fragments loaded once serve all of them.
template <int D, int kWarps, int kMT, bool kFp8, typename T>
struct Tile {
  static constexpr int kRows = kWarps * 16 * kMT;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kQkChunks = D / 16;                     // 16-byte chunks per INT8 Q/K row
  static constexpr int kVChunks = kFp8 ? kKBlock / 16 : D / 8;  // per V^T row (64 keys) or 16-bit V row
  static constexpr int kVRows = kFp8 ? D : kKBlock;
  static constexpr int kQBytes = kRows * D;
  static constexpr int kKBytes = kKBlock * D;
  static constexpr int kVBytes = kVRows * kVChunks * 16;
  static constexpr int kSmem = kQBytes + 2 * (kKBytes + kVBytes);
};

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
