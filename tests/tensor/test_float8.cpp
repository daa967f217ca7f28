// The float8 storage dtypes (Float8_e4m3fn, Float8_e5m2): decoding of every code, rounding, saturation, NaN and
// subnormals on the way in, casts with every dtype, what float8 tensors support (factories, copies, views, item,
// printing) and the error every computing op gives them. References are computed here from the OCP FP8 bit fields
// in float64, and the rounding reference is a search over the decoded codes, independent of float8.h's arithmetic.
//
// The Float8CastTest cases run on every backend (cuda0 too, where a GPU is visible): each compares the backend's
// bits with those references, so on a GPU they check that the CUDA conversions give the CPU's bits.
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "kiln/tensor/cuda.h"
#include "support/float8_reference.h"
#include "support/test_support.h"

namespace kiln {
namespace {

using testing::expect_error;
using testing::kInf;
using testing::kNaN;

// ---------------------------------------------------------------- references from the bit fields

using Format = testing::Fp8Format;
using testing::kE4M3;
using testing::kE5M2;
const Format kFormats[] = {kE4M3, kE5M2};

std::vector<uint8_t> all_codes() {
  std::vector<uint8_t> c(256);
  for (int i = 0; i < 256; ++i) c[i] = static_cast<uint8_t>(i);
  return c;
}

// The raw codes of a float8 tensor (any device, any layout), in row-major order.
std::vector<uint8_t> codes_of(const Tensor& t) {
  EXPECT_TRUE(is_float8(t.dtype())) << t.dtype();
  const Tensor host = t.to(Device::cpu()).contiguous();
  std::vector<uint8_t> out(static_cast<size_t>(host.numel()));
  if (!out.empty()) std::memcpy(out.data(), host.data_ptr(), out.size());
  return out;
}

Tensor from_codes(const std::vector<uint8_t>& codes, DType dtype, Device device = Device::cpu()) {
  return from_blob(codes.data(), {static_cast<int64_t>(codes.size())}, dtype, device);
}

uint32_t float_bits(float f) { return std::bit_cast<uint32_t>(f); }

// Values that probe every rounding path of a format: each code's value, the midpoints between neighbouring codes
// (ties), the values just beside them (in double and in float steps), a midpoint plus less than half a float ulp
// (a double -> float -> fp8 path would round it to the tie and then to even), and the saturation edges, all with
// both signs; NaN and infinities.
std::vector<double> probe_values(const Format& f) {
  std::vector<double> v = {0.0, kInf, -kInf, kNaN, -kNaN, 1e300, 1e-300, 5e-324, 1e-40, 1e6, 1e9};
  for (int c = 0; c < f.max_code; ++c) {
    const double a = testing::fp8_value(f, static_cast<uint8_t>(c)),
                 b = testing::fp8_value(f, static_cast<uint8_t>(c + 1));
    const double mid = (a + b) / 2;
    for (double x : {a, mid, std::nextafter(mid, 0.0), std::nextafter(mid, kInf),
                     static_cast<double>(std::nextafter(static_cast<float>(mid), 0.0f)),
                     static_cast<double>(std::nextafter(static_cast<float>(mid), INFINITY)), mid + mid * 0x1p-40,
                     mid - mid * 0x1p-40}) {
      v.push_back(x);
      v.push_back(-x);
    }
  }
  const double max = f.max_value, ulp = max - testing::fp8_value(f, static_cast<uint8_t>(f.max_code - 1));
  for (double x : {max, max + 1, max + ulp / 2, max + ulp / 2 + 1, max + ulp, 2 * max, 1e30}) {
    v.push_back(x);
    v.push_back(-x);
  }
  return v;
}

// ---------------------------------------------------------------- the value types

TEST(Float8Types, DtypeNamesSizesAndCategories) {
  EXPECT_EQ(dtype_name(DType::Float8_e4m3fn), "float8_e4m3fn");
  EXPECT_EQ(dtype_name(DType::Float8_e5m2), "float8_e5m2");
  for (const Format& f : kFormats) {
    EXPECT_EQ(element_size(f.dtype), 1u);
    EXPECT_TRUE(is_floating_point(f.dtype));
    EXPECT_TRUE(is_float8(f.dtype));
    EXPECT_FALSE(is_reduced_float(f.dtype));
  }
  EXPECT_FALSE(is_float8(DType::BFloat16));
  EXPECT_EQ(dtype_of<Float8_e4m3fn>(), DType::Float8_e4m3fn);
  EXPECT_EQ(dtype_of<Float8_e5m2>(), DType::Float8_e5m2);
  EXPECT_EQ(sizeof(Float8_e4m3fn), 1u);
  EXPECT_EQ(sizeof(Float8_e5m2), 1u);
}

TEST(Float8Types, EveryCodeDecodesToItsFieldValue) {
  for (const Format& f : kFormats) {
    int nans = 0;
    for (int c = 0; c < 256; ++c) {
      SCOPED_TRACE(::testing::Message() << f.dtype << " code " << c);
      const double ref = testing::fp8_value(f, static_cast<uint8_t>(c));
      const float got = f.dtype == DType::Float8_e4m3fn ? float(Float8_e4m3fn::from_bits(static_cast<uint8_t>(c)))
                                                        : float(Float8_e5m2::from_bits(static_cast<uint8_t>(c)));
      if (std::isnan(ref)) {
        ++nans;
        EXPECT_EQ(float_bits(got), 0x7fc00000u);  // the canonical quiet NaN
      } else {
        EXPECT_EQ(static_cast<double>(got), ref);
        EXPECT_EQ(std::signbit(got), std::signbit(ref));
      }
    }
    EXPECT_EQ(nans, f.ieee ? 6 : 2);
  }
}

TEST(Float8Types, SpecialCodes) {
  EXPECT_EQ(float(Float8_e4m3fn::from_bits(0x7e)), 448.0f);
  EXPECT_EQ(float(Float8_e4m3fn::from_bits(0xfe)), -448.0f);
  EXPECT_EQ(float(Float8_e4m3fn::from_bits(0x01)), 0x1p-9f);
  EXPECT_EQ(float(Float8_e4m3fn::from_bits(0x08)), 0x1p-6f);  // smallest normal
  EXPECT_TRUE(std::isnan(float(Float8_e4m3fn::from_bits(0x7f))));
  EXPECT_TRUE(std::isnan(float(Float8_e4m3fn::from_bits(0xff))));
  EXPECT_EQ(float(Float8_e4m3fn::from_bits(0x78)), 256.0f);  // exponent 1111 is finite in E4M3FN
  EXPECT_EQ(float(Float8_e5m2::from_bits(0x7b)), 57344.0f);
  EXPECT_EQ(float(Float8_e5m2::from_bits(0x01)), 0x1p-16f);
  EXPECT_EQ(float(Float8_e5m2::from_bits(0x04)), 0x1p-14f);
  EXPECT_EQ(float(Float8_e5m2::from_bits(0x7c)), INFINITY);
  EXPECT_EQ(float(Float8_e5m2::from_bits(0xfc)), -INFINITY);
  for (uint8_t c : {0x7d, 0x7e, 0x7f, 0xfd, 0xfe, 0xff}) EXPECT_TRUE(std::isnan(float(Float8_e5m2::from_bits(c))));
}

TEST(Float8Types, ConversionMatchesTheNearestEvenReference) {
  for (const Format& f : kFormats) {
    for (double v : probe_values(f)) {
      SCOPED_TRACE(::testing::Message() << f.dtype << " from " << std::hexfloat << v);
      const uint8_t expected = testing::fp8_code(f, v);
      const uint8_t from_double = f.dtype == DType::Float8_e4m3fn ? Float8_e4m3fn(v).bits : Float8_e5m2(v).bits;
      EXPECT_EQ(int(from_double), int(expected));
      const float vf = static_cast<float>(v);
      const uint8_t from_float = f.dtype == DType::Float8_e4m3fn ? Float8_e4m3fn(vf).bits : Float8_e5m2(vf).bits;
      EXPECT_EQ(int(from_float), int(testing::fp8_code(f, static_cast<double>(vf))));
    }
  }
}

TEST(Float8Types, HandPickedRoundingSaturationAndSubnormals) {
  auto e4 = [](double v) { return int(Float8_e4m3fn(v).bits); };
  auto e5 = [](double v) { return int(Float8_e5m2(v).bits); };
  // Ties go to the even mantissa: 1.0625 lies between 1.0 (0x38) and 1.125 (0x39); 1.1875 between 0x39 and 0x3a.
  EXPECT_EQ(e4(1.0625), 0x38);
  EXPECT_EQ(e4(1.1875), 0x3a);
  EXPECT_EQ(e4(1.0625 + 0x1p-30), 0x39);  // above the tie by less than half a float ulp: rounded once, up
  EXPECT_EQ(e5(1.125), 0x3c);             // between 1.0 (0x3c) and 1.25 (0x3d): even is 0x3c
  EXPECT_EQ(e5(1.375), 0x3e);
  // Saturation: finite overflow and infinities go to ±max, NaN stays NaN (0x7f).
  for (double v : {449.0, 464.0, 465.0, 480.0, 1e6, kInf}) {
    EXPECT_EQ(e4(v), 0x7e) << v;
    EXPECT_EQ(e4(-v), 0xfe) << v;
  }
  for (double v : {57345.0, 61439.0, 61440.0, 65536.0, 1e9, kInf}) {
    EXPECT_EQ(e5(v), 0x7b) << v;
    EXPECT_EQ(e5(-v), 0xfb) << v;
  }
  EXPECT_EQ(e4(kNaN), 0x7f);
  EXPECT_EQ(e4(-kNaN), 0x7f);
  EXPECT_EQ(e5(kNaN), 0x7f);
  EXPECT_EQ(e5(-kNaN), 0x7f);
  // Subnormals: half the smallest subnormal is a tie with 0 (even), more rounds up; 3/2 of it ties to 2.
  EXPECT_EQ(e4(0x1p-9), 0x01);
  EXPECT_EQ(e4(0x1p-10), 0x00);
  EXPECT_EQ(e4(-0x1p-10), 0x80);  // the sign of zero is kept
  EXPECT_EQ(e4(0x1p-10 * 1.001), 0x01);
  EXPECT_EQ(e4(3 * 0x1p-10), 0x02);
  EXPECT_EQ(e4(7.5 * 0x1p-9), 0x08);  // the largest subnormal rounds up into the smallest normal
  EXPECT_EQ(e5(0x1p-16), 0x01);
  EXPECT_EQ(e5(0x1p-17), 0x00);
  EXPECT_EQ(e5(3 * 0x1p-17), 0x02);
  EXPECT_EQ(e5(1e-300), 0x00);
  EXPECT_EQ(e5(-0.0), 0x80);
}

TEST(Float8Types, ScalarsConvertOnce) {
  EXPECT_EQ(Scalar(1.0625 + 0x1p-30).to<Float8_e4m3fn>().bits, 0x39);
  EXPECT_EQ(Scalar(int64_t{1} << 40).to<Float8_e4m3fn>().bits, 0x7e);
  EXPECT_EQ(Scalar(Float8_e5m2::from_bits(0x7c)).to_double(), kInf);
  EXPECT_EQ(Scalar(Float8_e4m3fn::from_bits(0x7e)).to_double(), 448.0);
}

// ---------------------------------------------------------------- casts on every backend

class Float8CastTest : public testing::BackendTest {};

TEST_P(Float8CastTest, EveryCodeCastsExactlyToEveryFloatType) {
  for (const Format& f : kFormats) {
    const Tensor t = from_codes(all_codes(), f.dtype, dev());
    EXPECT_EQ(t.dtype(), f.dtype);
    const std::vector<float> as_float = t.to(DType::Float32).to_vector<float>();
    for (DType to : {DType::Float64, DType::Float16, DType::BFloat16}) {
      const std::vector<double> got = t.to(to).to_vector<double>();
      for (int c = 0; c < 256; ++c) {
        SCOPED_TRACE(::testing::Message() << f.dtype << " code " << c << " -> " << to);
        const double ref = testing::fp8_value(f, static_cast<uint8_t>(c));
        if (std::isnan(ref)) {
          EXPECT_TRUE(std::isnan(got[c]));
        } else {
          EXPECT_EQ(got[c], ref);
          EXPECT_EQ(std::signbit(got[c]), std::signbit(ref));
        }
      }
    }
    for (int c = 0; c < 256; ++c) {
      const double ref = testing::fp8_value(f, static_cast<uint8_t>(c));
      const uint32_t expected = std::isnan(ref) ? 0x7fc00000u : float_bits(static_cast<float>(ref));
      EXPECT_EQ(float_bits(as_float[c]), expected) << f.dtype << " code " << c;
    }
  }
}

TEST_P(Float8CastTest, EveryCodeRoundTripsThroughEveryFloatType) {
  for (const Format& f : kFormats) {
    std::vector<uint8_t> finite;
    for (uint8_t c : all_codes())
      if (!std::isnan(testing::fp8_value(f, c)) && !std::isinf(testing::fp8_value(f, c))) finite.push_back(c);
    const Tensor t = from_codes(finite, f.dtype, dev());
    for (DType via : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16}) {
      SCOPED_TRACE(::testing::Message() << f.dtype << " via " << via);
      EXPECT_EQ(codes_of(t.to(via).to(f.dtype)), finite);
    }
  }
}

TEST_P(Float8CastTest, FromFloat32AndFloat64MatchTheReference) {
  for (const Format& f : kFormats) {
    const std::vector<double> values = probe_values(f);
    const Tensor d = testing::make(values, {static_cast<int64_t>(values.size())}, opts(DType::Float64));
    std::vector<uint8_t> expected_double, expected_float;
    for (double v : values) {
      expected_double.push_back(testing::fp8_code(f, v));
      expected_float.push_back(testing::fp8_code(f, static_cast<double>(static_cast<float>(v))));
    }
    SCOPED_TRACE(::testing::Message() << f.dtype);
    EXPECT_EQ(codes_of(d.to(f.dtype)), expected_double);  // one rounding from double
    EXPECT_EQ(codes_of(d.to(DType::Float32).to(f.dtype)), expected_float);
  }
}

TEST_P(Float8CastTest, From16BitFloatsAndIntegers) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(::testing::Message() << f.dtype);
    // 16-bit floats: exact in float32, so the reference is that of their value.
    const std::vector<double> v = {0.0,  -0.0,  1.0625, 3.1,  -448.0,  500.0,   60000.0, -65504.0,
                                   kInf, -kInf, kNaN,   6e-8, 0x1p-10, 0x1p-17, 1e-3};
    for (DType from : {DType::Float16, DType::BFloat16}) {
      const Tensor t = testing::make(v, {static_cast<int64_t>(v.size())}, opts(from));
      std::vector<uint8_t> expected;
      for (double x : t.to_vector<double>()) expected.push_back(testing::fp8_code(f, x));
      EXPECT_EQ(codes_of(t.to(f.dtype)), expected) << from;
    }
    // Integers: their value, rounded once; huge ones saturate.
    const std::vector<int64_t> ints = {0, 1, -3, 17, 100, 449, -1000, 57345, int64_t{1} << 40, -(int64_t{1} << 62)};
    std::vector<uint8_t> expected;
    for (int64_t i : ints) expected.push_back(testing::fp8_code(f, static_cast<double>(i)));
    const Tensor i64 = from_vector(ints, {static_cast<int64_t>(ints.size())}, dev());
    EXPECT_EQ(codes_of(i64.to(f.dtype)), expected);
    const Tensor i32 = i64.narrow(0, 0, 8).to(DType::Int32);
    EXPECT_EQ(codes_of(i32.to(f.dtype)), std::vector<uint8_t>(expected.begin(), expected.begin() + 8));
    const Tensor b = testing::make({0, 1, 1}, {3}, opts(DType::Bool));
    std::vector<uint8_t> bool_expected = {0x00, testing::fp8_code(f, 1.0), testing::fp8_code(f, 1.0)};
    EXPECT_EQ(codes_of(b.to(f.dtype)), bool_expected);
  }
}

