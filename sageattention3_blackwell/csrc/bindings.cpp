// PyTorch bindings of the sageattn3 CUDA kernels (module sageattn3._C).
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "attention.h"

namespace {

void check(const torch::Tensor& t, const char* name, at::ScalarType dtype) {
  TORCH_CHECK(t.is_cuda() && t.is_contiguous(), name, " must be a contiguous CUDA tensor");
  TORCH_CHECK(t.scalar_type() == dtype, name, " has dtype ", t.scalar_type(), ", expected ", dtype);
}

// x [..., L] float32, L % 16 == 0 -> (codes [..., L/2] uint8, scales [..., L/16] float8_e4m3fn).
std::vector<torch::Tensor> quantize(const torch::Tensor& x) {
  check(x, "x", at::kFloat);
  TORCH_CHECK(x.size(-1) % 16 == 0, "the quantized dim must be a multiple of 16, got ", x.size(-1));
  const c10::cuda::CUDAGuard guard(x.device());
  auto sizes = x.sizes().vec();
  sizes.back() /= 2;
  auto codes = torch::empty(sizes, x.options().dtype(at::kByte));
  sizes.back() /= 8;
  auto scales = torch::empty(sizes, x.options().dtype(at::kFloat8_e4m3fn));
  sage3::quantize_groups(x.data_ptr<float>(), codes.data_ptr<uint8_t>(),
                         reinterpret_cast<uint8_t*>(scales.data_ptr()), x.numel() / 16,
                         c10::cuda::getCurrentCUDAStream());
  return {codes, scales};
}

std::vector<torch::Tensor> attention(const torch::Tensor& q_codes, const torch::Tensor& q_scales,
                                     const torch::Tensor& k_codes, const torch::Tensor& k_scales,
                                     const torch::Tensor& v_codes, const torch::Tensor& v_scales,
                                     const c10::optional<torch::Tensor>& q_bias, int64_t n_k, double sm_scale,
                                     bool causal) {
  for (auto [t, name] : {std::pair{&q_codes, "q_codes"}, {&k_codes, "k_codes"}, {&v_codes, "v_codes"}})
    check(*t, name, at::kByte);
  for (auto [t, name] : {std::pair{&q_scales, "q_scales"}, {&k_scales, "k_scales"}, {&v_scales, "v_scales"}})
    check(*t, name, at::kFloat8_e4m3fn);
  if (q_bias) check(*q_bias, "q_bias", at::kFloat);
  const c10::cuda::CUDAGuard guard(q_codes.device());
  const int64_t head_dim = q_codes.size(3) * 2;
  TORCH_CHECK(head_dim == 64 || head_dim == 128, "head_dim must be 64 or 128 (padded by the caller)");
  auto out = torch::empty({q_codes.size(0), q_codes.size(1), q_codes.size(2), head_dim},
                          q_codes.options().dtype(at::kFloat));
  auto lse = torch::empty({q_codes.size(0), q_codes.size(1), q_codes.size(2)}, out.options());
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
  p.batch = int(q_codes.size(0));
  p.heads = int(q_codes.size(1));
  p.kv_group = int(q_codes.size(1) / k_codes.size(1));
  p.n_q_pad = int(q_codes.size(2));
  p.n_k = int(n_k);
  p.n_k_pad = int(k_codes.size(2));
  p.head_dim = int(head_dim);
  p.scale_log2 = float(sm_scale * 1.4426950408889634);
  p.causal = causal;
  int major = 0, minor = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, q_codes.get_device()));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, q_codes.get_device()));
  const auto stream = c10::cuda::getCurrentCUDAStream();
  if (major == 10 && minor == 0) {
    sage3::attention_sm100(p, stream);
  } else if (major == 12) {
    sage3::attention_sm120(p, stream);
  } else {
    TORCH_CHECK(false, "sageattn3 CUDA kernels need sm_100 or sm_120/sm_121, got sm_", major, minor);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {out, lse};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("quantize", &quantize, "NVFP4 quantization along the last dim");
  m.def("attention", &attention, "NVFP4 attention forward on quantized operands");
}
