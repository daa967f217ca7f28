// nn::Linear in FP8 (kiln/layers/fp8_linear.h) under amp::Autocast with an FP8 recipe, against references computed
// here in float64: FP8 codes decoded from their bit fields (OCP FP8: sign, exponent, mantissa), quantisation by
// searching the decoded codes for the nearest (ties to even), and delayed scaling by a small reference of its rules
// (Transformer Engine's). Nothing here uses kiln's own FP8 conversions.
//
// Fp8LinearTest runs on every backend: on cuda0 (an sm_89+ GPU) it checks the cuBLASLt path the same way, with the
// tolerance of a float32 accumulation (see tests/tensor/test_fp8_ops.cpp for that bound).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kiln/layers/models/bert.h"  // the FP8 path of BertSelfAttention
#include "kiln/profiler/profiler.h"   // the additions a backward makes
#include "kiln/tensor/cuda.h"
#include "support/float8_reference.h"
#include "support/profile_counts.h"  // additions_of
#include "support/test_support.h"

namespace kiln {
namespace {

using testing::additions_of;
using testing::expect_error;
using testing::values;

// ---------------------------------------------------------------- FP8 references

using Format = testing::Fp8Format;
using testing::kE4M3;
using testing::kE5M2;

// The value of the code nearest to v: saturating at ±max, ties to the even code.
double quantised(const Format& f, double v) { return testing::fp8_value(f, testing::fp8_code(f, v)); }

// The FP8 values (not rescaled) of x * scale, the product in float32 as the quantisation computes it.
std::vector<double> quantise(const std::vector<double>& x, float scale, const Format& f) {
  std::vector<double> out;
  for (double v : x) out.push_back(quantised(f, static_cast<double>(static_cast<float>(v) * scale)));
  return out;
}

double amax_of(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::abs(v));
  return m;
}

// Delayed scaling of a Linear's three tensors (input, weight: E4M3; gradient: E5M2 under Hybrid), amax algorithm
// Max, in float32 arithmetic as the recipe documents it.
struct ReferenceScaling {
  int64_t len;
  int margin;
  std::vector<std::vector<double>> history;  // [row][column]
  double fmax[3];                            // 448 for E4M3, 57344 for E5M2
  float scale[3] = {1, 1, 1}, scale_inv[3] = {1, 1, 1};
  ReferenceScaling(int64_t len, int margin, bool hybrid = true)
      : len(len), margin(margin), history(len, std::vector<double>(3, 0.0)), fmax{448, 448, hybrid ? 57344.0 : 448} {}
  void record(int j, double amax) { history[0][j] = std::max(history[0][j], amax); }
  void update() {
    for (int j = 0; j < 3; ++j) {
      const double c = history[0][j];
      if (c == 0) continue;
      double a = 0;
      for (const auto& row : history) a = std::max(a, row[j]);
      for (int64_t i = 1; i + 1 < len; ++i) history[i][j] = history[i + 1][j];
      if (len > 1) history[len - 1][j] = c;
      history[0][j] = 0;
      const float next = static_cast<float>(std::ldexp(fmax[j], -margin)) / static_cast<float>(a);
      if (std::isfinite(a) && a > 0) scale[j] = std::isinf(next) ? FLT_MAX : next;
      scale_inv[j] = 1.0f / scale[j];
    }
  }
};

// out[i][n] = sa * sb * sum_k a[i][k] b[n][k] (+ bias[n]); abs_sum the same over |a b| (for the tolerance).
void reference_product(const std::vector<double>& a, const std::vector<double>& b, int64_t m, int64_t n, int64_t k,
                       double sa, double sb, const std::vector<double>& bias, std::vector<double>& out,
                       std::vector<double>& abs_sum) {
  out.assign(m * n, 0.0);
  abs_sum.assign(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, t = 0;
      for (int64_t q = 0; q < k; ++q) {
        s += a[i * k + q] * b[j * k + q];
        t += std::abs(a[i * k + q] * b[j * k + q]);
      }
      out[i * n + j] = sa * sb * s + (bias.empty() ? 0.0 : bias[j]);
      abs_sum[i * n + j] = sa * sb * t + (bias.empty() ? 0.0 : std::abs(bias[j]));
    }
  }
}

// |got - ref| within the output dtype's rounding (`ulp`, relative) and a float32 accumulation of the products
// (2^-9 of the sum of their magnitudes on the GPU; the CPU sums in float64).
void expect_product(const Tensor& got, const Shape& shape, const std::vector<double>& ref,
                    const std::vector<double>& abs_sum, double ulp, const std::string& what) {
  ASSERT_EQ(got.shape(), shape) << what;
  const std::vector<double> v = values(got);
  const double accumulation = got.device().is_cpu() ? 0.0 : std::ldexp(1.0, -9);
  int bad = 0;
  for (size_t i = 0; i < ref.size() && bad < 5; ++i) {
    const double tol = 2 * ulp * abs_sum[i] + accumulation * abs_sum[i] + 1e-30;
    if (!(std::abs(v[i] - ref[i]) <= tol)) {
      ADD_FAILURE() << what << "[" << i << "]: got " << v[i] << ", expected " << ref[i] << " (tolerance " << tol << ")";
      ++bad;
    }
  }
}

void expect_bitwise_equal(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_TRUE(a.defined() && b.defined()) << what;
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  const std::vector<double> va = values(a), vb = values(b);
  for (size_t i = 0; i < va.size(); ++i) ASSERT_EQ(va[i], vb[i]) << what << "[" << i << "]";
}

// ---------------------------------------------------------------- the test suite

class Fp8LinearTest : public testing::BackendTest {
 protected:
  amp::AutocastOptions fp8_options(const amp::Fp8Recipe& recipe) const {
    return {.device_type = dev().type(), .fp8 = recipe};
  }
  // Values of x as `dtype` holds them.
  Tensor input(const Shape& shape, double lo, double hi, uint64_t seed, DType dtype = DType::Float32) const {
    return testing::make(testing::uniform(numel(shape), lo, hi, seed), shape, opts(dtype));
  }
};

// Three training steps of one Linear(32, 16) (6 rows, padded to 16 inside): each step's output and gradients against
// the references from the quantised operands, with the scales the reference delayed scaling gives at that step, and
// the state's buffers against the reference state after each step. The input's range changes from step to step, so
// the window maximum (history 4) and the margin (1) show in the scales.
TEST_P(Fp8LinearTest, ThreeStepsMatchTheReference) {
  const int64_t in = 32, out = 16, rows = 6;
  auto fc = nn::make<nn::Linear>(in, out);
  fc->to(dev());
  const amp::Fp8Recipe recipe{.amax_history_len = 4, .margin = 1};
  ReferenceScaling ref(4, 1);
  const std::vector<double> w = values(fc->weight), bias = values(fc->bias);
  std::vector<double> bias_bf16 = values(fc->bias.to(DType::BFloat16));
  const double ranges[3] = {1.0, 4.0, 2.0};
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step + 1));
    const Tensor x = input({2, 3, in}, -ranges[step], ranges[step], 10 + step).requires_grad_();
    const Tensor dy = input({2, 3, out}, -0.5, 0.5, 20 + step, DType::BFloat16);
    fc->zero_grad();
    Tensor y;
    {
      amp::Autocast cast(DType::BFloat16, fp8_options(recipe));
      y = fc(x);
    }
    y.backward(dy);

    // The reference of this step: update, quantise with the new scales, record the amaxes.
    ref.update();
    const std::vector<double> xv = values(x), dyv = values(dy);
    const std::vector<double> qx = quantise(xv, ref.scale[0], kE4M3), qw = quantise(w, ref.scale[1], kE4M3);
    const std::vector<double> qg = quantise(dyv, ref.scale[2], kE5M2);
    ref.record(0, amax_of(xv));
    ref.record(1, amax_of(w));
    ref.record(2, amax_of(dyv));

    std::vector<double> expected, abs_sum;
    reference_product(qx, qw, rows, out, in, ref.scale_inv[0], ref.scale_inv[1], bias_bf16, expected, abs_sum);
    EXPECT_EQ(y.dtype(), DType::BFloat16);
    expect_product(y, {2, 3, out}, expected, abs_sum, std::ldexp(1.0, -8), "y");

    // dX (rows, in) = g (rows, out) @ W (out, in): b operand is W^T (in, out).
    std::vector<double> qwt(in * out), qgt(out * rows), qxt(in * rows);
    for (int64_t o = 0; o < out; ++o)
      for (int64_t k = 0; k < in; ++k) qwt[k * out + o] = qw[o * in + k];
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t o = 0; o < out; ++o) qgt[o * rows + i] = qg[i * out + o];
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t k = 0; k < in; ++k) qxt[k * rows + i] = qx[i * in + k];
    reference_product(qg, qwt, rows, in, out, ref.scale_inv[2], ref.scale_inv[1], {}, expected, abs_sum);
    EXPECT_EQ(x.grad().dtype(), DType::Float32);
    expect_product(x.grad(), {2, 3, in}, expected, abs_sum, std::ldexp(1.0, -24), "dX");
    reference_product(qgt, qxt, out, in, rows, ref.scale_inv[2], ref.scale_inv[0], {}, expected, abs_sum);
    EXPECT_EQ(fc->weight.grad().dtype(), DType::Float32);
    expect_product(fc->weight.grad(), {out, in}, expected, abs_sum, std::ldexp(1.0, -24), "dW");
    std::vector<double> db(out, 0.0);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t o = 0; o < out; ++o) db[o] += dyv[i * out + o];
    EXPECT_EQ(fc->bias.grad().dtype(), DType::Float32);
    testing::expect_values(fc->bias.grad(), {out}, db, 1e-6, 1e-7);

    // The state after the step: buffers of the module, equal to the reference's.
    const amp::Fp8ScalingState* st = fc->fp8_state();
    ASSERT_NE(st, nullptr);
    std::vector<double> hist;
    for (const auto& row : ref.history) hist.insert(hist.end(), row.begin(), row.end());
    testing::expect_values(st->amax_history(), {4, 3}, hist, 0, 0);
    testing::expect_values(st->scale(), {3}, {ref.scale[0], ref.scale[1], ref.scale[2]}, 0, 0);
    testing::expect_values(st->scale_inv(), {3}, {ref.scale_inv[0], ref.scale_inv[1], ref.scale_inv[2]}, 0, 0);
  }
  // The scales did move off 1 (steps 2 and 3 used recorded amaxes).
  EXPECT_NE(ref.scale[0], 1.0f);
  EXPECT_NE(ref.scale[2], 1.0f);
  // The buffers are the state's tensors, under the names checkpoints use.
  const nn::StateDict sd = fc->state_dict();
  std::vector<std::string> keys;
  for (const auto& [k, t] : sd) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"weight", "bias", "fp8_amax_history", "fp8_scale", "fp8_scale_inv"}));
  testing::expect_values(sd[3].second, {3}, {ref.scale[0], ref.scale[1], ref.scale[2]}, 0, 0);
}