TEST_P(Float8CastTest, IntoIntegersAndBool) {
  for (const Format& f : kFormats) {
    const Tensor t = testing::make({2.5, -2.5, 0.0, 3.0, 448.0}, {5}, opts(f.dtype));  // exact in both formats
    EXPECT_EQ(t.to(DType::Int64).to_vector<int64_t>(), (std::vector<int64_t>{2, -2, 0, 3, 448}));
    EXPECT_EQ(t.to(DType::Int32).to_vector<int32_t>(), (std::vector<int32_t>{2, -2, 0, 3, 448}));
    EXPECT_EQ(t.to(DType::UInt8).to_vector<uint8_t>(), (std::vector<uint8_t>{2, 254, 0, 3, 192}));  // wraps mod 256
    EXPECT_EQ(t.to(DType::Bool).to_vector<bool>(), (std::vector<bool>{true, true, false, true, true}));
  }
}

TEST_P(Float8CastTest, BetweenTheTwoFormats) {
  // E4M3FN -> E5M2: every E4M3FN value rounded to E5M2's 2 mantissa bits.
  const Tensor e4 = from_codes(all_codes(), DType::Float8_e4m3fn, dev());
  std::vector<uint8_t> expected;
  for (uint8_t c : all_codes()) expected.push_back(testing::fp8_code(kE5M2, testing::fp8_value(kE4M3, c)));
  EXPECT_EQ(codes_of(e4.to(DType::Float8_e5m2)), expected);
  // E5M2 -> E4M3FN: saturates (57344 and inf -> 448), NaN -> NaN.
  const Tensor e5 = from_codes(all_codes(), DType::Float8_e5m2, dev());
  expected.clear();
  for (uint8_t c : all_codes()) expected.push_back(testing::fp8_code(kE4M3, testing::fp8_value(kE5M2, c)));
  EXPECT_EQ(codes_of(e5.to(DType::Float8_e4m3fn)), expected);
}

