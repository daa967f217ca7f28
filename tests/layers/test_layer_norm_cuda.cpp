// nn::layer_norm's fused GPU kernels against float64 references computed here on the host: 16-bit and
// float32 inputs, BERT's row size and a large one (the block loops), no affine parameters, many rows
// (the column-sum backward splits rows into chunks), non-contiguous input, short rows that the backward cannot read
// in groups of 4 (a size not a multiple of 4, an input 4-byte but not 16-byte aligned), and autocast (float32 out);
// and add_layer_norm's fused residual, also after a fused dropout (dropout_add_layer_norm, against the unfused ops),
// and the column sums of x's gradient that the backward offers the Linear before it.
// float64 gradients against gradcheck run through check_gradients in test_functional.cpp's cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "kiln/autograd/autocast.h"       // autocast::Guard
#include "kiln/autograd/grad_mode.h"      // NoGradGuard
#include "kiln/layers/cuda/layer_norm.h"  // cuda_impl::layer_norm_backward: x's gradient with its column sums
#include "kiln/layers/functional.h"
#include "kiln/profiler/profiler.h"  // the products a backward runs
#include "kiln/tensor/cuda.h"
#include "kiln/tensor/internal_ops.h"  // internal::draw_for
#include "support/test_support.h"

namespace kiln::testing {
namespace {

struct Ref {
  std::vector<double> y, dx, dw, db;
};

// y = (x - mean) / sqrt(var + eps) * w + b per row of d; gradients for the output gradient g.
Ref layer_norm_ref(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                   const std::vector<double>& g, int64_t rows, int64_t d, double eps) {
  Ref r{std::vector<double>(x.size()), std::vector<double>(x.size()), std::vector<double>(d, 0.0),
        std::vector<double>(d, 0.0)};
  for (int64_t i = 0; i < rows; ++i) {
    const double* xr = &x[i * d];
    double mean = 0, var = 0;
    for (int64_t j = 0; j < d; ++j) mean += xr[j];
    mean /= static_cast<double>(d);
    for (int64_t j = 0; j < d; ++j) var += (xr[j] - mean) * (xr[j] - mean);
    var /= static_cast<double>(d);
    const double rstd = 1 / std::sqrt(var + eps);
    double mg = 0, mgx = 0;
    for (int64_t j = 0; j < d; ++j) {
      const double xhat = (xr[j] - mean) * rstd;
      r.y[i * d + j] = xhat * w[j] + b[j];
      const double gj = g[i * d + j] * w[j];
      mg += gj;
      mgx += gj * xhat;
      r.dw[j] += g[i * d + j] * xhat;
      r.db[j] += g[i * d + j];
    }
    mg /= static_cast<double>(d);
    mgx /= static_cast<double>(d);
    for (int64_t j = 0; j < d; ++j) {
      const double xhat = (xr[j] - mean) * rstd;
      r.dx[i * d + j] = rstd * (g[i * d + j] * w[j] - mg - xhat * mgx);
    }
  }
  return r;
}

class CudaLayerNorm : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  }
};

// Values rounded to `dtype` first, so the reference sees exactly what the kernel reads.
std::vector<double> rounded(const std::vector<double>& v, DType dtype) {
  return values(make(v, {static_cast<int64_t>(v.size())}, {.dtype = dtype}));
}