// Gradient accumulation: two forwards, then their backwards in reverse order. The second forward updates the state
// in place; the first call's backward still uses the scales its forward quantised with (1 on a fresh state).
TEST_P(Fp8LinearTest, BackwardUsesItsForwardsScales) {
  const int64_t in = 16, out = 16, rows = 16;
  auto fc = nn::make<nn::Linear>(in, out);
  fc->to(dev());
  const amp::Fp8Recipe recipe{.amax_history_len = 2};
  const Tensor x1 = input({rows, in}, -2, 2, 100).requires_grad_(), x2 = input({rows, in}, -8, 8, 101).requires_grad_();
  Tensor y1, y2;
  {
    amp::Autocast cast(DType::BFloat16, fp8_options(recipe));
    y1 = fc(x1);
    y2 = fc(x2);
  }
  const Tensor dy = input({rows, out}, -1, 1, 102, DType::BFloat16);
  y2.backward(dy);
  fc->zero_grad();
  y1.backward(dy);
  // The first call: every scale 1.
  const std::vector<double> w = values(fc->weight);
  const std::vector<double> qw = quantise(w, 1.0f, kE4M3), qg = quantise(values(dy), 1.0f, kE5M2);
  std::vector<double> qwt(in * out), expected, abs_sum;
  for (int64_t o = 0; o < out; ++o)
    for (int64_t k = 0; k < in; ++k) qwt[k * out + o] = qw[o * in + k];
  reference_product(qg, qwt, rows, in, out, 1.0, 1.0, {}, expected, abs_sum);
  expect_product(x1.grad(), {rows, in}, expected, abs_sum, std::ldexp(1.0, -24), "dX of the first call");
  // ... and the second call's scales were not 1 (so the test can tell them apart).
  ReferenceScaling ref(2, 0);
  ref.record(0, amax_of(values(x1)));
  ref.record(1, amax_of(w));
  ref.update();
  testing::expect_values(fc->fp8_state()->scale().narrow(0, 0, 2), {2}, {ref.scale[0], ref.scale[1]}, 0, 0);
  EXPECT_NE(ref.scale[1], 1.0f);
}

// E4M3 everywhere: the gradient is quantised to E4M3 too (its scale from 448, not 57344), 16 rows (no padding), no
// bias, and a float16 region: y in float16.
TEST_P(Fp8LinearTest, E4M3RecipeAndNoBias) {
  const int64_t in = 16, out = 32, rows = 16;
  auto fc = nn::make<nn::Linear>(in, out, nn::LinearOptions{.bias = false});
  fc->to(dev());
  const amp::Fp8Recipe recipe{.format = amp::Fp8Format::E4M3, .amax_history_len = 2};
  ReferenceScaling ref(2, 0, /*hybrid=*/false);
  const std::vector<double> w = values(fc->weight);
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE("step " + std::to_string(step + 1));
    const Tensor x = input({rows, in}, -3, 3, 30 + step).requires_grad_();
    const Tensor dy = input({rows, out}, -2, 2, 40 + step, DType::Float16);
    fc->zero_grad();
    Tensor y;
    {
      amp::Autocast cast(DType::Float16, fp8_options(recipe));
      y = fc(x);
    }
    y.backward(dy);
    ref.update();
    const std::vector<double> xv = values(x), dyv = values(dy);
    const std::vector<double> qx = quantise(xv, ref.scale[0], kE4M3), qw = quantise(w, ref.scale[1], kE4M3);
    const std::vector<double> qg = quantise(dyv, ref.scale[2], kE4M3);
    ref.record(0, amax_of(xv));
    ref.record(1, amax_of(w));
    ref.record(2, amax_of(dyv));
    std::vector<double> expected, abs_sum;
    reference_product(qx, qw, rows, out, in, ref.scale_inv[0], ref.scale_inv[1], {}, expected, abs_sum);
    EXPECT_EQ(y.dtype(), DType::Float16);
    expect_product(y, {rows, out}, expected, abs_sum, std::ldexp(1.0, -11), "y");
    std::vector<double> qwt(in * out);
    for (int64_t o = 0; o < out; ++o)
      for (int64_t k = 0; k < in; ++k) qwt[k * out + o] = qw[o * in + k];
    reference_product(qg, qwt, rows, in, out, ref.scale_inv[2], ref.scale_inv[1], {}, expected, abs_sum);
    expect_product(x.grad(), {rows, in}, expected, abs_sum, std::ldexp(1.0, -24), "dX");
    testing::expect_values(fc->fp8_state()->scale(), {3}, {ref.scale[0], ref.scale[1], ref.scale[2]}, 0, 0);
  }
}

// forward_gelu(h) in an FP8 region applies the GELU in the input's quantisation: over two steps its output, weight
// and bias gradients and FP8 state equal, bit for bit, those of a twin Linear given kiln's float32 gelu of h (the
// values the fused quantisation sees), and h's gradient is that twin input's gradient taken through gelu's
// derivative (bit for bit for a float32 h, whose gradient the twin computes in the same dtype; within bfloat16's
// rounding for a bfloat16 h). Outside FP8 regions it is forward(gelu(h)).
TEST_P(Fp8LinearTest, ForwardGeluAppliesTheGeluInTheInputQuantisation) {
  const int64_t in = 64, out = 32, rows = 20;
  for (const DType h_dtype : {DType::Float32, DType::BFloat16}) {
    for (const bool tanh_form : {false, true}) {
      SCOPED_TRACE(::testing::Message() << h_dtype << (tanh_form ? ", tanh GELU" : ", GELU"));
      manual_seed(3);
      auto fused = nn::make<nn::Linear>(in, out), twin = nn::make<nn::Linear>(in, out);
      twin->weight.detach().copy_(fused->weight.detach());
      twin->bias.detach().copy_(fused->bias.detach());
      fused->to(dev());
      twin->to(dev());
      const amp::Fp8Recipe recipe{.amax_history_len = 4};
      for (int step = 0; step < 2; ++step) {
        SCOPED_TRACE("step " + std::to_string(step + 1));
        const Tensor h = input({rows, in}, -4, 4, 60 + step, h_dtype).requires_grad_();
        const Tensor h32 = h.detach().to(DType::Float32).requires_grad_();
        const Tensor dy = input({rows, out}, -1, 1, 70 + step, DType::BFloat16);
        fused->zero_grad();
        twin->zero_grad();
        Tensor y, y_twin, g;
        {
          amp::Autocast cast(DType::BFloat16, fp8_options(recipe));
          y = fused->forward_gelu(h, tanh_form);
          g = gelu(h32, tanh_form);
          y_twin = twin(g);
        }
        EXPECT_TRUE(internal::equal(y, y_twin));
        y.backward(dy);
        y_twin.backward(dy);
        EXPECT_TRUE(internal::equal(fused->weight.grad(), twin->weight.grad()));
        EXPECT_TRUE(internal::equal(fused->bias.grad(), twin->bias.grad()));
        EXPECT_TRUE(internal::equal(fused->fp8_state()->amax_history(), twin->fp8_state()->amax_history()));
        EXPECT_TRUE(internal::equal(fused->fp8_state()->scale(), twin->fp8_state()->scale()));
        ASSERT_EQ(h.grad().dtype(), h_dtype);
        if (h_dtype == DType::Float32) {
          EXPECT_TRUE(internal::equal(h.grad(), h32.grad()));
        } else {
          testing::expect_values(h.grad(), {rows, in}, values(h32.grad()), 2e-2, 1e-2);
        }
      }
      // Outside an FP8 region: the plain ops (float32 here, as the Linear's parameters).
      const Tensor h = input({rows, in}, -4, 4, 80);
      EXPECT_TRUE(internal::equal(fused->forward_gelu(h, tanh_form), fused(gelu(h, tanh_form))));
    }
  }
}

