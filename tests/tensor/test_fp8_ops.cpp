// The FP8 compute primitives (kiln/tensor/fp8_ops.h): fp8_quantize (saturating quantisation with a fused amax,
// plain and transposed), fp8_gemm (the scaled FP8 product) and fp8_update_scales (the delayed-scaling update, against
// a float64 reference of Fp8ScalingState's rules). References are computed here in float64 from the
// OCP FP8 bit fields (a code's value from its sign, exponent and mantissa; the code of a value by searching the
// decoded codes for the nearest, ties to even), never by kiln's conversions.
//
// Fp8OpsTest runs on every backend (cuda0 too where a GPU is visible: there it checks the CUDA kernels and
// cuBLASLt). Fp8CudaOps holds the GPU-only cases (GPU against CPU on large shapes, a CUDA graph capture).
//
// Tolerances of the products. Inputs are exact FP8 values and every product of two of them is exact in float32, so
// the only errors are the summation's and the final rounding's:
//  - rounding: 2 ulps of the output dtype at |reference| + |bias| (one rounding to float32, one to the output dtype;
//    the bias may be added before either);
//  - summation on the CPU: float64, negligible;
//  - summation on the GPU: float32 between chunks of K in cuBLASLt's order (K * 2^-24 * S at most, S = sa * sb *
//    sum_k |a_ik b_jk|), and within each chunk Hopper's FP8 tensor cores keep their own accumulator, about 13
//    mantissa bits that truncate, for up to 4 instructions of 32 products before cuBLASLt promotes the partial sum
//    to float32 (FAST_ACCUM off). That bounds the error by 2^-9 * S, the bound used for random data.
//  The "exact grid" cases take values whose every partial sum, in any order and chunking, is exact in 11 bits, and
//  powers of two for the scales: there accumulation adds no error at all, so the GPU must give the reference up to
//  the output rounding alone. They are the tight check of layouts, scales, bias and accumulation.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <vector>

#include "kiln/autograd/fp8.h"
#include "kiln/tensor/cuda.h"
#include "kiln/tensor/fp8_ops.h"
#include "support/float8_reference.h"
#include "support/test_support.h"

