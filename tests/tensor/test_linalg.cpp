// Conformance tests of the linear-algebra ops: matmul (every rank combination, broadcast batches),
// mm, bmm, addmm, dot, outer. References are plain double loops written here.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kiln/tensor/backend.h"      // matmul_epilogue, called directly
#include "kiln/tensor/cuda.h"         // allow_tf32, set_allow_tf32, set_matmul_tuning
#include "kiln/tensor/determinism.h"  // DeterministicGuard
#include "support/test_support.h"

namespace kiln {
namespace {

using testing::expect_error;
using testing::expect_values;
using testing::make;

class MatmulTest : public testing::BackendTest {
 protected:
  // cuBLAS has no integer GEMM: the CUDA backend throws NotImplementedError for integer dtypes.
  bool unsupported(DType dt) const { return dev().is_cuda() && !is_floating_point(dt); }
};

// Multiples of 0.25 in [-1, 1]: exact in every float dtype, and their products sum exactly in float32
// for the sizes used here, so float32/float64/integer results can be compared tightly.
std::vector<double> quarters(int64_t n, uint32_t seed) { return testing::exact_grid(n, 4, 4.0, seed); }

// Small integers in [-4, 4] for the integer dtypes.
std::vector<double> small_ints(int64_t n, uint32_t seed) {
  std::vector<double> v = quarters(n, seed);
  for (auto& x : v) x *= 4;
  return v;
}

std::vector<double> data_for(DType dtype, int64_t n, uint32_t seed) {
  return is_floating_point(dtype) ? quarters(n, seed) : small_ints(n, seed);
}

// Batched reference with NumPy broadcasting of the batch dims:
// a (batch_a..., M, K), b (batch_b..., K, N) -> (batch..., M, N), all row-major.
std::vector<double> ref_matmul(const std::vector<double>& a, const Shape& batch_a, const std::vector<double>& b,
                               const Shape& batch_b, const Shape& batch, int64_t m, int64_t k, int64_t n) {
  const int64_t count = numel(batch);
  std::vector<double> out(static_cast<size_t>(count * m * n), 0.0);
  for (int64_t bi = 0; bi < count; ++bi) {
    const std::vector<int64_t> idx = testing::unravel(bi, batch);
    auto source = [&](const Shape& own) {  // the batch of an operand that broadcasts to idx
      std::vector<int64_t> own_idx(own.size());
      for (size_t d = 0; d < own.size(); ++d) {
        const size_t bd = d + batch.size() - own.size();
        own_idx[d] = own[d] == 1 ? 0 : idx[bd];
      }
      return testing::ravel(own_idx, own);
    };
    const int64_t ab = source(batch_a), bb = source(batch_b);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < k; ++p) acc += a[(ab * m + i) * k + p] * b[(bb * k + p) * n + j];
        out[(bi * m + i) * n + j] = acc;
      }
  }
  return out;
}

std::vector<double> ref_mm(const std::vector<double>& a, const std::vector<double>& b, int64_t m, int64_t k,
                           int64_t n) {
  return ref_matmul(a, {}, b, {}, {}, m, k, n);
}

// 16-bit results: the default relative tolerance plus an absolute one that grows with K (each of the
// K products carries the inputs' rounding, and the result is rounded once more).
double matmul_atol(DType dtype, int64_t k) {
  return testing::default_atol(dtype) * std::max<double>(1.0, static_cast<double>(k) / 4.0);
}

const std::vector<DType> kAllMatmulDTypes = {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16,
                                             DType::Int32,   DType::Int64,   DType::UInt8};

// TF32 keeps 10 mantissa bits: 1 + 2^-12 becomes 1 in a TF32 product, and stays exact without it.
TEST_P(MatmulTest, Tf32SwitchControlsFloat32Precision) {
  if (!dev().is_cuda()) GTEST_SKIP() << "TF32 applies to CUDA matmuls only";
  const double x = 1.0 + std::ldexp(1.0, -12);
  Tensor a = testing::make(std::vector<double>(64 * 64, x), {64, 64}, opts());
  Tensor b = eye(64, {}, opts());
  const bool before = cuda::allow_tf32();
  cuda::set_allow_tf32(false);
  EXPECT_FALSE(cuda::allow_tf32());
  expect_values(mm(a, b), {64, 64}, std::vector<double>(64 * 64, x), 0, 0);  // exact in full float32
  cuda::set_allow_tf32(true);
  EXPECT_TRUE(cuda::allow_tf32());
  const auto tf32 = mm(a, b).to_vector<double>();
  EXPECT_EQ(tf32[0], 1.0) << "float32 matmul did not use TF32 with allow_tf32 on";
  cuda::set_allow_tf32(before);
}

TEST_P(MatmulTest, MmMatchesReferenceInEveryDType) {
  const int64_t m = 5, k = 7, n = 3;
  for (DType dt : kAllMatmulDTypes) {
    SCOPED_TRACE(::testing::Message() << dt);
    if (unsupported(dt)) continue;
    std::vector<double> a = data_for(dt, m * k, 1), b = data_for(dt, k * n, 2);
    if (dt == DType::UInt8) {  // unsigned: keep inputs non-negative, results wrap modulo 256 like PyTorch
      for (auto& x : a) x = std::abs(x);
      for (auto& x : b) x = std::abs(x);
    }
    Tensor c = internal::mm(make(a, {m, k}, opts(dt)), make(b, {k, n}, opts(dt)));
    EXPECT_EQ(c.dtype(), dt);
    expect_values(c, {m, n}, ref_mm(a, b, m, k, n), -1, matmul_atol(dt, k));
  }
}

TEST_P(MatmulTest, TransposedAndStridedOperands) {
  const int64_t m = 4, k = 6, n = 5;
  for (DType dt : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16, DType::Int64}) {
    SCOPED_TRACE(::testing::Message() << dt);
    if (unsupported(dt)) continue;
    const std::vector<double> a = data_for(dt, m * k, 3), b = data_for(dt, k * n, 4);
    const std::vector<double> want = ref_mm(a, b, m, k, n);
    const Tensor ac = make(a, {m, k}, opts(dt)), bc = make(b, {k, n}, opts(dt));
    // Column-major views: the transpose of a contiguous (K, M) tensor.
    const Tensor at = internal::contiguous(ac.t()).t(), bt = internal::contiguous(bc.t()).t();
    ASSERT_EQ(at.stride(0), 1);
    // No unit stride in either matrix dim: the frontend copies.
    const Tensor as = testing::non_contiguous(ac), bs = testing::non_contiguous(bc);
    ASSERT_NE(as.stride(1), 1);
    for (const auto& [x, y] :
         std::vector<std::pair<Tensor, Tensor>>{{at, bc}, {ac, bt}, {at, bt}, {as, bs}, {as, bt}}) {
      expect_values(internal::matmul(x, y), {m, n}, want, -1, matmul_atol(dt, k));
    }
  }
}