TEST_P(Float8CastTest, StridedCopiesAndFill) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(::testing::Message() << f.dtype);
    const Tensor src = testing::make({1, 2, 3, 4, 5, 6}, {2, 3}, opts(DType::Float32));
    // A strided fp8 destination, converted from a transposed float32 source.
    Tensor dst = zeros({3, 4}, opts(f.dtype)).narrow(1, 1, 2);
    dst.copy_(src.t());
    EXPECT_EQ(dst.to(DType::Float64).to_vector<double>(), (std::vector<double>{1, 4, 2, 5, 3, 6}));
    // Same-dtype strided copy moves the codes.
    const Tensor back = dst.t().contiguous();
    EXPECT_EQ(back.to(DType::Float64).to_vector<double>(), (std::vector<double>{1, 2, 3, 4, 5, 6}));
    // fill saturates like a cast.
    EXPECT_EQ(codes_of(full({2}, 1e9, opts(f.dtype))), (std::vector<uint8_t>{f.max_code, f.max_code}));
    EXPECT_EQ(codes_of(full({1}, -kInf, opts(f.dtype))), (std::vector<uint8_t>{uint8_t(0x80 | f.max_code)}));
    EXPECT_EQ(codes_of(full({1}, kNaN, opts(f.dtype))), (std::vector<uint8_t>{0x7f}));
  }
}