namespace kiln {
namespace {

using testing::expect_error;
using testing::kInf;
using testing::kNaN;

// ---------------------------------------------------------------- references from the bit fields

using Format = testing::Fp8Format;
using testing::fp8_format_of;
using testing::kE4M3;
using testing::kE5M2;

// The codes of an FP8 tensor (any device), row-major.
std::vector<uint8_t> codes_of(const Tensor& t) {
  const Tensor host = t.to(Device::cpu()).contiguous();
  std::vector<uint8_t> out(static_cast<size_t>(host.numel()));
  if (!out.empty()) std::memcpy(out.data(), host.data_ptr(), out.size());
  return out;
}

Tensor from_codes(const std::vector<uint8_t>& codes, const Shape& shape, DType dtype, Device device) {
  return from_blob(codes.data(), shape, dtype, device);
}

// The reference quantisation of x's values (as x holds them, in its dtype) with a float32 scale: the product in
// float32 (one IEEE rounding), then the nearest code.
std::vector<uint8_t> reference_codes(const std::vector<double>& x, float scale, const Format& f) {
  std::vector<uint8_t> out;
  for (double v : x) out.push_back(testing::fp8_code(f, static_cast<double>(static_cast<float>(v) * scale)));
  return out;
}

// max |x| where a NaN wins.
double reference_amax(const std::vector<double>& x, double start = 0) {
  double m = start;
  for (double v : x) m = (std::isnan(m) || std::isnan(v)) ? kNaN : std::max(m, std::abs(v));
  return m;
}

float f32(const Tensor& t) { return t.to(Device::cpu()).item<float>(); }

// A (1,) float32 view at element `index` of a fresh (n,) tensor of `fill`: a non-owning view with an offset.
Tensor cell_view(double fill, int64_t index, int64_t n, Device dev) {
  return full({n}, fill, {.dtype = DType::Float32, .device = dev}).narrow(0, index, 1);
}

const DType kInputTypes[] = {DType::Float32, DType::BFloat16, DType::Float16};

// ---------------------------------------------------------------- fp8_quantize

class Fp8OpsTest : public testing::BackendTest {};

// Values that exercise every path of the conversion, for a format, before scaling by `scale`: zeros, ±max and just
// beyond, ±inf, NaN, the subnormals, half the smallest subnormal (a tie to 0) and just above it, a midpoint between
// two codes (ties to even), values in the normal range.
std::vector<double> probe_values(const Format& f, double scale) {
  std::vector<double> v = {0.0,
                           -0.0,
                           f.max_value,
                           -f.max_value,
                           f.max_value * 1.01,
                           -f.max_value * 4,
                           kInf,
                           -kInf,
                           kNaN,
                           f.min_sub,
                           -3 * f.min_sub,
                           f.min_sub / 2,
                           f.min_sub * 0.75,
                           1.0,
                           -1.0625,
                           3.3,
                           -0.1,
                           1e30};
  // The midpoint between 1 and the next code up: a tie, which rounds to 1 (the even code).
  v.push_back(1.0 + std::ldexp(1.0, -f.man_bits - 1));
  for (double& x : v) x /= scale;  // so that x * scale lands on the probe
  return v;
}

TEST_P(Fp8OpsTest, QuantizeRoundsSaturatesAndKeepsNaN) {
  for (const Format* f : {&kE4M3, &kE5M2}) {
    for (DType in : kInputTypes) {
      for (double scale : {1.0, 0.375, 16.0}) {
        SCOPED_TRACE(::testing::Message() << f->dtype << " from " << in << ", scale " << scale);
        std::vector<double> probes = probe_values(*f, scale);
        probes.erase(probes.begin() + 8);  // NaN: its amax is checked apart; here amax must stay finite
        const Tensor x = testing::make(probes, {static_cast<int64_t>(probes.size())}, opts(in));
        const std::vector<double> held = testing::values(x);  // the values as x's dtype holds them
        const Tensor s = cell_view(scale, 0, 1, dev());
        const Tensor amax = cell_view(0.0, 0, 1, dev());
        const Tensor q = internal::fp8_quantize(x, f->dtype, s, amax);
        EXPECT_EQ(q.dtype(), f->dtype);
        EXPECT_EQ(q.shape(), x.shape());
        EXPECT_EQ(q.device(), dev());
        EXPECT_EQ(codes_of(q), reference_codes(held, static_cast<float>(scale), *f));
        EXPECT_EQ(f32(amax), reference_amax(held));  // inf among the probes
      }
    }
  }
}

TEST_P(Fp8OpsTest, QuantizeNaNCodesAndAmax) {
  for (const Format* f : {&kE4M3, &kE5M2}) {
    for (DType in : kInputTypes) {
      SCOPED_TRACE(::testing::Message() << f->dtype << " from " << in);
      const Tensor x = testing::make({1.0, kNaN, -2.0, -kNaN, 0.5}, {5}, opts(in));
      const Tensor amax = cell_view(3.0, 0, 1, dev());
      const Tensor q = internal::fp8_quantize(x, f->dtype, cell_view(2.0, 0, 1, dev()), amax);
      const std::vector<uint8_t> codes = codes_of(q);
      EXPECT_EQ(codes[1], 0x7f);
      EXPECT_EQ(codes[3], 0x7f);  // any NaN is the canonical code
      EXPECT_EQ(codes[0], testing::fp8_code(*f, 2.0));
      EXPECT_EQ(codes[2], testing::fp8_code(*f, -4.0));
      EXPECT_TRUE(std::isnan(f32(amax)));
      // A NaN amax stays NaN whatever comes next.
      internal::fp8_quantize(testing::make({100.0}, {1}, opts(in)), f->dtype, cell_view(1.0, 0, 1, dev()), amax);
      EXPECT_TRUE(std::isnan(f32(amax)));
    }
  }
}

// Every code of a format, decoded, quantised with scale 1, gives itself back (NaN codes give 0x7f, E5M2's
// infinities saturate to ±max).
TEST_P(Fp8OpsTest, QuantizeEveryCodeRoundTrips) {
  for (const Format* f : {&kE4M3, &kE5M2}) {
    std::vector<double> v;
    for (int c = 0; c < 256; ++c) v.push_back(testing::fp8_value(*f, static_cast<uint8_t>(c)));
    const Tensor x = testing::make(v, {256}, opts(DType::Float32));
    const Tensor q = internal::fp8_quantize(x, f->dtype, cell_view(1.0, 0, 1, dev()), cell_view(0.0, 0, 1, dev()));
    const std::vector<uint8_t> codes = codes_of(q);
    for (int c = 0; c < 256; ++c) {
      const double value = v[c];
      const uint8_t expected = std::isnan(value)   ? uint8_t{0x7f}
                               : std::isinf(value) ? uint8_t((value < 0 ? 0x80 : 0) | f->max_code)
                                                   : static_cast<uint8_t>(c);
      EXPECT_EQ(codes[c], expected) << f->dtype << " code " << c;
    }
  }
}

// The amax cell and the scale as the scaling state holds them: views with offsets into its tensors. Only the cell
// changes; it keeps the largest value over calls, like Fp8ScalingState::record_amax.
TEST_P(Fp8OpsTest, AmaxAccumulatesInAViewOfTheHistory) {
  amp::Fp8ScalingState st(amp::Fp8Recipe{.amax_history_len = 3},
                          {amp::Fp8Pass::Forward, amp::Fp8Pass::Forward, amp::Fp8Pass::Backward}, dev());
  amp::Fp8ScalingState twin(amp::Fp8Recipe{.amax_history_len = 3},
                            {amp::Fp8Pass::Forward, amp::Fp8Pass::Forward, amp::Fp8Pass::Backward}, dev());
  st.scale().narrow(0, 1, 1).fill_(0.5);
  const Tensor scale = st.scale().narrow(0, 1, 1);                     // offset 1
  const Tensor amax = st.amax_history().select(0, 0).narrow(0, 1, 1);  // h[0, 1]: offset 1
  const std::vector<std::vector<double>> steps = {{1, -5, 2}, {3, 0.25, -1}, {-7, 6, 0}, {4, kInf, 1}, {2, 2, 2}};
  double expected = 0;
  for (const auto& data : steps) {
    const Tensor x = testing::make(data, {3}, opts());
    const Tensor q = internal::fp8_quantize(x, DType::Float8_e4m3fn, scale, amax);
    twin.record_amax(1, x);
    expected = reference_amax(data, expected);
    EXPECT_EQ(f32(amax), expected);
    EXPECT_EQ(codes_of(q), reference_codes(data, 0.5f, kE4M3));
  }
  // The rest of the history and the scales are untouched; the cell holds what record_amax would have recorded.
  const std::vector<double> h = testing::values(st.amax_history());
  EXPECT_EQ(h, testing::values(twin.amax_history()));
  EXPECT_EQ(h, (std::vector<double>{0, kInf, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(testing::values(st.scale()), (std::vector<double>{1, 0.5, 1}));
}

TEST_P(Fp8OpsTest, QuantizeTransposed) {
  for (const Format* f : {&kE4M3, &kE5M2}) {
    for (DType in : kInputTypes) {
      // Shapes around the 32 x 32 tiles of the CUDA kernel: partial tiles, one row, one column.
      for (const Shape& shape : {Shape{37, 70}, Shape{64, 96}, Shape{1, 45}, Shape{50, 1}, Shape{33, 31}}) {
        SCOPED_TRACE(::testing::Message() << f->dtype << " from " << in << " (" << shape[0] << ", " << shape[1] << ")");
        const int64_t r = shape[0], c = shape[1];
        std::vector<double> v = testing::uniform(r * c, -600, 600, 7);
        v[static_cast<size_t>(r * c / 2)] = -1e6;  // saturates, and is the amax
        const Tensor x = testing::make(v, shape, opts(in));
        const std::vector<double> held = testing::values(x);
        const Tensor amax = cell_view(1.0, 2, 4, dev());
        const Tensor q = internal::fp8_quantize(x, f->dtype, cell_view(0.75, 3, 5, dev()), amax, true);
        EXPECT_EQ(q.shape(), (Shape{c, r}));
        EXPECT_TRUE(q.is_contiguous());
        const std::vector<uint8_t> plain = reference_codes(held, 0.75f, *f);
        std::vector<uint8_t> expected(plain.size());
        for (int64_t i = 0; i < r; ++i)
          for (int64_t j = 0; j < c; ++j) expected[j * r + i] = plain[i * c + j];
        EXPECT_EQ(codes_of(q), expected);
        EXPECT_EQ(f32(amax), reference_amax(held));
      }
    }
  }
}

// Both layouts in one call, against the references, with the column sums against float64 sums: shapes the GPU's
// paired kernel takes (whole and partial 64-row tiles, rows a multiple of 16 or only of 4, several column tiles) and
// shapes it leaves to the two separate quantisations (columns not a multiple of 64, rows not of 4). The sums are
// float32 sums, within a bound of the float64 one by the sum of magnitudes.
TEST_P(Fp8OpsTest, QuantizePairGivesBothLayoutsAndColumnSums) {
  for (const Format* f : {&kE4M3, &kE5M2}) {
    for (DType in : kInputTypes) {
      for (const Shape& shape :
           {Shape{128, 192}, Shape{80, 128}, Shape{132, 64}, Shape{4, 128}, Shape{20, 48}, Shape{37, 64}}) {
        SCOPED_TRACE(::testing::Message() << f->dtype << " from " << in << " (" << shape[0] << ", " << shape[1] << ")");
        const int64_t r = shape[0], c = shape[1];
        std::vector<double> v = testing::uniform(r * c, -300, 300, 11);
        v[static_cast<size_t>(r * c / 3)] = -2e4;  // saturates E4M3, and is the amax
        const Tensor x = testing::make(v, shape, opts(in));
        const std::vector<double> held = testing::values(x);
        const Tensor amax = cell_view(1.0, 1, 3, dev());
        Tensor sums;
        const auto [q, qt] = internal::fp8_quantize_pair(x, f->dtype, cell_view(0.5, 2, 4, dev()), amax, &sums);
        ASSERT_EQ(q.shape(), shape);
        ASSERT_EQ(qt.shape(), (Shape{c, r}));
        EXPECT_TRUE(q.is_contiguous() && qt.is_contiguous());
        const std::vector<uint8_t> plain = reference_codes(held, 0.5f, *f);
        std::vector<uint8_t> transposed(plain.size());
        for (int64_t i = 0; i < r; ++i)
          for (int64_t j = 0; j < c; ++j) transposed[j * r + i] = plain[i * c + j];
        EXPECT_EQ(codes_of(q), plain);
        EXPECT_EQ(codes_of(qt), transposed);
        EXPECT_EQ(f32(amax), reference_amax(held));
        ASSERT_EQ(sums.shape(), (Shape{c}));
        ASSERT_EQ(sums.dtype(), DType::Float32);
        const std::vector<double> got = testing::values(sums);
        for (int64_t j = 0; j < c; ++j) {
          double exact = 0, magnitude = 0;
          for (int64_t i = 0; i < r; ++i) {
            exact += held[i * c + j];
            magnitude += std::abs(held[i * c + j]);
          }
          ASSERT_NEAR(got[j], exact, 4 * r * 0x1p-24 * magnitude) << "column " << j;
        }
        // Without sums: the same codes.
        const auto [q2, qt2] = internal::fp8_quantize_pair(x, f->dtype, cell_view(0.5, 0, 1, dev()), amax);
        EXPECT_EQ(codes_of(q2), plain);
        EXPECT_EQ(codes_of(qt2), transposed);
      }
    }
  }
  expect_error(
      [&] {
        internal::fp8_quantize_pair(zeros({2, 2, 2}, opts()), DType::Float8_e4m3fn, cell_view(1, 0, 1, dev()),
                                    cell_view(0, 0, 1, dev()));
      },
      {"fp8_quantize_pair", "2-D"});
}

// A GELU applied as the values are quantised (Fp8Activation): the codes, amax and column sums are exactly those of
// quantising kiln's float32 gelu of x, on every backend (on a GPU: the pair kernel applying it itself for 16-bit x to
// E4M3 without sums, the other cases a float32 pass first; both call the unary kernels' functions), for shapes the
// pair kernel takes and shapes it does not, both GELU forms, and the plain quantisation too. And independently of
// kiln's gelu: each code decodes to within half an E4M3/E5M2 step of the float64 GELU times the scale.
TEST_P(Fp8OpsTest, QuantizeWithAGeluIsTheQuantisationOfTheFloat32Gelu) {
  using internal::Fp8Activation;
  for (const Fp8Activation act : {Fp8Activation::Gelu, Fp8Activation::GeluTanh}) {
    const bool tanh_form = act == Fp8Activation::GeluTanh;
    for (const Format* f : {&kE4M3, &kE5M2}) {
      for (DType in : kInputTypes) {
        for (const Shape& shape : {Shape{128, 192}, Shape{132, 64}, Shape{20, 48}}) {
          for (const bool with_sums : {false, true}) {
            SCOPED_TRACE(::testing::Message()
                         << (tanh_form ? "tanh GELU, " : "GELU, ") << f->dtype << " from " << in << " (" << shape[0]
                         << ", " << shape[1] << ")" << (with_sums ? ", sums" : ""));
            const int64_t r = shape[0], c = shape[1];
            std::vector<double> v = testing::uniform(r * c, -6, 6, 21);
            v[5] = -kInf;  // GELU(-inf) = -0
            v[6] = 300;    // the amax: GELU(300) = 300
            const Tensor x = testing::make(v, shape, opts(in));
            const Tensor reference_input = internal::gelu(x.to(DType::Float32), tanh_form);
            const Tensor scale = cell_view(0.75, 1, 2, dev());
            const Tensor amax = cell_view(0.0, 0, 1, dev()), reference_amax_cell = cell_view(0.0, 0, 1, dev());
            Tensor sums, reference_sums;
            const auto [q, qt] =
                internal::fp8_quantize_pair(x, f->dtype, scale, amax, with_sums ? &sums : nullptr, act);
            const auto [rq, rqt] = internal::fp8_quantize_pair(reference_input, f->dtype, scale, reference_amax_cell,
                                                               with_sums ? &reference_sums : nullptr);
            EXPECT_EQ(codes_of(q), codes_of(rq));
            EXPECT_EQ(codes_of(qt), codes_of(rqt));
            EXPECT_EQ(f32(amax), f32(reference_amax_cell));
            EXPECT_EQ(f32(amax), 300.0f);
            if (with_sums) {
              EXPECT_TRUE(internal::equal(sums, reference_sums));
            }
            // The plain quantisation with the activation.
            const Tensor plain_amax = cell_view(0.0, 0, 1, dev());
            EXPECT_EQ(codes_of(internal::fp8_quantize(x, f->dtype, scale, plain_amax, false, act)), codes_of(rq));
            EXPECT_EQ(f32(plain_amax), 300.0f);
            // Against the float64 GELU of the values x holds.
            const std::vector<double> held = testing::values(x);
            const std::vector<uint8_t> got = codes_of(q);
            int failures = 0;
            for (size_t i = 0; i < held.size(); ++i) {
              const double h = held[i];
              const double g =
                  std::isinf(h) ? (h > 0 ? h : -0.0)
                  : tanh_form ? 0.5 * h * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (h + 0.044715 * h * h * h)))
                              : 0.5 * h * (1 + std::erf(h / std::sqrt(2.0)));
              const double want = std::min(g * 0.75, f->max_value);
              const double decoded = testing::fp8_value(*f, got[i]);
              // Half a step at the value's exponent (the spacing of codes there), and the subnormal spacing near 0;
              // plus the float32 GELU's own error, which in the far negative tail (1 + erf(x) cancelling) is a few
              // float32 ulps of |x| rather than of the result.
              const double step =
                  std::max(std::ldexp(1.0, std::ilogb(std::max(std::abs(want), f->min_sub)) - f->man_bits), f->min_sub);
              const double gelu_error = 16 * 0x1p-24 * std::abs(h) * 0.75;
              if (!(std::abs(decoded - want) <= 0.5 * step + gelu_error) && ++failures <= 5) {
                ADD_FAILURE() << "x = " << h << ": code " << int(got[i]) << " decodes to " << decoded << ", want "
                              << want;
              }
            }
            EXPECT_EQ(failures, 0);
          }
        }
      }
    }
  }
}

// The gradient through a GELU quantised without writing it (fp8_quantize_pair_through_gelu): codes, amax and column
// sums exactly those of quantising kiln's float32 gelu_backward of the two inputs, on every backend (on a GPU the pair
// kernel takes 16-bit inputs of the erf form itself, the rest a float32 pass first), and each code within half a step
// of the float64 product g * gelu'(h).
TEST_P(Fp8OpsTest, QuantizeThroughAGeluIsTheQuantisationOfItsFloat32Gradient) {
  for (const bool tanh_form : {false, true}) {
    for (const Format* f : {&kE4M3, &kE5M2}) {
      for (DType in : kInputTypes) {
        for (const Shape& shape : {Shape{128, 192}, Shape{20, 48}}) {
          for (const bool with_sums : {false, true}) {
            SCOPED_TRACE(::testing::Message()
                         << (tanh_form ? "tanh GELU, " : "GELU, ") << f->dtype << " from " << in << " (" << shape[0]
                         << ", " << shape[1] << ")" << (with_sums ? ", sums" : ""));
            const int64_t n = shape[0] * shape[1];
            const Tensor g = testing::make(testing::uniform(n, -3, 3, 31), shape, opts(in));
            const Tensor h = testing::make(testing::uniform(n, -5, 5, 32), shape, opts(in));
            const Tensor reference_input =
                internal::gelu_backward(g.to(DType::Float32), h.to(DType::Float32), tanh_form);
            const Tensor scale = cell_view(2.0, 0, 1, dev());
            const Tensor amax = cell_view(0.0, 0, 1, dev()), reference_amax_cell = cell_view(0.0, 0, 1, dev());
            Tensor sums, reference_sums;
            const auto [q, qt] = internal::fp8_quantize_pair_through_gelu(g, h, tanh_form, f->dtype, scale, amax,
                                                                          with_sums ? &sums : nullptr);
            const auto [rq, rqt] = internal::fp8_quantize_pair(reference_input, f->dtype, scale, reference_amax_cell,
                                                               with_sums ? &reference_sums : nullptr);
            EXPECT_EQ(codes_of(q), codes_of(rq));
            EXPECT_EQ(codes_of(qt), codes_of(rqt));
            EXPECT_EQ(f32(amax), f32(reference_amax_cell));
            if (with_sums) testing::expect_values(sums, {shape[1]}, testing::values(reference_sums), 1e-6, 1e-5);
            // Against float64.
            const std::vector<double> gv = testing::values(g), hv = testing::values(h);
            const std::vector<uint8_t> got = codes_of(q);
            int failures = 0;
            for (int64_t i = 0; i < n; ++i) {
              const double x = hv[i];
              double d;
              if (tanh_form) {
                const double k = std::sqrt(2 / std::numbers::pi), t = std::tanh(k * (x + 0.044715 * x * x * x));
                d = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
              } else {
                d = 0.5 * (1 + std::erf(x / std::sqrt(2.0))) +
                    x * std::exp(-0.5 * x * x) / std::sqrt(2 * std::numbers::pi);
              }
              const double want = std::clamp(gv[i] * d * 2.0, -f->max_value, f->max_value);
              const double step =
                  std::max(std::ldexp(1.0, std::ilogb(std::max(std::abs(want), f->min_sub)) - f->man_bits), f->min_sub);
              const double float32_error = 16 * 0x1p-24 * (std::abs(gv[i]) * (1 + std::abs(x))) * 2.0;
              if (!(std::abs(testing::fp8_value(*f, got[i]) - want) <= 0.5 * step + float32_error) && ++failures <= 5) {
                ADD_FAILURE() << "g = " << gv[i] << ", h = " << x << ": code " << int(got[i]) << ", want " << want;
              }
            }
            EXPECT_EQ(failures, 0);
          }
        }
      }
    }
  }
  const Tensor one = cell_view(1, 0, 1, dev()), zero = cell_view(0, 0, 1, dev());
  expect_error(
      [&] {
        internal::fp8_quantize_pair_through_gelu(zeros({16, 64}, opts()), zeros({16, 32}, opts()), false,
                                                 DType::Float8_e5m2, one, zero);
      },
      {"fp8_quantize_pair_through_gelu", "[16, 32]", "[16, 64]"});
}

// Stacked rows quantised without the stack (fp8_quantize_pair_of_rows): the codes of both layouts and the amax equal
// those of quantising the concatenation, for parts the GPU quantises one by one into the stack (rows multiples of
// 16) and parts it concatenates first (20 rows), in every input dtype and both formats.
TEST_P(Fp8OpsTest, QuantizePairOfRowsEqualsThePairOfTheConcatenation) {
  for (const Format* f : {&kE4M3, &kE5M2}) {
    for (DType in : kInputTypes) {
      for (const std::vector<int64_t>& rows :
           {std::vector<int64_t>{64, 128, 32}, std::vector<int64_t>{48, 20}, std::vector<int64_t>{96}}) {
        SCOPED_TRACE(::testing::Message() << f->dtype << " from " << in << ", " << rows.size() << " parts");
        std::vector<Tensor> parts;
        for (size_t i = 0; i < rows.size(); ++i) {
          std::vector<double> v = testing::uniform(rows[i] * 128, -300, 300, 40 + i);
          if (i == 1) v[7] = -5e4;  // the amax, in the second part
          parts.push_back(testing::make(v, {rows[i], 128}, opts(in)));
        }
        const Tensor amax = cell_view(1.0, 1, 3, dev()), reference_amax_cell = cell_view(1.0, 1, 3, dev());
        const Tensor scale = cell_view(0.5, 0, 2, dev());
        const auto [q, qt] = internal::fp8_quantize_pair_of_rows(parts, f->dtype, scale, amax);
        const auto [rq, rqt] = internal::fp8_quantize_pair(cat(parts, 0), f->dtype, scale, reference_amax_cell);
        ASSERT_EQ(q.shape(), rq.shape());
        ASSERT_EQ(qt.shape(), rqt.shape());
        EXPECT_EQ(codes_of(q), codes_of(rq));
        EXPECT_EQ(codes_of(qt), codes_of(rqt));
        EXPECT_EQ(f32(amax), f32(reference_amax_cell));
      }
    }
  }
  const Tensor one = cell_view(1, 0, 1, dev()), zero = cell_view(0, 0, 1, dev());
  expect_error([&] { internal::fp8_quantize_pair_of_rows({}, DType::Float8_e4m3fn, one, zero); },
               {"fp8_quantize_pair_of_rows", "no parts"});
  expect_error(
      [&] {
        internal::fp8_quantize_pair_of_rows({zeros({16, 64}, opts()), zeros({16, 128}, opts())}, DType::Float8_e4m3fn,
                                            one, zero);
      },
      {"fp8_quantize_pair_of_rows", "part 1", "[16, 128]", "does not agree with part 0"});
  expect_error(
      [&] {
        internal::fp8_quantize_pair_of_rows({zeros({16, 64}, opts()), zeros({16, 64}, opts(DType::BFloat16))},
                                            DType::Float8_e4m3fn, one, zero);
      },
      {"part 1", "bfloat16", "float32"});
  expect_error([&] { internal::fp8_quantize_pair_of_rows({zeros({64}, opts())}, DType::Float8_e4m3fn, one, zero); },
               {"part 0", "2-D"});
}

// Many elements (several blocks and grid-stride steps on a GPU), and a contiguous view at an odd offset (the CUDA
// kernel's scalar path and its vector tail).
TEST_P(Fp8OpsTest, QuantizeLargeAndOffsetViews) {
  for (DType in : kInputTypes) {
    SCOPED_TRACE(::testing::Message() << in);
    const int64_t n = 300007;
    std::vector<double> v = testing::uniform(n + 3, -3000, 3000, 11);
    v[123457] = 70000;  // beyond E5M2's max: saturates; the amax
    const Tensor base = testing::make(v, {n + 3}, opts(in));
    for (int64_t offset : {0, 1, 3}) {
      const Tensor x = base.narrow(0, offset, n);
      const std::vector<double> held = testing::values(x);
      const Tensor amax = cell_view(0.0, 0, 1, dev());
      const Tensor q = internal::fp8_quantize(x, DType::Float8_e5m2, cell_view(1.5, 0, 1, dev()), amax);
      EXPECT_EQ(codes_of(q), reference_codes(held, 1.5f, kE5M2)) << "offset " << offset;
      EXPECT_EQ(f32(amax), reference_amax(held)) << "offset " << offset;
    }
  }
}

// fp8_transpose: the same codes, transposed, for shapes the GPU's tiled kernel takes (columns a multiple of 64, rows of
// 16) and for those it leaves to a strided copy; every byte value, NaN codes included, moves as it is.
TEST_P(Fp8OpsTest, TransposeMovesEveryCode) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{64, 128}, {48, 64},  {208, 192},
                                                           {20, 64},  {64, 100}, {1, 1}};
  for (const auto& [r, c] : shapes) {
    for (DType f8 : {DType::Float8_e4m3fn, DType::Float8_e5m2}) {
      SCOPED_TRACE(::testing::Message() << f8 << " (" << r << ", " << c << ")");
      std::vector<uint8_t> codes(static_cast<size_t>(r * c));
      for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>((i * 37 + i / 7) & 0xff);
      const Tensor t = internal::fp8_transpose(from_codes(codes, {r, c}, f8, dev()));
      ASSERT_EQ(t.shape(), (Shape{c, r}));
      ASSERT_EQ(t.dtype(), f8);
      EXPECT_TRUE(t.is_contiguous());
      const std::vector<uint8_t> got = codes_of(t);
      for (int64_t i = 0; i < r; ++i) {
        for (int64_t j = 0; j < c; ++j) ASSERT_EQ(got[j * r + i], codes[i * c + j]) << i << ", " << j;
      }
    }
  }
  expect_error([&] { internal::fp8_transpose(testing::make({1, 2}, {2}, opts())); }, {"fp8_transpose", "2-D FP8"});
}

TEST_P(Fp8OpsTest, QuantizeEmptyLeavesAmax) {
  const Tensor amax = cell_view(2.5, 0, 1, dev());
  const Tensor s = cell_view(1.0, 0, 1, dev());
  const Tensor q = internal::fp8_quantize(zeros({0, 5}, opts()), DType::Float8_e4m3fn, s, amax);
  EXPECT_EQ(q.shape(), (Shape{0, 5}));
  const Tensor t = internal::fp8_quantize(zeros({0, 5}, opts()), DType::Float8_e4m3fn, s, amax, true);
  EXPECT_EQ(t.shape(), (Shape{5, 0}));
  EXPECT_EQ(f32(amax), 2.5f);
}

TEST_P(Fp8OpsTest, QuantizeErrors) {
  const Tensor x = zeros({4, 4}, opts());
  const Tensor s = cell_view(1.0, 0, 1, dev()), a = cell_view(0.0, 0, 1, dev());
  const DType e4 = DType::Float8_e4m3fn;
  expect_error([&] { internal::fp8_quantize(x, DType::BFloat16, s, a); }, {"fp8_quantize", "bfloat16", "not an FP8"});
  expect_error([&] { internal::fp8_quantize(zeros({4}, opts(DType::Int32)), e4, s, a); },
               {"fp8_quantize", "int32", "float32, bfloat16 or float16"});
  expect_error([&] { internal::fp8_quantize(zeros({4}, opts(DType::Float64)), e4, s, a); }, {"float64"});
  expect_error([&] { internal::fp8_quantize(x.to(e4), e4, s, a); }, {"float8_e4m3fn"});
  expect_error([&] { internal::fp8_quantize(x.t(), e4, s, a); }, {"not contiguous"});
  expect_error(
      [&] {
        internal::fp8_quantize(zeros({2, 2, 2}, opts()), e4, s, a, true);
      },
      {"transpose needs a 2-D input", "[2, 2, 2]"});
  expect_error([&] { internal::fp8_quantize(x, e4, zeros({2}, opts()), a); }, {"scale", "1-element float32"});
  expect_error([&] { internal::fp8_quantize(x, e4, s, zeros({1}, opts(DType::Float64))); },
               {"amax", "1-element float32", "float64"});
  expect_error([&] { internal::fp8_quantize(x, e4, Tensor(), a); }, {"scale", "undefined"});
  expect_error([&] { internal::fp8_quantize(Tensor(), e4, s, a); }, {"undefined"});
  if (dev().is_cuda()) {
    expect_error([&] { internal::fp8_quantize(x, e4, s, zeros({1}, {.dtype = DType::Float32})); },
                 {"amax", "cpu", "cuda:0"});
  }
  EXPECT_EQ(f32(a), 0.0f);  // nothing written by a refused call
}

// ---------------------------------------------------------------- fp8_gemm

// float64 reference of (sa a) @ (sb b)^T from the codes, and the bound of sum_k |a_ik b_jk| * sa * sb.
struct GemmReference {
  std::vector<double> value, abs_sum;
};
GemmReference reference_gemm(const std::vector<uint8_t>& a, const Format& fa, const std::vector<uint8_t>& b,
                             const Format& fb, int64_t m, int64_t n, int64_t k, double sa, double sb) {
  GemmReference r{std::vector<double>(m * n), std::vector<double>(m * n)};
  std::vector<double> va, vb;  // decoded once
  for (uint8_t c : a) va.push_back(testing::fp8_value(fa, c));
  for (uint8_t c : b) vb.push_back(testing::fp8_value(fb, c));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, sabs = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const double p = va[i * k + kk] * vb[j * k + kk];
        s += p;
        sabs += std::abs(p);
      }
      r.value[i * n + j] = s * sa * sb;
      r.abs_sum[i * n + j] = sabs * sa * sb;
    }
  return r;
}

