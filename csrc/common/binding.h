// The torch binding shared by every kernel family's module (included once, by csrc/<family>/bindings.cpp, which
// registers these functions). The only code here that knows torch: it checks arguments, allocates, picks the current
// stream and device, and fills the torch-free params of csrc/common/params.h. Written against torch_binding.h
// (sageattention3_blackwell/csrc/, shared with sageattn3), so that it builds against libtorch's stable ABI
// (SAGE_STABLE_ABI=1, torch >= 2.10) or against ATen alike; the schemas and fakes are sageattention/ops.py's.
#pragma once
#include "torch_binding.h"

#include <algorithm>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/params.h"

namespace sage::binding {

using namespace sage_binding;

inline int64_t padded_head_dim(int64_t d) { return d <= 64 ? 64 : 128; }
inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// q, k, v in the caller's layout -> [B, H, N, D] views, after the checks the kernels rely on.
struct Views {
  Tensor q, k, v;
  int64_t batch, hq, hk, nq, nk, d;
};

inline Views check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, bool nhd) {
  Views x;
  const char* names[3] = {"q", "k", "v"};
  const Tensor* ts[3] = {&q, &k, &v};
  for (int i = 0; i < 3; ++i) {
    const Tensor& t = *ts[i];
    const std::string name = names[i];
    require(t.is_cuda(), name + " must be a CUDA tensor");
    require(t.dim() == 4, name + " must be 4-D, got " + str(t.dim()) + " dimensions");
    require(t.scalar_type() == q.scalar_type(), "q, k, v must share one dtype");
    require(t.get_device() == q.get_device(), "q, k, v must be on one device");
    require(t.stride(3) == 1, name + " must be contiguous in head_dim");
  }
  require(q.scalar_type() == ScalarType::Half || q.scalar_type() == ScalarType::BFloat16,
          "sageattention's compiled kernels take float16 or bfloat16");
  x.q = nhd ? transpose(q, 1, 2) : q;
  x.k = nhd ? transpose(k, 1, 2) : k;
  x.v = nhd ? transpose(v, 1, 2) : v;
  x.batch = x.q.size(0), x.hq = x.q.size(1), x.nq = x.q.size(2), x.d = x.q.size(3);
  x.hk = x.k.size(1), x.nk = x.k.size(2);
  require(x.k.sizes().equals(x.v.sizes()), "k and v must have the same shape");
  require(x.k.size(0) == x.batch && x.k.size(3) == x.d, "q and k differ in batch or head_dim");
  require(x.hk > 0 && x.hq % x.hk == 0, "k/v heads (" + str(x.hk) + ") must divide q heads (" + str(x.hq) + ")");
  require(x.d >= 1 && x.d <= 128, "head_dim " + str(x.d) + " is not supported; the compiled kernels take 1..128");
  require(x.nq >= 1 && x.nk >= 1 && x.batch >= 1, "every dimension must be >= 1");
  return x;
}

inline sage::Strided strided(const Tensor& t) {
  return {t.data_ptr(), t.stride(0), t.stride(1), t.stride(2)};
}

// Whether every row of a 16-bit [B, H, N, D] view starts 16 bytes aligned (a size-1 dimension's stride is never
// used); positive: its strides are also nonzero, as the copy engine needs.
inline bool rows_aligned(const Tensor& t, bool positive = false) {
  bool ok = reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  for (int i = 0; i < 3; ++i) ok = ok && (t.size(i) == 1 || (t.stride(i) % 8 == 0 && (!positive || t.stride(i) > 0)));
  return ok;
}

inline bool readable_in_place(const Tensor& t, int64_t d, int64_t d_pad) {
  return d == d_pad && rows_aligned(t);
}

// One workspace for every intermediate of a call: a single allocation, carved at 256-byte boundaries.
struct Workspace {
  sage::PrepareParams p{};
  std::vector<std::pair<int64_t, int64_t>> parts;  // (offset, bytes) of q_i8, q_scale, k_i8, k_scale, k_mean,
                                                  // v_out, v_scale, v_mean, partials, counters
  Tensor buffer;
};