// A region whose filter selects nothing, a nested region without FP8, and enabled = false all compute exactly as the
// plain (bf16 or float32) Linear does, and make no FP8 state.
TEST_P(Fp8LinearTest, UnselectedOrNestedRegionsStayPlain) {
  auto fc = nn::make<nn::Linear>(32, 16);
  fc->to(dev());
  const Tensor x = input({5, 32}, -1, 1, 50);
  Tensor plain_bf16, plain_f32;
  {
    amp::Autocast cast(DType::BFloat16, false, dev().type());
    plain_f32 = fc(x);
  }
  {
    amp::Autocast cast(DType::BFloat16, true, dev().type());
    plain_bf16 = fc(x);
  }
  amp::Fp8Recipe none;
  none.module_filter = [](const amp::Fp8ModuleInfo&) { return false; };
  {
    amp::Autocast cast(DType::BFloat16, fp8_options(none));
    expect_bitwise_equal(fc(x), plain_bf16, "filter off");
  }
  const amp::Fp8Recipe all{};
  {
    amp::Autocast outer(DType::BFloat16, fp8_options(all));
    EXPECT_NE(autocast::fp8_recipe(dev().type()), nullptr);
    {
      amp::Autocast inner(DType::BFloat16, true, dev().type());  // the innermost region decides: no FP8
      EXPECT_EQ(autocast::fp8_recipe(dev().type()), nullptr);
      expect_bitwise_equal(fc(x), plain_bf16, "nested bf16 region");
    }
    {
      amp::Autocast inner(DType::BFloat16, {.enabled = false, .device_type = dev().type(), .fp8 = all});
      EXPECT_EQ(autocast::fp8_recipe(dev().type()), nullptr);
      expect_bitwise_equal(fc(x), plain_f32, "enabled = false");
    }
    EXPECT_NE(autocast::fp8_recipe(dev().type()), nullptr);  // back after the inner regions
  }
  EXPECT_EQ(autocast::fp8_recipe(dev().type()), nullptr);
  EXPECT_EQ(fc->fp8_state(), nullptr);
  EXPECT_EQ(fc->state_dict().size(), 2u);
  // The plain spelling (device type CUDA by default), where no GPU or an FP8-capable one is visible.
  if (!cuda::is_available() || cuda::compute_capability(cuda::current_device()) >= 89) {
    amp::Autocast cast(DType::BFloat16, {.fp8 = amp::Fp8Recipe{}});
    ASSERT_NE(autocast::fp8_recipe(DeviceType::CUDA), nullptr);
    EXPECT_EQ(autocast::fp8_recipe(DeviceType::CUDA)->amax_history_len, 1024);
    EXPECT_EQ(autocast::get_dtype(DeviceType::CUDA), DType::BFloat16);
  }
  EXPECT_EQ(autocast::fp8_recipe(DeviceType::CUDA), nullptr);
  // The region of another device type leaves this one's Linears plain.
  const DeviceType other = dev().is_cpu() ? DeviceType::CUDA : DeviceType::CPU;
  if (other == DeviceType::CPU || cuda::is_available()) {
    amp::Autocast cast(DType::BFloat16, {.device_type = other, .fp8 = all});
    EXPECT_EQ(autocast::fp8_recipe(dev().type()), nullptr);
    expect_bitwise_equal(fc(x), plain_f32, "other device type");
  }
  EXPECT_EQ(fc->fp8_state(), nullptr);
}

struct TwoLayers : nn::Module {
  nn::Handle<nn::Linear> fc1, fc2, odd;
  TwoLayers() : Module("TwoLayers") {
    fc1 = register_module("fc1", nn::Linear(32, 32));
    fc2 = register_module("fc2", nn::Linear(32, 16));
    odd = register_module("odd", nn::Linear(16, 20));  // 20: not a multiple of 16
  }
  Tensor forward(const Tensor& x) override { return odd(fc2(relu(fc1(x)))); }
};

// prepare_fp8 asks the filter with qualified names; a Linear it leaves out, and one the default filter refuses (20
// features), stay plain in the region, even though a lazy decision (name "") would take the first.
TEST_P(Fp8LinearTest, PrepareChoosesByName) {
  auto model = nn::make<TwoLayers>();
  model->to(dev());
  amp::Fp8Recipe recipe{.amax_history_len = 8};
  std::vector<std::string> asked;
  recipe.module_filter = [&asked](const amp::Fp8ModuleInfo& m) {
    asked.emplace_back(m.name);
    return amp::default_fp8_module_filter(m) && m.name != "fc2";
  };
  EXPECT_EQ(amp::prepare_fp8(*model, recipe, dev()), 1);
  EXPECT_EQ(asked, (std::vector<std::string>{"fc1", "fc2", "odd"}));
  EXPECT_NE(model->fc1->fp8_state(), nullptr);
  EXPECT_EQ(model->fc2->fp8_state(), nullptr);
  EXPECT_EQ(model->odd->fp8_state(), nullptr);
  EXPECT_EQ(model->fc1->fp8_state()->recipe().amax_history_len, 8);

  const Tensor x = input({3, 32}, -1, 1, 60);
  Tensor h, y;
  {
    amp::Autocast cast(DType::BFloat16, fp8_options(recipe));
    h = relu(model->fc1(x));
    y = model->fc2(h);
  }
  Tensor plain;
  {
    amp::Autocast cast(DType::BFloat16, true, dev().type());
    plain = model->fc2(h);
  }
  expect_bitwise_equal(y, plain, "fc2 (left out by name)");
  EXPECT_EQ(model->fc2->fp8_state(), nullptr);
  // fc1 recorded its input's amax in the current row.
  EXPECT_EQ(values(model->fc1->fp8_state()->amax_history())[0], amax_of(values(x)));

  // A Linear the default filter refuses, forced in by a filter that takes everything: a clear error.
  amp::Fp8Recipe all;
  all.module_filter = [](const amp::Fp8ModuleInfo&) { return true; };
  expect_error([&] { amp::prepare_fp8(*model, all, dev()); }, {"Linear(16, 20)", "multiples of 16", "module_filter"});
}