KILN_INSTANTIATE_BACKENDS(Float8CastTest);

// The GPU's casts against the CPU's, bit for bit, over every code and the probe values of each format (a GPU test:
// skipped, as the others are, where no GPU is visible).
TEST(Float8CudaCast, MatchesTheCpuBitForBit) {
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU visible";
  const Device gpu = Device::cuda(0);
  for (const Format& f : kFormats) {
    SCOPED_TRACE(::testing::Message() << f.dtype);
    const Tensor cpu_codes = from_codes(all_codes(), f.dtype);
    const Tensor dev_codes = cpu_codes.to(gpu);
    for (DType to : {DType::Float32, DType::Float16, DType::BFloat16, DType::Float64}) {
      const Tensor a = cpu_codes.to(to), b = dev_codes.to(to).to(Device::cpu());
      const std::vector<double> va = a.to_vector<double>(), vb = b.to_vector<double>();
      for (size_t i = 0; i < va.size(); ++i) {
        if (std::isnan(va[i])) EXPECT_TRUE(std::isnan(vb[i])) << to << " code " << i;
        else EXPECT_EQ(std::bit_cast<uint64_t>(va[i]), std::bit_cast<uint64_t>(vb[i])) << to << " code " << i;
      }
    }
    const std::vector<double> probes = probe_values(f);
    const Tensor d = testing::make(probes, {static_cast<int64_t>(probes.size())}, {.dtype = DType::Float64});
    for (DType from : {DType::Float64, DType::Float32, DType::Float16, DType::BFloat16}) {
      const Tensor src = d.to(from);
      EXPECT_EQ(codes_of(src.to(gpu).to(f.dtype)), codes_of(src.to(f.dtype))) << from;
    }
    std::vector<int64_t> ints;
    for (double v : probes)
      if (std::isfinite(v) && std::abs(v) < 1e18) ints.push_back(static_cast<int64_t>(v));
    const Tensor i = from_vector(ints, {static_cast<int64_t>(ints.size())});
    EXPECT_EQ(codes_of(i.to(gpu).to(f.dtype)), codes_of(i.to(f.dtype))) << "int64";
  }
}