// quantize_q false: Q is left to the attention kernel (q_i8 and q_scale get no space and stay nullptr).
inline Workspace prepare(const Views& x, bool quantize_q, int q_gran, int k_gran, int v_mode, bool smooth_k,
                         bool smooth_v, float v_fp8_max, cudaStream_t stream) {
  require(q_gran >= 0 && q_gran <= 2 && k_gran >= 0 && k_gran <= 2, "granularity must be 0, 1 or 2");
  Workspace w;
  sage::PrepareParams& p = w.p;
  p.q = strided(x.q), p.k = strided(x.k), p.v = strided(x.v);
  p.batch = x.batch, p.hq = x.hq, p.hk = x.hk, p.nq = x.nq, p.nk = x.nk, p.d = x.d;
  p.d_pad = padded_head_dim(x.d);
  p.nq_pad = round_up(x.nq, sage::kQBlock), p.nk_pad = round_up(x.nk, sage::kKBlock);
  p.q_gran = q_gran, p.k_gran = k_gran, p.v_mode = v_mode, p.smooth_k = smooth_k, p.smooth_v = smooth_v;
  p.v_fp8_max = v_fp8_max;
  // statistics chunks of 256 tokens or more, at most 64 per head (the head's last chunk sums them all)
  p.chunk_len = static_cast<int>(std::max<int64_t>(256, round_up((x.nk + 63) / 64, sage::kKBlock)));
  p.n_chunks = static_cast<int>((x.nk + p.chunk_len - 1) / p.chunk_len);
  const int64_t bq = x.batch * x.hq, bk = x.batch * x.hk;
  const int64_t v_bytes = v_mode == sage::kVFp8 ? bk * p.d_pad * p.nk_pad
                          : v_mode == sage::kV16 ? bk * p.nk_pad * p.d_pad * 2 : 0;
  const int64_t q_rows = quantize_q ? bq * p.nq_pad : 0;
  const int64_t n_counters = 1 + 2 * bk;  // PrepareParams::counters, then kv_ready's B Hk + 1
  const int64_t sizes[10] = {q_rows * p.d_pad, q_rows * 4, bk * p.nk_pad * p.d_pad, bk * p.nk_pad * 4,
                             bk * p.d_pad * 4, v_bytes, bk * p.d_pad * 4, bk * p.d_pad * 4,
                             bk * p.n_chunks * 4 * p.d_pad * 4, (n_counters + bk + 1) * 4};
  int64_t total = 0;
  for (int64_t s : sizes) {
    w.parts.emplace_back(total, s);
    total += round_up(s, 256);
  }
  w.buffer = empty({total}, ScalarType::Byte, x.q);
  uint8_t* base = static_cast<uint8_t*>(w.buffer.data_ptr());
  auto at = [&](int i) { return base + w.parts[i].first; };
  p.q_i8 = q_rows ? reinterpret_cast<int8_t*>(at(0)) : nullptr;
  p.q_scale = q_rows ? reinterpret_cast<float*>(at(1)) : nullptr;
  p.k_i8 = reinterpret_cast<int8_t*>(at(2)), p.k_scale = reinterpret_cast<float*>(at(3));
  p.k_mean = reinterpret_cast<float*>(at(4)), p.v_out = v_bytes ? at(5) : nullptr;
  p.v_scale = v_mode == sage::kVFp8 ? reinterpret_cast<float*>(at(6)) : nullptr;
  p.v_mean = smooth_v ? reinterpret_cast<float*>(at(7)) : nullptr;
  p.partials = reinterpret_cast<float*>(at(8));
  p.counters = reinterpret_cast<int*>(at(9));
  p.kv_ready = p.counters + n_counters;
  // kept only where the preparation counts its heads in it (the attention kernel then waits on it)
  if (!sage::prepare_qkv(p, x.q.scalar_type() == ScalarType::BFloat16 ? sage::kBF16 : sage::kF16, stream))
    p.kv_ready = nullptr;
  cuda_check(cudaGetLastError());
  return w;
}

// Call under a device guard for q's device. The answer is kept per device: asking the runtime costs microseconds,
// which a small call feels. Calls hold the GIL, so the table is not written concurrently.
inline void check_device() {
  static bool runs[64] = {};  // devices known to run this module's kernels
  int device = 0, major = 0, minor = 0;
  cuda_check(cudaGetDevice(&device));
  if (device < 64 && runs[device]) return;
  if (sage::module_runs_on_current_device()) {
    if (device < 64) runs[device] = true;
    return;
  }
  cuda_check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  cuda_check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  fail("this sageattention module has no kernels for this GPU (sm_" + str(major) + str(minor) +
       "); rebuild with its arch in TORCH_CUDA_ARCH_LIST");
}

// Q as the sm90 kernel's copy engine reads it: t where its rows are aligned, else a contiguous copy with head_dim
// padded to a multiple of 8 by zeros.
inline Tensor copy_engine_readable(const Tensor& t) {
  if (rows_aligned(t, true)) return t;
  return contiguous(pad(t, {0, round_up(t.size(3), 8) - t.size(3)}));
}

