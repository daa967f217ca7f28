// Zeroing the flagged rows of an attention output (attention_rows.h): one thread per row reads its flag (a
// broadcast dim has stride 0) and only a flagged row is written.
#include "kiln/layers/cuda/attention_rows.h"

#include "kiln/tensor/cuda/kernel_util.cuh"  // ceil_div, stream_for, KILN_CUDA_CHECK_LAUNCH
#include "kiln/tensor/dispatch.h"            // visit_floating_dtype
#include "kiln/tensor/trace.h"               // a range per kernel entry

namespace kiln::nn::cuda_impl {
namespace {

struct RowGeometry {
  int64_t heads, len, width;       // H, L, E of out
  int64_t out_b, out_h, out_l;     // out's strides
  int64_t dead_b, dead_h, dead_l;  // dead's strides, 0 where it broadcasts
};

template <typename D>
__global__ void zero_flagged_rows_kernel(D* out, const bool* dead, float* stats, RowGeometry g, int64_t rows) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const int64_t l = r % g.len, h = (r / g.len) % g.heads, b = r / (g.len * g.heads);
  if (!dead[b * g.dead_b + h * g.dead_h + l * g.dead_l]) return;
  if (stats != nullptr) stats[r] = __int_as_float(0x7f800000);  // +inf
  D* row = out + b * g.out_b + h * g.out_h + l * g.out_l;
  for (int64_t e = 0; e < g.width; ++e) row[e] = D(0.0f);
}

}  // namespace

void zero_flagged_rows(const Tensor& out, const Tensor& dead, const Tensor& stats) {
  KILN_CHECK(out.dim() == 4 && out.stride(3) == 1 && dead.dim() == 4 && dead.size(3) == 1 &&
                 dead.dtype() == DType::Bool && dead.device() == out.device(),
             "zero_flagged_rows: expected out (B, H, L, E) with unit last stride and Bool flags (B|1, H|1, L|1, 1) on ",
             "its device, got ", out.shape(), " and ", dead.shape(), " ", dead.dtype());
  for (int64_t d = 0; d < 3; ++d) {
    KILN_CHECK(dead.size(d) == 1 || dead.size(d) == out.size(d), "zero_flagged_rows: flags ", dead.shape(),
               " do not broadcast to the rows of ", out.shape());
  }
  if (stats.defined()) {
    KILN_CHECK(stats.shape() == (Shape{out.size(0), out.size(1), out.size(2), 1}) && stats.is_contiguous() &&
                   stats.dtype() == DType::Float32 && stats.device() == out.device(),
               "zero_flagged_rows: expected contiguous Float32 stats of shape (B, H, L, 1) beside out ", out.shape(),
               ", got ", stats.shape(), " ", stats.dtype());
  }
  const int64_t rows = out.size(0) * out.size(1) * out.size(2);
  if (rows == 0 || out.size(3) == 0) return;
  trace::Scope range(trace::Kind::Op, "zero_flagged_rows", out.device(), {&out, &dead, &stats});
  auto st = [&](int64_t d) { return dead.size(d) == 1 ? int64_t{0} : dead.stride(d); };
  const RowGeometry g{out.size(1),   out.size(2), out.size(3), out.stride(0), out.stride(1),
                      out.stride(2), st(0),       st(1),       st(2)};
  cudaStream_t stream = cuda::stream_for(out);
  constexpr int kThreads = 256;
  const auto blocks = static_cast<unsigned>(cuda::kdetail::ceil_div(rows, kThreads));
  visit_floating_dtype(out.dtype(), "zero_flagged_rows", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using D = cuda::device_t<T>;
    zero_flagged_rows_kernel<D><<<blocks, kThreads, 0, stream>>>(static_cast<D*>(out.data_ptr()), dead.data_ptr<bool>(),
                                                                 stats.defined() ? stats.data_ptr<float>() : nullptr, g,
                                                                 rows);
    KILN_CUDA_CHECK_LAUNCH("zero_flagged_rows");
  });
  out.impl().storage()->bump_version();
  if (stats.defined()) stats.impl().storage()->bump_version();
}

}  // namespace kiln::nn::cuda_impl