// ---------------------------------------------------------------- float8 tensors

TEST(Float8Tensors, FactoriesViewsCloneAndItem) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(::testing::Message() << f.dtype);
    const TensorOptions o{.dtype = f.dtype};
    EXPECT_EQ(empty({2, 3}, o).dtype(), f.dtype);
    EXPECT_EQ(empty({2, 3}, o).nbytes(), 6u);
    EXPECT_EQ(codes_of(zeros({3}, o)), (std::vector<uint8_t>{0, 0, 0}));
    EXPECT_EQ(ones({2}, o).to_vector<double>(), (std::vector<double>{1, 1}));
    const Tensor t = testing::make({0.5, 1, 1.5, 2, 3, 4}, {2, 3}, o);
    EXPECT_EQ(t.dtype(), f.dtype);
    // Views share the codes.
    EXPECT_EQ(t.t().contiguous().to_vector<double>(), (std::vector<double>{0.5, 2, 1, 3, 1.5, 4}));
    EXPECT_EQ(t.reshape({3, 2}).select(0, 2).to_vector<double>(), (std::vector<double>{3, 4}));
    EXPECT_EQ(t.narrow(1, 1, 2).unsqueeze(0).squeeze(0).flatten().to_vector<double>(),
              (std::vector<double>{1, 1.5, 3, 4}));
    EXPECT_EQ(t.view({6}).expand({2, 6}).select(0, 1).to_vector<double>(), (std::vector<double>{0.5, 1, 1.5, 2, 3, 4}));
    // clone is a new storage with the same codes.
    Tensor c = t.clone();
    EXPECT_FALSE(c.is_alias_of(t));
    EXPECT_EQ(codes_of(c), codes_of(t));
    c.fill_(7);
    EXPECT_EQ(t.to_vector<double>()[0], 0.5);
    // item converts exactly.
    EXPECT_EQ(t.select(1, 2).select(0, 1).item<float>(), 4.0f);
    EXPECT_EQ(t.select(1, 0).select(0, 0).item<double>(), 0.5);
    EXPECT_EQ(from_codes({f.max_code}, f.dtype).item<double>(), f.max_value);
    EXPECT_TRUE(std::isnan(from_codes({0x7f}, f.dtype).item<float>()));
    // to_vector / from_vector of the value types.
    if (f.dtype == DType::Float8_e4m3fn) {
      const std::vector<Float8_e4m3fn> v = t.to_vector<Float8_e4m3fn>();
      EXPECT_EQ(float(v[5]), 4.0f);
      EXPECT_EQ(codes_of(from_vector(v, {6})), codes_of(t));
    } else {
      const std::vector<Float8_e5m2> v = t.to_vector<Float8_e5m2>();
      EXPECT_EQ(float(v[5]), 4.0f);
      EXPECT_EQ(codes_of(from_vector(v, {6})), codes_of(t));
    }
  }
}