double unit_roundoff(DType t) {
  return t == DType::Float32 ? 0x1p-24 : t == DType::Float16 ? 0x1p-11 : 0x1p-8;  // bfloat16: 8 bits
}

// got against expected within 2 ulps of the output dtype at |expected| + |bias| (bias: one value per column, or
// none), plus on the GPU (except on exact grids) the accumulation bound 2^-9 * abs_sum (the header comment).
void expect_product(const Tensor& got, const std::vector<double>& expected, const std::vector<double>& abs_sum,
                    DType out_dtype, bool on_gpu, bool exact_grid, const std::vector<double>& bias = {}) {
  const std::vector<double> g = testing::values(got);
  ASSERT_EQ(g.size(), expected.size());
  int failures = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double sum_term = on_gpu && !exact_grid ? 0x1p-9 * abs_sum[i] : 0.0;
    const double b = bias.empty() ? 0.0 : std::abs(bias[i % bias.size()]);
    const double tol = 2 * unit_roundoff(out_dtype) * (std::abs(expected[i]) + b) + sum_term + 1e-30;
    if (!(std::abs(g[i] - expected[i]) <= tol) && ++failures <= 5) {
      ADD_FAILURE() << "element " << i << ": got " << g[i] << ", expected " << expected[i] << " (tolerance " << tol
                    << ")";
    }
  }
  EXPECT_EQ(failures, 0);
}