TEST_P(MatmulTest, ExpandedOperandWithZeroStride) {
  // a is one row repeated: stride 0 across rows.
  const std::vector<double> row = quarters(3, 5), b = quarters(3 * 2, 6);
  const Tensor a = make(row, {1, 3}, opts()).expand({4, 3});
  std::vector<double> a_full;
  for (int i = 0; i < 4; ++i) a_full.insert(a_full.end(), row.begin(), row.end());
  expect_values(internal::matmul(a, make(b, {3, 2}, opts())), {4, 2}, ref_mm(a_full, b, 4, 3, 2));
}

TEST_P(MatmulTest, LargeProductsSplitAcrossThreads) {
  // Large enough that the CPU backend cuts the output into row blocks (one product) or batches.
  const int64_t m = 301, k = 67, n = 129;
  for (DType dt : {DType::Float32, DType::Float64, DType::BFloat16, DType::Int32}) {
    SCOPED_TRACE(::testing::Message() << dt);
    if (unsupported(dt)) continue;
    const std::vector<double> a = data_for(dt, m * k, 7), b = data_for(dt, k * n, 8);
    expect_values(internal::mm(make(a, {m, k}, opts(dt)), make(b, {k, n}, opts(dt))), {m, n}, ref_mm(a, b, m, k, n), -1,
                  matmul_atol(dt, k));
  }
  const int64_t batches = 6, bm = 70, bk = 40, bn = 50;
  const std::vector<double> a = quarters(batches * bm * bk, 9), b = quarters(batches * bk * bn, 10);
  expect_values(internal::bmm(make(a, {batches, bm, bk}, opts()), make(b, {batches, bk, bn}, opts())),
                {batches, bm, bn}, ref_matmul(a, {batches}, b, {batches}, {batches}, bm, bk, bn));
}

TEST_P(MatmulTest, SixteenBitToleranceGrowsWithK) {
  // Inputs that 16-bit floats cannot hold exactly: their rounding error accumulates over K products.
  const int64_t m = 3, k = 256, n = 4;
  std::vector<double> a(m * k), b(k * n);
  for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.37 * static_cast<double>(i));
  for (size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.11 * static_cast<double>(i));
  for (DType dt : {DType::Float16, DType::BFloat16}) {
    SCOPED_TRACE(::testing::Message() << dt);
    const double eps = dt == DType::Float16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
    // Each product carries two input roundings; sums of K such errors stay below K * 2 * eps (|a|, |b| <= 1).
    expect_values(internal::matmul(make(a, {m, k}, opts(dt)), make(b, {k, n}, opts(dt))), {m, n}, ref_mm(a, b, m, k, n),
                  testing::default_rtol(dt), 2.0 * eps * static_cast<double>(k) / 4.0);
  }
}

TEST_P(MatmulTest, VectorCombinationsFollowTorchMatmul) {
  const std::vector<double> v3 = quarters(3, 11), v3b = quarters(3, 12), m23 = quarters(6, 13), m32 = quarters(6, 14);
  // 1-D x 1-D: dot product, 0-d
  Tensor d = internal::matmul(make(v3, {3}, opts()), make(v3b, {3}, opts()));
  expect_values(d, {}, ref_mm(v3, v3b, 1, 3, 1));
  // 2-D x 1-D: (2, 3) @ (3,) -> (2,)
  expect_values(internal::matmul(make(m23, {2, 3}, opts()), make(v3, {3}, opts())), {2}, ref_mm(m23, v3, 2, 3, 1));
  // 1-D x 2-D: (3,) @ (3, 2) -> (2,)
  expect_values(internal::matmul(make(v3, {3}, opts()), make(m32, {3, 2}, opts())), {2}, ref_mm(v3, m32, 1, 3, 2));
  // 3-D x 1-D: (4, 2, 3) @ (3,) -> (4, 2)
  const std::vector<double> b423 = quarters(24, 15);
  expect_values(internal::matmul(make(b423, {4, 2, 3}, opts()), make(v3, {3}, opts())), {4, 2},
                ref_matmul(b423, {4}, v3, {}, {4}, 2, 3, 1));
  // 1-D x 3-D: (2,) @ (4, 2, 3) -> (4, 3)
  const std::vector<double> v2 = quarters(2, 16);
  expect_values(internal::matmul(make(v2, {2}, opts()), make(b423, {4, 2, 3}, opts())), {4, 3},
                ref_matmul(v2, {}, b423, {4}, {4}, 1, 2, 3));
}

TEST_P(MatmulTest, BatchedRankCombinations) {
  const int64_t m = 3, k = 4, n = 2;
  // 3-D x 2-D (rows folded into one product), 2-D x 3-D, 3-D x 3-D
  const std::vector<double> a3 = quarters(5 * m * k, 17), b2 = quarters(k * n, 18), a2 = quarters(m * k, 19),
                            b3 = quarters(5 * k * n, 20);
  expect_values(internal::matmul(make(a3, {5, m, k}, opts()), make(b2, {k, n}, opts())), {5, m, n},
                ref_matmul(a3, {5}, b2, {}, {5}, m, k, n));
  expect_values(internal::matmul(make(a2, {m, k}, opts()), make(b3, {5, k, n}, opts())), {5, m, n},
                ref_matmul(a2, {}, b3, {5}, {5}, m, k, n));
  expect_values(internal::matmul(make(a3, {5, m, k}, opts()), make(b3, {5, k, n}, opts())), {5, m, n},
                ref_matmul(a3, {5}, b3, {5}, {5}, m, k, n));
  // 4-D x 3-D with a broadcast batch: (2, 1, M, K) @ (3, K, N) -> (2, 3, M, N)
  const std::vector<double> a4 = quarters(2 * m * k, 21), b33 = quarters(3 * k * n, 22);
  expect_values(internal::matmul(make(a4, {2, 1, m, k}, opts()), make(b33, {3, k, n}, opts())), {2, 3, m, n},
                ref_matmul(a4, {2, 1}, b33, {3}, {2, 3}, m, k, n));
  // 4-D x 4-D broadcasting both ways: (2, 1, M, K) @ (1, 3, K, N): batch dims cannot merge into one stride
  expect_values(internal::matmul(make(a4, {2, 1, m, k}, opts()), make(b33, {1, 3, k, n}, opts())), {2, 3, m, n},
                ref_matmul(a4, {2, 1}, b33, {1, 3}, {2, 3}, m, k, n));
  // 5-D x 2-D with a permuted (non-foldable) batch in float64
  const std::vector<double> a5 = quarters(2 * 3 * 2 * m * k, 23);
  Tensor a5t = make(a5, {3, 2, 2, m, k}, opts(DType::Float64)).permute({1, 0, 2, 3, 4});  // (2, 3, 2, M, K)
  std::vector<double> a5p;  // a5t's values in row-major order
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int l = 0; l < 2 * m * k; ++l) a5p.push_back(a5[(j * 2 + i) * 2 * m * k + l]);
  expect_values(internal::matmul(a5t, make(b2, {k, n}, opts(DType::Float64))), {2, 3, 2, m, n},
                ref_matmul(a5p, {2, 3, 2}, b2, {}, {2, 3, 2}, m, k, n));
  // Batch dims of size 1 only: (1, M, K) @ (1, 1, K, N) -> (1, 1, M, N)
  expect_values(internal::matmul(make(a2, {1, m, k}, opts()), make(b2, {1, 1, k, n}, opts())), {1, 1, m, n},
                ref_mm(a2, b2, m, k, n));
  // Non-contiguous batched operands
  expect_values(internal::matmul(testing::non_contiguous(make(a3, {5, m, k}, opts())),
                                 testing::non_contiguous(make(b3, {5, k, n}, opts()))),
                {5, m, n}, ref_matmul(a3, {5}, b3, {5}, {5}, m, k, n));
}

