// fused_sparse_update (fused.h): a row-sparse gradient applied to the rows it touches, without a host
// synchronisation. The entries are ordered by row with a stable device sort (kiln's argsort); then one warp per
// entry that starts a run of equal rows sums the run's values in the entries' order (what SparseRowGrad::coalesce
// computes: index_add into zeros, each sum rounded to the values' dtype) and updates that row of the parameter and
// of its state. Each step is one rounding, as the kiln ops of the unfused path (sgd.cpp, sparse_adam.cpp,
// rowwise_adagrad.cpp) round it, with the _rn intrinsics so that nothing is contracted into a fused multiply-add:
// SGD and SparseAdam give the unfused path's values bit for bit; row-wise Adagrad's row mean may add in another
// order. A step counter is read as steps + 1 and incremented by a second launch; with found_inf != 0 nothing is
// written.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kiln/optim/cuda/checks.h"          // check_scalar, is_fused_dtype
#include "kiln/optim/cuda/fused.h"           // fused_sparse_update
#include "kiln/tensor/cuda/kernel_util.cuh"  // load_as, store_as, ceil_div, stream_for
#include "kiln/tensor/dispatch.h"            // Half, BFloat16
#include "kiln/tensor/cuda/cuda_check.h"     // KILN_CUDA_CHECK_LAUNCH
#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"  // argsort
#include "kiln/tensor/trace.h"         // a range per kernel entry

namespace kiln::optim::cuda_impl {
namespace {

using cuda::kdetail::load_as;
using cuda::kdetail::store_as;

constexpr int kWarpsPerBlock = 8;

struct SparseArgs {
  SparseRule rule;
  int64_t k = 0, rows = 0, width = 0;  // entries, the table's rows, elements per row
  float neg_lr = 0, one_minus_beta1 = 0, one_minus_beta2 = 0, eps = 0;
  double lr = 0, beta1 = 0, beta2 = 0;
  bool maximize = false;
};

// x rounded to T and read back as float (identity for float).
template <typename T>
__device__ __forceinline__ float round_to(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return cuda::to_compute<T>(cuda::from_compute<T>(x));
  }
}

// Column c of the run [begin, end) of sorted entries, summed in order from zero, each sum rounded to T; then
// divided by the gradient scale and negated for maximize, in float.
template <typename T>
__device__ __forceinline__ float run_grad(const T* values, const int64_t* order, int64_t begin, int64_t end,
                                          int64_t width, int64_t c, const float* grad_scale, bool maximize) {
  float acc = 0.f;
  for (int64_t e = begin; e < end; ++e) acc = round_to<T>(__fadd_rn(acc, load_as<float>(values + order[e] * width + c)));
  if (grad_scale != nullptr) acc = __fdiv_rn(acc, *grad_scale);
  return maximize ? -acc : acc;
}

template <typename T>
__global__ void sparse_update_kernel(T* param, const T* values, const int64_t* indices, const int64_t* order,
                                     float* state1, float* state2, const float* step, const float* grad_scale,
                                     const float* found_inf, SparseArgs a) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (j >= a.k) return;
  if (found_inf != nullptr && *found_inf != 0.f) return;
  const int64_t row = indices[order[j]];
  if (j > 0 && indices[order[j - 1]] == row) return;  // not the first entry of its row's run
  // A row outside the table was recorded by the lookup's index check and is raised at the next synchronisation:
  // it is not written here.
  if (row < 0 || row >= a.rows) return;
  int64_t end = j + 1;
  while (end < a.k && indices[order[end]] == row) ++end;
  const int64_t w = a.width;
  T* p = param + row * w;
  if (a.rule == SparseRule::Sgd) {
    for (int64_t c = lane; c < w; c += 32) {
      const float g = run_grad(values, order, j, end, w, c, grad_scale, a.maximize);
      store_as(p + c, __fadd_rn(load_as<float>(p + c), __fmul_rn(g, a.neg_lr)));
    }
  } else if (a.rule == SparseRule::Adam) {
    // step_size = lr * sqrt(1 - beta2^t) / (1 - beta1^t) in double, as the unfused path's host computes it.
    const double t = static_cast<double>(*step) + 1;
    const double step_size = a.lr * sqrt(1 - pow(a.beta2, t)) / (1 - pow(a.beta1, t));
    const auto neg_step = static_cast<float>(-step_size);
    float* m = state1 + row * w;
    float* v = state2 + row * w;
    for (int64_t c = lane; c < w; c += 32) {
      const float g = run_grad(values, order, j, end, w, c, grad_scale, a.maximize);
      const float m_new = __fadd_rn(m[c], __fmul_rn(__fsub_rn(g, m[c]), a.one_minus_beta1));
      const float v_new = __fadd_rn(v[c], __fmul_rn(__fsub_rn(__fmul_rn(g, g), v[c]), a.one_minus_beta2));
      m[c] = m_new;
      v[c] = v_new;
      const float denom = __fadd_rn(__fsqrt_rn(v_new), a.eps);
      store_as(p + c, __fadd_rn(load_as<float>(p + c), __fmul_rn(__fdiv_rn(m_new, denom), neg_step)));
    }
  } else {  // row-wise Adagrad: sum[row] += mean over the row of g^2; p -= lr * g / (sqrt(sum[row]) + eps)
    float squares = 0.f;
    for (int64_t c = lane; c < w; c += 32) {
      const float g = run_grad(values, order, j, end, w, c, grad_scale, a.maximize);
      squares = __fadd_rn(squares, __fmul_rn(g, g));
    }
    for (int offset = 16; offset > 0; offset /= 2) squares = __fadd_rn(squares, __shfl_xor_sync(0xffffffffu, squares, offset));
    const float sum = __fadd_rn(state1[row], __fdiv_rn(squares, static_cast<float>(w)));
    __syncwarp();
    if (lane == 0) state1[row] = sum;
    const float denom = __fadd_rn(__fsqrt_rn(sum), a.eps);
    for (int64_t c = lane; c < w; c += 32) {  // the run's sums again (from L2), not kept in registers of any width
      const float g = run_grad(values, order, j, end, w, c, grad_scale, a.maximize);
      store_as(p + c, __fadd_rn(load_as<float>(p + c), __fmul_rn(__fdiv_rn(g, denom), a.neg_lr)));
    }
  }
}