// misaligned_input: x is a contiguous view starting one element into its storage.
void check_case(DType dtype, int64_t rows, int64_t d, bool non_contiguous_input, bool misaligned_input = false) {
  const TensorOptions o{.dtype = dtype, .device = Device::cuda(0)};
  const auto xv = rounded(uniform(rows * d, -2, 3, 1), dtype);
  const auto wv = rounded(uniform(d, 0.5, 1.5, 2), dtype);
  const auto bv = rounded(uniform(d, -0.5, 0.5, 3), dtype);
  const auto gv = rounded(uniform(rows * d, -1, 1, 4), dtype);
  Tensor x = make(xv, {rows, d}, o);
  if (non_contiguous_input) x = non_contiguous(x);
  if (misaligned_input) {
    std::vector<double> padded(1, 0.0);
    padded.insert(padded.end(), xv.begin(), xv.end());
    x = make(padded, {rows * d + 1}, o).narrow(0, 1, rows * d).view({rows, d});
    ASSERT_TRUE(x.is_contiguous());
  }
  x.requires_grad_();
  Tensor w = make(wv, {d}, o).requires_grad_(), b = make(bv, {d}, o).requires_grad_();
  Tensor y = nn::layer_norm(x, {d}, w, b, 1e-5);
  ASSERT_EQ(y.dtype(), dtype);
  y.backward(make(gv, {rows, d}, o));
  const Ref r = layer_norm_ref(xv, wv, bv, gv, rows, d, 1e-5);
  const bool half = dtype == DType::Float16 || dtype == DType::BFloat16;
  const double tol = half ? 2e-2 : 1e-4;
  expect_values(y, {rows, d}, r.y, tol, tol);
  expect_values(x.grad(), {rows, d}, r.dx, tol, tol);
  // Column sums over many rows: relative to their size.
  expect_values(w.grad(), {d}, r.dw, half ? 3e-2 : 1e-4, half ? 0.5 : 1e-3);
  expect_values(b.grad(), {d}, r.db, half ? 3e-2 : 1e-4, half ? 0.5 : 1e-3);
}

TEST_P(CudaLayerNorm, BertRows) { check_case(GetParam(), 64, 768, false); }
TEST_P(CudaLayerNorm, LongRowsNonContiguous) { check_case(GetParam(), 6, 5000, true); }
TEST_P(CudaLayerNorm, ManyShortRows) { check_case(GetParam(), 20000, 24, false); }
TEST_P(CudaLayerNorm, BertLargeRows) { check_case(GetParam(), 300, 1024, false); }
TEST_P(CudaLayerNorm, RowsJustOverOneWarpTile) { check_case(GetParam(), 70, 1025, false); }
TEST_P(CudaLayerNorm, ShortRowsNotAMultipleOfFour) {
  check_case(GetParam(), 300, 1022, false);
  check_case(GetParam(), 70, 250, false);
}
TEST_P(CudaLayerNorm, ShortRowsMisaligned) { check_case(GetParam(), 64, 768, false, true); }

// add_layer_norm(x, residual): x in x_dtype (BERT's sublayer output), residual, weight and bias in Float32 (or all
// in one dtype); against the reference of the sum, formed as the add would form it.
void check_add_case(DType x_dtype, DType r_dtype, int64_t rows, int64_t d) {
  const TensorOptions xo{.dtype = x_dtype, .device = Device::cuda(0)}, ro{.dtype = r_dtype, .device = Device::cuda(0)};
  const auto xv = rounded(uniform(rows * d, -2, 2, 11), x_dtype);
  const auto rv = rounded(uniform(rows * d, -1, 3, 12), r_dtype);
  const auto wv = rounded(uniform(d, 0.5, 1.5, 13), r_dtype);
  const auto bv = rounded(uniform(d, -0.5, 0.5, 14), r_dtype);
  const auto gv = rounded(uniform(rows * d, -1, 1, 15), r_dtype);
  std::vector<double> sv(xv.size());
  for (size_t i = 0; i < sv.size(); ++i) sv[i] = xv[i] + rv[i];
  sv = rounded(sv, r_dtype);
  Tensor x = make(xv, {rows, d}, xo).requires_grad_(), res = make(rv, {rows, d}, ro).requires_grad_();
  Tensor w = make(wv, {d}, ro).requires_grad_(), b = make(bv, {d}, ro).requires_grad_();
  Tensor y = nn::add_layer_norm(x, res, {d}, w, b, 1e-5);
  ASSERT_EQ(y.dtype(), r_dtype);
  ASSERT_NE(std::string(y.grad_fn()->name()).find("AddLayerNormFunction"), std::string::npos)
      << "the fused path did not run: " << y.grad_fn()->name();
  y.backward(make(gv, {rows, d}, ro));
  const Ref r = layer_norm_ref(sv, wv, bv, gv, rows, d, 1e-5);
  const bool half_r = r_dtype != DType::Float32 && r_dtype != DType::Float64;
  const double tol = half_r ? 2e-2 : 1e-4;
  expect_values(y, {rows, d}, r.y, tol, tol);
  ASSERT_EQ(x.grad().dtype(), x_dtype);
  ASSERT_EQ(res.grad().dtype(), r_dtype);
  const double xtol = x_dtype == DType::Float32 ? 1e-4 : 2e-2;
  expect_values(x.grad(), {rows, d}, r.dx, xtol, xtol);
  expect_values(res.grad(), {rows, d}, r.dx, tol, tol);
  expect_values(w.grad(), {d}, r.dw, half_r ? 3e-2 : 1e-4, half_r ? 0.5 : 1e-3);
  expect_values(b.grad(), {d}, r.db, half_r ? 3e-2 : 1e-4, half_r ? 0.5 : 1e-3);
}

