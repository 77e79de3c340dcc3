// The sageattn3 CUDA kernels as CUDA implementations of torch.ops.sageattn3.* (schemas: sageattn3/ops.py), and
// the module sageattn3._C that loads them. torch_binding.h builds this file against libtorch's stable ABI or
// against ATen; the module uses CPython's limited API only.
#include "torch_binding.h"

#include "attention.h"

namespace {

using namespace sage_binding;

// A contiguous CUDA tensor of `dtype` whose data is `align`-byte aligned: the kernels load 4 bytes
// (codes, scales) or 16 bytes (quantize input) at a time.
void check(const Tensor& t, const char* name, ScalarType dtype, int64_t align) {
  require(t.is_cuda() && t.is_contiguous(), std::string(name) + " must be a contiguous CUDA tensor");
  require(t.scalar_type() == dtype,
          std::string(name) + " has dtype " + str(t.scalar_type()) + ", expected " + str(dtype));
  require(reinterpret_cast<uintptr_t>(t.data_ptr()) % align == 0,
          std::string(name) + " must be " + str(align) + "-byte aligned (a view at an odd offset is not; pass a copy)");
}

// check(), plus the device and the exact shape the kernels index: they read raw pointers unchecked.
void check(const Tensor& t, const char* name, ScalarType dtype, int device, Sizes shape) {
  check(t, name, dtype, 4);
  require(t.get_device() == device,
          std::string(name) + " is on cuda:" + str(t.get_device()) + ", q_codes on cuda:" + str(device));
  require(t.sizes().equals(shape), std::string(name) + " has shape " + str(t.sizes()) + ", expected " + str(shape));
}

// x [..., L] float32, L % 16 == 0 -> (codes [..., L/2] uint8, scales [..., L/16] float8_e4m3fn).
std::tuple<Tensor, Tensor> quantize(const Tensor& x) {
  check(x, "x", ScalarType::Float, 16);
  require(x.dim() > 0 && x.sizes()[x.dim() - 1] % 16 == 0,
          "the quantized dim must be a multiple of 16, got shape " + str(x.sizes()));
  const int device = x.get_device();
  const DeviceGuard guard(device);
  auto sizes = x.sizes().vec();
  sizes.back() /= 2;
  Tensor codes = empty(sizes, ScalarType::Byte, x);
  sizes.back() /= 8;
  Tensor scales = empty(sizes, ScalarType::Float8_e4m3fn, x);
  if (x.numel() > 0) {  // an empty grid is a launch error
    sage3::quantize_groups(static_cast<const float*>(x.data_ptr()), static_cast<uint8_t*>(codes.data_ptr()),
                           static_cast<uint8_t*>(scales.data_ptr()), x.numel() / 16, current_stream(device));
    cuda_check(cudaGetLastError());
  }
  return {codes, scales};
}

// The attention kernel for this GPU; a GPU without FP4 tensor cores is refused before any other work.
using AttentionKernel = void (*)(const sage3::AttentionParams&, cudaStream_t);
AttentionKernel attention_kernel_for(int device) {
  int major = 0, minor = 0;
  cuda_check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  cuda_check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major == 10 && minor == 0) return sage3::attention_sm100;
  require(major == 12, "sageattn3 CUDA kernels need sm_100 or sm_120/sm_121, got sm_" + str(major) + str(minor));
  return sage3::attention_sm120;
}