// BERT's self-attention stacks its q/k/v weights into one product; in an FP8 region that selects all three it is one
// FP8 product under query's state, which key and value then share: the output equals, bit for bit, nn::fp8_linear
// with the stacked weight and a state of its own that saw the same calls; the state records the input's amax and the
// largest of the three weights' amaxes; each weight gets a gradient. The output stays near the bf16 path's (FP8's 3
// mantissa bits: a loose bound, and a tight one would say nothing more than the Linear tests above).
TEST_P(Fp8LinearTest, BertSelfAttentionStacksItsProjectionsUnderOneState) {
  const nn::models::BertConfig config = nn::models::BertConfig::custom(100, 32, 1, 2, 64, 16);
  auto attention = std::make_shared<nn::models::BertSelfAttention>(config);
  attention->to(dev());
  attention->eval();  // no attention dropout: the two paths see the same probabilities
  const amp::Fp8Recipe recipe{.amax_history_len = 2};
  EXPECT_EQ(amp::prepare_fp8(*attention, recipe, dev()), 3);
  const Tensor hidden = input({2, 5, 32}, -1.5, 1.5, 70);
  Tensor y, plain, stacked;
  amp::Fp8ScalingState own = amp::Fp8ScalingState::for_linear(recipe, dev());
  const Tensor w = cat({attention->query->weight, attention->key->weight, attention->value->weight}, 0).detach();
  const Tensor bias = cat({attention->query->bias, attention->key->bias, attention->value->bias}, 0).detach();
  {
    amp::Autocast cast(DType::BFloat16, fp8_options(recipe));
    {
      NoGradGuard no_grad;  // the first call records the amaxes; its own scales are still 1
      attention->forward(hidden, Tensor());
      nn::fp8_linear(hidden, w, bias, own, DType::BFloat16);
    }
    y = attention->forward(hidden, Tensor());  // with the scales from the recorded amaxes
    NoGradGuard no_grad;
    stacked = nn::fp8_linear(hidden, w, bias, own, DType::BFloat16);  // (2, 5, 96): q | k | v
  }
  {
    amp::Autocast cast(DType::BFloat16, true, dev().type());
    plain = attention->forward(hidden, Tensor());
  }
  ASSERT_EQ(y.shape(), (Shape{2, 5, 32}));
  // The same q, k, v as the stacked product: the same attention output from them.
  {
    NoGradGuard no_grad;
    const auto heads = [](const Tensor& t) { return permute(reshape(t, {2, 5, 2, 16}), {0, 2, 1, 3}); };
    const std::vector<Tensor> qkv = split(stacked, 32, -1);
    const Tensor context = nn::scaled_dot_product_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), {});
    expect_bitwise_equal(y, reshape(permute(context, {0, 2, 1, 3}), {2, 5, 32}), "the stacked FP8 product");
  }
  const std::vector<double> yv = values(y), pv = values(plain);
  const double scale = amax_of(pv);
  double diff = 0;
  for (size_t i = 0; i < yv.size(); ++i) diff = std::max(diff, std::abs(yv[i] - pv[i]));
  EXPECT_LE(diff, 0.15 * scale) << "FP8 output against the bf16 path's";
  EXPECT_GT(diff, 0) << "the FP8 region computed the same as bf16: FP8 was not used";
  sum(y.to(DType::Float32)).backward();
  ASSERT_NE(attention->query->fp8_state(), nullptr);
  EXPECT_EQ(attention->key->fp8_state(), attention->query->fp8_state());
  EXPECT_EQ(attention->value->fp8_state(), attention->query->fp8_state());
  const std::vector<double> h = values(attention->query->fp8_state()->amax_history());  // (2, 3): row 0 this call's
  EXPECT_EQ(h[0], amax_of(values(hidden))) << "input amax";
  EXPECT_EQ(h[1], amax_of(values(w))) << "the stacked weights' amax";
  EXPECT_GT(h[2], 0) << "the output gradient's amax";
  // The buffers, as state_dict() (and so a checkpoint) shows them, hold the shared state.
  int shown = 0;
  for (const auto& [name, tensor] : attention->state_dict()) {
    if (name != "key.fp8_amax_history" && name != "value.fp8_amax_history") continue;
    EXPECT_EQ(values(tensor), h) << name;
    ++shown;
  }
  EXPECT_EQ(shown, 2) << "key's and value's fp8_amax_history in state_dict()";
  for (const auto& [name, linear] :
       {std::pair{"query", attention->query}, std::pair{"key", attention->key}, std::pair{"value", attention->value}}) {
    ASSERT_TRUE(linear->weight.grad().defined()) << name;
    EXPECT_GT(amax_of(values(linear->weight.grad())), 0) << name;
    ASSERT_TRUE(linear->bias.grad().defined()) << name;
  }
}

// Linear::share_fp8_state needs a state on both sides, and says so.
// fp8_linear_stacked computes what fp8_linear of the concatenated weights and biases computes: over two steps the
// same output, input gradient and FP8 state, and each weight's and bias's gradient equal to its block of the
// concatenation's (bit for bit on the CPU; on a GPU each weight's product is its own, whose float32 sums may be
// ordered differently), each a tensor of its own.
TEST_P(Fp8LinearTest, StackedProductEqualsTheProductOfTheConcatenation) {
  const int64_t in = 32, rows = 24;
  const std::vector<int64_t> outs = {16, 32, 16};
  const amp::Fp8Recipe recipe{.amax_history_len = 4};
  amp::Fp8ScalingState stacked_state = amp::Fp8ScalingState::for_linear(recipe, dev());
  amp::Fp8ScalingState cat_state = amp::Fp8ScalingState::for_linear(recipe, dev());
  std::vector<Tensor> ws, bs, ws_ref, bs_ref;
  for (size_t i = 0; i < outs.size(); ++i) {
    ws.push_back(input({outs[i], in}, -0.5, 0.5, 90 + i).requires_grad_());
    bs.push_back(input({outs[i]}, -0.5, 0.5, 95 + i).requires_grad_());
    ws_ref.push_back(ws.back().detach().clone().requires_grad_());
    bs_ref.push_back(bs.back().detach().clone().requires_grad_());
  }
  const double rtol = dev().is_cuda() ? 1e-5 : 0, atol = dev().is_cuda() ? 1e-6 : 0;
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE("step " + std::to_string(step + 1));
    for (auto* list : {&ws, &bs, &ws_ref, &bs_ref}) {
      for (Tensor& t : *list) t.mutable_grad() = Tensor();
    }
    const Tensor x = input({2, rows / 2, in}, -2, 2, 100 + step, DType::BFloat16).requires_grad_();
    const Tensor x_ref = x.detach().clone().requires_grad_();
    const Tensor dy = input({2, rows / 2, 64}, -1, 1, 110 + step, DType::BFloat16);
    Tensor y, y_ref;
    {
      amp::Autocast cast(DType::BFloat16, fp8_options(recipe));
      y = nn::fp8_linear_stacked(x, ws, bs, stacked_state, DType::BFloat16);
      y_ref = nn::fp8_linear(x_ref, cat(ws_ref, 0), cat(bs_ref, 0), cat_state, DType::BFloat16);
    }
    ASSERT_EQ(y.shape(), (Shape{2, rows / 2, 64}));
    expect_bitwise_equal(y, y_ref, "the output");
    y.backward(dy);
    y_ref.backward(dy);
    expect_bitwise_equal(x.grad(), x_ref.grad(), "the input's gradient");
    EXPECT_TRUE(internal::equal(stacked_state.amax_history(), cat_state.amax_history()));
    EXPECT_TRUE(internal::equal(stacked_state.scale(), cat_state.scale()));
    for (size_t i = 0; i < outs.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "part " << i);
      testing::expect_values(ws[i].grad(), {outs[i], in}, values(ws_ref[i].grad()), rtol, atol);
      testing::expect_values(bs[i].grad(), {outs[i]}, values(bs_ref[i].grad()), rtol, atol);
      EXPECT_EQ(ws[i].grad().dtype(), DType::Float32);
      for (size_t j = 0; j < i; ++j) {
        EXPECT_NE(ws[i].grad().impl().storage(), ws[j].grad().impl().storage());
        EXPECT_NE(bs[i].grad().impl().storage(), bs[j].grad().impl().storage());
      }
      // One product's rows and one pass's sums, kept as they are: each gradient follows the one before in memory.
      if (i > 0) {
        const auto* w_prev = static_cast<const char*>(ws[i - 1].grad().data_ptr());
        const auto* b_prev = static_cast<const char*>(bs[i - 1].grad().data_ptr());
        EXPECT_EQ(static_cast<const char*>(ws[i].grad().data_ptr()), w_prev + outs[i - 1] * in * 4)
            << "the weights' gradients were copied apart";
        EXPECT_EQ(static_cast<const char*>(bs[i].grad().data_ptr()), b_prev + outs[i - 1] * 4)
            << "the biases' gradients were copied apart";
      }
    }
  }
  expect_error(
      [&] {
        nn::fp8_linear_stacked(input({4, in}, -1, 1, 1), {}, {}, stacked_state, DType::BFloat16);
      },
      {"fp8_linear_stacked", "1 to 3 weights", "got 0"});
  expect_error(
      [&] {
        nn::fp8_linear_stacked(input({4, in}, -1, 1, 1), ws, {bs[0]}, stacked_state, DType::BFloat16);
      },
      {"fp8_linear_stacked", "one bias per weight"});
  expect_error(
      [&] {
        nn::fp8_linear_stacked(input({4, in}, -1, 1, 1), {ws[0], input({16, 48}, -1, 1, 2)}, {}, stacked_state,
                               DType::BFloat16);
      },
      {"fp8_linear_stacked", "weight 1", "[16, 48]"});
}