TEST(CudaAddLayerNorm, LowPrecisionSublayerOutputAndFloat32Residual) {
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  check_add_case(DType::BFloat16, DType::Float32, 256, 768);
  check_add_case(DType::Float16, DType::Float32, 130, 1024);
  check_add_case(DType::BFloat16, DType::Float32, 33, 40);
}

TEST(CudaAddLayerNorm, OneDtype) {
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  check_add_case(DType::Float32, DType::Float32, 64, 768);
  check_add_case(DType::BFloat16, DType::BFloat16, 64, 768);  // the sum rounded to bfloat16, as the add rounds it
}

TEST(CudaAddLayerNorm, UnderAutocastAsBertRunsIt) {
  // Under autocast the residual stream is Float32 and the sublayer output bfloat16: the fused path runs, and its
  // result is the unfused one's.
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  const Device gpu = Device::cuda(0);
  Tensor x = make(uniform(8 * 64, -1, 1, 21), {8, 64}, {.dtype = DType::BFloat16, .device = gpu});
  Tensor res = make(uniform(8 * 64, -1, 1, 22), {8, 64}, {.device = gpu});
  Tensor w = make(uniform(64, 0.5, 1.5, 23), {64}, {.device = gpu}),
         b = make(uniform(64, -1, 1, 24), {64}, {.device = gpu});
  Tensor fused, plain;
  {
    autocast::Guard guard(DeviceType::CUDA, DType::BFloat16);
    fused = nn::add_layer_norm(x, res, {64}, w, b);
    plain = nn::layer_norm(x + res, {64}, w, b);
  }
  EXPECT_EQ(fused.dtype(), DType::Float32);
  expect_values(fused, {8, 64}, values(plain), 1e-5, 1e-5);
}

// In an autocast region the three fused layer norms write their float32 output's bfloat16 cast in the same kernel and
// offer it (autocast::offer_cast): the region's cast of the output is that tensor (the same one each time), bit for
// bit the cast a cast kernel makes of it, and gradients through it equal those of a region in which the kernel does
// not offer one (autocast::Guard alone: no CacheRegion). Without grad mode nothing is offered.
TEST(CudaLayerNorm, OffersTheCastOfItsOutputToTheNextProduct) {
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  const Device gpu = Device::cuda(0);
  const int64_t rows = 64, d = 768;
  for (int which = 0; which < 3; ++which) {
    SCOPED_TRACE(which == 0 ? "layer_norm" : which == 1 ? "add_layer_norm" : "dropout_add_layer_norm");
    auto run = [&](bool offered, Tensor* cast_out) {
      Tensor x = make(uniform(rows * d, -2, 2, 81), {rows, d}, {.dtype = DType::BFloat16, .device = gpu});
      Tensor res = make(uniform(rows * d, -1, 1, 82), {rows, d}, {.device = gpu});
      Tensor w = make(uniform(d, 0.5, 1.5, 83), {d}, {.device = gpu}),
             b = make(uniform(d, -1, 1, 84), {d}, {.device = gpu});
      for (Tensor* t : {&x, &res, &w, &b}) t->requires_grad_();
      Generator gen(7);
      Tensor product;
      {
        std::optional<amp::Autocast> region;
        std::optional<autocast::Guard> guard;
        if (offered) {
          region.emplace(DType::BFloat16);
        } else {
          guard.emplace(DeviceType::CUDA, DType::BFloat16);
        }
        const Tensor y = which == 0   ? nn::layer_norm(x.to(DType::Float32) + res, {d}, w, b)
                         : which == 1 ? nn::add_layer_norm(x, res, {d}, w, b)
                                      : nn::dropout_add_layer_norm(x, res, 0.1, true, {d}, w, b, 1e-5, &gen);
        EXPECT_EQ(y.dtype(), DType::Float32);
        const Tensor cast = autocast::cast_to(y, DType::BFloat16);
        if (offered) {
          EXPECT_EQ(autocast::cast_to(y, DType::BFloat16).data_ptr(), cast.data_ptr()) << "not the offered cast";
          EXPECT_TRUE(internal::equal(cast, y.detach().to(DType::BFloat16))) << "not the cast of the output";
        }
        if (cast_out != nullptr) *cast_out = cast.detach();
        product = matmul(cast, make(uniform(d * 16, -1, 1, 85), {d, 16}, {.dtype = DType::BFloat16, .device = gpu}));
      }
      product.to(DType::Float32).sum().backward();
      return std::vector<Tensor>{x.grad(), res.grad(), w.grad(), b.grad()};
    };
    Tensor offered_cast;
    const std::vector<Tensor> with = run(true, &offered_cast), without = run(false, nullptr);
    for (size_t i = 0; i < with.size(); ++i) EXPECT_TRUE(internal::equal(with[i], without[i])) << "gradient " << i;
  }
  // No grad mode: no offer (the cast would only take memory).
  NoGradGuard no_grad;
  amp::Autocast region(DType::BFloat16);
  EXPECT_FALSE(autocast::cast_worth_offering(gpu).has_value());
}