// Attention's products: heads transposed out of (B, S, H, D) activations, so the batch dims (B, H) need two
// strides, and a key operand broadcast over the heads (stride 0 in H only). Both take the single-product path
// (operands copied where their batch dims do not walk with one stride); values against the reference.
TEST_P(MatmulTest, HeadTransposedBatches) {
  const int64_t bs = 3, s = 5, h = 4, d = 6;
  for (DType dt : {DType::Float32, DType::Float64}) {
    SCOPED_TRACE(::testing::Message() << dt);
    const std::vector<double> q = quarters(bs * s * h * d, 31), kv = quarters(bs * s * h * d, 32),
                              k1 = quarters(bs * s * d, 33);
    const Tensor qt = make(q, {bs, s, h, d}, opts(dt)).permute({0, 2, 1, 3});   // (B, H, S, D)
    const Tensor kt = make(kv, {bs, s, h, d}, opts(dt)).permute({0, 2, 3, 1});  // (B, H, D, S)
    const Tensor kb = make(k1, {bs, 1, d, s}, opts(dt)).expand({bs, h, d, s});  // (B, H, D, S), stride 0 in H
    std::vector<double> qp, ktp, kbp;  // the operands' values in row-major order of their (B, H, ...) shapes
    for (int64_t b = 0; b < bs; ++b)
      for (int64_t j = 0; j < h; ++j) {
        for (int64_t i = 0; i < s; ++i)
          for (int64_t e = 0; e < d; ++e) qp.push_back(q[static_cast<size_t>(((b * s + i) * h + j) * d + e)]);
        for (int64_t e = 0; e < d; ++e)
          for (int64_t i = 0; i < s; ++i) {
            ktp.push_back(kv[static_cast<size_t>(((b * s + i) * h + j) * d + e)]);
            kbp.push_back(k1[static_cast<size_t>((b * d + e) * s + i)]);
          }
      }
    expect_values(internal::matmul(qt, kt), {bs, h, s, s}, ref_matmul(qp, {bs, h}, ktp, {bs, h}, {bs, h}, s, d, s), -1,
                  matmul_atol(dt, d));
    expect_values(internal::matmul(qt, kb), {bs, h, s, s}, ref_matmul(qp, {bs, h}, kbp, {bs, h}, {bs, h}, s, d, s), -1,
                  matmul_atol(dt, d));
  }
}

TEST_P(MatmulTest, ZeroSizedDims) {
  // K = 0: sums over nothing are zeros.
  expect_values(internal::matmul(internal::empty({3, 0}, opts()), internal::empty({0, 2}, opts())), {3, 2},
                std::vector<double>(6, 0));
  expect_values(
      internal::bmm(internal::empty({2, 3, 0}, opts(DType::Float16)), internal::empty({2, 0, 2}, opts(DType::Float16))),
      {2, 3, 2}, std::vector<double>(12, 0));
  expect_values(internal::dot(internal::empty({0}, opts()), internal::empty({0}, opts())), {}, {0});
  // M = 0, N = 0 or B = 0: empty results.
  expect_values(internal::matmul(internal::empty({0, 3}, opts()), internal::ones({3, 2}, opts())), {0, 2}, {});
  expect_values(internal::matmul(internal::ones({2, 3}, opts()), internal::ones({3, 0}, opts())), {2, 0}, {});
  expect_values(internal::matmul(internal::empty({0, 2, 3}, opts()), internal::ones({3, 4}, opts())), {0, 2, 4}, {});
  expect_values(internal::outer(internal::empty({0}, opts()), internal::ones({3}, opts())), {0, 3}, {});
  // addmm with K = 0 is beta * c.
  expect_values(internal::addmm(internal::full({2, 2}, 3.0, opts()), internal::empty({2, 0}, opts()),
                                internal::empty({0, 2}, opts()), 0.5),
                {2, 2}, {1.5, 1.5, 1.5, 1.5});
}

TEST_P(MatmulTest, BmmAndOuterAndDot) {
  const std::vector<double> a = quarters(2 * 3 * 4, 24), b = quarters(2 * 4 * 5, 25);
  for (DType dt : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16, DType::Int64}) {
    SCOPED_TRACE(::testing::Message() << dt);
    if (unsupported(dt)) continue;
    const std::vector<double> ad = data_for(dt, 24, 24), bd = data_for(dt, 40, 25);
    expect_values(internal::bmm(make(ad, {2, 3, 4}, opts(dt)), make(bd, {2, 4, 5}, opts(dt))), {2, 3, 5},
                  ref_matmul(ad, {2}, bd, {2}, {2}, 3, 4, 5), -1, matmul_atol(dt, 4));
    const std::vector<double> u = data_for(dt, 4, 26), v = data_for(dt, 3, 27);
    std::vector<double> want;
    for (double x : u)
      for (double y : v) want.push_back(x * y);
    expect_values(internal::outer(make(u, {4}, opts(dt)), make(v, {3}, opts(dt))), {4, 3}, want);
    const std::vector<double> w = data_for(dt, 4, 28);
    double dotv = 0;
    for (int i = 0; i < 4; ++i) dotv += u[i] * w[i];
    expect_values(internal::dot(make(u, {4}, opts(dt)), make(w, {4}, opts(dt))), {}, {dotv});
  }
  // Strided vectors
  const std::vector<double> u = quarters(6, 29), w = quarters(6, 30);
  double dotv = 0;
  for (int i = 0; i < 6; ++i) dotv += u[i] * w[i];
  expect_values(
      internal::dot(testing::non_contiguous(make(u, {6}, opts())), testing::non_contiguous(make(w, {6}, opts()))), {},
      {dotv});
}