// fp8_mlp: fc2(gelu(fc1(x))) as one function, against its two products (fp8_linear, then fp8_linear with the GELU
// applied in its input quantisation, then gelu_backward between them). With float32 products the two compute the
// same values, so over two steps and both GELU forms the output, every gradient and both states are equal bit for bit.
// With bfloat16 products the output still is, and the gradients differ only where the fused backward's unrounded
// gradient through the GELU falls on the other side of an E5M2 rounding than its bfloat16 rounding does.
TEST_P(Fp8LinearTest, MlpEqualsItsTwoProducts) {
  const int64_t in = 64, hidden = 96, out = 32;
  for (const DType out_dtype : {DType::Float32, DType::BFloat16}) {
    for (const bool tanh_form : {false, true}) {
      SCOPED_TRACE(::testing::Message() << out_dtype << (tanh_form ? ", tanh GELU" : ", GELU"));
      const amp::Fp8Recipe recipe{.amax_history_len = 4};
      amp::Fp8ScalingState s1 = amp::Fp8ScalingState::for_linear(recipe, dev());
      amp::Fp8ScalingState s2 = amp::Fp8ScalingState::for_linear(recipe, dev());
      amp::Fp8ScalingState r1 = amp::Fp8ScalingState::for_linear(recipe, dev());
      amp::Fp8ScalingState r2 = amp::Fp8ScalingState::for_linear(recipe, dev());
      std::vector<Tensor> params = {input({hidden, in}, -0.3, 0.3, 120), input({hidden}, -0.5, 0.5, 121),
                                    input({out, hidden}, -0.3, 0.3, 122), input({out}, -0.5, 0.5, 123)};
      std::vector<Tensor> refs;
      for (Tensor& p : params) {
        p.requires_grad_();
        refs.push_back(p.detach().clone().requires_grad_());
      }
      for (int step = 0; step < 2; ++step) {
        SCOPED_TRACE("step " + std::to_string(step + 1));
        for (auto* list : {&params, &refs}) {
          for (Tensor& t : *list) t.mutable_grad() = Tensor();
        }
        const Tensor x = input({2, 12, in}, -2, 2, 130 + step).requires_grad_();
        const Tensor x_ref = x.detach().clone().requires_grad_();
        const Tensor dy = input({2, 12, out}, -1, 1, 140 + step, out_dtype);
        const Tensor y = nn::fp8_mlp(x, params[0], params[1], s1, params[2], params[3], s2, out_dtype, tanh_form);
        const Tensor h = nn::fp8_linear(x_ref, refs[0], refs[1], r1, out_dtype);
        const Tensor y_ref =
            nn::fp8_linear(h, refs[2], refs[3], r2, out_dtype,
                           tanh_form ? internal::Fp8Activation::GeluTanh : internal::Fp8Activation::Gelu);
        expect_bitwise_equal(y, y_ref, "the output");
        y.backward(dy);
        y_ref.backward(dy);
        EXPECT_TRUE(internal::equal(s2.amax_history(), r2.amax_history()));
        const std::vector<Tensor> got = {x.grad(), params[0].grad(), params[1].grad(), params[2].grad(),
                                         params[3].grad()};
        const std::vector<Tensor> want = {x_ref.grad(), refs[0].grad(), refs[1].grad(), refs[2].grad(), refs[3].grad()};
        for (size_t i = 0; i < got.size(); ++i) {
          SCOPED_TRACE(::testing::Message() << "gradient " << i);
          ASSERT_TRUE(got[i].defined());
          EXPECT_EQ(got[i].dtype(), want[i].dtype());
          if (out_dtype == DType::Float32 || i >= 3) {  // fc2's own gradients do not go through the GELU
            expect_bitwise_equal(got[i], want[i], "the gradient");
          } else {
            const std::vector<double> w = values(want[i]);
            testing::expect_values(got[i], want[i].shape(), w, 0.3, 0.05 * amax_of(w));
          }
        }
        if (out_dtype == DType::Float32) {
          EXPECT_TRUE(internal::equal(s1.amax_history(), r1.amax_history()));
          EXPECT_TRUE(internal::equal(s1.scale(), r1.scale()));
        }
      }
    }
  }
  amp::Fp8ScalingState s = amp::Fp8ScalingState::for_linear(amp::Fp8Recipe{}, dev());
  expect_error(
      [&] {
        nn::fp8_mlp(input({4, 64}, -1, 1, 1), input({96, 64}, -1, 1, 2), {}, s, input({32, 80}, -1, 1, 3), {}, s,
                    DType::BFloat16);
      },
      {"fp8_mlp", "[32, 80]", "96 outputs"});
}

// In an FP8 region nn::linear_gelu_linear (which BERT's MLP takes) is fp8_mlp with the two Linears' states: the same
// output as fc2->forward_gelu(fc1(x)) of twin Linears, bit for bit.
TEST_P(Fp8LinearTest, LinearGeluLinearIsTheMlpFunctionInFp8Regions) {
  manual_seed(4);
  auto fc1 = nn::make<nn::Linear>(64, 96), fc2 = nn::make<nn::Linear>(96, 32);
  auto tw1 = nn::make<nn::Linear>(64, 96), tw2 = nn::make<nn::Linear>(96, 32);
  for (auto [a, b] : {std::pair{fc1, tw1}, std::pair{fc2, tw2}}) {
    b->weight.detach().copy_(a->weight.detach());
    b->bias.detach().copy_(a->bias.detach());
  }
  for (auto* m : {&fc1, &fc2, &tw1, &tw2}) (*m)->to(dev());
  const Tensor x = input({3, 8, 64}, -2, 2, 150);
  const amp::Fp8Recipe recipe{.amax_history_len = 4};
  Tensor y, y_twin;
  {
    amp::Autocast cast(DType::BFloat16, fp8_options(recipe));
    y = nn::linear_gelu_linear(*fc1, *fc2, x);
    y_twin = tw2->forward_gelu(tw1(x));
  }
  expect_bitwise_equal(y, y_twin, "the output");
  ASSERT_NE(fc1->fp8_state(), nullptr);
  EXPECT_TRUE(internal::equal(fc1->fp8_state()->amax_history(), tw1->fp8_state()->amax_history()));
  // Outside FP8 regions: the plain ops.
  expect_bitwise_equal(nn::linear_gelu_linear(*fc1, *fc2, x), fc2(gelu(fc1(x))), "outside FP8");
}

// A float32 input that other ops also use (a residual stream: h = 1.5 r, used by the product and by h * u): the FP8
// products' backward adds the input's gradient into the sum those began (fp8_gemm's accumulate_into), and the
// backward runs no addition of its own. r's gradient is the same as when h's two gradients are added by the engine
// (the reference: the product's gradient of h alone, plus u). Rows that are not a multiple of 16 (padded inside)
// take the plain path, with the same result.
TEST_P(Fp8LinearTest, InputGradientIsAddedIntoTheSumItsOtherUsesBegan) {
  const int64_t in = 64;
  const amp::Fp8Recipe recipe{.amax_history_len = 4};
  for (const int64_t batch : {int64_t{2}, int64_t{3}}) {  // 2 x 16 rows (added into), 3 x 12 (padded: not)
    const int64_t seq = batch == 2 ? 16 : 12;
    const std::string shape =
        "[" + std::to_string(batch) + ", " + std::to_string(seq) + ", " + std::to_string(in) + "]";
    for (const int kind : {0, 1, 2}) {  // fp8_linear, fp8_linear_stacked (two weights), fp8_mlp
      SCOPED_TRACE(::testing::Message() << (kind == 0   ? "fp8_linear"
                                            : kind == 1 ? "fp8_linear_stacked"
                                                        : "fp8_mlp")
                                        << ", input " << shape);
      amp::Fp8ScalingState s1 = amp::Fp8ScalingState::for_linear(recipe, dev());
      amp::Fp8ScalingState s2 = amp::Fp8ScalingState::for_linear(recipe, dev());
      amp::Fp8ScalingState r1 = amp::Fp8ScalingState::for_linear(recipe, dev());
      amp::Fp8ScalingState r2 = amp::Fp8ScalingState::for_linear(recipe, dev());
      const Tensor w1 = input({48, in}, -0.3, 0.3, 160), b1 = input({48}, -0.5, 0.5, 161);
      const Tensor w2 = input({32, kind == 2 ? int64_t{48} : in}, -0.3, 0.3, 162), b2 = input({32}, -0.5, 0.5, 163);
      auto product = [&](const Tensor& h, amp::Fp8ScalingState& a, amp::Fp8ScalingState& b) {
        if (kind == 0) return nn::fp8_linear(h, w1, b1, a, DType::BFloat16);
        if (kind == 1) return nn::fp8_linear_stacked(h, {w1, w2}, {b1, b2}, a, DType::BFloat16);
        return nn::fp8_mlp(h, w1, b1, a, w2, b2, b, DType::BFloat16);
      };
      const Tensor r0 = input({batch, seq, in}, -2, 2, 164);
      const Tensor u = input({batch, seq, in}, -1, 1, 165);
      // The reference: h's gradient from the product alone (retained), then 1.5 (that + u).
      Tensor r_ref = r0.clone().requires_grad_();
      Tensor h_ref = r_ref * 1.5;
      h_ref.retain_grad();
      const Tensor y_ref = product(h_ref, r1, r2);
      const Tensor dy = input(y_ref.shape(), -1, 1, 166, DType::BFloat16);
      y_ref.backward(dy);
      const std::vector<double> dh = values(h_ref.grad()), uv = values(u);
      std::vector<double> want;
      for (size_t i = 0; i < dh.size(); ++i) {
        want.push_back(
            static_cast<double>(1.5f * static_cast<float>(static_cast<float>(dh[i]) + static_cast<float>(uv[i]))));
      }
      Tensor r = r0.clone().requires_grad_();
      const Tensor h = r * 1.5;
      const Tensor y = product(h, s1, s2);
      const Tensor loss = (y.to(DType::Float32) * dy.to(DType::Float32)).sum() + (h * u).sum();
      profiler::Profile prof;
      loss.backward();
      prof.stop();
      ASSERT_TRUE(r.grad().defined());
      EXPECT_EQ(r.grad().dtype(), DType::Float32);
      testing::expect_values(r.grad(), r0.shape(), want, 1e-6, 1e-6);
      EXPECT_EQ(additions_of(prof.result(), shape), batch == 2 ? 0u : 1u) << "additions of h's gradients";
    }
  }
}