// nn::dropout_add_layer_norm's fused kernels against internal::dropout then add_layer_norm on the GPU, from the same
// generator state: bit for bit, the output, the generator's state after, and the gradients of x, residual, weight and
// bias. Bit for bit because the fused forward keeps each element by the Philox word internal::dropout's kernel gives
// it, rounds x * mask to x's dtype before adding the residual (no FMA across the two), and sums each row in
// add_layer_norm's lane order; backward is add_layer_norm's kernel on the same grid (so dw and db are summed in the
// same order), with x's gradient rounded to x's dtype and multiplied by the mask once, as the dropout's backward does.
// Where the residual is Float32 the result is also the CPU's for the same seed (the same mask; float32 rounding apart).
void check_fused_dropout_case(DType x_dtype, DType r_dtype, int64_t rows, int64_t d, double p) {
  SCOPED_TRACE(std::string(dtype_name(x_dtype)) + " onto " + std::string(dtype_name(r_dtype)) + ", rows " +
               std::to_string(rows) + ", d " + std::to_string(d) + ", p " + std::to_string(p));
  const Device gpu = Device::cuda(0);
  const auto xv = uniform(rows * d, -2, 2, 61), rv = uniform(rows * d, -1, 3, 62), wv = uniform(d, 0.5, 1.5, 63),
             bv = uniform(d, -0.5, 0.5, 64), gv = uniform(rows * d, -1, 1, 65);
  auto inputs = [&](Device dev) {
    const TensorOptions xo{.dtype = x_dtype, .device = dev}, ro{.dtype = r_dtype, .device = dev};
    return std::vector<Tensor>{make(xv, {rows, d}, xo).requires_grad_(), make(rv, {rows, d}, ro).requires_grad_(),
                               make(wv, {d}, ro).requires_grad_(), make(bv, {d}, ro).requires_grad_()};
  };
  const auto a = inputs(gpu), b = inputs(gpu);
  Generator g_fused(1234), g_plain(1234);
  Tensor y = nn::dropout_add_layer_norm(a[0], a[1], p, true, {d}, a[2], a[3], 1e-5, &g_fused);
  ASSERT_NE(std::string(y.grad_fn()->name()).find("DropoutAddLayerNormFunction"), std::string::npos)
      << "the fused path did not run: " << y.grad_fn()->name();
  Tensor y_plain = nn::add_layer_norm(nn::dropout(b[0], p, true, &g_plain), b[1], {d}, b[2], b[3], 1e-5);
  EXPECT_EQ(g_fused.state(), g_plain.state());
  const auto got = values(y);
  EXPECT_EQ(got, values(y_plain));
  EXPECT_NE(got, values(nn::add_layer_norm(a[0], a[1], {d}, a[2], a[3], 1e-5))) << "nothing was dropped";
  if (r_dtype == DType::Float32) {
    NoGradGuard no_grad;
    Generator g_cpu(1234);
    const auto c = inputs(Device::cpu());
    expect_values(nn::dropout_add_layer_norm(c[0], c[1], p, true, {d}, c[2], c[3], 1e-5, &g_cpu), {rows, d}, got, 1e-4,
                  1e-4);
  }
  const TensorOptions ro{.dtype = r_dtype, .device = gpu};
  y.backward(make(gv, {rows, d}, ro));
  y_plain.backward(make(gv, {rows, d}, ro));
  ASSERT_EQ(a[0].grad().dtype(), x_dtype);
  const char* names[] = {"x", "residual", "weight", "bias"};
  for (size_t k = 0; k < a.size(); ++k) {
    SCOPED_TRACE(names[k]);
    EXPECT_EQ(values(a[k].grad()), values(b[k].grad()));
  }
}