struct Pair {
  DType a, b;
};
const Pair kPairs[] = {{DType::Float8_e4m3fn, DType::Float8_e4m3fn},
                       {DType::Float8_e4m3fn, DType::Float8_e5m2},
                       {DType::Float8_e5m2, DType::Float8_e4m3fn}};
const DType kOutTypes[] = {DType::BFloat16, DType::Float32, DType::Float16};

// Random data quantised with fp8_quantize at a delayed-scaling scale (fp8_max / amax), multiplied back with the
// inverse scales: the product of the codes, scaled.
TEST_P(Fp8OpsTest, GemmOfQuantisedInputsMatchesTheReference) {
  const int64_t m = 32, n = 48, k = 64;
  for (const Pair& p : kPairs) {
    for (DType out_dtype : kOutTypes) {
      for (bool fast : {false, true}) {  // fast accumulation (the FP8 Linear's forward) within the same bound
        SCOPED_TRACE(::testing::Message() << p.a << " x " << p.b << " -> " << out_dtype << (fast ? ", fast" : ""));
        const Format &fa = fp8_format_of(p.a), &fb = fp8_format_of(p.b);
        const Tensor xa = testing::make(testing::uniform(m * k, -3, 3, 21), {m, k}, opts());
        const Tensor xb = testing::make(testing::uniform(n * k, -0.02, 0.02, 22), {n, k}, opts());
        const float scale_a = static_cast<float>(fa.max_value / 3), scale_b = static_cast<float>(fb.max_value / 0.02);
        const Tensor qa = internal::fp8_quantize(xa, p.a, cell_view(scale_a, 1, 2, dev()), cell_view(0, 0, 1, dev()));
        const Tensor qb = internal::fp8_quantize(xb, p.b, cell_view(scale_b, 0, 3, dev()), cell_view(0, 0, 1, dev()));
        const float inv_a = 1.0f / scale_a, inv_b = 1.0f / scale_b;
        const Tensor out = internal::fp8_gemm(qa, qb, cell_view(inv_a, 2, 3, dev()), cell_view(inv_b, 1, 2, dev()),
                                              out_dtype, Tensor(), nullptr, fast);
        EXPECT_EQ(out.shape(), (Shape{m, n}));
        EXPECT_EQ(out.dtype(), out_dtype);
        const GemmReference ref = reference_gemm(codes_of(qa), fa, codes_of(qb), fb, m, n, k, inv_a, inv_b);
        expect_product(out, ref.value, ref.abs_sum, out_dtype, dev().is_cuda(), false);
        // And it approximates the product of the unquantised data: each FP8 value is within 2^-3 (E5M2) or 2^-4
        // (E4M3) of the value it stands for, so each product within 0.27 of its own size.
        const std::vector<double> va = testing::values(xa), vb = testing::values(xb), got = testing::values(out);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double exact = 0, size = 0;
            for (int64_t kk = 0; kk < k; ++kk) {
              exact += va[i * k + kk] * vb[j * k + kk];
              size += std::abs(va[i * k + kk] * vb[j * k + kk]);
            }
            EXPECT_LE(std::abs(got[i * n + j] - exact), 0.3 * size) << i << ", " << j;
          }
      }
    }
  }
}