// A layer norm that makes the next FP8 product's input codes (dropout_add_layer_norm's fp8_next; on the GPU in the
// kernel's own pass) changes nothing: over three steps the product's output, every gradient (the layer norm's
// included) and the scaling states equal, bit for bit, those of the same ops where the product quantises the layer
// norm's output itself. For one Linear, the stacked product (BERT's query, key and value), the MLP, and a Linear
// that receives the output as another tensor (a view: it cannot take the codes, but takes the step's scales, so the
// state still updates once a step). Where the codes are taken, the product quantises no input of its own.
TEST_P(Fp8LinearTest, LayerNormCodesOfferedToTheNextProductChangeNothing) {
  const int64_t d = 64, hidden = 96, out = 48;
  const Shape shape{2, 16, d};
  const std::string in_shape = "[32, 64]";  // the product's input rows, as the profiler prints them
  const amp::Fp8Recipe recipe{.amax_history_len = 4};
  for (const int kind : {0, 1, 2, 3}) {  // fp8_linear, fp8_linear_stacked, fp8_mlp, fp8_linear of a view
    SCOPED_TRACE(::testing::Message() << (kind == 0   ? "fp8_linear"
                                          : kind == 1 ? "fp8_linear_stacked"
                                          : kind == 2 ? "fp8_mlp"
                                                      : "fp8_linear of a view"));
    struct Side {
      std::vector<Tensor> params;  // layer norm weight, bias; w1, b1, w2, b2
      std::unique_ptr<amp::Fp8ScalingState> s1, s2;
    };
    Side sides[2];
    for (Side& side : sides) {
      side.params = {input({d}, 0.5, 1.5, 170),
                     input({d}, -0.2, 0.2, 171),
                     input({hidden, d}, -0.3, 0.3, 172),
                     input({hidden}, -0.5, 0.5, 173),
                     input({out, kind == 2 ? hidden : d}, -0.3, 0.3, 174),
                     input({out}, -0.5, 0.5, 175)};
      for (Tensor& t : side.params) t.requires_grad_();
      side.s1 = std::make_unique<amp::Fp8ScalingState>(amp::Fp8ScalingState::for_linear(recipe, dev()));
      side.s2 = std::make_unique<amp::Fp8ScalingState>(amp::Fp8ScalingState::for_linear(recipe, dev()));
    }
    for (int step = 0; step < 3; ++step) {
      SCOPED_TRACE("step " + std::to_string(step + 1));
      const Tensor x0 = input(shape, -2 - step, 2 + step, 180 + step, DType::BFloat16);
      const Tensor r0 = input(shape, -1, 1, 190 + step);
      const Tensor dy = input({2, 16, out}, -1, 1, 200 + step, DType::BFloat16);
      std::vector<Tensor> results[2];
      size_t input_quantisations[2] = {0, 0};
      for (int offered = 0; offered < 2; ++offered) {
        Side& side = sides[offered];
        std::vector<Tensor>& p = side.params;
        for (Tensor& t : p) t.mutable_grad() = Tensor();
        Tensor x = x0.clone().requires_grad_(), r = r0.clone().requires_grad_();
        Generator gen(300 + step);
        Tensor y;
        profiler::Profile prof;
        {
          amp::Autocast cast(DType::BFloat16, fp8_options(recipe));
          const Tensor h = nn::dropout_add_layer_norm(x, r, 0.1, true, {d}, p[0], p[1], 1e-5, &gen,
                                                      offered == 1 ? side.s1.get() : nullptr);
          if (kind == 0) y = nn::fp8_linear(h, p[4], p[5], *side.s1, DType::BFloat16);
          if (kind == 1) {
            y = nn::fp8_linear_stacked(h, {p[2], p[4]}, {p[3], p[5]}, *side.s1, DType::BFloat16).narrow(2, hidden, out);
          }
          if (kind == 2) y = nn::fp8_mlp(h, p[2], p[3], *side.s1, p[4], p[5], *side.s2, DType::BFloat16);
          if (kind == 3) y = nn::fp8_linear(h.view({32, d}), p[4], p[5], *side.s1, DType::BFloat16).view({2, 16, out});
        }
        prof.stop();
        for (const profiler::Event& e : prof.result().events()) {
          if (e.kind == trace::Kind::Op && e.name.rfind("fp8_quantize", 0) == 0 &&
              e.shapes.find(in_shape + " f32") != std::string::npos) {
            ++input_quantisations[offered];
          }
        }
        y.backward(dy);
        results[offered] = {y, x.grad(), r.grad()};
        for (const Tensor& t : p) results[offered].push_back(t.grad());
        for (const amp::Fp8ScalingState* st : {side.s1.get(), side.s2.get()}) {
          results[offered].push_back(st->amax_history().clone());
          results[offered].push_back(st->scale().clone());
        }
      }
      for (size_t i = 0; i < results[0].size(); ++i) {
        if (!results[0][i].defined() && !results[1][i].defined()) continue;
        expect_bitwise_equal(results[1][i], results[0][i], "result " + std::to_string(i));
      }
      // The product's quantisation of its input in both layouts: one pair kernel on the GPU, two quantisations on
      // the CPU. With the codes taken it quantises none: the GPU's layer norm writes them in its kernel, the CPU
      // quantises its output once. The view's product takes no codes and quantises its input as before.
      const size_t pair = dev().is_cuda() ? 1u : 2u, made = dev().is_cuda() ? 0u : 1u;
      EXPECT_EQ(input_quantisations[0], pair) << "quantisations of the layer norm's output, no codes offered";
      EXPECT_EQ(input_quantisations[1], kind == 3 ? made + pair : made)
          << "quantisations of the layer norm's output, codes offered";
    }
  }
}

TEST_P(Fp8LinearTest, ShareFp8StateNeedsBothStates) {
  nn::Linear a(16, 16), b(16, 16);
  expect_error([&] { b.share_fp8_state(a); }, {"share_fp8_state", "FP8 state first", "prepare_fp8"});
  a.enable_fp8(amp::Fp8Recipe{}, dev());
  expect_error([&] { b.share_fp8_state(a); }, {"share_fp8_state", "FP8 state first"});
  EXPECT_EQ(b.fp8_state(), nullptr) << "a refused share leaves the Linear as it was";
  b.enable_fp8(amp::Fp8Recipe{}, dev());
  b.share_fp8_state(a);
  EXPECT_EQ(b.fp8_state(), a.fp8_state());
  int shared = 0;  // b's buffers now hold a's state's memory
  for (const auto& [name, t] : b.named_buffers()) {
    if (name.rfind("fp8_", 0) == 0)
      shared += t.impl().storage() == a.fp8_state()->amax_history().impl().storage() ||
                t.impl().storage() == a.fp8_state()->scale().impl().storage() ||
                t.impl().storage() == a.fp8_state()->scale_inv().impl().storage();
  }
  EXPECT_EQ(shared, 3);
}

