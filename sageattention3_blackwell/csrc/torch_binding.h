// What a binding needs from torch, from one of two APIs chosen at compile time:
//   SAGE_STABLE_ABI=1  libtorch's stable ABI (torch/csrc/stable, C shim underneath), built with
//                      TORCH_TARGET_VERSION so one binary loads under every torch from that version on;
//   otherwise          ATen and TORCH_LIBRARY, for one torch version (the builds for torch < 2.10).
// A binding written against this header compiles unchanged in both. It registers kernels only: the operator
// schemas and their fake implementations are declared once, in Python (torch.library.define). Include it first:
// it includes Python.h (CPython's limited API when Py_LIMITED_API is defined, as the stable-ABI build does).
#pragma once

#include <Python.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>

#if SAGE_STABLE_ABI
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#if defined(_WIN32)
#define WIN32_LEAN_AND_MEAN
#define NOMINMAX
#include <windows.h>
#else
#include <dlfcn.h>
#endif
#else
#include <ATen/core/Tensor.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/sub.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>
#endif

namespace sage_binding {

using ScalarType = c10::ScalarType;  // header-only in the stable ABI, the same enum

#if SAGE_STABLE_ABI
using Tensor = torch::stable::Tensor;
using Sizes = torch::headeronly::IntHeaderOnlyArrayRef;
using DeviceGuard = torch::stable::accelerator::DeviceGuard;
#else
using Tensor = at::Tensor;
using Sizes = c10::IntArrayRef;
using DeviceGuard = c10::cuda::CUDAGuard;
#endif

// Errors are std::runtime_error with the message built as a std::string: torch turns them into Python's
// RuntimeError in both builds. No std::ostream formatting of numbers: built with a g++ newer than the
// libstdc++ Python had loaded, that code crashed (SIGSEGV) on an H200 machine instead of raising.
[[noreturn]] inline void fail(const std::string& message) { throw std::runtime_error(message); }

inline void require(bool ok, const std::string& message) {
  if (!ok) fail(message);
}

inline std::string str(int64_t n) { return std::to_string(n); }

inline std::string str(Sizes shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

inline std::string str(ScalarType dtype) { return c10::toString(dtype); }

inline void cuda_check(cudaError_t status) {
  if (status != cudaSuccess) fail(std::string("CUDA error: ") + cudaGetErrorString(status));
}

// An uninitialized tensor of `dtype` on `like`'s device.
inline Tensor empty(Sizes sizes, ScalarType dtype, const Tensor& like) {
#if SAGE_STABLE_ABI
  return torch::stable::new_empty(like, sizes, dtype);
#else
  return at::empty(sizes, like.options().dtype(dtype));
#endif
}

// The tensor operations the bindings use, under torch::stable's names in both builds.
#if SAGE_STABLE_ABI
using torch::stable::contiguous;
using torch::stable::matmul;
using torch::stable::pad;
using torch::stable::reshape;
using torch::stable::squeeze;
using torch::stable::subtract;
using torch::stable::transpose;
using torch::stable::view;

inline Tensor narrow(Tensor t, int64_t dim, int64_t start, int64_t length) {
  return torch::stable::narrow(t, dim, start, length);
}

inline Tensor to(const Tensor& t, ScalarType dtype) { return torch::stable::to(t, dtype); }

// The same bytes read as another dtype of the same size (aten::view.dtype, through the dispatcher). torch 2.14's
// headers have this overload themselves (loading under torch 2.10 and later, like ours).
#if !(defined(TORCH_VERSION_2_14_0) && TORCH_ABI_VERSION >= TORCH_VERSION_2_14_0)
inline Tensor view(const Tensor& t, ScalarType dtype) {
  std::array<StableIValue, 2> stack{torch::stable::detail::from(t), torch::stable::detail::from(dtype)};
  TORCH_ERROR_CODE_CHECK(torch_call_dispatcher("aten::view", "dtype", stack.data(), TORCH_ABI_VERSION));
  return torch::stable::detail::to<Tensor>(stack[0]);
}
#endif
#else
inline Tensor contiguous(const Tensor& t) { return t.contiguous(); }
using at::matmul;
inline Tensor pad(const Tensor& t, Sizes widths) { return at::constant_pad_nd(t, widths); }
inline Tensor reshape(const Tensor& t, Sizes sizes) { return t.reshape(sizes); }
inline Tensor squeeze(const Tensor& t, int64_t dim) { return t.squeeze(dim); }
inline Tensor subtract(const Tensor& a, const Tensor& b, double alpha) { return at::sub(a, b, alpha); }
inline Tensor transpose(const Tensor& t, int64_t a, int64_t b) { return t.transpose(a, b); }
inline Tensor view(const Tensor& t, Sizes sizes) { return t.view(sizes); }
inline Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  return t.narrow(dim, start, length);
}
inline Tensor to(const Tensor& t, ScalarType dtype) { return t.to(dtype); }
inline Tensor view(const Tensor& t, ScalarType dtype) { return t.view(dtype); }
#endif

#if SAGE_STABLE_ABI
// libtorch_cuda's current-stream function, looked up in the copy torch has already loaded: the binary links
// only libtorch_cpu, so it builds against any torch >= 2.10 (CPU builds too) and loads under all of them.
inline cudaStream_t current_stream(int device) {
  using Fn = int32_t (*)(int32_t, void**);  // aoti_torch_get_current_cuda_stream (C shim)
  static const Fn get_stream = [] {
#if defined(_WIN32)
    HMODULE lib = GetModuleHandleA("torch_cuda.dll");
    return lib ? reinterpret_cast<Fn>(GetProcAddress(lib, "aoti_torch_get_current_cuda_stream")) : nullptr;
#else
    void* lib = dlopen("libtorch_cuda.so", RTLD_LAZY | RTLD_NOLOAD);
    return lib ? reinterpret_cast<Fn>(dlsym(lib, "aoti_torch_get_current_cuda_stream")) : nullptr;
#endif
  }();
  require(get_stream != nullptr, "the CUDA kernels need a CUDA build of torch (libtorch_cuda is not loaded)");
  void* stream = nullptr;
  require(get_stream(device, &stream) == AOTI_TORCH_SUCCESS, "cannot get the current CUDA stream");
  return static_cast<cudaStream_t>(stream);
}
#else
inline cudaStream_t current_stream(int device) { return c10::cuda::getCurrentCUDAStream(device).stream(); }
#endif

}  // namespace sage_binding