TEST(Float8Tensors, EqualComparesValues) {
  const Tensor a = testing::make({1, -2, 0.5}, {3}, {.dtype = DType::Float8_e4m3fn});
  EXPECT_TRUE(equal(a, a.clone()));
  EXPECT_TRUE(equal(a, testing::make({1, -2, 0.5}, {3})));  // float32, the same values
  EXPECT_FALSE(equal(a, testing::make({1, -2, 0.75}, {3}, {.dtype = DType::Float8_e4m3fn})));
  EXPECT_TRUE(equal(from_codes({0x00}, DType::Float8_e4m3fn), from_codes({0x80}, DType::Float8_e4m3fn)));   // ±0
  EXPECT_FALSE(equal(from_codes({0x7f}, DType::Float8_e4m3fn), from_codes({0x7f}, DType::Float8_e4m3fn)));  // NaN
}

TEST(Float8Tensors, PrintsValuesAsFloats) {
  EXPECT_EQ(testing::make({1, 2.5, -448}, {3}, {.dtype = DType::Float8_e4m3fn}).str(),
            "tensor([   1.0000,    2.5000, -448.0000], shape=[3], dtype=float8_e4m3fn, device=cpu)");
  EXPECT_EQ(from_codes({0x7c, 0xfc, 0x7f, 0x3c}, DType::Float8_e5m2).str(),
            "tensor([ inf, -inf,  nan,   1.], shape=[4], dtype=float8_e5m2, device=cpu)");
  EXPECT_EQ(testing::make({0.5, 1.0}, {1, 2}, {.dtype = DType::Float8_e5m2}).str(),
            "tensor([[0.5000, 1.0000]], shape=[1, 2], dtype=float8_e5m2, device=cpu)");
}