TEST(CudaAddLayerNorm, FusedDropoutIsDropoutThenAddLayerNorm) {
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  check_fused_dropout_case(DType::Float32, DType::Float32, 64, 768, 0.1);
  check_fused_dropout_case(DType::BFloat16, DType::Float32, 256, 768, 0.1);  // BERT under bf16 autocast
  check_fused_dropout_case(DType::Float16, DType::Float32, 130, 1024, 0.3);
  check_fused_dropout_case(DType::BFloat16, DType::BFloat16, 64, 768, 0.1);
  check_fused_dropout_case(DType::Float32, DType::Float32, 3000, 256, 0.2);  // more rows than backward blocks
  check_fused_dropout_case(DType::BFloat16, DType::Float32, 50, 100, 0.5);
  // Rows not a multiple of 4: Philox blocks straddle rows (a draw per element), backward one element at a time.
  check_fused_dropout_case(DType::Float32, DType::Float32, 33, 37, 0.5);
  check_fused_dropout_case(DType::BFloat16, DType::Float32, 17, 202, 0.25);
}

TEST(CudaAddLayerNorm, FusedDropoutInACudaGraphDrawsANewMaskEveryReplay) {
  // As internal::dropout: each replay takes a fresh draw of the generator, and gives what the unfused ops give from the
  // generator's state just before that replay.
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  const Device gpu = Device::cuda(0);
  Generator& gen = default_generator(gpu);
  const int64_t rows = 64, d = 768;
  Tensor x = make(uniform(rows * d, -2, 2, 71), {rows, d}, {.dtype = DType::BFloat16, .device = gpu});
  Tensor r = make(uniform(rows * d, -1, 1, 72), {rows, d}, {.device = gpu});
  Tensor w = make(uniform(d, 0.5, 1.5, 73), {d}, {.device = gpu}),
         b = make(uniform(d, -1, 1, 74), {d}, {.device = gpu});
  Tensor y;
  cuda::Graph graph;
  graph.capture([&] { y = nn::dropout_add_layer_norm(x, r, 0.1, true, {d}, w, b); }, 1);
  std::vector<double> previous;
  for (int k = 0; k < 3; ++k) {
    SCOPED_TRACE(k);
    const GeneratorState before = gen.state();
    graph.replay();
    const std::vector<double> got = values(y);
    const GeneratorState after = gen.state();
    EXPECT_EQ(after.offset, before.offset + 1);  // one draw per replay, as an eager call takes
    gen.set_state(before);
    EXPECT_EQ(got, values(nn::add_layer_norm(nn::dropout(x, 0.1, true), r, {d}, w, b)));
    EXPECT_EQ(gen.state().offset, after.offset);
    EXPECT_NE(got, previous) << "a replay repeated the previous replay's mask";
    previous = got;
  }
}