// addmm_ adds the product into its destination in place: the same memory afterwards, for every float dtype, with
// beta and alpha, into a view of a larger tensor's rows (the NHWC rows of a channels-last gradient, say), and with
// the bad destinations refused.
TEST_P(MatmulTest, AddmmInPlaceAddsIntoTheDestination) {
  const int64_t m = 6, k = 5, n = 4;
  const std::vector<double> a = quarters(m * k, 41), b = quarters(k * n, 42), c = quarters(m * n, 43);
  const std::vector<double> ab = ref_mm(a, b, m, k, n);
  for (DType dt : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16}) {
    SCOPED_TRACE(::testing::Message() << dt);
    Tensor dest = make(c, {m, n}, opts(dt));
    const void* before = dest.data_ptr();
    Tensor& result = internal::addmm_(dest, make(a, {m, k}, opts(dt)), make(b, {k, n}, opts(dt)), 0.5, 2.0);
    EXPECT_EQ(&result, &dest);
    EXPECT_EQ(dest.data_ptr(), before);
    std::vector<double> want(m * n);
    for (int64_t i = 0; i < m * n; ++i) want[i] = 0.5 * c[i] + 2.0 * ab[i];
    expect_values(dest, {m, n}, want, -1, matmul_atol(dt, k));
  }
  // The (N H W, C) rows of a channels-last (N, C, H, W) tensor: the product lands in its memory; a transposed a.
  const Tensor nchw = internal::contiguous(make(c, {1, n, 2, 3}, opts()), MemoryFormat::ChannelsLast);  // N H W = m
  Tensor rows = internal::view(internal::permute(nchw, {0, 2, 3, 1}), {m, n});
  const std::vector<double> rows_before = testing::values(rows);
  const Tensor at = internal::contiguous(make(a, {m, k}, opts()).t()).t();
  internal::addmm_(rows, at, make(b, {k, n}, opts()));
  std::vector<double> want(m * n);
  for (int64_t i = 0; i < m * n; ++i) want[i] = rows_before[i] + ab[i];
  expect_values(internal::view(internal::permute(nchw, {0, 2, 3, 1}), {m, n}), {m, n}, want);
  // Refused: a destination of another shape (no broadcasting), without contiguous rows, or of another dtype.
  Tensor row = make(std::vector<double>(n, 0.0), {n}, opts());
  expect_error(
      [&] {
        internal::addmm_(row, make(a, {m, k}, opts()), make(b, {k, n}, opts()));
      },
      {"addmm_", "does not broadcast"});
  Tensor strided = internal::contiguous(make(c, {n, m}, opts())).t();
  expect_error(
      [&] {
        internal::addmm_(strided, make(a, {m, k}, opts()), make(b, {k, n}, opts()));
      },
      {"addmm_", "contiguous rows"});
  Tensor doubles = make(c, {m, n}, opts(DType::Float64));
  expect_error(
      [&] {
        internal::addmm_(doubles, make(a, {m, k}, opts()), make(b, {k, n}, opts()));
      },
      {"addmm_", "float32 only", "float64"});
  Tensor halves = make(c, {m, n}, opts(DType::BFloat16));
  expect_error(
      [&] {
        internal::addmm_(halves, make(a, {m, k}, opts(DType::Float16)), make(b, {k, n}, opts(DType::Float16)));
      },
      {"addmm_", "float16", "bfloat16"});
}

// 16-bit operands add their float32 sums into a float32 destination: a gradient sum kept in float32 (a residual
// stream's) takes a 16-bit product's share without a rounding to 16 bits. The destination holds values that 16 bits
// cannot represent (1 + 2^-20 and the like), and the operands' quarters multiply and sum exactly in float32, so the
// result equals the float64 reference exactly (every sum here is exact in float32).
TEST_P(MatmulTest, AddmmInPlaceAddsSixteenBitProductsIntoFloat32) {
  const int64_t m = 6, k = 5, n = 4;
  const std::vector<double> a = quarters(m * k, 44), b = quarters(k * n, 45);
  const std::vector<double> ab = ref_mm(a, b, m, k, n);
  std::vector<double> c(m * n);
  for (int64_t i = 0; i < m * n; ++i) c[i] = 1.0 + std::ldexp(static_cast<double>(i + 1), -20);
  for (DType dt : {DType::Float16, DType::BFloat16}) {
    SCOPED_TRACE(::testing::Message() << dt);
    Tensor dest = make(c, {m, n}, opts(DType::Float32));
    const void* before = dest.data_ptr();
    internal::addmm_(dest, make(a, {m, k}, opts(dt)), make(b, {k, n}, opts(dt)));
    EXPECT_EQ(dest.dtype(), DType::Float32);
    EXPECT_EQ(dest.data_ptr(), before);
    std::vector<double> want(m * n);
    for (int64_t i = 0; i < m * n; ++i) want[i] = c[i] + ab[i];
    expect_values(dest, {m, n}, want, 0, 1e-7);
  }
}