// ---------------------------------------------------------------- what float8 tensors refuse

const char* const kAdvice = "cast to bfloat16 or float32 first";

TEST(Float8Tensors, ComputingOpsRefuseWithTheOpAndDtype) {
  for (const Format& f : kFormats) {
    const std::string name(dtype_name(f.dtype));
    const Tensor a = testing::make({1, 2, 3, 4}, {2, 2}, {.dtype = f.dtype});
    const Tensor x = testing::make({1, 2, 3, 4}, {2, 2});
    expect_error([&] { (void)(a + a); }, {"add", name, "not implemented", kAdvice});
    expect_error([&] { (void)(a * 2.0); }, {"mul", name, kAdvice});
    expect_error([&] { (void)kiln::exp(a); }, {"exp", name, kAdvice});
    expect_error([&] { (void)kiln::relu(a); }, {name, kAdvice});
    expect_error([&] { (void)a.sum(); }, {"sum", name, kAdvice});
    expect_error([&] { (void)a.mean(); }, {"mean", name, kAdvice});
    expect_error([&] { (void)kiln::max(a); }, {"max", name, kAdvice});
    expect_error([&] { (void)kiln::argmax(a); }, {"argmax", name, kAdvice});
    expect_error([&] { (void)kiln::softmax(a, 1); }, {"softmax", name, kAdvice});
    expect_error([&] { (void)kiln::matmul(a, a); }, {"matmul", name, kAdvice});
    expect_error([&] { (void)kiln::mm(a, a); }, {"mm", name, kAdvice});
    expect_error([&] { (void)(a == a); }, {"eq", name, kAdvice});
    expect_error([&] { (void)kiln::sort(a); }, {"sort", name, kAdvice});
    expect_error([&] { (void)kiln::index_select(a, 0, testing::make({1}, {1}, {.dtype = DType::Int64})); },
                 {"index_select", name, kAdvice});
    expect_error([&] { (void)kiln::where(x > 2, a, a); }, {"where", name, kAdvice});
    expect_error(
        [&] {
          Tensor b = a.clone();
          b.mul_(2.5);
        },
        {"mul_", name, kAdvice});
    expect_error(
        [&] {
          Tensor b = a.clone();
          kiln::uniform_(b, 0, 1);
        },
        {"uniform_", name, kAdvice});
    expect_error([&] { (void)internal::dropout(a, 0.5, nullptr); }, {"dropout", name, kAdvice});
    expect_error([&] { (void)arange(0, 4, 1, {.dtype = f.dtype}); }, {"arange", name, kAdvice});
    expect_error([&] { (void)allclose(a, a); }, {"isclose", name, kAdvice});
    // An op whose gradient would be recorded refuses it too, before recording anything.
    Tensor w = testing::make({1, 2, 3, 4}, {2, 2}, {.dtype = f.dtype});
    w.requires_grad_(true);
    expect_error([&] { (void)(w * w); }, {"mul", name, kAdvice});
  }
}