// SAGE_CUDA_KERNELS(ns, m) { m.impl("op", SAGE_KERNEL(function)); } registers CUDA kernels of operators that
// Python defines. A kernel takes const Tensor&, const std::optional<Tensor>&, int64_t, bool, double and
// returns a Tensor or a std::tuple of them.
#if SAGE_STABLE_ABI
#define SAGE_CUDA_KERNELS(ns, m) STABLE_TORCH_LIBRARY_IMPL(ns, CUDA, m)
#define SAGE_KERNEL(function) TORCH_BOX(&function)
#else
#define SAGE_CUDA_KERNELS(ns, m) TORCH_LIBRARY_IMPL(ns, CUDA, m)
#define SAGE_KERNEL(function) TORCH_FN(function)
#endif

// SAGE_PYTHON_MODULE(_C) defines the module whose import loads the library, and so runs its registrations; the
// module itself is empty (torch.ops.load_library loads the library the same way). SAGE_PYTHON_MODULE_WITH(_C,
// methods) gives it the torch-free functions of a PyMethodDef table (limited API).
#define SAGE_PYTHON_MODULE(name) SAGE_PYTHON_MODULE_WITH(name, nullptr)
#define SAGE_PYTHON_MODULE_WITH(name, methods)                                                                \
  PyMODINIT_FUNC PyInit_##name() {                                                                           \
    static PyModuleDef module = {PyModuleDef_HEAD_INIT, #name, nullptr, -1, methods, nullptr, nullptr, nullptr, \
                                 nullptr};                                                                   \
    return PyModule_Create(&module);                                                                         \
  }