// Where the filter selects only some of query, key and value, each is its own Linear call: the selected ones in FP8
// with their own state, the others in bf16, and no state is shared.
TEST_P(Fp8LinearTest, BertSelfAttentionWithSomeProjectionsSelected) {
  const nn::models::BertConfig config = nn::models::BertConfig::custom(100, 32, 1, 2, 64, 16);
  auto attention = std::make_shared<nn::models::BertSelfAttention>(config);
  attention->to(dev());
  attention->eval();
  amp::Fp8Recipe recipe{.amax_history_len = 2};
  recipe.module_filter = [](const amp::Fp8ModuleInfo& m) { return m.name != "value"; };
  EXPECT_EQ(amp::prepare_fp8(*attention, recipe, dev()), 2);
  const Tensor hidden = input({2, 5, 32}, -1.5, 1.5, 71);
  {
    amp::Autocast cast(DType::BFloat16, fp8_options(recipe));
    sum(attention->forward(hidden, Tensor()).to(DType::Float32)).backward();
  }
  ASSERT_NE(attention->query->fp8_state(), nullptr);
  ASSERT_NE(attention->key->fp8_state(), nullptr);
  EXPECT_NE(attention->key->fp8_state(), attention->query->fp8_state());
  EXPECT_EQ(attention->value->fp8_state(), nullptr);
  for (const auto& linear : {attention->query, attention->key}) {
    const std::vector<double> h = values(linear->fp8_state()->amax_history());
    EXPECT_EQ(h[1], amax_of(values(linear->weight))) << "its own weight's amax";
  }
}

// Unprepared Linears decide on their first FP8 forward (the filter sees the name ""), and make their state then.
TEST_P(Fp8LinearTest, LazyStateOnFirstForward) {
  auto fc = nn::make<nn::Linear>(16, 16);
  fc->to(dev());
  amp::Fp8Recipe recipe{.amax_history_len = 3};
  std::vector<std::string> asked;
  recipe.module_filter = [&asked](const amp::Fp8ModuleInfo& m) {
    asked.emplace_back(std::string(m.name) + "/" + std::string(m.type));
    return true;
  };
  EXPECT_EQ(fc->state_dict().size(), 2u);
  {
    amp::Autocast cast(DType::BFloat16, fp8_options(recipe));
    NoGradGuard no_grad;  // an inference forward works (nothing saved for backward)
    const Tensor y = fc(input({4, 16}, -1, 1, 70));
    EXPECT_EQ(y.shape(), (Shape{4, 16}));
    EXPECT_FALSE(y.requires_grad());
  }
  EXPECT_EQ(asked, (std::vector<std::string>{"/Linear"}));
  ASSERT_NE(fc->fp8_state(), nullptr);
  EXPECT_EQ(fc->state_dict().size(), 5u);
  EXPECT_EQ(fc->fp8_state()->amax_history().shape(), (Shape{3, 3}));
}

// Exact resume: the state saved after step 2 (weights and FP8 buffers), loaded into a freshly prepared model, gives a
// step 3 bit-identical to the one of the run that went on; a model not prepared refuses the state and says why.
TEST_P(Fp8LinearTest, StateDictResumesExactly) {
  const amp::Fp8Recipe recipe{.amax_history_len = 4};
  auto make_model = [&] {
    auto m = nn::make<TwoLayers>();
    m->to(dev());
    return m;
  };
  auto step = [&](TwoLayers& m, int i) {
    m.zero_grad();
    const Tensor x = input({5, 32}, -1.0 - i, 1.0 + i, 80 + i).requires_grad_();
    Tensor y;
    {
      amp::Autocast cast(DType::BFloat16, fp8_options(recipe));
      y = m.fc2(relu(m.fc1(x)));
    }
    y.backward(input({5, 16}, -1, 1, 90 + i, DType::BFloat16));
    return std::vector<Tensor>{y, x.grad(), m.fc1->weight.grad(), m.fc2->weight.grad(), m.fc1->bias.grad()};
  };
  auto a = make_model();
  amp::prepare_fp8(*a, recipe, dev());
  step(*a, 0);
  step(*a, 1);
  nn::StateDict saved;
  for (const auto& [k, t] : a->state_dict()) saved.emplace_back(k, t.clone());
  const std::vector<Tensor> want = step(*a, 2);

  // Prepared on the CPU, then moved (as a program does before training): on a GPU the state is remade there at the
  // first FP8 forward, from the buffers' loaded values.
  auto b = nn::make<TwoLayers>();
  amp::prepare_fp8(*b, recipe, Device::cpu());
  b->to(dev());
  b->load_state_dict(saved);
  const std::vector<Tensor> got = step(*b, 2);
  const char* names[] = {"y", "dX", "fc1 dW", "fc2 dW", "fc1 db"};
  for (size_t i = 0; i < want.size(); ++i) expect_bitwise_equal(got[i], want[i], names[i]);
  expect_bitwise_equal(b->fc1->fp8_state()->amax_history(), a->fc1->fp8_state()->amax_history(), "history");
  expect_bitwise_equal(b->fc2->fp8_state()->scale(), a->fc2->fp8_state()->scale(), "scale");

  auto c = make_model();  // not prepared
  expect_error([&] { c->load_state_dict(saved); },
               {"unexpected keys", "fc1.fp8_amax_history", "amp::prepare_fp8(model, recipe, device)"});
  // Moving a prepared model keeps its FP8 state (remade on the buffers' device at the next FP8 forward).
  b->to(Device::cpu());
  b->to(dev());
  const std::vector<Tensor> again = step(*b, 3);
  const std::vector<Tensor> want4 = step(*a, 3);
  for (size_t i = 0; i < want4.size(); ++i) expect_bitwise_equal(again[i], want4[i], names[i]);
  // ... and its buffers (what a checkpoint saves) still are the state it computes with.
  const nn::StateDict sa = a->state_dict(), sb = b->state_dict();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) expect_bitwise_equal(sb[i].second, sa[i].second, sb[i].first);
  for (const auto& [k, t] : sb) {
    if (k == "fc1.fp8_amax_history") expect_bitwise_equal(t, b->fc1->fp8_state()->amax_history(), k);
    if (k == "fc2.fp8_scale") expect_bitwise_equal(t, b->fc2->fp8_state()->scale(), k);
  }
}

// Gradient checkpointing: backward recomputes the forward (after the region has closed) under the region's FP8
// recipe, with the scales the forward used; outputs, gradients and the state equal those of a run without
// checkpointing, bit for bit, over two steps (the second with scales from recorded amaxes).
TEST_P(Fp8LinearTest, CheckpointRecomputationKeepsTheScales) {
  const amp::Fp8Recipe recipe{.amax_history_len = 4};
  const nn::StateDict init = nn::make<TwoLayers>()->state_dict();
  auto run = [&](bool checkpointed) {
    auto m = nn::make<TwoLayers>();
    m->load_state_dict(init);
    m->to(dev());
    std::vector<Tensor> out;
    for (int i = 0; i < 2; ++i) {
      m->zero_grad();
      const Tensor x = input({5, 32}, -1.0 - i, 1.0 + i, 130 + i).requires_grad_();
      Tensor y;
      {
        amp::Autocast cast(DType::BFloat16, fp8_options(recipe));
        auto block = [&](const Tensor& in) { return m->fc2(relu(m->fc1(in))); };
        y = checkpointed ? autograd::checkpoint(block, x) : block(x);
      }
      y.backward(input({5, 16}, -1, 1, 140 + i, DType::BFloat16));
      out.insert(out.end(), {y, x.grad(), m->fc1->weight.grad(), m->fc2->weight.grad()});
    }
    out.insert(out.end(), {m->fc1->fp8_state()->amax_history(), m->fc1->fp8_state()->scale(),
                           m->fc2->fp8_state()->amax_history(), m->fc2->fp8_state()->scale()});
    return out;
  };
  const std::vector<Tensor> plain = run(false), checkpointed = run(true);
  ASSERT_EQ(plain.size(), checkpointed.size());
  for (size_t i = 0; i < plain.size(); ++i) expect_bitwise_equal(checkpointed[i], plain[i], std::to_string(i));
}