// Large products time the heuristic's candidate algorithms on their first eager run (cuda::set_matmul_tuning). The
// timed runs must leave no trace: a product that adds into its destination (beta = 1) times on scratch memory, and
// one that overwrites it is written again. Quarters in [-1, 1] multiply and sum exactly in float32 for K = 1024, so
// every result equals the float64 reference exactly, whichever algorithm ran; the reference is checked on every 16th
// row. Deterministic mode, and a product first met inside a CUDA graph capture, keep the heuristic's choice (nothing
// timed); the first eager call after the capture times it.
TEST_P(MatmulTest, TimedAlgorithmsLeaveTheProductAsTheHeuristicsWould) {
  if (!dev().is_cuda()) GTEST_SKIP() << "algorithm timing applies to CUDA matmuls only";
  const bool before = cuda::matmul_tuning();
  cuda::set_matmul_tuning(true);
  const int64_t m = 2048, k = 1024;
  const std::vector<double> a = quarters(m * k, 46);
  // Each block uses its own N, so that no earlier product of this process has chosen its algorithm.
  auto check = [&](const Tensor& got, const std::vector<double>& b, const std::vector<double>& c, int64_t n) {
    ASSERT_EQ(got.shape(), (Shape{m, n}));
    const std::vector<double> v = testing::values(got);
    for (int64_t i = 0; i < m; i += 16) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = c.empty() ? 0.0 : c[i * n + j];
        for (int64_t p = 0; p < k; ++p) acc += a[i * k + p] * b[p * n + j];
        ASSERT_EQ(v[i * n + j], acc) << "row " << i << ", column " << j;
      }
    }
  };
  const Tensor a16 = make(a, {m, k}, opts(DType::BFloat16));
  {
    SCOPED_TRACE("timed: a product added into a destination, then the same problem into a new tensor");
    const int64_t n = 1040;
    const std::vector<double> b = quarters(k * n, 47), c = quarters(m * n, 48);
    const Tensor b16 = make(b, {k, n}, opts(DType::BFloat16));
    const int64_t timed = cuda::matmul_problems_timed();
    Tensor dest = make(c, {m, n}, opts(DType::Float32));
    internal::addmm_(dest, a16, b16);  // beta = 1: timed on scratch memory
    EXPECT_EQ(cuda::matmul_problems_timed(), timed + 1);
    check(dest, b, c, n);
    // The same problem (beta is not part of it) into a new float32 tensor: the algorithm chosen above, not timed again.
    check(internal::mm(a16, b16, DType::Float32), b, {}, n);
    EXPECT_EQ(cuda::matmul_problems_timed(), timed + 1);
  }
  {
    SCOPED_TRACE("timed: a product that overwrites its destination (beta = 0) is written again after the timing");
    const int64_t n = 1088;
    const std::vector<double> b = quarters(k * n, 52);
    const int64_t timed = cuda::matmul_problems_timed();
    check(internal::mm(a16, make(b, {k, n}, opts(DType::BFloat16)), DType::Float32), b, {}, n);
    EXPECT_EQ(cuda::matmul_problems_timed(), timed + 1);
  }
  {
    SCOPED_TRACE("deterministic mode: the heuristic's choice, nothing timed");
    const int64_t n = 1056;
    const std::vector<double> b = quarters(k * n, 49);
    const int64_t timed = cuda::matmul_problems_timed();
    {
      DeterministicGuard deterministic(true);
      check(internal::mm(a16, make(b, {k, n}, opts(DType::BFloat16)), DType::Float32), b, {}, n);
    }
    EXPECT_EQ(cuda::matmul_problems_timed(), timed);
  }
  {
    SCOPED_TRACE("first met inside a CUDA graph capture: not timed there; the next eager call times it");
    const int64_t n = 1072;
    const std::vector<double> b = quarters(k * n, 50), c = quarters(m * n, 51);
    const Tensor b16 = make(b, {k, n}, opts(DType::BFloat16));
    Tensor dest = make(c, {m, n}, opts(DType::Float32));
    const int64_t timed = cuda::matmul_problems_timed();
    cuda::Graph graph;
    graph.capture([&] { internal::addmm_(dest, a16, b16); }, 0);
    EXPECT_EQ(cuda::matmul_problems_timed(), timed);
    graph.replay();
    cuda::synchronize();
    check(dest, b, c, n);
    dest.copy_(make(c, {m, n}, opts(DType::Float32)));
    internal::addmm_(dest, a16, b16);
    EXPECT_EQ(cuda::matmul_problems_timed(), timed + 1);
    check(dest, b, c, n);
  }
  cuda::set_matmul_tuning(before);
}

TEST_P(MatmulTest, AddmmScalesAndBroadcastsC) {
  const int64_t m = 3, k = 4, n = 2;
  const std::vector<double> a = quarters(m * k, 31), b = quarters(k * n, 32);
  const std::vector<double> ab = ref_mm(a, b, m, k, n);
  const std::vector<double> c_row = {0.5, -1.0};  // (N,) broadcast over rows
  for (DType dt : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16}) {
    SCOPED_TRACE(::testing::Message() << dt);
    std::vector<double> want(m * n);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) want[i * n + j] = 2.0 * c_row[j] + 0.5 * ab[i * n + j];
    expect_values(
        internal::addmm(make(c_row, {n}, opts(dt)), make(a, {m, k}, opts(dt)), make(b, {k, n}, opts(dt)), 2.0, 0.5),
        {m, n}, want, -1, matmul_atol(dt, k));
  }
  // c of shape (M, 1) and (M, N), default beta = alpha = 1, transposed a
  const std::vector<double> c_col = {1, 2, 3};
  std::vector<double> want(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) want[i * n + j] = c_col[i] + ab[i * n + j];
  const Tensor at = internal::contiguous(make(a, {m, k}, opts()).t()).t();
  expect_values(internal::addmm(make(c_col, {m, 1}, opts()), at, make(b, {k, n}, opts())), {m, n}, want);
  expect_values(internal::addmm(make(want, {m, n}, opts()), make(a, {m, k}, opts()), make(b, {k, n}, opts()), 1, -1),
                {m, n}, {1, 1, 2, 2, 3, 3});
  // beta = 0 ignores c, NaN included
  const Tensor nan_c = internal::full({m, n}, std::numeric_limits<double>::quiet_NaN(), opts());
  expect_values(internal::addmm(nan_c, make(a, {m, k}, opts()), make(b, {k, n}, opts()), 0), {m, n}, ab);
  // integers
  if (unsupported(DType::Int32)) {
    expect_error(
        [&] {
          internal::mm(internal::ones({2, 2}, opts(DType::Int32)), internal::ones({2, 2}, opts(DType::Int32)));
        },
        {"matmul", "integer", "CUDA"});
    return;
  }
  const std::vector<double> ai = small_ints(m * k, 33), bi = small_ints(k * n, 34);
  const std::vector<double> abi = ref_mm(ai, bi, m, k, n);
  std::vector<double> wi(m * n);
  for (int64_t i = 0; i < m * n; ++i) wi[i] = 3 * 7 + 2 * abi[i];
  expect_values(internal::addmm(internal::full({1}, 7, opts(DType::Int32)), make(ai, {m, k}, opts(DType::Int32)),
                                make(bi, {k, n}, opts(DType::Int32)), 3, 2),
                {m, n}, wi);
}