// Operands as sageattn3/prepare.py lays them out (see attention.h).
std::tuple<Tensor, Tensor> attention(const Tensor& q_codes, const Tensor& q_scales, const Tensor& k_codes,
                                     const Tensor& k_scales, const Tensor& v_codes, const Tensor& v_scales,
                                     const std::optional<Tensor>& q_bias, int64_t n_k, const Tensor& scales,
                                     bool causal, int64_t causal_offset) {
  require(q_codes.is_cuda(), "q_codes must be a CUDA tensor");
  const int device = q_codes.get_device();
  const AttentionKernel kernel = attention_kernel_for(device);
  require(q_codes.dim() == 4 && k_codes.dim() == 4, "q_codes and k_codes must be 4-D, got shapes " +
                                                        str(q_codes.sizes()) + " and " + str(k_codes.sizes()));
  const int64_t batch = q_codes.size(0), heads = q_codes.size(1), n_q_pad = q_codes.size(2);
  const int64_t head_dim = q_codes.size(3) * 2, kv_heads = k_codes.size(1), n_k_pad = k_codes.size(2);
  require(head_dim == 64 || head_dim == 128, "head_dim must be 64 or 128 (padded by the caller), got " + str(head_dim));
  require(kv_heads > 0 && heads % kv_heads == 0,
          "q heads (" + str(heads) + ") must be a multiple of k/v heads (" + str(kv_heads) + ")");
  require(n_q_pad % sage3::kQBlock == 0 && n_k_pad % sage3::kKvTile == 0,
          "token counts must be padded to " + str(sage3::kQBlock) + " (q) and " + str(sage3::kKvTile) +
              " (k, v), got " + str(n_q_pad) + " and " + str(n_k_pad));
  check(q_codes, "q_codes", ScalarType::Byte, device, {batch, heads, n_q_pad, head_dim / 2});
  check(q_scales, "q_scales", ScalarType::Float8_e4m3fn, device, {batch, heads, n_q_pad, head_dim / 16});
  check(k_codes, "k_codes", ScalarType::Byte, device, {batch, kv_heads, n_k_pad, head_dim / 2});
  check(k_scales, "k_scales", ScalarType::Float8_e4m3fn, device, {batch, kv_heads, n_k_pad, head_dim / 16});
  check(v_codes, "v_codes", ScalarType::Byte, device, {batch, kv_heads, head_dim, n_k_pad / 2});
  check(v_scales, "v_scales", ScalarType::Float8_e4m3fn, device, {batch, kv_heads, head_dim, n_k_pad / 16});
  if (q_bias) check(*q_bias, "q_bias", ScalarType::Float, device, {batch, heads, n_q_pad / sage3::kQBlock, n_k_pad});
  check(scales, "scales", ScalarType::Float, device, {3});
  // The kernels add causal_offset to row indices in 32-bit ints: keep it within the padded sizes.
  require(n_k >= 0 && n_k <= n_k_pad && causal_offset >= -n_q_pad && causal_offset <= n_k_pad,
          "n_k must be in [0, " + str(n_k_pad) + "] and causal_offset in [-" + str(n_q_pad) + ", " + str(n_k_pad) +
              "], got " + str(n_k) + " and " + str(causal_offset));
  const DeviceGuard guard(device);
  Tensor out = empty({batch, heads, n_q_pad, head_dim}, ScalarType::Float, q_codes);
  Tensor lse = empty({batch, heads, n_q_pad}, ScalarType::Float, q_codes);
  sage3::AttentionParams p{};
  p.q_codes = static_cast<const uint8_t*>(q_codes.data_ptr());
  p.q_scales = static_cast<const uint8_t*>(q_scales.data_ptr());
  p.k_codes = static_cast<const uint8_t*>(k_codes.data_ptr());
  p.k_scales = static_cast<const uint8_t*>(k_scales.data_ptr());
  p.v_codes = static_cast<const uint8_t*>(v_codes.data_ptr());
  p.v_scales = static_cast<const uint8_t*>(v_scales.data_ptr());
  p.q_bias = q_bias ? static_cast<const float*>(q_bias->data_ptr()) : nullptr;
  p.out = static_cast<float*>(out.data_ptr());
  p.lse = static_cast<float*>(lse.data_ptr());
  p.batch = int(batch);
  p.heads = int(heads);
  p.kv_group = int(heads / kv_heads);
  p.n_q_pad = int(n_q_pad);
  p.n_k = int(n_k);
  p.n_k_pad = int(n_k_pad);
  p.head_dim = int(head_dim);
  p.scales = static_cast<const float*>(scales.data_ptr());
  p.causal = causal;
  p.causal_offset = int(causal_offset);
  if (out.numel() > 0) {  // an empty grid is a launch error
    kernel(p, current_stream(device));
    cuda_check(cudaGetLastError());
  }
  return {out, lse};
}

}  // namespace

SAGE_CUDA_KERNELS(sageattn3, m) {
  m.impl("quantize", SAGE_KERNEL(quantize));
  m.impl("attention", SAGE_KERNEL(attention));
}

SAGE_PYTHON_MODULE(_C)