// The fused op: quantize, attend, return (out in the caller's layout, lse [B, Hq, Nq] fp32 or an empty tensor).
// kPvFp8: this module's P·V (FP8 for the sm89 family, V's 16-bit dtype for sm80). kKernelQuantizesQ: the attention
// kernel quantizes Q itself from the caller's tensor (sm90), so prepare() leaves Q alone.
// The parameters after q, k, v are sageattention/compiled_call.py's CompiledCall after `family`, in order (a test
// checks the names).
template <bool kPvFp8, bool kKernelQuantizesQ>
std::tuple<Tensor, Tensor> attention(const Tensor& q, const Tensor& k, const Tensor& v, bool nhd, bool is_causal,
                                     int64_t causal_offset, double sm_scale, int64_t qk_gran, int64_t pv_accum,
                                     bool smooth_k, bool smooth_v, bool return_lse) {
  const Views x = check_inputs(q, k, v, nhd);
  require(pv_accum >= sage::kAccF32 && pv_accum <= sage::kAccF16Inner, "pv_accum must be 0, 1 or 2");
  const DeviceGuard guard(q.get_device());
  check_device();
  const cudaStream_t stream = current_stream(q.get_device());
  const int64_t d_pad = padded_head_dim(x.d);
  int accum = static_cast<int>(pv_accum);
#if !defined(SAGE_FP8_F16_ACCUM)
  if (kPvFp8 && accum == sage::kAccF16Inner) accum = sage::kAccTwoLevel;  // built without it: fp32, more precise
#endif
  const int v_mode = kPvFp8 ? sage::kVFp8
                     : (smooth_v || !readable_in_place(x.v, x.d, d_pad)) ? sage::kV16 : sage::kVNone;
  // an fp16 accumulator over 64 keys of p * 448 * v stays finite for |v| <= 2.25
  const float v_max = kPvFp8 && accum == sage::kAccF16Inner ? 2.25f : 448.f;
  // (copied before the preparation: the sm90 kernel may start before the launch ahead of it ends, and reads q16
  // without waiting for it)
  const Tensor q16 = kKernelQuantizesQ ? copy_engine_readable(x.q) : Tensor();
  const Workspace w = prepare(x, !kKernelQuantizesQ, static_cast<int>(qk_gran), static_cast<int>(qk_gran), v_mode,
                              smooth_k, smooth_v, v_max, stream);
  const sage::PrepareParams& p = w.p;
  const Tensor out = empty(q.sizes(), q.scalar_type(), q);
  const Tensor out_hnd = nhd ? transpose(out, 1, 2) : out;
  Tensor lse = return_lse ? empty({x.batch, x.hq, x.nq}, ScalarType::Float, q) : empty({0}, ScalarType::Float, q);
  sage::AttentionParams a{};
  a.q_i8 = p.q_i8, a.q_scale = p.q_scale, a.k_i8 = p.k_i8, a.k_scale = p.k_scale;
  a.kv_ready = p.kv_ready;
  if (kKernelQuantizesQ) a.q16 = strided(q16);
  a.q_gran = static_cast<int>(qk_gran);
  if (v_mode == sage::kVNone) a.v = strided(x.v);
  else a.v = {p.v_out, x.hk * p.nk_pad * d_pad, p.nk_pad * d_pad, d_pad};  // (fp8 V^T: only .ptr is read)
  a.v_scale = p.v_scale, a.v_max = v_max, a.v_mean = p.v_mean;
  a.out = out_hnd.data_ptr(), a.o_sb = out_hnd.stride(0), a.o_sh = out_hnd.stride(1), a.o_sn = out_hnd.stride(2);
  a.lse = return_lse ? static_cast<float*>(lse.data_ptr()) : nullptr;
  a.batch = p.batch, a.hq = p.hq, a.hk = p.hk, a.nq = p.nq, a.nk = p.nk, a.d = p.d;
  a.nq_pad = p.nq_pad, a.nk_pad = p.nk_pad;
  a.scale_log2 = static_cast<float>(sm_scale) * 1.4426950408889634f;
  a.causal = is_causal, a.causal_offset = static_cast<int>(causal_offset), a.pv_accum = accum;
  const sage::DType dtype = q.scalar_type() == ScalarType::BFloat16 ? sage::kBF16 : sage::kF16;
  if constexpr (kPvFp8) sage::attention_pv8(a, dtype, static_cast<int>(d_pad), stream);
  else sage::attention_pv16(a, dtype, static_cast<int>(d_pad), stream);
  cuda_check(cudaGetLastError());
  if (return_lse && smooth_k) {  // add back what K smoothing subtracted from every score of a row: sm_scale q·mean(k)
    const Tensor k_mean = narrow(view(view(narrow(w.buffer, 0, w.parts[4].first, w.parts[4].second),
                                           ScalarType::Float), {x.batch, x.hk, d_pad, 1}), 2, 0, x.d);  // [B, Hk, d, 1]
    // q's heads in groups of Hq / Hk, each group against its k/v head's mean: [B, Hk, (Hq / Hk) Nq, d]
    const Tensor q_groups = reshape(to(x.q, ScalarType::Float), {x.batch, x.hk, x.hq / x.hk * x.nq, x.d});
    const Tensor scores = reshape(squeeze(matmul(q_groups, k_mean), 3), {x.batch, x.hq, x.nq});
    lse = subtract(lse, scores, -sm_scale);
  }
  return {out, lse};
}