// Codes from a small grid (multiples of 1/2 up to 2 in magnitude: products are multiples of 1/4 up to 4, so with
// K = 80 every partial sum, in any order and chunking, is a multiple of 1/4 below 320, exact in 11 bits); scales are
// powers of two. The GPU must then give the reference up to the output's
// rounding, with bias, and accumulating into float32.
TEST_P(Fp8OpsTest, GemmExactGridWithBiasAndAccumulate) {
  const int64_t m = 48, n = 32, k = 80;
  for (const Pair& p : kPairs) {
    SCOPED_TRACE(::testing::Message() << p.a << " x " << p.b);
    const Format &fa = fp8_format_of(p.a), &fb = fp8_format_of(p.b);
    const auto grid_codes = [](const Format& f, int64_t count, uint64_t seed) {
      std::vector<uint8_t> c;
      for (double u : testing::uniform(count, -4.5, 4.5, seed)) c.push_back(testing::fp8_code(f, std::round(u) / 2));
      return c;
    };
    const std::vector<uint8_t> ca = grid_codes(fa, m * k, 31), cb = grid_codes(fb, n * k, 32);
    const Tensor a = from_codes(ca, {m, k}, p.a, dev()), b = from_codes(cb, {n, k}, p.b, dev());
    const double sa = 0.25, sb = 8.0;
    const GemmReference ref = reference_gemm(ca, fa, cb, fb, m, n, k, sa, sb);
    const std::vector<double> bias_v = testing::uniform(n, -4, 4, 33);
    for (DType out_dtype : kOutTypes) {
      SCOPED_TRACE(::testing::Message() << out_dtype);
      const Tensor plain = internal::fp8_gemm(a, b, cell_view(sa, 0, 1, dev()), cell_view(sb, 0, 1, dev()), out_dtype);
      expect_product(plain, ref.value, ref.abs_sum, out_dtype, dev().is_cuda(), true);
      const Tensor bias = testing::make(bias_v, {n}, opts(out_dtype));
      const std::vector<double> bias_held = testing::values(bias);
      std::vector<double> with_bias = ref.value;
      for (int64_t i = 0; i < m * n; ++i) with_bias[i] += bias_held[i % n];
      const Tensor biased =
          internal::fp8_gemm(a, b, cell_view(sa, 0, 1, dev()), cell_view(sb, 0, 1, dev()), out_dtype, bias);
      expect_product(biased, with_bias, ref.abs_sum, out_dtype, dev().is_cuda(), true, bias_held);
    }
    // Accumulate into float32 twice: acc0 + 2 * (product + bias).
    const std::vector<double> acc0 = testing::uniform(m * n, -100, 100, 34);
    Tensor acc = testing::make(acc0, {m, n}, opts());
    const Tensor bias = testing::make(bias_v, {n}, opts());
    const std::vector<double> acc0_held = testing::values(acc), bias_held = testing::values(bias);
    const void* storage = acc.data_ptr();
    for (int round = 1; round <= 2; ++round) {
      const Tensor r =
          internal::fp8_gemm(a, b, cell_view(sa, 0, 1, dev()), cell_view(sb, 0, 1, dev()), DType::Float32, bias, &acc);
      EXPECT_EQ(r.data_ptr(), storage);  // the same tensor, updated in place
      std::vector<double> expected(m * n), abs_sum(m * n);
      for (int64_t i = 0; i < m * n; ++i) {
        expected[i] = acc0_held[i] + round * (ref.value[i] + bias_held[i % n]);
        abs_sum[i] = round * ref.abs_sum[i];
      }
      // Rounding: the sum of a few float32 roundings of values up to |acc0| + |product|.
      std::vector<double> bound = abs_sum;
      for (int64_t i = 0; i < m * n; ++i) bound[i] = std::abs(acc0_held[i]) + abs_sum[i] + std::abs(bias_held[i % n]);
      const std::vector<double> got = testing::values(acc);
      int failures = 0;
      for (int64_t i = 0; i < m * n; ++i) {
        const double tol = 4 * round * 0x1p-24 * bound[i];
        if (!(std::abs(got[i] - expected[i]) <= tol) && ++failures <= 5)
          ADD_FAILURE() << "round " << round << " element " << i << ": got " << got[i] << ", expected " << expected[i];
      }
      EXPECT_EQ(failures, 0);
    }
  }
}

TEST_P(Fp8OpsTest, GemmPropagatesNaNAndInfinity) {
  const int64_t m = 16, n = 16, k = 16;
  std::vector<uint8_t> ca(m * k, testing::fp8_code(kE5M2, 1.0)), cb(n * k, testing::fp8_code(kE4M3, 0.5));
  ca[0] = 0x7f;          // a[0, 0] NaN: row 0 of the result is NaN
  ca[1 * k + 3] = 0x7c;  // a[1, 3] = +inf in E5M2: row 1 is +inf (times positive b)
  const Tensor a = from_codes(ca, {m, k}, DType::Float8_e5m2, dev());
  const Tensor b = from_codes(cb, {n, k}, DType::Float8_e4m3fn, dev());
  const Tensor out = internal::fp8_gemm(a, b, cell_view(1, 0, 1, dev()), cell_view(1, 0, 1, dev()), DType::Float32);
  const std::vector<double> v = testing::values(out);
  for (int64_t j = 0; j < n; ++j) {
    EXPECT_TRUE(std::isnan(v[j])) << j;
    EXPECT_EQ(v[n + j], kInf) << j;
    EXPECT_EQ(v[2 * n + j], 8.0) << j;  // 16 * 1 * 0.5
  }
}

TEST_P(Fp8OpsTest, GemmEmptyDims) {
  const TensorOptions e4 = opts(DType::Float8_e4m3fn);
  const Tensor one = cell_view(1, 0, 1, dev());
  const Tensor out = internal::fp8_gemm(zeros({0, 32}, e4), zeros({16, 32}, e4), one, one, DType::BFloat16);
  EXPECT_EQ(out.shape(), (Shape{0, 16}));
  // K = 0: the empty sum, plus the bias (and the accumulator).
  const Tensor bias = testing::make(testing::uniform(16, -1, 1, 5), {16}, opts());
  const Tensor k0 = internal::fp8_gemm(zeros({16, 0}, e4), zeros({16, 0}, e4), one, one, DType::Float32, bias);
  std::vector<double> expected;
  for (int i = 0; i < 16; ++i)
    for (double b : testing::values(bias)) expected.push_back(b);
  EXPECT_EQ(testing::values(k0), expected);
  Tensor acc = ones({16, 16}, opts());
  internal::fp8_gemm(zeros({16, 0}, e4), zeros({16, 0}, e4), one, one, DType::Float32, {}, &acc);
  EXPECT_EQ(testing::values(acc), std::vector<double>(256, 1.0));
}