TEST_P(MatmulTest, ErrorsNameTheOpShapesAndDTypes) {
  const Tensor a23 = internal::ones({2, 3}, opts()), a45 = internal::ones({4, 5}, opts());
  expect_error([&] { internal::matmul(a23, a45); }, {"matmul: shapes [2, 3] and [4, 5] cannot be multiplied (3 != 4)"});
  expect_error([&] { internal::mm(a23, a45); }, {"mm: shapes [2, 3] and [4, 5] cannot be multiplied (3 != 4)"});
  expect_error([&] { internal::matmul(internal::ones({3}, opts()), internal::ones({4}, opts())); },
               {"matmul", "[3]", "[4]", "3 != 4"});
  expect_error(
      [&] {
        internal::matmul(internal::ones({2, 5, 3}, opts()), internal::ones({5}, opts()));
      },
      {"matmul", "[2, 5, 3]", "3 != 5"});
  expect_error(
      [&] {
        internal::matmul(a23, internal::ones({3, 2}, opts(DType::Float64)));
      },
      {"matmul", "float32", "float64", ".to(DType::Float64)"});
  expect_error(
      [&] {
        internal::mm(a23.to(DType::Int32), internal::ones({3, 2}, opts(DType::Float16)));
      },
      {"mm", "int32", "float16", ".to("});
  expect_error(
      [&] {
        internal::matmul(a23.to(DType::Bool), internal::ones({3, 2}, opts(DType::Bool)));
      },
      {"matmul", "bool"});
  expect_error([&] { internal::matmul(internal::ones({}, opts()), a23); },
               {"matmul", "at least 1 dim", "[]", "[2, 3]"});
  expect_error([&] { internal::mm(internal::ones({3}, opts()), a23); }, {"mm", "2-D", "[3]", "[2, 3]"});
  expect_error([&] { internal::bmm(a23, a23); }, {"bmm", "3-D", "[2, 3]"});
  expect_error(
      [&] {
        internal::bmm(internal::ones({2, 2, 3}, opts()), internal::ones({3, 3, 2}, opts()));
      },
      {"bmm", "batch", "2 != 3"});
  expect_error(
      [&] {
        internal::bmm(internal::ones({2, 2, 3}, opts()), internal::ones({2, 4, 2}, opts()));
      },
      {"bmm", "3 != 4"});
  expect_error(
      [&] {
        internal::matmul(internal::ones({2, 2, 3}, opts()), internal::ones({3, 3, 2}, opts()));
      },
      {"matmul", "batch", "[2]", "[3]", "[2, 2, 3]", "[3, 3, 2]"});
  expect_error(
      [&] {
        internal::addmm(internal::ones({3}, opts()), a23, internal::ones({3, 2}, opts()));
      },
      {"addmm", "[3]", "[2, 2]"});
  expect_error(
      [&] {
        internal::addmm(internal::ones({2}, opts(DType::Float64)), a23, internal::ones({3, 2}, opts()));
      },
      {"addmm", "float64", "float32"});
  expect_error([&] { internal::dot(internal::ones({3}, opts()), internal::ones({4}, opts())); },
               {"dot", "[3]", "[4]", "3 != 4"});
  expect_error([&] { internal::dot(a23, a23); }, {"dot", "1-D", "[2, 3]"});
  expect_error([&] { internal::outer(a23, internal::ones({2}, opts())); }, {"outer", "1-D", "[2, 3]"});
  expect_error([&] { internal::matmul(Tensor(), a23); }, {"matmul", "undefined"});
}

TEST_P(MatmulTest, DevicesMustMatch) {
  if (dev().is_cpu()) {
    if (testing::test_devices().size() < 2) GTEST_SKIP() << "needs a second device";
    expect_error(
        [&] {
          internal::matmul(internal::ones({2, 2}, opts()),
                           internal::ones({2, 2}, {.dtype = DType::Float32, .device = Device::cuda(0)}));
        },
        {"matmul", "same device", "cpu", "cuda:0"});
    return;
  }
  expect_error(
      [&] {
        internal::mm(internal::ones({2, 2}, opts()), internal::ones({2, 2}));
      },
      {"mm", "same device", "cpu", "cuda"});
}

// A linear layer's forward (addmm with a bias vector) and its weight and bias gradients in one product
// (mm_with_row_sums): on CUDA in 16-bit dtypes through cuBLASLt's epilogues, elsewhere through a product and a
// reduction; both against double references, with a of several layouts and sizes that exercise real tiles.
TEST_P(MatmulTest, LinearEpilogues) {
  struct Size {
    int64_t m, k, n;
  };
  for (const Size sz : {Size{3, 4, 2}, Size{37, 48, 24}, Size{256, 64, 40}}) {
    const int64_t m = sz.m, k = sz.k, n = sz.n;
    const std::vector<double> a = quarters(m * k, 41), b = quarters(k * n, 42), bias = quarters(n, 43);
    const std::vector<double> ab = ref_mm(a, b, m, k, n);
    std::vector<double> want(m * n), sums(m, 0.0);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) want[i * n + j] = ab[i * n + j] + bias[j];
      for (int64_t j = 0; j < k; ++j) sums[i] += a[i * k + j];
    }
    for (DType dt : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16}) {
      SCOPED_TRACE(::testing::Message() << dt << " " << m << "x" << k << "x" << n);
      const Tensor ac = make(a, {m, k}, opts(dt)), bc = make(b, {k, n}, opts(dt));
      const Tensor at = internal::contiguous(ac.t()).t();  // column-major, as g^T is in a backward
      for (const Tensor& x : {ac, at}) {
        expect_values(internal::addmm(make(bias, {n}, opts(dt)), x, bc), {m, n}, want, -1, matmul_atol(dt, k));
        expect_values(internal::addmm(make(bias, {1, n}, opts(dt)), x, bc), {m, n}, want, -1, matmul_atol(dt, k));
        auto [prod, row_sums] = internal::mm_with_row_sums(x, bc);
        expect_values(prod, {m, n}, ab, -1, matmul_atol(dt, k));
        expect_values(row_sums, {m}, sums, -1, matmul_atol(dt, k));
      }
      // On the GPU the 16-bit products with dims of multiples of 8 take the epilogues themselves (not the
      // fallback); other dims are declined.
      if (dev().is_cuda() && (dt == DType::Float16 || dt == DType::BFloat16)) {
        // Leading dimensions of multiples of 8 elements: at (column-major) has m, ac (row-major) has k.
        const bool aligned = m % 8 == 0 && k % 8 == 0 && n % 8 == 0;
        const bool bias_aligned = k % 8 == 0 && n % 8 == 0;
        Tensor out = internal::empty({1, m, n}, opts(dt)), row = internal::empty({m}, opts(dt));
        auto batch = [](const Tensor& t) { return t.unsqueeze(0); };
        EXPECT_EQ(backend(dev()).matmul_epilogue(out, batch(at), batch(bc), {.bias = {}, .row_sums = row}), aligned);
        if (aligned) expect_values(row, {m}, sums, -1, matmul_atol(dt, k));
        EXPECT_EQ(backend(dev()).matmul_epilogue(out, batch(ac), batch(bc),
                                                 {.bias = make(bias, {n}, opts(dt)), .row_sums = {}}),
                  bias_aligned);
        if (bias_aligned) expect_values(out.squeeze(0), {m, n}, want, -1, matmul_atol(dt, k));
      }
    }
  }
  // Other scalings or shapes of c keep the general path.
  expect_values(internal::addmm(internal::full({2}, 1.0, opts()), internal::ones({2, 3}, opts()),
                                internal::ones({3, 2}, opts()), 2, 1),
                {2, 2}, {5, 5, 5, 5});
  expect_error(
      [&] {
        internal::mm_with_row_sums(internal::ones({2, 3}, opts()), internal::ones({2, 2}, opts()));
      },
      {"mm_with_row_sums", "[2, 3]", "[2, 2]"});
}

