// Hopper (sm_90a) primitives of the sm90 attention kernel, as inline PTX (PTX ISA 8.0): shared-memory matrix
// descriptors and wgmma ordering, mbarriers, bulk tensor copies (TMA) and register reallocation.
#pragma once
#include <cstdint>

#include <cuda.h>  // CUtensorMap (a type only: nothing links libcuda)

#include "common/ptx.cuh"

namespace sage::sm90 {

// Matrix descriptor of a K-major tile whose rows are `row_bytes` (64 or 128) long and swizzled at that width, as
// the bulk tensor copy writes it (one 8-row atom = 8 * row_bytes bytes, atoms contiguous). Start address, leading
// byte offset (unused for swizzled K-major tiles: 1), stride byte offset = one atom, all in 16-byte units; swizzle
// mode in bits 62-63 (1: 128 B, 2: 64 B). Stepping along K by 32 bytes adds 2 to the start address.
template <int kRowBytes>
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr) {
  static_assert(kRowBytes == 64 || kRowBytes == 128, "rows of 64 or 128 bytes");
  constexpr uint64_t kSwizzle = kRowBytes == 128 ? 1 : 2;
  return static_cast<uint64_t>((addr & 0x3ffff) >> 4) | (1ull << 16) |
         (static_cast<uint64_t>((8 * kRowBytes) >> 4) << 32) | (kSwizzle << 62);
}

// The descriptor of the tile `bytes` after the one desc describes: shared-memory addresses stay below 2^18, so the
// start address field takes bytes >> 4 in a 32-bit add of the low word that never carries out of it.
__device__ __forceinline__ uint64_t desc_at(uint64_t desc, uint32_t bytes) {
  return (desc & ~0xffffffffull) | (static_cast<uint32_t>(desc) + (bytes >> 4));
}

// A position in a ring of kStages shared-memory stages: the stage a tile occupies and the parity of its round (the
// phase of the stage's barriers that the tile's fill completes). A fresh barrier counts its phase of parity 1 as
// complete, so a producer waiting for parity ^ 1 on a stage's "empty" barrier passes in the first round.
template <int kStages>
struct RingPos {
  int stage = 0;
  uint32_t parity = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == kStages) stage = 0, parity ^= 1;
  }
  __device__ __forceinline__ int previous_stage() const { return stage == 0 ? kStages - 1 : stage - 1; }
};

// Byte offset of (row, byte) in a tile of kRowBytes-long rows swizzled at that width (the copy engine's and the
// wgmma descriptors' pattern: 16-byte chunk bits 4.. XOR address bits 7..).
template <int kRowBytes>
__device__ __forceinline__ int swizzled(int row, int byte) {
  const int off = row * kRowBytes + byte;
  return off ^ (((off >> 7) & (kRowBytes / 16 - 1)) << 4);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Registers handed between the warpgroups (the count must be a multiple of 8 in [24, 256]).
template <int kRegs>
__device__ __forceinline__ void regs_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs)); }
template <int kRegs>
__device__ __forceinline__ void regs_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs)); }

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(ptx::smem_addr(bar)), "r"(count));
}
// The initialized barriers, visible to the copy engine (the async proxy) before its first complete_tx.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(ptx::smem_addr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(ptx::smem_addr(bar)) : "memory");
}
// Blocks until the barrier's phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(ptx::smem_addr(bar)), "r"(parity)
      : "memory");
}

// A 3-D box of the tensor map at (c0, c1, c2) into shared memory; completes `bytes` on the barrier. Elements outside
// the tensor arrive as zeros.
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
      ::"r"(ptx::smem_addr(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2),
      "r"(ptx::smem_addr(bar))
      : "memory");
}

// The same for a 4-D box at (c0, c1, c2, c3).
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                            uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(ptx::smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(ptx::smem_addr(bar))
      : "memory");
}

// A 4-D box of shared memory at src out to the tensor map's box at (c0, c1, c2, c3), in this thread's current bulk
// group; elements outside the tensor are not written. The source must stay unchanged until bulk_wait_read says the
// copy engine has read it.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, const void* src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n"
               ::"l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(ptx::smem_addr(src))
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Blocks until at most kPending of this thread's bulk groups still read their shared-memory sources.
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}

// Four 8x8 b16 matrices to shared memory (the converse of ldmatrix_x4): lane l gives the row address of matrix l / 8,
// and r[j] holds row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix j, as in an m16n8 accumulator.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
}

// `bytes` (a multiple of 16) of contiguous global memory at src (16-byte aligned) into shared memory; completes them
// on the barrier.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               ::"r"(ptx::smem_addr(dst)), "l"(src), "r"(bytes), "r"(ptx::smem_addr(bar))
               : "memory");
}

// This thread's shared-memory writes, visible to the warpgroup MMAs (the async proxy) that read them next.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Global memory this thread has seen written (an acquire), visible as such to the bulk copies it issues next.
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

// Lets the launch that follows this one in the stream, where it is this one's programmatic dependent, start as soon as
// every program of this launch has executed this (on the SMs they leave).
__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

// Barrier `id` (1..15; 0 is __syncthreads') over `count` threads, a multiple of 32.
__device__ __forceinline__ void named_barrier(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Thread-block clusters: this program's rank and the cluster's size; a barrier over the cluster's threads, split
// into arrive (release: this program's shared-memory writes before it; relaxed: no writes to publish) and wait
// (acquire); a float of another program's shared memory at the address `local` has in this one.
__device__ __forceinline__ int cluster_rank() {
  int r;
  asm("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ int cluster_size() {
  int n;
  asm("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
  return n;
}
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }
__device__ __forceinline__ float load_from_rank(const float* local, int rank) {
  uint32_t remote;
  float v;
  asm("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(ptx::smem_addr(local)), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(remote) : "memory");
  return v;
}

}  // namespace sage::sm90