TEST_P(Fp8OpsTest, GemmErrors) {
  const TensorOptions e4 = opts(DType::Float8_e4m3fn), e5 = opts(DType::Float8_e5m2);
  const Tensor a = zeros({32, 64}, e4), b = zeros({16, 64}, e4), one = cell_view(1, 0, 1, dev());
  const DType bf = DType::BFloat16;
  try {
    internal::fp8_gemm(zeros({32, 64}, e5), zeros({16, 64}, e5), one, one, bf);
    ADD_FAILURE() << "e5m2 x e5m2 was accepted";
  } catch (const NotImplementedError& e) {
    EXPECT_NE(std::string(e.what()).find("float8_e5m2 x float8_e5m2 is not supported"), std::string::npos) << e.what();
  }
  expect_error(
      [&] {
        internal::fp8_gemm(zeros({32, 24}, e4), zeros({16, 24}, e4), one, one, bf);
      },
      {"fp8_gemm", "multiples of 16", "K = 24"});
  expect_error([&] { internal::fp8_gemm(zeros({20, 64}, e4), b, one, one, bf); }, {"multiples of 16", "M = 20"});
  expect_error([&] { internal::fp8_gemm(a, zeros({8, 64}, e4), one, one, bf); }, {"multiples of 16", "N = 8"});
  expect_error([&] { internal::fp8_gemm(a, zeros({16, 32}, e4), one, one, bf); }, {"(M, K)", "[32, 64]", "[16, 32]"});
  expect_error([&] { internal::fp8_gemm(zeros({32, 64}, opts(bf)), b, one, one, bf); }, {"must be FP8", "bfloat16"});
  expect_error([&] { internal::fp8_gemm(zeros({64, 32}, e4).t(), b, one, one, bf); }, {"contiguous"});
  expect_error([&] { internal::fp8_gemm(a, b, zeros({2}, opts()), one, bf); }, {"a_scale_inv", "1-element float32"});
  expect_error([&] { internal::fp8_gemm(a, b, one, zeros({1}, opts(DType::Float64)), bf); }, {"b_scale_inv"});
  expect_error([&] { internal::fp8_gemm(a, b, one, one, DType::Float64); }, {"out_dtype", "float64"});
  expect_error([&] { internal::fp8_gemm(a, b, one, one, bf, zeros({16}, opts())); }, {"bias", "(16)", "bfloat16"});
  expect_error([&] { internal::fp8_gemm(a, b, one, one, bf, zeros({32}, opts(bf))); }, {"bias", "[32]"});
  Tensor acc = zeros({32, 16}, opts());
  expect_error([&] { internal::fp8_gemm(a, b, one, one, bf, {}, &acc); }, {"accumulating needs out_dtype Float32"});
  Tensor wrong = zeros({16, 32}, opts());
  expect_error([&] { internal::fp8_gemm(a, b, one, one, DType::Float32, {}, &wrong); },
               {"accumulate_into", "(32, 16)", "[16, 32]"});
  Tensor acc_bf = zeros({32, 16}, opts(bf));
  expect_error([&] { internal::fp8_gemm(a, b, one, one, DType::Float32, {}, &acc_bf); }, {"accumulate_into"});
  EXPECT_EQ(testing::values(acc), std::vector<double>(32 * 16, 0.0));  // untouched
}

// ---------------------------------------------------------------- fp8_update_scales

// x rounded to float32 as IEEE division does (to nearest even; past FLT_MAX + half an ulp, to ±inf), written out so
// the reference never relies on a double-to-float conversion of an out-of-range value.
double round_to_f32(double x) {
  const double overflow = std::ldexp(2.0 - std::ldexp(1.0, -24), 127);  // FLT_MAX + half its ulp: a tie to inf
  if (std::isnan(x)) return x;
  if (std::abs(x) >= overflow) return x > 0 ? kInf : -kInf;
  return static_cast<double>(static_cast<float>(x));
}

// The delayed-scaling update in float64 from Fp8ScalingState's rules, one column at a time. A quotient of two float32
// values computed in float64 and rounded once to float32 is the float32 quotient (53 >= 2 * 24 + 2 bits).
struct ScalingReference {
  std::vector<double> history, scale, scale_inv;
};
ScalingReference reference_update(ScalingReference s, const std::vector<double>& scaled_max, int64_t len, int64_t n,
                                  bool most_recent) {
  const double flt_max = std::numeric_limits<float>::max();
  std::vector<double>& h = s.history;
  for (int64_t j = 0; j < n; ++j) {
    const double c = h[j];
    const bool seen = c != 0;
    double amax = c;
    if (!most_recent) {
      amax = 0;  // every entry >= 0 or NaN here, and NaN entries count as 0
      for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::isnan(h[i * n + j]) ? 0.0 : h[i * n + j]);
    }
    if (seen) {
      std::vector<double> rolled(len, 0.0);
      for (int64_t i = 1; i + 1 < len; ++i) rolled[i] = h[(i + 1) * n + j];
      if (len > 1) rolled[len - 1] = c;
      for (int64_t i = 0; i < len; ++i) h[i * n + j] = rolled[i];
    }
    const bool usable = seen && std::isfinite(amax) && amax > 0;
    double next = usable ? round_to_f32(scaled_max[j] / amax) : s.scale[j];
    if (std::isinf(next)) next = flt_max;
    s.scale[j] = next;
    s.scale_inv[j] = round_to_f32(1.0 / next);
  }
  return s;
}

// Every element equal (NaN where the reference is NaN), reporting the first few that are not.
void expect_same(const std::vector<double>& actual, const std::vector<double>& expected, const char* what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < actual.size() && reported < 5; ++i) {
    const bool same = std::isnan(expected[i]) ? std::isnan(actual[i]) : actual[i] == expected[i];
    if (!same) {
      ADD_FAILURE() << what << "[" << i << "] = " << actual[i] << ", expected " << expected[i];
      ++reported;
    }
  }
}

// A scaling state's tensors with one column per case the update distinguishes (L rows, kCases columns):
//   0 plain values; 1 NaN entries below row 0 (the maximum skips them); 2 a NaN current amax (seen; in Max mode the
//   window's other entries give the amax, in MostRecent the scale is kept); 3 an inf current amax (not usable);
//   4 an amax so small that scaled_max / amax overflows float32 (-> FLT_MAX); 5 not seen (c == 0: unchanged);
//   6 not seen with an infinite old scale (-> FLT_MAX); 7 a subnormal amax (overflow again, scale_inv subnormal);
//   8 the window's largest entry in its last row; 9 an inf below row 0 (Max: not usable); 10 a current amax of 1 and
//   2 below it (exact quotients: scaled_max in MostRecent, scaled_max / 2 in Max).
constexpr int64_t kCases = 11;
struct ScalingCase {
  std::vector<double> history, scale, scale_inv, scaled_max;
};
ScalingCase scaling_case(int64_t len, uint64_t seed) {
  const int64_t n = kCases;
  ScalingCase c;
  c.history = testing::uniform(len * n, 0.01, 100, seed);
  const auto at = [&](int64_t i, int64_t j) -> double& { return c.history[i * n + j]; };
  for (int64_t i = 1; i < len; i += 3) at(i, 1) = kNaN;
  at(0, 2) = kNaN;
  at(0, 3) = kInf;
  for (int64_t i = 0; i < len; ++i) at(i, 4) = i == 0 ? 1e-37 : 0.0;
  at(0, 5) = 0;
  at(0, 6) = 0;
  for (int64_t i = 0; i < len; ++i) at(i, 7) = i == 0 ? 1e-40 : 0.0;
  at(len - 1, 8) = 1000;
  if (len > 1) at(len / 2, 9) = kInf;
  for (int64_t i = 0; i < len; ++i) at(i, 10) = i == 0 ? 1.0 : 2.0;
  c.scale = testing::uniform(n, 0.5, 2, seed + 1);
  c.scale[6] = kInf;
  c.scale_inv.assign(n, 7.0);  // stale: the update recomputes every column's
  for (int64_t j = 0; j < n; ++j) c.scaled_max.push_back(j % 3 == 0 ? 448.0 : j % 3 == 1 ? 57344.0 : 448.0 / 8);
  return c;
}

// Lengths around the CUDA kernel's chunk of 256 rows: 1 (no roll), 2 and 3 (the shortest rolls), one chunk and one
// more row, and 1000 and 5000 (many chunks).
const int64_t kHistoryLengths[] = {1, 2, 3, 256, 258, 1000, 5000};

