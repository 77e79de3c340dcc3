// The current device's SM count, which the launches size their grids by.
#pragma once
#include <cuda_runtime.h>

namespace sage {

// The current device's SM count (kept per device: the launches ask on every call).
inline int current_sm_count() {
  static int kept[64] = {};
  int device = 0, n = 0;
  cudaGetDevice(&device);
  int& sms = device < 64 ? kept[device] : n;
  if (sms == 0) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  return sms;
}

}  // namespace sage