// layer_norm_backward with dx_sums: x's gradient, dw and db bit for bit those of the call without, and dx_sums the
// column sums of x's gradient as returned (dx_low where written, else dx) within float32 rounding of float64 sums of
// the stored values; none where rows do not move in groups of 4 (202 elements). With a fused dropout (BERT's
// training), a residual add alone, and float32 rows whose x gradient is dx itself.
void check_dx_sums_case(DType x_dtype, DType r_dtype, int64_t rows, int64_t d, double p) {
  SCOPED_TRACE(std::string(dtype_name(x_dtype)) + " onto " + std::string(dtype_name(r_dtype)) + ", rows " +
               std::to_string(rows) + ", d " + std::to_string(d) + ", p " + std::to_string(p));
  const Device gpu = Device::cuda(0);
  const TensorOptions xo{.dtype = x_dtype, .device = gpu}, ro{.dtype = r_dtype, .device = gpu};
  const Tensor x = make(uniform(rows * d, -2, 2, 81), {rows, d}, xo);
  const Tensor r = make(uniform(rows * d, -1, 3, 82), {rows, d}, ro);
  const Tensor w = make(uniform(d, 0.5, 1.5, 83), {d}, ro), b = make(uniform(d, -0.5, 0.5, 84), {d}, ro);
  const Tensor dy = make(uniform(rows * d, -1, 1, 85), {rows, d}, ro);
  Generator gen(99);
  nn::cuda_impl::FusedDropout dropout{.p = p};
  if (p > 0) dropout.draw = internal::draw_for(&gen, gpu);
  const auto saved = nn::cuda_impl::layer_norm_forward(x, d, w, b, 1e-5, r, p > 0 ? &dropout : nullptr);
  const std::optional<DType> low = x_dtype != r_dtype || p > 0 ? std::optional<DType>(x_dtype) : std::nullopt;
  const auto plain = nn::cuda_impl::layer_norm_backward(dy, saved.sum, d, saved.mean, saved.rstd, w, true, true, true,
                                                        low, saved.keep, p, false);
  const auto with = nn::cuda_impl::layer_norm_backward(dy, saved.sum, d, saved.mean, saved.rstd, w, true, true, true,
                                                       low, saved.keep, p, true);
  EXPECT_FALSE(plain.dx_sums.defined());
  EXPECT_EQ(bytes_of(with.dx), bytes_of(plain.dx));
  EXPECT_EQ(bytes_of(with.dweight), bytes_of(plain.dweight));
  EXPECT_EQ(bytes_of(with.dbias), bytes_of(plain.dbias));
  const Tensor& xg = low ? with.dx_low : with.dx;
  if (low) EXPECT_EQ(bytes_of(with.dx_low), bytes_of(plain.dx_low));
  if (d % 4 != 0) {
    EXPECT_FALSE(with.dx_sums.defined()) << "rows that do not move in groups of 4 give no sums";
    return;
  }
  ASSERT_TRUE(with.dx_sums.defined());
  ASSERT_EQ(with.dx_sums.shape(), (Shape{d}));
  ASSERT_EQ(with.dx_sums.dtype(), DType::Float32);
  const std::vector<double> v = values(xg), s = values(with.dx_sums);
  for (int64_t j = 0; j < d; ++j) {
    double exact = 0, magnitude = 0;
    for (int64_t i = 0; i < rows; ++i) {
      exact += v[i * d + j];
      magnitude += std::abs(v[i * d + j]);
    }
    ASSERT_NEAR(s[j], exact, 4 * rows * 0x1p-24 * magnitude + 1e-30) << "column " << j;
  }
}

TEST(CudaAddLayerNorm, SumsXGradientForTheLinearBefore) {
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  check_dx_sums_case(DType::BFloat16, DType::Float32, 4096, 768, 0.1);   // BERT-base's training
  check_dx_sums_case(DType::BFloat16, DType::Float32, 2048, 1024, 0.1);  // BERT-large's
  check_dx_sums_case(DType::Float16, DType::Float32, 300, 1024, 0.3);
  check_dx_sums_case(DType::BFloat16, DType::BFloat16, 64, 768, 0.1);
  check_dx_sums_case(DType::BFloat16, DType::Float32, 256, 768, 0);  // add_layer_norm: dx_low, the cast of dx
  check_dx_sums_case(DType::Float32, DType::Float32, 3000, 256, 0);  // x's gradient is dx itself
  check_dx_sums_case(DType::Float32, DType::Float32, 33, 24, 0.5);
  check_dx_sums_case(DType::BFloat16, DType::Float32, 17, 202, 0.25);  // no groups of 4: no sums
}