__global__ void increment_step_kernel(float* step, const float* found_inf) {
  if (found_inf == nullptr || *found_inf == 0.f) *step += 1.f;
}

const char* rule_name(SparseRule r) {
  return r == SparseRule::Sgd ? "SGD" : r == SparseRule::Adam ? "SparseAdam" : "RowWiseAdagrad";
}

}  // namespace

bool fuses_sparse(const Tensor& param, Device device) {
  return param.defined() && device.is_cuda() && (param.device() == device || (param.is_cpu() && param.is_pinned())) &&
         param.is_contiguous() && param.dim() >= 1 && is_fused_dtype(param.dtype());
}

void fused_sparse_update(const Tensor& param, const Tensor& indices, const Tensor& values, const TensorVec& states,
                         const Tensor& step, const SparseHyper& h, const Tensor& grad_scale,
                         const Tensor& found_inf) {
  const char* op = "fused_sparse_update";
  KILN_CHECK(indices.defined() && indices.is_cuda(), op, ": the indices must be on the GPU that runs the update, got ",
             indices.defined() ? indices.device() : Device::cpu());
  const Device dev = indices.device();
  KILN_CHECK(fuses_sparse(param, dev), op, ": the parameter must be a contiguous float32, float16 or bfloat16 tensor ",
             "on ", dev, " or in page-locked host memory, got ", param.shape(), " ", param.dtype(), " on ",
             param.device(), param.is_cpu() && !param.is_pinned() ? " (pageable)" : "");
  // Where the parameter lives (dev, or page-locked host memory): its states and step counter live there too.
  const Device home = param.device();
  const auto at_home = [&](const Tensor& t) { return t.device() == home && (home.is_cuda() || t.is_pinned()); };
  const int64_t k = indices.numel();
  KILN_CHECK(indices.dim() == 1 && indices.dtype() == DType::Int64, op, ": indices must be 1-D Int64, got ",
             indices.shape(), " ", indices.dtype());
  Shape value_shape = param.shape();
  value_shape[0] = k;
  KILN_CHECK(values.shape() == value_shape && values.dtype() == param.dtype() && values.device() == dev &&
                 values.is_contiguous(),
             op, ": values must be contiguous ", value_shape, " ", param.dtype(), " on ", dev, ", got ",
             values.shape(), " ", values.dtype(), " on ", values.device());
  const char* where = home.is_cuda() ? "" : " (page-locked)";
  const size_t want = h.rule == SparseRule::Sgd ? 0 : h.rule == SparseRule::Adam ? 2 : 1;
  KILN_CHECK(states.size() == want, op, ": ", rule_name(h.rule), " takes ", want, " state tensors, got ", states.size());
  for (size_t i = 0; i < states.size(); ++i) {
    const Shape expected = h.rule == SparseRule::Adam ? param.shape() : Shape{param.size(0)};
    KILN_CHECK(states[i].shape() == expected && states[i].dtype() == DType::Float32 && at_home(states[i]) &&
                   states[i].is_contiguous(),
               op, ": state ", i, " must be a contiguous float32 ", expected, " on ", home, where, ", got ",
               states[i].shape(), " ", states[i].dtype(), " on ", states[i].device());
  }
  KILN_CHECK(step.defined() && step.numel() == 1 && step.dtype() == DType::Float32 && at_home(step), op,
             ": step must be a 1-element float32 tensor on ", home, where, ", got ",
             step.defined() ? ::kiln::detail::str_cat(step.numel(), " elements of ", step.dtype(), " on ",
                                                       step.device())
                            : std::string("an undefined tensor"));
  check_scalar(grad_scale, op, "grad_scale", dev, /*required=*/false);
  check_scalar(found_inf, op, "found_inf", dev, /*required=*/false);
  // Page-locked host memory is mapped for every device at its host address under unified addressing (every 64-bit
  // platform CUDA supports; gather_host_rows relies on the same), so its pointers are used as they are.
  const float* scale_ptr = grad_scale.defined() ? grad_scale.data_ptr<float>() : nullptr;
  const float* inf_ptr = found_inf.defined() ? found_inf.data_ptr<float>() : nullptr;
  const cudaStream_t stream = cuda::stream_for(indices);
  trace::Scope range(trace::Kind::Op, op, dev, {&param, &indices, &values});
  if (k > 0 && param.numel() > 0) {
    const Tensor order = internal::argsort(indices, 0);  // stable: runs of a row keep the entries' order
    SparseArgs a{.rule = h.rule,
                 .k = k,
                 .rows = param.size(0),
                 .width = param.numel() / param.size(0),
                 .neg_lr = static_cast<float>(-h.lr),
                 .one_minus_beta1 = static_cast<float>(1 - h.beta1),
                 .one_minus_beta2 = static_cast<float>(1 - h.beta2),
                 .eps = static_cast<float>(h.eps),
                 .lr = h.lr,
                 .beta1 = h.beta1,
                 .beta2 = h.beta2,
                 .maximize = h.maximize};
    float* s1 = states.size() > 0 ? states[0].data_ptr<float>() : nullptr;
    float* s2 = states.size() > 1 ? states[1].data_ptr<float>() : nullptr;
    const auto blocks = static_cast<unsigned>(cuda::kdetail::ceil_div(k, kWarpsPerBlock));
    const auto launch = [&](auto tag) {
      using T = decltype(tag);
      sparse_update_kernel<T><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(
          param.data_ptr<T>(), values.data_ptr<T>(), indices.data_ptr<int64_t>(), order.data_ptr<int64_t>(), s1, s2,
          step.data_ptr<float>(), scale_ptr, inf_ptr, a);
      KILN_CUDA_CHECK_LAUNCH("fused_sparse_update");
    };
    switch (param.dtype()) {
      case DType::Float32: launch(float{}); break;
      case DType::Float16: launch(Half{}); break;
      default: launch(BFloat16{}); break;  // fuses_sparse admitted only these three
    }
    param.impl().storage()->bump_version();
    for (const Tensor& s : states) s.impl().storage()->bump_version();
  }
  increment_step_kernel<<<1, 1, 0, stream>>>(step.data_ptr<float>(), inf_ptr);
  KILN_CUDA_CHECK_LAUNCH("fused_sparse_update (step)");
  step.impl().storage()->bump_version();
}

}  // namespace kiln::optim::cuda_impl
