// Host-side helpers for launching the module's kernels: per-device function attributes, and whether a kernel has
// device code for the current GPU.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace sage {

// Sets attribute kAttr of kKernel to `value` once per device (function attributes are kept per device); false where
// the device refused it (the refusal is not left behind as an error for the next launch to report).
template <auto kKernel, cudaFuncAttribute kAttr>
bool set_attribute_once(int value) {
  static int8_t state[64] = {};  // per device: 0 not yet set, 1 set, -1 refused
  int device = 0;
  cudaGetDevice(&device);
  int8_t unkept = 0;
  int8_t& s = device < 64 ? state[device] : unkept;
  if (s == 0) {
    s = cudaFuncSetAttribute(kKernel, kAttr, value) == cudaSuccess ? 1 : -1;
    if (s < 0) cudaGetLastError();
  }
  return s > 0;
}

// Lets kKernel use `bytes` of dynamic shared memory where that is over the default 48 KB.
template <auto kKernel>
bool raise_dynamic_smem(int bytes) {
  return bytes <= 48 * 1024 || set_attribute_once<kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize>(bytes);
}

// Launches kernel with one launch attribute (a cluster shape, a programmatic dependency); false where the runtime
// refused it, the refusal cleared rather than left for the next launch to report.
template <typename... Params, typename... Args>
bool launch_with_attribute(cudaLaunchAttribute attr, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                           void (*kernel)(Params...), const Args&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid, config.blockDim = block, config.dynamicSmemBytes = smem, config.stream = stream;
  config.attrs = &attr, config.numAttrs = 1;
  if (cudaLaunchKernelEx(&config, kernel, args...) == cudaSuccess) return true;
  cudaGetLastError();
  return false;
}

// Whether this module holds device code of kKernel that the current device can run.
template <auto kKernel>
bool has_device_code() {
  cudaFuncAttributes attr;
  const bool ok = cudaFuncGetAttributes(&attr, kKernel) == cudaSuccess;
  cudaGetLastError();  // a missing kernel image is an answer here, not an error for the next launch to report
  return ok;
}

}  // namespace sage