// Products whose rows would not be 16-byte aligned (n = 1001) get rows padded to a multiple of 16 bytes on CUDA
// (Backend::matmul_row_pitch): the result is the (m, n) view of (m, 1008) storage for 16-bit values and (m, 1004) for
// float32, with the right values, for mm, addmm with a bias (which then takes the epilogue) and the products of a
// linear layer's backward that read such rows (g @ w and g^T @ x). Elsewhere, and for short rows, products stay
// contiguous.
TEST_P(MatmulTest, ProductRowsPaddedToAnAlignedPitch) {
  const int64_t m = 40, k = 64, n = 1001, j = 48;
  const std::vector<double> a = quarters(m * k, 51), b = quarters(k * n, 52), bias = quarters(n, 53),
                            w = quarters(n * j, 54);
  const std::vector<double> ab = ref_mm(a, b, m, k, n);
  std::vector<double> with_bias(ab), abw = ref_mm(ab, w, m, n, j), abt_a(n * k, 0.0), row_sums(n, 0.0);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < n; ++c) with_bias[r * n + c] += bias[c];
  for (int64_t c = 0; c < n; ++c) {  // (ab)^T a: (n, k), and the row sums of (ab)^T
    for (int64_t r = 0; r < m; ++r) row_sums[c] += ab[r * n + c];
    for (int64_t q = 0; q < k; ++q)
      for (int64_t r = 0; r < m; ++r) abt_a[c * k + q] += ab[r * n + c] * a[r * k + q];
  }
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) {
    SCOPED_TRACE(::testing::Message() << dt);
    const int64_t pitch = !dev().is_cuda() ? n : dt == DType::Float32 ? 1004 : 1008;
    const Tensor ac = make(a, {m, k}, opts(dt)), bc = make(b, {k, n}, opts(dt));
    const Tensor prod = internal::mm(ac, bc);
    EXPECT_EQ(prod.stride(0), pitch);
    EXPECT_EQ(prod.stride(1), 1);
    expect_values(prod, {m, n}, ab, -1, matmul_atol(dt, k));
    const Tensor biased = internal::addmm(make(bias, {n}, opts(dt)), ac, bc);
    EXPECT_EQ(biased.stride(0), pitch);
    expect_values(biased, {m, n}, with_bias, -1, matmul_atol(dt, k));
    expect_values(internal::matmul(ac, bc), {m, n}, ab, -1, matmul_atol(dt, k));
    // Reading padded rows: the products of a backward. prod holds exact values (quarters, k = 64), so these
    // references are exact too, up to the output's rounding.
    expect_values(internal::mm(prod, make(w, {n, j}, opts(dt))), {m, j}, abw, -1, matmul_atol(dt, n));
    auto [gt_a, sums] = internal::mm_with_row_sums(prod.t(), ac);
    expect_values(gt_a, {n, k}, abt_a, -1, matmul_atol(dt, m));
    expect_values(sums, {n}, row_sums, -1, matmul_atol(dt, m));
    // Short rows, and one-row products, stay contiguous.
    EXPECT_TRUE(internal::mm(ac, internal::narrow(bc, 1, 0, 100)).is_contiguous());
    EXPECT_TRUE(internal::mm(internal::narrow(ac, 0, 0, 1), bc).is_contiguous());
  }
}

// On CUDA a product with a large dimension that is not a multiple of 16 bytes' worth of elements (8 16-bit values, 4
// floats) runs as an aligned part and a rest of at most 7 (kiln/tensor/cuda/matmul.cpp): every dimension cut here in
// every dtype (m = 256 + 6, k = 296 + 6, n = 264 + 6), with general scalars (the rest of K adds onto the first part's
// result), batched, and through the epilogues.
TEST_P(MatmulTest, ProductsCutAtUnalignedDimensions) {
  const int64_t m = 262, k = 302, n = 270, batches = 2;
  const std::vector<double> a = quarters(batches * m * k, 61), b = quarters(batches * k * n, 62),
                            c = quarters(m * n, 63), bias = quarters(n, 64);
  const std::vector<double> ab = ref_matmul(a, {batches}, b, {batches}, {batches}, m, k, n);
  std::vector<double> scaled(m * n), with_bias(m * n), row_sums(m, 0.0);
  for (int64_t i = 0; i < m * n; ++i) {
    scaled[i] = 0.5 * c[i] + 2.0 * ab[i];
    with_bias[i] = ab[i] + bias[i % n];
  }
  for (int64_t i = 0; i < m; ++i)
    for (int64_t q = 0; q < k; ++q) row_sums[i] += a[i * k + q];
  const std::vector<double> first(ab.begin(), ab.begin() + m * n);
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) {
    SCOPED_TRACE(::testing::Message() << dt);
    const double atol = matmul_atol(dt, k);
    const Tensor a3 = make(a, {batches, m, k}, opts(dt)), b3 = make(b, {batches, k, n}, opts(dt));
    const Tensor a2 = internal::select(a3, 0, 0), b2 = internal::select(b3, 0, 0);
    expect_values(internal::bmm(a3, b3), {batches, m, n}, ab, -1, atol);
    expect_values(internal::addmm(make(c, {m, n}, opts(dt)), a2, b2, 0.5, 2.0), {m, n}, scaled, -1, atol);
    expect_values(internal::addmm(make(bias, {n}, opts(dt)), a2, b2), {m, n}, with_bias, -1, atol);
    auto [prod, sums] = internal::mm_with_row_sums(a2, b2);
    expect_values(prod, {m, n}, first, -1, atol);
    expect_values(sums, {m}, row_sums, -1, atol);
    // Column-major a (as g^T in a backward).
    expect_values(internal::mm(internal::contiguous(a2.t()).t(), b2), {m, n}, first, -1, atol);
  }
}

// The row sums of a float32 product (a linear layer's bias gradient) are float32 sums of a's values, also where the
// product itself runs in TF32 (the default): every element is 1 + 2^-12, which TF32's 10-bit mantissa rounds to 1,
// and the sums (k + k 2^-12) are exact in float32, so sums of TF32-rounded values would be short by k 2^-12. Through
// the epilogue (aligned shapes) and the cut (unaligned ones).
TEST_P(MatmulTest, Float32RowSumsAreFloat32SumsUnderTf32) {
  for (const auto& [m, k] : {std::pair<int64_t, int64_t>{512, 4096}, {262, 302}}) {
    SCOPED_TRACE(::testing::Message() << "(" << m << ", " << k << ")");
    const double v = 1 + std::ldexp(1.0, -12);
    const Tensor a = internal::full({m, k}, v, opts()), b = internal::full({k, 64}, 0.25, opts());
    auto [prod, sums] = internal::mm_with_row_sums(a, b);
    expect_values(sums, {m}, std::vector<double>(m, v * static_cast<double>(k)), 0, 0);
  }
}

