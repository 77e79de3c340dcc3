// PyTorch bindings of the sageattn3 CUDA kernels (module sageattn3._C).
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "attention.h"

namespace {

// Numbers reach error messages as strings. Streaming an integer into TORCH_CHECK's std::ostream
// instantiates libstdc++ stream code inside this library; built with a g++ newer than the libstdc++
// Python had loaded, that code crashed (SIGSEGV) on an H200 machine instead of raising the error.
std::string str(int64_t n) { return std::to_string(n); }

std::string str(at::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// A contiguous CUDA tensor of `dtype` whose data is `align`-byte aligned: the kernels load 4 bytes
// (codes, scales) or 16 bytes (quantize input) at a time.
void check(const torch::Tensor& t, const char* name, at::ScalarType dtype, int64_t align) {
  TORCH_CHECK(t.is_cuda() && t.is_contiguous(), name, " must be a contiguous CUDA tensor");
  TORCH_CHECK(t.scalar_type() == dtype, name, " has dtype ", t.scalar_type(), ", expected ", dtype);
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % align == 0, name, " must be ", str(align),
              "-byte aligned (a view at an odd offset is not; pass a copy)");
}

// check(), plus the device and the exact shape the kernels index: they read raw pointers unchecked.
void check(const torch::Tensor& t, const char* name, at::ScalarType dtype, at::Device device,
           at::IntArrayRef shape) {
  check(t, name, dtype, 4);
  TORCH_CHECK(t.device() == device, name, " is on ", t.device(), ", q_codes on ", device);
  TORCH_CHECK(t.sizes() == shape, name, " has shape ", str(t.sizes()), ", expected ", str(shape));
}

// x [..., L] float32, L % 16 == 0 -> (codes [..., L/2] uint8, scales [..., L/16] float8_e4m3fn).
std::vector<torch::Tensor> quantize(const torch::Tensor& x) {
  check(x, "x", at::kFloat, 16);
  TORCH_CHECK(x.dim() > 0 && x.size(-1) % 16 == 0, "the quantized dim must be a multiple of 16, got shape ",
              str(x.sizes()));
  const c10::cuda::CUDAGuard guard(x.device());
  auto sizes = x.sizes().vec();
  sizes.back() /= 2;
  auto codes = torch::empty(sizes, x.options().dtype(at::kByte));
  sizes.back() /= 8;
  auto scales = torch::empty(sizes, x.options().dtype(at::kFloat8_e4m3fn));
  if (x.numel() > 0) {  // an empty grid is a launch error
    sage3::quantize_groups(x.data_ptr<float>(), codes.data_ptr<uint8_t>(),
                           reinterpret_cast<uint8_t*>(scales.data_ptr()), x.numel() / 16,
                           c10::cuda::getCurrentCUDAStream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {codes, scales};
}

// The attention kernel for this GPU; a GPU without FP4 tensor cores is refused before any other work.
using AttentionKernel = void (*)(const sage3::AttentionParams&, cudaStream_t);
AttentionKernel attention_kernel_for(int device) {
  int major = 0, minor = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major == 10 && minor == 0) return sage3::attention_sm100;
  TORCH_CHECK(major == 12, "sageattn3 CUDA kernels need sm_100 or sm_120/sm_121, got sm_", str(major), str(minor));
  return sage3::attention_sm120;
}

// Operands as sageattn3/prepare.py lays them out (see attention.h).
std::vector<torch::Tensor> attention(const torch::Tensor& q_codes, const torch::Tensor& q_scales,
                                     const torch::Tensor& k_codes, const torch::Tensor& k_scales,
                                     const torch::Tensor& v_codes, const torch::Tensor& v_scales,
                                     const c10::optional<torch::Tensor>& q_bias, int64_t n_k,
                                     const torch::Tensor& scales, bool causal, int64_t causal_offset) {
  TORCH_CHECK(q_codes.is_cuda(), "q_codes must be a CUDA tensor");
  const AttentionKernel kernel = attention_kernel_for(q_codes.get_device());
  TORCH_CHECK(q_codes.dim() == 4 && k_codes.dim() == 4, "q_codes and k_codes must be 4-D, got shapes ",
              str(q_codes.sizes()), " and ", str(k_codes.sizes()));
  const int64_t batch = q_codes.size(0), heads = q_codes.size(1), n_q_pad = q_codes.size(2);
  const int64_t head_dim = q_codes.size(3) * 2, kv_heads = k_codes.size(1), n_k_pad = k_codes.size(2);
  TORCH_CHECK(head_dim == 64 || head_dim == 128, "head_dim must be 64 or 128 (padded by the caller), got ",
              str(head_dim));
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0, "q heads (", str(heads), ") must be a multiple of k/v heads (",
              str(kv_heads), ")");
  TORCH_CHECK(n_q_pad % sage3::kQBlock == 0 && n_k_pad % sage3::kKvTile == 0, "token counts must be padded to ",
              str(sage3::kQBlock), " (q) and ", str(sage3::kKvTile), " (k, v), got ", str(n_q_pad), " and ",
              str(n_k_pad));
  const at::Device device = q_codes.device();
  check(q_codes, "q_codes", at::kByte, device, {batch, heads, n_q_pad, head_dim / 2});
  check(q_scales, "q_scales", at::kFloat8_e4m3fn, device, {batch, heads, n_q_pad, head_dim / 16});
  check(k_codes, "k_codes", at::kByte, device, {batch, kv_heads, n_k_pad, head_dim / 2});
  check(k_scales, "k_scales", at::kFloat8_e4m3fn, device, {batch, kv_heads, n_k_pad, head_dim / 16});
  check(v_codes, "v_codes", at::kByte, device, {batch, kv_heads, head_dim, n_k_pad / 2});
  check(v_scales, "v_scales", at::kFloat8_e4m3fn, device, {batch, kv_heads, head_dim, n_k_pad / 16});
  if (q_bias) check(*q_bias, "q_bias", at::kFloat, device, {batch, heads, n_q_pad / sage3::kQBlock, n_k_pad});
  check(scales, "scales", at::kFloat, device, {3});
  // The kernels add causal_offset to row indices in 32-bit ints: keep it within the padded sizes.
  TORCH_CHECK(n_k >= 0 && n_k <= n_k_pad && causal_offset >= -n_q_pad && causal_offset <= n_k_pad,
              "n_k must be in [0, ", str(n_k_pad), "] and causal_offset in [-", str(n_q_pad), ", ", str(n_k_pad),
              "], got ", str(n_k), " and ", str(causal_offset));
  const c10::cuda::CUDAGuard guard(device);
  auto out = torch::empty({batch, heads, n_q_pad, head_dim}, q_codes.options().dtype(at::kFloat));
  auto lse = torch::empty({batch, heads, n_q_pad}, out.options());
  sage3::AttentionParams p{};
  p.q_codes = q_codes.data_ptr<uint8_t>();
  p.q_scales = reinterpret_cast<const uint8_t*>(q_scales.data_ptr());
  p.k_codes = k_codes.data_ptr<uint8_t>();
  p.k_scales = reinterpret_cast<const uint8_t*>(k_scales.data_ptr());
  p.v_codes = v_codes.data_ptr<uint8_t>();
  p.v_scales = reinterpret_cast<const uint8_t*>(v_scales.data_ptr());
  p.q_bias = q_bias ? q_bias->data_ptr<float>() : nullptr;
  p.out = out.data_ptr<float>();
  p.lse = lse.data_ptr<float>();
  p.batch = int(batch);
  p.heads = int(heads);
  p.kv_group = int(heads / kv_heads);
  p.n_q_pad = int(n_q_pad);
  p.n_k = int(n_k);
  p.n_k_pad = int(n_k_pad);
  p.head_dim = int(head_dim);
  p.scales = scales.data_ptr<float>();
  p.causal = causal;
  p.causal_offset = int(causal_offset);
  if (out.numel() > 0) {  // an empty grid is a launch error
    kernel(p, c10::cuda::getCurrentCUDAStream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {out, lse};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("quantize", &quantize, "NVFP4 quantization along the last dim");
  m.def("attention", &attention, "NVFP4 attention forward on quantized operands");
}