TEST(Float8Tensors, AutocastLeavesThemForTheOpToRefuse) {
  // Autocast casts floating inputs to its dtype; float8 ones stay as they are, so the op refuses them rather than
  // computing in bfloat16 behind the user's back.
  const Tensor a = testing::make({1, 2, 3, 4}, {2, 2}, {.dtype = DType::Float8_e4m3fn});
  autocast::Guard guard(DeviceType::CPU, DType::BFloat16);
  expect_error([&] { (void)kiln::matmul(a, a); }, {"matmul", "float8_e4m3fn", kAdvice});
  // Mixed with float32: autocast cannot promote the two, and says so.
  expect_error(
      [&] {
        (void)kiln::matmul(a, testing::make({1, 0, 0, 1}, {2, 2}));
      },
      {"float8_e4m3fn", "float32", "no implicit type promotion"});
}

TEST(Float8Tensors, NoImplicitPromotion) {
  expect_error([] { (void)promote_types(DType::Float8_e4m3fn, DType::Float32); },
               {"promote_types", "float8_e4m3fn", "float32", "no implicit type promotion"});
  expect_error([] { (void)promote_types(DType::Int64, DType::Float8_e5m2); }, {"float8_e5m2", "int64"});
  expect_error([] { (void)promote_types(DType::Float8_e4m3fn, DType::Float8_e5m2); }, {"float8_e4m3fn", "float8_e5m2"});
  expect_error([] { (void)promote_types(DType::Bool, DType::Float8_e4m3fn); }, {"float8_e4m3fn", "bool"});
  EXPECT_EQ(promote_types(DType::Float8_e4m3fn, DType::Float8_e4m3fn), DType::Float8_e4m3fn);
  // Mixed with another dtype in an op: the op's own error.
  const Tensor a = testing::make({1, 2}, {2}, {.dtype = DType::Float8_e4m3fn});
  expect_error([&] { (void)(a + testing::make({1, 2}, {2})); }, {"add", "float8_e4m3fn", kAdvice});
  expect_error([&] { (void)(testing::make({1, 2}, {2}) + a); }, {"add", "float8_e4m3fn", kAdvice});
}

}  // namespace
}  // namespace kiln
