// Quantization kernels of the sm90 module: the shared ones (common/prepare.cuh), and for K/V heads that fit in the
// shared memory of a thread-block cluster, prepare_kv_cluster: one pass over K and V.
//
// prepare_kv (common/prepare.cuh) reads K and V twice, once for the statistics and once to quantize, and its
// quantization units wait for other programs' statistics; it is latency-bound (docs/design/prepare.md). Here a
// cluster of programs takes one head of K (or of V), each program a slice of its tokens, copied whole into shared
// memory by the bulk tensor copy engine; the programs exchange their per-channel partial statistics through
// distributed shared memory, then quantize their slices from shared memory. Each tensor is read from DRAM once, and no
// program waits for another cluster. The arithmetic is prepare_kv's, the same functions on rows read from shared
// memory, so the INT8 and FP8 values are the same given the same statistics (sums in another fixed order). Each
// program counts the blocks it wrote (p.kv_ready), and lets the attention kernel, launched as its programmatic
// dependent, start on the SMs the last programs leave: that kernel reads each head once its count is complete.
#include "common/launch.h"
#include "common/prepare.cuh"
#include "sm90/hopper.cuh"
#include "sm90/tensor_maps.h"

namespace sage::sm90 {
namespace {

// Slices of 32-64 KB of 16-bit rows (128-256 tokens at d128, 256-512 at d64) in clusters of up to 16 programs measured
// fastest on an H100; 128 KB slices (one program per SM) were slower than prepare_kv. Slices up to 80 KB (two programs
// per SM) still beat prepare_kv on Flux's 4608-token heads (docs/decisions/0006-sm90-prepare-cluster-slices.md), so
// heads up to 5120 tokens at d128 and 10240 at d64 take this path (past 8 programs a cluster has a non-portable size,
// which the launch allows).
constexpr int kMaxCluster = 16;
constexpr int kMinSliceBytes = 32 * 1024;
constexpr int kMaxSliceBytes = 80 * 1024;
constexpr int kClusterProgramsPerSm = 4;  // registers for four resident programs (shared memory holds four 32 KB ones)

// Tokens per program for a head of nk_pad tokens (whole 64-key blocks), or 0 where the head does not fit.
int cluster_slice(int nk_pad, int d_pad) {
  const int row_bytes = d_pad * 2, per_program = (nk_pad + kMaxCluster - 1) / kMaxCluster;
  const int blocks = (per_program + kKBlock - 1) / kKBlock;
  const int slice = std::min(nk_pad, std::max(kMinSliceBytes / row_bytes, blocks * kKBlock));
  return slice * row_bytes <= kMaxSliceBytes ? slice : 0;
}

// Counts `blocks` K or V blocks of `head` that this program has written into p.kv_ready; the program that completes
// the head's count also counts the head among the complete ones (p.kv_ready[B Hk]).
__device__ __forceinline__ void count_ready_blocks(const PrepareParams& p, int64_t head, int blocks) {
  __syncthreads();  // every thread's stores of the blocks come before the count
  if (threadIdx.x == 0 && ptx::add_acq_rel(p.kv_ready + head, blocks) + blocks == kv_ready_count(p.nk_pad))
    ptx::add_release(p.kv_ready + p.batch * p.hk, 1);
}

// Program `rank` of cluster 2 * head + of_v prepares tokens [rank * slice, +slice) of that head's K or V. Its rows are
// copied in boxes of 64 rows x 64 columns, 128-byte swizzled (a warp's 32 row reads at one column hit all banks),
// into one region per 64-column half of the head dimension.
template <typename T, int DPAD>
__global__ void __launch_bounds__(kPrepThreads, kClusterProgramsPerSm)
    prepare_kv_cluster(const __grid_constant__ CUtensorMap k_rows, const __grid_constant__ CUtensorMap v_rows,
                       const PrepareParams p, int slice) {
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(16) float partial[4 * DPAD];  // kv_statistics' layout: K sums, V max, V min, V sums
  __shared__ __align__(16) float mean[DPAD], inv_scale[DPAD];
  __shared__ __align__(16) union {  // the statistics' scratch, then V^T's transposed tile
    float red[8][kRedStride];
    uint8_t tile[DPAD][kKBlock];
  } scratch;
  __shared__ __align__(8) uint64_t loaded;
  launch_dependents();  // the attention kernel waits for each head's kv_ready count, not for this launch's end
  uint8_t* rows = smem_raw + ((1024 - ptx::smem_addr(smem_raw) % 1024) % 1024);  // swizzle atoms are 1024-aligned
  const int programs = cluster_size(), rank = cluster_rank(), unit = blockIdx.x / programs;
  const bool of_v = unit % 2;
  const int64_t head = unit / 2;
  const int b = static_cast<int>(head / p.hk), hk = static_cast<int>(head % p.hk);
  const int n0 = rank * slice, n1 = min(n0 + slice, p.nk_pad), half_bytes = slice * 128;
  if (threadIdx.x == 0) {
    mbar_init(&loaded, 1);
    mbar_init_fence();
    mbar_arrive_expect_tx(&loaded, (n1 - n0) * DPAD * 2);
    for (int n = n0; n < n1; n += kKBlock) {
#pragma unroll
      for (int half = 0; half < DPAD / 64; ++half)
        tma_load_4d(rows + half * half_bytes + (n - n0) * 128, of_v ? &v_rows : &k_rows, half * 64, n, hk, b, &loaded);
    }
  }
  __syncthreads();  // the barrier is initialized before anyone waits on it
  mbar_wait(&loaded, 0);
  auto load = [=](int n, int chunk) {
    return *reinterpret_cast<const uint4*>(rows + chunk / 8 * half_bytes + swizzled<128>(n - n0, chunk % 8 * 16));
  };
  kv_statistics<T, DPAD>(p, load, n0, statistics_needed(p, of_v) ? min(n1, p.nk) : n0, of_v, partial, scratch.red);
  cluster_arrive();  // every program's partials are written before any program reads them
  cluster_wait();
  const float* mine = partial + (of_v ? DPAD : 0) + threadIdx.x % DPAD;
  finish_statistics<T, DPAD>(
      p, of_v, programs, [mine](int i, int j) { return load_from_rank(mine + j * DPAD, i); },
      [&](int c, float m, float s) {
        mean[c] = m, inv_scale[c] = 1.f / s;
        if (rank == 0) publish_statistics(p, head, of_v, c, m, s);
      });
  cluster_arrive_relaxed();  // done reading the other programs' partials (their values are in mean and inv_scale)
  __syncthreads();
  for (int n = n0; n < n1; n += kKBlock) {
    if (!of_v) {
      quantize_block<T, kKBlock, DPAD>(load, n, p.nk, false, p.k_gran, mean, p.k_i8 + head * p.nk_pad * DPAD,
                                       p.k_scale + head * p.nk_pad, [] {});
    } else {
      v_to_fp8<T, DPAD>(p, b, hk, n, load, mean, inv_scale, [] {}, scratch.tile);
      __syncthreads();  // the transposed tile is read out before the next block writes it
    }
  }
  count_ready_blocks(p, head, (n1 - n0) / kKBlock);
  cluster_wait();  // no program leaves while another may still read its partials
}

// prepare_for_family's first try: K and V prepared in clusters where the call allows it (FP8 V^T, rows the copy
// engine can read, heads that fit); false where prepare_kv must do it (or the device cannot run the clusters).
struct InClusters {
  template <typename T, int DPAD>
  static bool launch_kv(const PrepareParams& p, cudaStream_t stream);
};

template <typename T, int DPAD>
bool InClusters::launch_kv(const PrepareParams& p, cudaStream_t stream) {
  const int slice = cluster_slice(p.nk_pad, DPAD);
  if (p.v_mode != kVFp8 || slice == 0 || !vectorizable(p.k) || !vectorizable(p.v)) return false;
  constexpr auto kKernel = prepare_kv_cluster<T, DPAD>;
  if (!raise_dynamic_smem<kKernel>(kMaxSliceBytes + 1024) ||
      !set_attribute_once<kKernel, cudaFuncAttributeNonPortableClusterSizeAllowed>(1))
    return false;
  const CUtensorMap k_rows = rows16_map(p.k, p.batch, p.hk, p.nk, p.d, kKBlock);
  const CUtensorMap v_rows = rows16_map(p.v, p.batch, p.hk, p.nk, p.d, kKBlock);
  const unsigned programs = (p.nk_pad + slice - 1) / slice;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = programs, cluster.val.clusterDim.y = 1, cluster.val.clusterDim.z = 1;
  // refused where the device has no room for the cluster: prepare_kv takes the call
  return launch_with_attribute(cluster, dim3(2u * p.batch * p.hk * programs), dim3(kPrepThreads),
                               static_cast<size_t>(slice) * DPAD * 2 + 1024, stream, kKernel, k_rows, v_rows, p, slice);
}

}  // namespace
}  // namespace sage::sm90

bool sage::prepare_qkv(const PrepareParams& p, DType dtype, cudaStream_t stream) {
  return prepare_for_family<true, sm90::InClusters>(p, dtype, stream);
}
