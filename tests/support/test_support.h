// tests/support/test_support.h — what every kiln test uses.
//
//   class MyOpTest : public kiln::testing::BackendTest {};
//   TEST_P(MyOpTest, Adds) { auto x = kiln::ones({2}, opts()); ... }
//   KILN_INSTANTIATE_BACKENDS(MyOpTest);        // runs on cpu, and on cuda:0 where a GPU is visible
//
// References are computed independently of kiln's backends: plain loops in double, or hand-derived
// values. expect_values() compares a tensor (any device, dtype, layout) with such a reference.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "kiln/kiln.h"

namespace kiln::testing {

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
inline constexpr double kInf = std::numeric_limits<double>::infinity();
inline const std::vector<DType> kFloatTypes = {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16};

// Deterministic values in [lo, hi) from a small LCG, so references do not depend on kiln's generator.
std::vector<double> uniform(int64_t n, double lo, double hi, uint64_t seed = 1);
// n values k / denominator, for integers k in [-half_range, half_range] drawn from a seeded generator: exact in every
// float dtype whose mantissa holds k, so that products and sums of them can be exact too (references then compare
// without a tolerance).
std::vector<double> exact_grid(int64_t n, int half_range, double denominator, uint32_t seed);

// cpu, plus cuda:0 when the build has a CUDA backend and a GPU is visible.
std::vector<Device> test_devices();

class BackendTest : public ::testing::TestWithParam<Device> {
 protected:
  Device dev() const { return GetParam(); }
  TensorOptions opts(DType dtype = DType::Float32) const { return {.dtype = dtype, .device = dev()}; }
};

// A BackendTest whose float32 matrix products are full float32 on the GPU too (TF32 off for the test):
// for tests that compare float32 layers built on matmul against references with float32 tolerances.
class ExactFloat32Test : public BackendTest {
 protected:
  void SetUp() override;
  void TearDown() override;

 private:
  bool previous_tf32_ = true;
};

std::string device_param_name(const ::testing::TestParamInfo<Device>& info);

// The tensor's elements in row-major order as doubles (copied to the host, converted).
std::vector<double> values(const Tensor& t);
// The bytes of the tensor's elements in row-major order (copied to the host): equal exactly when the bits are.
std::vector<uint8_t> bytes_of(const Tensor& t);

// Tolerances that match a dtype's precision (tight for float64/float32, looser for 16-bit floats).
double default_rtol(DType dtype);
double default_atol(DType dtype);

// Checks shape and every element against a reference; NaNs must match NaNs. Reports the first mismatches.
void expect_values(const Tensor& actual, const Shape& shape, const std::vector<double>& expected, double rtol = -1,
                   double atol = -1);

// Builds a tensor from doubles (row-major) in the given dtype and device, e.g. make({1, 2, 3, 4}, {2, 2}, opts()).
Tensor make(const std::vector<double>& data, const Shape& shape, const TensorOptions& options = {});

// A non-contiguous tensor with the same values as `t` (a transposed copy transposed back, or a strided slice).
Tensor non_contiguous(const Tensor& t);

// Runs `fn` and checks that it throws kiln::Error (or a subclass) whose message contains every fragment.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& fragments);

// What `fn` threw when it ran in a child process whose address space could grow by at most `headroom_bytes`
// beyond the parent's (RLIMIT_AS): host allocations past that fail as they do on a machine out of memory.
struct ThrownUnderMemoryLimit {
  std::string kind;     // "OutOfMemoryError", "Error" (another kiln::Error), "other", "nothing", or "crash"
  std::string message;  // what() (for "crash": how the child ended)
};
ThrownUnderMemoryLimit run_under_memory_limit(const std::function<void()>& fn, size_t headroom_bytes);

// Sanitizer runtimes reserve terabytes of address space for their shadow memory, so an address-space limit cannot
// stand for "out of memory" in their builds.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitizerBuild = true;
#else
inline constexpr bool kSanitizerBuild = false;
#endif

// The process's threads, once the count has settled: a thread that was just joined can still be listed in
// /proc/self/task for a moment (join returns when the thread has cleared its id, before the kernel has removed
// it), so the count is read until three reads a millisecond apart agree (at most half a second).
int thread_count();

// Row-major index helpers for references: the multi-index of a flat index, and back.
std::vector<int64_t> unravel(int64_t flat, const Shape& shape);
int64_t ravel(const std::vector<int64_t>& index, const Shape& shape);

}  // namespace kiln::testing

#define KILN_INSTANTIATE_BACKENDS(Suite)                                                          \
  INSTANTIATE_TEST_SUITE_P(Backends, Suite, ::testing::ValuesIn(::kiln::testing::test_devices()), \
                           ::kiln::testing::device_param_name)