// Through the graph: a Linear (under bf16 autocast, from a float32 activation) and BERT's dropout, residual add and
// layer norm. The layer norm's backward offers its x gradient's column sums and the Linear takes them for its bias:
// the gradients are those of the same graph with a multiply by 1 between the two (whose own gradient the offer does
// not reach, so that the Linear sums its bias itself), within float32 rounding.
TEST(CudaAddLayerNorm, TheLinearBeforeTakesTheSumsForItsBias) {
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  const Device gpu = Device::cuda(0);
  const int64_t rows = 512, in = 256, d = 768;
  const TensorOptions o{.device = gpu};
  std::vector<Tensor> bias_grads, weight_grads, input_grads;
  for (const bool between : {false, true}) {
    Tensor h = make(uniform(rows * in, -1, 1, 91), {4, rows / 4, in}, o).requires_grad_();
    Tensor w = make(uniform(d * in, -0.1, 0.1, 92), {d, in}, o).requires_grad_();
    Tensor b = make(uniform(d, -0.5, 0.5, 93), {d}, o).requires_grad_();
    const Tensor r = make(uniform(rows * d, -1, 1, 94), {4, rows / 4, d}, o);
    const Tensor lw = make(uniform(d, 0.5, 1.5, 95), {d}, o), lb = make(uniform(d, -0.5, 0.5, 96), {d}, o);
    Generator gen(7);
    Tensor y;
    {
      autocast::Guard on(DeviceType::CUDA, DType::BFloat16);
      Tensor z = nn::linear(h * 1.0, w, b);
      if (between) z = z * 1.0;
      y = nn::dropout_add_layer_norm(z, r, 0.1, true, {d}, lw, lb, 1e-5, &gen);
    }
    const Tensor gy = make(uniform(rows * d, -1, 1, 97), {4, rows / 4, d}, o);
    profiler::Profile prof;
    y.backward(gy);
    prof.stop();
    size_t row_sums = 0;  // products whose epilogue sums the bias's gradient
    for (const profiler::Event& e : prof.result().events()) row_sums += e.name == "matmul_row_sums" ? 1 : 0;
    EXPECT_EQ(row_sums, between ? 1u : 0u) << (between ? "the Linear sums its bias" : "the offer was not taken");
    bias_grads.push_back(b.grad());
    weight_grads.push_back(w.grad());
    input_grads.push_back(h.grad());
  }
  const auto close = [](const Tensor& got, const Tensor& want, const char* what) {
    SCOPED_TRACE(what);
    const std::vector<double> g = values(got), v = values(want);
    ASSERT_EQ(g.size(), v.size());
    double scale = 0;
    for (double e : v) scale = std::max(scale, std::abs(e));
    for (size_t i = 0; i < g.size(); ++i) ASSERT_NEAR(g[i], v[i], 1e-5 * scale) << i;
  };
  close(bias_grads[0], bias_grads[1], "bias");
  close(weight_grads[0], weight_grads[1], "weight");
  close(input_grads[0], input_grads[1], "input");
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaLayerNorm,
                         ::testing::Values(DType::Float32, DType::Float16, DType::BFloat16, DType::Float64),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(CudaLayerNormAutocast, RunsInFloat32WithoutAffine) {
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  const auto xv = uniform(4 * 3 * 8, -1, 1, 5);
  Tensor x = make(xv, {4, 3, 8}, {.dtype = DType::BFloat16, .device = Device::cuda(0)});
  Tensor y;
  {
    autocast::Guard guard(DeviceType::CUDA, DType::BFloat16);
    y = nn::layer_norm(x, {3, 8});
  }
  EXPECT_EQ(y.dtype(), DType::Float32);  // layer norm runs in float32 under autocast, as in PyTorch
  const auto xr = values(x);
  const std::vector<double> ones(24, 1.0), zeros(24, 0.0), g(xr.size(), 0.0);
  expect_values(y, {4, 3, 8}, layer_norm_ref(xr, ones, zeros, g, 4, 24, 1e-5).y, 1e-5, 1e-5);
}

}  // namespace
}  // namespace kiln::testing