// Module::to() moves or converts the FP8 buffers in place; the next FP8 forward remakes the state from their values
// (float32, on the buffers' device), and the buffers keep being the state's tensors.
TEST_P(Fp8LinearTest, ConvertedModelKeepsItsState) {
  auto fc = nn::make<nn::Linear>(16, 16);
  fc->to(dev());
  const amp::Fp8Recipe recipe{.amax_history_len = 3};
  amp::prepare_fp8(*fc, recipe, dev());
  const Tensor x = input({4, 16}, -3, 3, 110);
  auto forward = [&](const Tensor& in) {
    amp::Autocast cast(DType::BFloat16, fp8_options(recipe));
    return fc(in);
  };
  forward(x);  // records amax(x), amax(W) in row 0
  const double ax = amax_of(values(x)), aw = amax_of(values(fc->weight));
  fc->to(DType::Float64);  // the buffers too
  EXPECT_EQ(fc->state_dict()[2].second.dtype(), DType::Float64);
  const Tensor y = forward(x.to(DType::Float64));  // update(): row 0 rolls to the last row
  EXPECT_EQ(y.dtype(), DType::BFloat16);
  const amp::Fp8ScalingState* st = fc->fp8_state();
  EXPECT_EQ(st->amax_history().dtype(), DType::Float32);
  const std::vector<double> h = values(st->amax_history());  // (3, 3)
  EXPECT_EQ(h[2 * 3 + 0], ax);
  EXPECT_EQ(h[2 * 3 + 1], aw);
  EXPECT_EQ(values(st->scale())[0], static_cast<double>(448.0f / static_cast<float>(ax)));
  fc->to(DType::Float32);
  forward(x);
  const nn::StateDict sd = fc->state_dict();
  ASSERT_EQ(sd.size(), 5u);
  expect_bitwise_equal(sd[2].second, fc->fp8_state()->amax_history(), "fp8_amax_history");
  expect_bitwise_equal(sd[3].second, fc->fp8_state()->scale(), "fp8_scale");
  expect_bitwise_equal(sd[4].second, fc->fp8_state()->scale_inv(), "fp8_scale_inv");
  EXPECT_EQ(values(sd[2].second)[0], ax);  // the last forward recorded into the state the buffers show
}

TEST_P(Fp8LinearTest, Errors) {
  amp::Fp8Recipe bad{.amax_history_len = 0};
  expect_error([&] { amp::Autocast cast(DType::BFloat16, fp8_options(bad)); }, {"Fp8Recipe", "amax_history_len"});
  EXPECT_EQ(autocast::fp8_recipe(dev().type()), nullptr);
  EXPECT_FALSE(autocast::is_enabled(dev().type()));  // nothing left switched on
  amp::Fp8Recipe no_filter;
  no_filter.module_filter = nullptr;
  expect_error([&] { amp::Autocast cast(DType::BFloat16, fp8_options(no_filter)); }, {"module_filter"});
  expect_error([&] { amp::Autocast cast(DType::Float32, fp8_options(amp::Fp8Recipe{})); }, {"Float16 or BFloat16"});

  auto state = amp::Fp8ScalingState::for_linear(amp::Fp8Recipe{}, dev());
  const Tensor w = input({16, 20}, -1, 1, 1);
  expect_error(
      [&] {
        nn::fp8_linear(input({4, 20}, -1, 1, 2), w, {}, state, DType::BFloat16);
      },
      {"fp8_linear", "multiples of 16", "[16, 20]"});
  const Tensor w16 = input({16, 32}, -1, 1, 3);
  expect_error(
      [&] {
        nn::fp8_linear(input({4, 16}, -1, 1, 4), w16, {}, state, DType::BFloat16);
      },
      {"fp8_linear", "(..., 32)"});
  expect_error(
      [&] {
        nn::fp8_linear(input({4, 32}, -1, 1, 4), w16, {}, state, DType::Float64);
      },
      {"fp8_linear", "out_dtype"});
  amp::Fp8ScalingState two(amp::Fp8Recipe{}, {amp::Fp8Pass::Forward, amp::Fp8Pass::Forward}, dev());
  expect_error(
      [&] {
        nn::fp8_linear(input({4, 32}, -1, 1, 4), w16, {}, two, DType::BFloat16);
      },
      {"fp8_linear", "tracks 2"});
  expect_error([&] { nn::Linear(20, 16).enable_fp8(amp::Fp8Recipe{}, dev()); }, {"multiples of 16"});
  if (!dev().is_cpu()) {
    auto cpu_state = amp::Fp8ScalingState::for_linear(amp::Fp8Recipe{}, Device::cpu());
    expect_error(
        [&] {
          nn::fp8_linear(input({4, 32}, -1, 1, 4), w16, {}, cpu_state, DType::BFloat16);
        },
        {"fp8_linear", "FP8 state on cpu"});
  }
}

KILN_INSTANTIATE_BACKENDS(Fp8LinearTest);

// ---------------------------------------------------------------- GPU only

// Whole training steps (FP8 forward, backward, SGD) captured in a cuda::Graph and replayed: no host sync anywhere in
// the FP8 path (a capture fails on one), and the replayed run follows an eager run of the same steps, its FP8 scales
// and amax histories included (the delayed scaling updates inside the graph).
TEST(Fp8LinearCuda, CapturedStepsFollowEagerSteps) {
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  if (cuda::compute_capability(0) < 89) GTEST_SKIP() << "FP8 needs sm_89+";
  const Device gpu = Device::cuda(0);
  const amp::Fp8Recipe recipe{.amax_history_len = 4};
  const nn::StateDict init = nn::make<TwoLayers>()->state_dict();
  const Tensor x = testing::make(testing::uniform(24 * 32, -2, 2, 120), {24, 32}, {.device = gpu});
  struct Run {
    nn::Handle<TwoLayers> model;
    std::unique_ptr<optim::SGD> opt;
    Tensor loss;
  };
  auto make_run = [&] {
    Run r{nn::make<TwoLayers>(), nullptr, {}};
    r.model->load_state_dict(init);
    r.model->to(gpu);
    amp::prepare_fp8(*r.model, recipe, gpu);
    r.opt = std::make_unique<optim::SGD>(r.model->parameters(), optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
    return r;
  };
  auto step = [&](Run& r) {
    r.opt->zero_grad();
    Tensor y;
    {
      amp::Autocast cast(DType::BFloat16, {.fp8 = recipe});
      y = (*r.model)(x);
    }
    r.loss = mean(square(y.to(DType::Float32)));
    r.loss.backward();
    r.opt->step();
  };
  Run eager = make_run(), graphed = make_run();
  const int warmup = 3, steps = 6;
  for (int i = 0; i < warmup; ++i) step(eager);
  cuda::Graph graph;
  graph.capture([&] { step(graphed); }, warmup);
  std::vector<std::vector<double>> scales;  // fc1's (x, weight, gradient) scales after each replay
  for (int k = 0; k < steps; ++k) {
    step(eager);
    graph.replay();
    EXPECT_NEAR(graphed.loss.item<double>(), eager.loss.item<double>(), 1e-3 * std::abs(eager.loss.item<double>()))
        << "step " << k;
    scales.push_back(values(graphed.model->fc1->fp8_state()->scale()));
    const std::vector<double> eager_scales = values(eager.model->fc1->fp8_state()->scale());
    ASSERT_EQ(scales.back().size(), 3u);
    for (size_t j = 0; j < 3; ++j) EXPECT_NEAR(scales.back()[j], eager_scales[j], 1e-3 * eager_scales[j]) << k << j;
  }
  // The input x is the same every step, so its scale stays; the weight's and the gradient's follow the training, and
  // they moved between replays only if the update runs inside the graph.
  EXPECT_EQ(scales.front()[0], scales.back()[0]);
  EXPECT_TRUE(scales.front()[1] != scales.back()[1] || scales.front()[2] != scales.back()[2])
      << "weight scale " << scales.back()[1] << ", gradient scale " << scales.back()[2];
  const nn::StateDict se = eager.model->state_dict(), sg = graphed.model->state_dict();
  ASSERT_EQ(se.size(), sg.size());
  for (size_t i = 0; i < se.size(); ++i) {
    const std::vector<double> a = values(se[i].second), b = values(sg[i].second);
    double scale = 0, diff = 0;
    for (size_t j = 0; j < a.size(); ++j) {
      scale = std::max(scale, std::abs(a[j]));
      diff = std::max(diff, std::abs(a[j] - b[j]));
    }
    EXPECT_LE(diff, 1e-3 * scale) << se[i].first;
  }
  EXPECT_EQ(sg.size(), 5u + 5u + 2u);  // fc1, fc2: weight, bias and 3 FP8 buffers; odd (20 features): plain
}

}  // namespace
}  // namespace kiln