TEST_P(Fp8OpsTest, UpdateScalesMatchesTheReference) {
  for (bool most_recent : {false, true}) {
    for (int64_t len : kHistoryLengths) {
      SCOPED_TRACE(::testing::Message() << "L = " << len << (most_recent ? ", most_recent" : ", max"));
      const ScalingCase c = scaling_case(len, 70 + static_cast<uint64_t>(len));
      Tensor h = testing::make(c.history, {len, kCases}, opts());
      Tensor scale = testing::make(c.scale, {kCases}, opts());
      Tensor scale_inv = testing::make(c.scale_inv, {kCases}, opts());
      const Tensor scaled_max = testing::make(c.scaled_max, {kCases}, opts());
      // The reference starts from the float32 values the tensors hold.
      const ScalingReference start{testing::values(h), testing::values(scale), testing::values(scale_inv)};
      ScalingReference ref = start;
      const std::vector<double> sm = testing::values(scaled_max);
      // Twice: the second update sees row 0 zeroed by the first wherever a column was seen.
      for (int step = 0; step < 2; ++step) {
        SCOPED_TRACE(::testing::Message() << "update " << step);
        internal::fp8_update_scales(h, scale, scale_inv, scaled_max, most_recent);
        ref = reference_update(ref, sm, len, kCases, most_recent);
        expect_same(testing::values(h), ref.history, "amax_history");
        expect_same(testing::values(scale), ref.scale, "scale");
        expect_same(testing::values(scale_inv), ref.scale_inv, "scale_inv");
      }
      // The cases the reference is meant to exercise, spelled out (first update).
      const ScalingReference once = reference_update(start, sm, len, kCases, most_recent);
      const double flt_max = std::numeric_limits<float>::max();
      EXPECT_EQ(once.scale[3], start.scale[3]);  // inf amax: kept
      EXPECT_EQ(once.scale[4], flt_max);         // 57344 / 1e-37 overflows
      EXPECT_EQ(once.scale[6], flt_max);         // infinite old scale
      EXPECT_EQ(once.scale[7], flt_max);         // subnormal amax
      EXPECT_EQ(once.scale[10], most_recent || len == 1 ? 57344.0 : 28672.0);
      EXPECT_EQ(once.scale_inv[5], round_to_f32(1.0 / start.scale[5]));  // not seen: scale kept, scale_inv from it
      if (most_recent) {
        EXPECT_EQ(once.scale[2], start.scale[2]);  // NaN amax: kept
      } else if (len > 1) {
        EXPECT_EQ(once.scale[9], start.scale[9]);  // an inf in the window: kept
      }
    }
  }
}

// The copies an update writes (a layer's snapshot of its call's scales): the new scale and scale_inv, into strided
// views (scale_inv 16 bytes apart, as an FP8 Linear keeps it), left alone by the next update, which changes the state.
TEST_P(Fp8OpsTest, UpdateScalesWritesCopiesOfTheNewScales) {
  for (int64_t len : kHistoryLengths) {
    SCOPED_TRACE(::testing::Message() << "L = " << len);
    const ScalingCase c = scaling_case(len, 90 + static_cast<uint64_t>(len));
    Tensor h = testing::make(c.history, {len, kCases}, opts());
    Tensor scale = testing::make(c.scale, {kCases}, opts());
    Tensor scale_inv = testing::make(c.scale_inv, {kCases}, opts());
    const Tensor scaled_max = testing::make(c.scaled_max, {kCases}, opts());
    Tensor copy_rows = full({kCases, 2}, -1.0, opts()), inv_rows = full({kCases, 4}, -1.0, opts());
    const Tensor copy = copy_rows.select(1, 1), inv_copy = inv_rows.select(1, 0);
    internal::fp8_update_scales(h, scale, scale_inv, scaled_max, false, copy, inv_copy);
    const std::vector<double> first_scale = testing::values(scale), first_inv = testing::values(scale_inv);
    expect_same(testing::values(copy), first_scale, "scale_copy");
    expect_same(testing::values(inv_copy), first_inv, "scale_inv_copy");
    // Only the viewed elements were written.
    expect_same(testing::values(copy_rows.select(1, 0)), std::vector<double>(kCases, -1.0), "scale_copy's neighbours");
    expect_same(testing::values(inv_rows.narrow(1, 1, 3)), std::vector<double>(kCases * 3, -1.0),
                "scale_inv_copy's neighbours");
    // A second update (new amaxes in every column) moves the state, not the copies.
    h.select(0, 0).fill_(3.0);
    internal::fp8_update_scales(h, scale, scale_inv, scaled_max, false);
    EXPECT_FALSE(internal::equal(scale, copy));
    expect_same(testing::values(copy), first_scale, "scale_copy after the next update");
    expect_same(testing::values(inv_copy), first_inv, "scale_inv_copy after the next update");
  }
}

TEST_P(Fp8OpsTest, UpdateScalesOfAnEmptyStateIsANoOp) {
  Tensor h = zeros({4, 0}, opts()), v = zeros({0}, opts());
  internal::fp8_update_scales(h, v, v, v, false);
  EXPECT_EQ(h.shape(), Shape({4, 0}));
}

TEST_P(Fp8OpsTest, UpdateScalesErrors) {
  const Tensor h = full({4, 3}, 2.0, opts()), s = ones({3}, opts()), si = ones({3}, opts()),
               sm = full({3}, 448.0, opts());
  const auto call = [](const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& d) {
    internal::fp8_update_scales(a, b, c, d, false);
  };
  expect_error([&] { call(Tensor(), s, si, sm); }, {"fp8_update_scales", "amax_history", "undefined"});
  expect_error([&] { call(h.to(DType::Float64), s, si, sm); },
               {"fp8_update_scales", "amax_history", "float32 (L, N)", "float64", "[4, 3]"});
  expect_error([&] { call(zeros({12}, opts()), s, si, sm); }, {"amax_history", "(L, N)", "[12]"});
  expect_error([&] { call(zeros({0, 3}, opts()), s, si, sm); }, {"amax_history", "L >= 1", "[0, 3]"});
  expect_error([&] { call(h, ones({4}, opts()), si, sm); }, {"scale", "float32 (3)", "[4]"});
  expect_error([&] { call(h, s, Tensor(), sm); }, {"scale_inv", "undefined"});
  expect_error([&] { call(h, s, si, sm.to(DType::Int32)); }, {"scaled_max", "float32 (3)", "int32"});
  expect_error([&] { call(h, s, si, ones({3, 1}, opts())); }, {"scaled_max", "[3, 1]"});
  expect_error([&] { call(full({3, 4}, 2.0, opts()).t(), s, si, sm); }, {"amax_history", "not contiguous"});
  expect_error([&] { call(h, ones({3, 2}, opts()).select(1, 0), si, sm); }, {"scale", "not contiguous"});
  // Copies of the wrong shape or dtype, or sharing the state's memory.
  expect_error([&] { internal::fp8_update_scales(h, s, si, sm, false, ones({4}, opts())); },
               {"fp8_update_scales", "scale_copy", "float32 (3)", "[4]"});
  expect_error([&] { internal::fp8_update_scales(h, s, si, sm, false, {}, ones({3}, opts(DType::Float64))); },
               {"scale_inv_copy", "float32 (3)", "float64"});
  expect_error([&] { internal::fp8_update_scales(h, s, si, sm, false, s.view({3})); },
               {"scale_copy", "shares memory with the scaling state"});
  if (dev().is_cuda()) {
    expect_error([&] { internal::fp8_update_scales(h, s, si, sm, false, ones({3})); }, {"scale_copy", "cpu", "cuda:0"});
    expect_error([&] { call(h, s, ones({3}), sm); }, {"scale_inv", "cpu", "cuda:0", "one device"});
    expect_error([&] { call(h.to(Device::cpu()), s, si, sm); }, {"scale", "cuda:0", "cpu"});
  }
  // Nothing was written by a refused call.
  expect_same(testing::values(h), std::vector<double>(12, 2.0), "amax_history");
  expect_same(testing::values(s), std::vector<double>(3, 1.0), "scale");
  expect_same(testing::values(si), std::vector<double>(3, 1.0), "scale_inv");
}

KILN_INSTANTIATE_BACKENDS(Fp8OpsTest);

// ---------------------------------------------------------------- GPU only

// Large shapes on the GPU against the CPU: quantisation bit for bit (plain and transposed, with the amax), and the
// product within the tolerance of the header comment.
TEST(Fp8CudaOps, QuantizeMatchesTheCpuBitForBit) {
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  const Device gpu = Device::cuda(0);
  for (DType in : kInputTypes) {
    for (DType f8 : {DType::Float8_e4m3fn, DType::Float8_e5m2}) {
      SCOPED_TRACE(::testing::Message() << in << " -> " << f8);
      std::vector<double> v = testing::uniform(1000 * 3000, -1000, 1000, 41);
      v[2'222'222] = 1e5;
      const Tensor x = testing::make(v, {1000, 3000}, {.dtype = in});
      for (bool transpose : {false, true}) {
        const Tensor amax_cpu = cell_view(0, 0, 1, Device::cpu()), amax_gpu = cell_view(0, 0, 1, gpu);
        const Tensor q_cpu = internal::fp8_quantize(x, f8, cell_view(0.3, 0, 1, Device::cpu()), amax_cpu, transpose);
        const Tensor q_gpu = internal::fp8_quantize(x.to(gpu), f8, cell_view(0.3, 0, 1, gpu), amax_gpu, transpose);
        EXPECT_EQ(codes_of(q_gpu), codes_of(q_cpu)) << "transpose " << transpose;
        EXPECT_EQ(f32(amax_gpu), f32(amax_cpu)) << "transpose " << transpose;
      }
    }
  }
}