// a (m, k) and b (k, n) of multiples of 1/64 below 1 (exact in bfloat16 and float16, their products' sums exact in
// float32), with the double references of a @ b and of a's row sums.
struct ExactProduct {
  std::vector<double> a, b, ab, sums;
};
ExactProduct exact_product(int64_t m, int64_t k, int64_t n, uint32_t seed) {
  ExactProduct p{testing::exact_grid(m * k, 48, 64.0, seed),
                 testing::exact_grid(k * n, 48, 64.0, seed + 1),
                 {},
                 std::vector<double>(static_cast<size_t>(m), 0.0)};
  p.ab = ref_mm(p.a, p.b, m, k, n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t q = 0; q < k; ++q) p.sums[i] += p.a[i * k + q];
  return p;
}

// Widening products (internal::mm and mm_with_row_sums with a Float32 result for 16-bit operands, as a backward
// computes the gradient of a float32 tensor that autocast cast): the float32 sums themselves, not rounded to 16 bits.
// The values are multiples of 1/64 below 1 (exact in bfloat16 and float16) whose products sum exactly in float32, so
// the result must equal the double reference exactly, which a 16-bit result rounded to 8 or 11 bits cannot. The
// sizes exercise CUDA's cut at unaligned dimensions (m = 256 + 4, k = 296 + 4, n = 264 + 6) and the epilogue's
// aligned tiles.
TEST_P(MatmulTest, WideningProductsKeepTheFloat32Sums) {
  struct Size {
    int64_t m, k, n;
  };
  for (const Size sz : {Size{37, 48, 24}, Size{64, 128, 96}, Size{260, 300, 270}}) {
    const int64_t m = sz.m, k = sz.k, n = sz.n;
    const auto [a, b, ab, sums] = exact_product(m, k, n, 71);
    for (DType dt : {DType::BFloat16, DType::Float16}) {
      SCOPED_TRACE(::testing::Message() << dt << " " << m << "x" << k << "x" << n);
      const Tensor ac = make(a, {m, k}, opts(dt)), bc = make(b, {k, n}, opts(dt));
      const Tensor at = internal::contiguous(ac.t()).t();  // column-major, as g^T is in a backward
      for (const Tensor& x : {ac, at}) {
        const Tensor prod = internal::mm(x, bc, DType::Float32);
        EXPECT_EQ(prod.dtype(), DType::Float32);
        expect_values(prod, {m, n}, ab, 0, 0);
        auto [with_sums, row_sums] = internal::mm_with_row_sums(x, bc, DType::Float32);
        EXPECT_EQ(with_sums.dtype(), DType::Float32);
        EXPECT_EQ(row_sums.dtype(), DType::Float32);
        expect_values(with_sums, {m, n}, ab, 0, 0);
        expect_values(row_sums, {m}, sums, 0, 0);
      }
      // The same product in the operands' dtype is rounded: the widening one is not that with a cast.
      EXPECT_FALSE(internal::equal(internal::mm(ac, bc, DType::Float32), internal::mm(ac, bc).to(DType::Float32)));
    }
  }
  // An empty inner dim gives zeros in float32.
  expect_values(internal::mm(internal::ones({2, 0}, opts(DType::BFloat16)),
                             internal::ones({0, 3}, opts(DType::BFloat16)), DType::Float32),
                {2, 3}, std::vector<double>(6, 0.0));
  // Only 16-bit operands widen, and only to float32.
  expect_error(
      [&] {
        internal::mm(internal::ones({2, 2}, opts()), internal::ones({2, 2}, opts()), DType::Float64);
      },
      {"mm", "float32 operands", "not in float64"});
  expect_error(
      [&] {
        internal::mm_with_row_sums(internal::ones({2, 2}, opts(DType::BFloat16)),
                                   internal::ones({2, 2}, opts(DType::BFloat16)), DType::Float16);
      },
      {"mm_with_row_sums", "bfloat16 operands", "bfloat16 or float32", "not in float16"});
}

// Row sums of a with at least 8 times as many rows as b has columns (a linear layer's weight and bias gradients when
// it has many more outputs than inputs: an output layer over a vocabulary). On the GPU, for 16-bit operands,
// mm_with_row_sums takes them as one more column of b (a @ [b | 1 | 0 ...]); they must equal the double references
// as the other paths do: exactly where the float32 result can hold them (multiples of 1/64), for row-major,
// column-major and padded a (the (M, N) view of a product's padded rows, transposed, as g^T is in a backward), with
// n a multiple of 8, not one, and one short of one (no padding columns).
TEST_P(MatmulTest, RowSumsOfTallProductsAsOneMoreColumn) {
  struct Size {
    int64_t m, k, n;
  };
  for (const Size sz : {Size{200, 96, 24}, Size{840, 300, 100}, Size{262, 64, 7}}) {
    const int64_t m = sz.m, k = sz.k, n = sz.n;
    const auto [a, b, ab, sums] = exact_product(m, k, n, 81);
    for (DType dt : {DType::BFloat16, DType::Float16}) {
      SCOPED_TRACE(::testing::Message() << dt << " " << m << "x" << k << "x" << n);
      const Tensor ac = make(a, {m, k}, opts(dt)), bc = make(b, {k, n}, opts(dt));
      const Tensor at = internal::contiguous(ac.t()).t();  // column-major
      // a as the transpose of a (K, M) view of rows M + 8 apart, as g^T is where g is a product's padded rows (for
      // m = 262 those rows are not 16-byte aligned, so matmul copies a first).
      Tensor padded = internal::narrow(internal::zeros({k, m + 8}, opts(dt)), 1, 0, m);
      internal::copy_(padded, internal::contiguous(ac.t()));
      for (const Tensor& x : {ac, at, padded.t()}) {
        auto [wide, wide_sums] = internal::mm_with_row_sums(x, bc, DType::Float32);
        EXPECT_EQ(wide.dtype(), DType::Float32);
        EXPECT_TRUE(wide.is_contiguous());
        expect_values(wide, {m, n}, ab, 0, 0);
        expect_values(wide_sums, {m}, sums, 0, 0);
        auto [prod, row_sums] = internal::mm_with_row_sums(x, bc);
        EXPECT_EQ(prod.dtype(), dt);
        EXPECT_EQ(row_sums.dtype(), dt);
        expect_values(prod, {m, n}, ab, -1, matmul_atol(dt, k));
        expect_values(row_sums, {m}, sums, -1, matmul_atol(dt, k));
      }
    }
  }
}

KILN_INSTANTIATE_BACKENDS(MatmulTest);

}  // namespace
}  // namespace kiln