// The intermediates of prepare(), for tests: q_i8, q_scale, k_i8, k_scale, k_mean, v_out, v_scale, v_mean.
// A part that the mode leaves out is an empty tensor (ops.py's quantize gives None for it).
using Parts = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;
inline Parts quantize(const Tensor& q, const Tensor& k, const Tensor& v, bool nhd, int64_t q_gran, int64_t k_gran,
                      int64_t v_mode, bool smooth_k, bool smooth_v, double v_fp8_max) {
  const Views x = check_inputs(q, k, v, nhd);
  require(v_mode >= sage::kVNone && v_mode <= sage::kV16, "v_mode must be 0, 1 or 2");
  const DeviceGuard guard(q.get_device());
  check_device();
  const Workspace w = prepare(x, true, static_cast<int>(q_gran), static_cast<int>(k_gran), static_cast<int>(v_mode),
                              smooth_k, smooth_v, static_cast<float>(v_fp8_max), current_stream(q.get_device()));
  const sage::PrepareParams& p = w.p;
  const int64_t dp = p.d_pad;
  const Tensor none = empty({0}, ScalarType::Float, q);
  auto part = [&](int i, ScalarType dtype, Sizes shape) {
    return view(view(narrow(w.buffer, 0, w.parts[i].first, w.parts[i].second), dtype), shape);
  };
  Tensor v_out = none;
  if (v_mode == sage::kVFp8) v_out = part(5, ScalarType::Float8_e4m3fn, {x.batch, x.hk, dp, p.nk_pad});
  else if (v_mode == sage::kV16) v_out = part(5, q.scalar_type(), {x.batch, x.hk, p.nk_pad, dp});
  return {part(0, ScalarType::Char, {x.batch, x.hq, p.nq_pad, dp}), part(1, ScalarType::Float, {x.batch, x.hq, p.nq_pad}),
          part(2, ScalarType::Char, {x.batch, x.hk, p.nk_pad, dp}), part(3, ScalarType::Float, {x.batch, x.hk, p.nk_pad}),
          part(4, ScalarType::Float, {x.batch, x.hk, dp}), v_out,
          v_mode == sage::kVFp8 ? part(6, ScalarType::Float, {x.batch, x.hk, dp}) : none,
          smooth_v ? part(7, ScalarType::Float, {x.batch, x.hk, dp}) : none};
}

// The module's torch-free functions (CPython's limited API): runs_on_current_device() and fp8_f16_accum(), whether
// it was built with the f16-accumulating FP8 MMA.
inline PyObject* runs_on_current_device(PyObject*, PyObject*) {
  return PyBool_FromLong(sage::module_runs_on_current_device());
}

inline PyObject* fp8_f16_accum(PyObject*, PyObject*) {
#if defined(SAGE_FP8_F16_ACCUM)
  return PyBool_FromLong(1);
#else
  return PyBool_FromLong(0);
#endif
}

inline PyMethodDef module_functions[] = {
    {"runs_on_current_device", runs_on_current_device, METH_NOARGS,
     "whether this module holds device code the current CUDA device runs"},
    {"fp8_f16_accum", fp8_f16_accum, METH_NOARGS, "whether it was built with the f16-accumulating FP8 MMA"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace sage::binding

// SAGE_FAMILY_MODULE(sm80, true/false, true/false) in csrc/<family>/bindings.cpp: the module sageattention._C_<family>
// and the CUDA kernels of its operators, torch.ops.sageattention_<family>.attention and .quantize (their schemas:
// sageattention/ops.py). kPvFp8 and kKernelQuantizesQ as attention() takes them.
#define SAGE_FAMILY_MODULE(family, pv_fp8, kernel_quantizes_q)                                            \
  SAGE_CUDA_KERNELS(sageattention_##family, m) {                                                           \
    m.impl("attention", SAGE_KERNEL((sage::binding::attention<pv_fp8, kernel_quantizes_q>)));             \
    m.impl("quantize", SAGE_KERNEL(sage::binding::quantize));                                              \
  }                                                                                                        \
  SAGE_PYTHON_MODULE_WITH(_C_##family, sage::binding::module_functions)
