// Host-side interface of sageattention's compiled kernels: plain structs of pointers, strides and sizes, no torch.
// Layouts (all intermediates contiguous, written by prepare(), read by the attention kernels):
//   q_i8    [B, Hq, nq_pad, d_pad] int8     q_scale [B, Hq, nq_pad] fp32 (one per row; rows of a group share it;
//                                           not written where the attention kernel quantizes Q: q_i8 nullptr)
//   k_i8    [B, Hk, nk_pad, d_pad] int8     k_scale [B, Hk, nk_pad] fp32 (one per key; likewise)
//   k_mean  [B, Hk, d_pad] fp32             (what K smoothing subtracted; zero when smooth_k is off)
//   v_fp8   [B, Hk, d_pad, nk_pad] e4m3     V^T, keys permuted within each 32-key group (kFp8KeySlot)
//   v_16    [B, Hk, nk_pad, d_pad] T        16-bit V, padded (only when the caller's V cannot be read in place)
//   v_scale, v_mean [B, Hk, d_pad] fp32
// Rows and columns past nq, nk, d are zero, so the kernels never read memory nothing wrote.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace sage {

constexpr int kQBlock = 128;  // query rows per quantization period (and per attention program at most)
constexpr int kKBlock = 64;   // keys per attention tile and per per-block K scale
constexpr int kWarpRows = 16; // query rows per attention warp (one m16 MMA tile)

// The enums that cross the binding: sageattention/compiled_call.py names them alike (kPerBlock is PER_BLOCK), and
// tests/sageattention/test_compiled_call.py checks that the two agree.
// Quantization granularity of Q and K (sageattention/quant_groups.py describes the same groups in Python).
enum Granularity : int { kPerBlock = 0, kPerWarp = 1, kPerThread = 2 };
// What prepare() does with V.
enum VMode : int { kVNone = 0, kVFp8 = 1, kV16 = 2 };
// P·V accumulation: kAccF32 accumulates every tile into the fp32 output; kAccTwoLevel gives each 64-key tile its own
// fp32 accumulator; kAccF16Inner gives each tile an fp16 accumulator (added to fp32 after the tile).
enum PvAccum : int { kAccF32 = 0, kAccTwoLevel = 1, kAccF16Inner = 2 };
enum DType : int { kF16 = 0, kBF16 = 1 };

struct Strided {  // a [B, H, N, D] tensor with unit stride along D; strides in elements
  const void* ptr;
  int64_t sb, sh, sn;
};

// Whether rows of x can be read or written 16 bytes (8 elements) at a time: aligned base and strides.
__host__ __device__ inline bool vectorizable(const Strided& x) {
  return reinterpret_cast<uintptr_t>(x.ptr) % 16 == 0 && x.sb % 8 == 0 && x.sh % 8 == 0 && x.sn % 8 == 0;
}

struct PrepareParams {
  Strided q, k, v;
  int batch, hq, hk, nq, nk, d, d_pad, nq_pad, nk_pad;
  int q_gran, k_gran, v_mode;
  bool smooth_k, smooth_v;
  float v_fp8_max;      // V^T is scaled to +-v_fp8_max (448, or less where an fp16 accumulator must not overflow)
  int n_chunks;         // token chunks of the statistics units (per K/V head)
  int chunk_len;        // tokens per chunk, a multiple of kKBlock
  float* partials;      // [B, Hk, n_chunks, 4, d_pad]: K sums, V max, V min, V sums
  int* counters;        // [1 + 2 B Hk], zeroed per call with kv_ready, which follows it: the units' ticket, then per
                        // head and tensor (K, V) its finished statistics chunks (n_chunks + 1 once they are finished)
  int* kv_ready;        // [B Hk + 1]: per head, its K and V blocks written so far (kv_ready_count once all are),
                        // then the heads complete; nullptr after a prepare_qkv that does not count them
  int lag_heads;        // heads between a head's statistics units and its quantization units (set at launch)
  int8_t* q_i8;
  float* q_scale;
  int8_t* k_i8;
  float* k_scale;
  float* k_mean;
  void* v_out;          // v_fp8 or v_16
  float* v_scale;
  float* v_mean;
};

struct AttentionParams {
  const int8_t* q_i8;   // nullptr where the kernel quantizes Q itself (the sm90 family), from q16:
  const float* q_scale;
  Strided q16;          // the caller's 16-bit Q, 16-byte aligned rows and strides
  int q_gran;
  const int8_t* k_i8;
  const float* k_scale;
  const int* kv_ready;  // PrepareParams::kv_ready: where set, the sm90 kernel starts while the preparation runs and
                        // reads a K/V head once its count is complete
  Strided v;            // 16-bit V rows (caller's or v_16), or v_fp8 (contiguous [B, Hk, d_pad, nk_pad])
  const float* v_scale; // FP8 P·V only
  float v_max;          // FP8 P·V: |quantized V| <= v_max (V = quantized V * v_scale)
  const float* v_mean;  // nullptr unless smooth_v
  void* out;            // [B, Hq, nq, d] with strides below (the caller's layout)
  int64_t o_sb, o_sh, o_sn;
  __host__ __device__ Strided out_rows() const { return {out, o_sb, o_sh, o_sn}; }
  float* lse;           // [B, Hq, nq] natural-log logsumexp of the (smoothed) scaled scores, or nullptr
  int batch, hq, hk, nq, nk, d, nq_pad, nk_pad;
  float scale_log2;     // sm_scale * log2(e)
  bool causal;
  int causal_offset;    // key j is visible to query i when j <= i + causal_offset
  int pv_accum;
};

// A head's K and V blocks of kKBlock keys: what kv_ready counts up to once the head is prepared.
__host__ __device__ inline int kv_ready_count(int nk_pad) { return 2 * (nk_pad / kKBlock); }

// Quantization (every family). True where the launch counts its prepared K/V heads in p.kv_ready: the attention
// kernel may then start before it ends (the sm90 family's clusters).
bool prepare_qkv(const PrepareParams& p, DType dtype, cudaStream_t stream);
// INT8 Q·K^T with 16-bit P·V (mma.sync, sm80+).
void attention_pv16(const AttentionParams& p, DType dtype, int d_pad, cudaStream_t stream);
// INT8 Q·K^T with FP8 e4m3 P·V (mma.sync, sm89+).
void attention_pv8(const AttentionParams& p, DType out_dtype, int d_pad, cudaStream_t stream);
// Whether the kernels of this module hold device code the current device can run.
bool module_runs_on_current_device();

}  // namespace sage