TEST(Fp8CudaOps, GemmMatchesTheCpu) {
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  const Device gpu = Device::cuda(0);
  const int64_t m = 256, n = 512, k = 1024;
  for (const Pair& p : kPairs) {
    SCOPED_TRACE(::testing::Message() << p.a << " x " << p.b);
    const Format &fa = fp8_format_of(p.a), &fb = fp8_format_of(p.b);
    std::vector<uint8_t> ca, cb;
    for (double u : testing::uniform(m * k, -fa.max_value, fa.max_value, 51)) ca.push_back(testing::fp8_code(fa, u));
    for (double u : testing::uniform(n * k, -1, 1, 52)) cb.push_back(testing::fp8_code(fb, u));
    // Scales that bring the sums (up to K * fp8_max in size) well inside float16's range.
    const float sa = static_cast<float>(0.02 / fa.max_value), sb = 3.0f;
    const GemmReference ref = reference_gemm(ca, fa, cb, fb, m, n, k, sa, sb);
    const Tensor a = from_codes(ca, {m, k}, p.a, gpu), b = from_codes(cb, {n, k}, p.b, gpu);
    for (DType out_dtype : kOutTypes) {
      SCOPED_TRACE(::testing::Message() << out_dtype);
      const Tensor out = internal::fp8_gemm(a, b, cell_view(sa, 1, 2, gpu), cell_view(sb, 0, 1, gpu), out_dtype);
      expect_product(out, ref.value, ref.abs_sum, out_dtype, true, false);
    }
  }
}

// A large FP8 product times the heuristic's candidate algorithms on its first eager call (cuda::set_matmul_tuning):
// one that adds into a float32 destination must time on scratch memory and add once; one that writes a new tensor
// writes it again after the timing. Halves in [-2.5, 2.5] multiply exactly and their sums over K = 1024 (multiples of
// 1/4, below 2^13) are exact in float32, so every result equals the float64 reference exactly whichever algorithm runs
// (without fast accumulation); the reference is checked on every 16th row.
TEST(Fp8CudaOps, TimedAlgorithmsLeaveTheProductAsTheHeuristicsWould) {
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  const Device gpu = Device::cuda(0);
  const bool before = cuda::matmul_tuning();
  cuda::set_matmul_tuning(true);
  const int64_t m = 2048, k = 1024;
  const Format& f = fp8_format_of(DType::Float8_e4m3fn);
  const auto halves = [&](int64_t count, uint64_t seed) {
    std::vector<uint8_t> c;
    for (double u : testing::uniform(count, -5.4, 5.4, seed)) c.push_back(testing::fp8_code(f, std::round(u) / 2));
    return c;
  };
  const std::vector<uint8_t> ca = halves(m * k, 61);
  const Tensor a = from_codes(ca, {m, k}, DType::Float8_e4m3fn, gpu);
  const Tensor one = cell_view(1.0, 0, 1, gpu);
  for (const int64_t n : {int64_t{1104}, int64_t{1120}}) {
    const bool accumulate = n == 1104;
    SCOPED_TRACE(accumulate ? "added into a float32 destination" : "into a new float32 tensor");
    const std::vector<uint8_t> cb = halves(n * k, 62 + n);
    const GemmReference ref = reference_gemm(ca, f, cb, f, m, n, k, 1.0, 1.0);
    const Tensor b = from_codes(cb, {n, k}, DType::Float8_e4m3fn, gpu);
    const std::vector<double> acc0 = testing::exact_grid(m * n, 4, 64.0, 63);
    Tensor acc = testing::make(acc0, {m, n}, {.device = gpu});
    const int64_t timed = cuda::matmul_problems_timed();
    const Tensor out = accumulate ? internal::fp8_gemm(a, b, one, one, DType::Float32, {}, &acc)
                                  : internal::fp8_gemm(a, b, one, one, DType::Float32);
    EXPECT_EQ(cuda::matmul_problems_timed(), timed + 1);
    const std::vector<double> got = testing::values(out);
    int failures = 0;
    for (int64_t i = 0; i < m; i += 16) {
      for (int64_t j = 0; j < n; ++j) {
        const double want = ref.value[i * n + j] + (accumulate ? acc0[i * n + j] : 0.0);
        if (got[i * n + j] != want && ++failures <= 5) {
          ADD_FAILURE() << "row " << i << ", column " << j << ": got " << got[i * n + j] << ", expected " << want;
        }
      }
    }
    EXPECT_EQ(failures, 0);
  }
  cuda::set_matmul_tuning(before);
}

// Quantise and multiply inside a CUDA graph capture (which fails on any host synchronisation), then replay on new
// data: the amax and the product follow the new data.
TEST(Fp8CudaOps, QuantizeAndGemmCaptureIntoAGraph) {
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  const Device gpu = Device::cuda(0);
  const TensorOptions f32o{.dtype = DType::Float32, .device = gpu};
  const int64_t m = 64, n = 32, k = 48;
  Tensor x = testing::make(testing::uniform(m * k, -2, 2, 61), {m, k}, f32o);
  Tensor w = testing::make(testing::uniform(n * k, -1, 1, 62), {n, k}, f32o);
  amp::Fp8ScalingState st = amp::Fp8ScalingState::for_linear(amp::Fp8Recipe{.amax_history_len = 4}, gpu);
  Tensor(st.scale()).copy_(testing::make({100, 200, 1}, {3}, f32o));
  Tensor(st.scale_inv()).copy_(testing::make({0.01, 0.005, 1}, {3}, f32o));
  Tensor y = zeros({m, n}, f32o);
  const auto step = [&] {
    const Tensor xq = internal::fp8_quantize(x, DType::Float8_e4m3fn, st.scale().narrow(0, 0, 1),
                                             st.amax_history().select(0, 0).narrow(0, 0, 1));
    const Tensor wq = internal::fp8_quantize(w, DType::Float8_e4m3fn, st.scale().narrow(0, 1, 1),
                                             st.amax_history().select(0, 0).narrow(0, 1, 1));
    y.copy_(internal::fp8_gemm(xq, wq, st.scale_inv().narrow(0, 0, 1), st.scale_inv().narrow(0, 1, 1), DType::Float32));
  };
  cuda::Graph graph;
  graph.capture(step);
  const std::vector<double> nx = testing::uniform(m * k, -3, 3, 63), nw = testing::uniform(n * k, -0.5, 0.5, 64);
  x.copy_(testing::make(nx, {m, k}, f32o));
  w.copy_(testing::make(nw, {n, k}, f32o));
  Tensor(st.amax_history()).fill_(0);
  graph.replay();
  cuda::synchronize();
  const std::vector<double> h = testing::values(st.amax_history().select(0, 0));
  EXPECT_EQ(h[0], reference_amax(testing::values(x)));
  EXPECT_EQ(h[1], reference_amax(testing::values(w)));
  EXPECT_EQ(h[2], 0.0);
  const std::vector<uint8_t> cx = reference_codes(testing::values(x), 100.0f, kE4M3);
  const std::vector<uint8_t> cw = reference_codes(testing::values(w), 200.0f, kE4M3);
  const GemmReference ref = reference_gemm(cx, kE4M3, cw, kE4M3, m, n, k, 0.01f, 0.005f);
  expect_product(y, ref.value, ref.abs_sum, DType::Float32, true, false);
}

// The update on the GPU equals the CPU's bit for bit, and runs inside a CUDA graph capture (which fails on any host
// synchronisation); a replay updates the state from the history it then holds.
TEST(Fp8CudaOps, UpdateScalesMatchesTheCpuAndCapturesIntoAGraph) {
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  const Device gpu = Device::cuda(0);
  const TensorOptions f32o{.dtype = DType::Float32, .device = gpu};
  for (bool most_recent : {false, true}) {
    const int64_t len = 1024;
    SCOPED_TRACE(most_recent ? "most_recent" : "max");
    const ScalingCase c = scaling_case(len, 91);
    Tensor h = testing::make(c.history, {len, kCases}, f32o), scale = testing::make(c.scale, {kCases}, f32o),
           scale_inv = testing::make(c.scale_inv, {kCases}, f32o);
    const Tensor scaled_max = testing::make(c.scaled_max, {kCases}, f32o);
    Tensor hc = h.to(Device::cpu()), sc = scale.to(Device::cpu()), sic = scale_inv.to(Device::cpu());
    const Tensor smc = scaled_max.to(Device::cpu());
    // capture() runs the step kWarmup times (the CPU state follows), then records it without running it.
    constexpr int kWarmup = 1;
    cuda::Graph graph;
    graph.capture([&] { internal::fp8_update_scales(h, scale, scale_inv, scaled_max, most_recent); }, kWarmup);
    for (int i = 0; i < kWarmup; ++i) internal::fp8_update_scales(hc, sc, sic, smc, most_recent);
    cuda::synchronize();
    expect_same(testing::values(h), testing::values(hc), "amax_history after the warm-up");
    // The replays are the next updates; between them, a new row 0.
    const Tensor row0 = testing::make(testing::uniform(kCases, 0.5, 3, 92), {kCases}, {.dtype = DType::Float32});
    for (int step = 0; step < 3; ++step) {
      graph.replay();
      cuda::synchronize();
      internal::fp8_update_scales(hc, sc, sic, smc, most_recent);
      expect_same(testing::values(h), testing::values(hc), "amax_history");
      expect_same(testing::values(scale), testing::values(sc), "scale");
      expect_same(testing::values(scale_inv), testing::values(sic), "scale_inv");
      Tensor(h.select(0, 0)).copy_(row0.to(gpu));
      Tensor(hc.select(0, 0)).copy_(row0);
    }
  }
}

}  // namespace
}  // namespace kiln
