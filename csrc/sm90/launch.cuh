// The sm90 kernel's launch: its tensor maps, the programmatic dependency on the preparation, and the choice of
// instantiation (LSE, dual loop) per call.
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/launch.h"
#include "common/params.h"
#include "sm90/kernel.cuh"
#include "sm90/tile_scheduler.cuh"
#include "sm90/traits.cuh"

namespace sage::sm90 {

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

// One instantiation per padded head_dim (attention_d64.cu, attention_d128.cu). Every p.pv_accum runs two-level (at
// least the precision asked for). The dual loop (speculative exponents, two P·V buffers) runs at d64 from kDualMinKeys
// keys on, where it measured faster (+4 % at 16k keys, the same at 4k, 4 % slower at 1k:
// docs/decisions/0010-sm90-d64-dual-loop.md); d128 has no registers for a second P·V buffer, and the LSE sums would
// spill.
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
