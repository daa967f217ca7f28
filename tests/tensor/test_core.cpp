// Core types: DType promotion, Half/BFloat16 conversion, Device parsing, shapes.
#include <cmath>
#include <cstdint>
#include <cstdio>  // std::sscanf: /proc/self/smaps
#include <fstream>
#include <limits>
#include <string>

#include "support/test_support.h"

namespace kiln {
namespace {

TEST(DType, PromotionFollowsPyTorch) {
  EXPECT_EQ(promote_types(DType::Int32, DType::Float16), DType::Float16);
  EXPECT_EQ(promote_types(DType::Float16, DType::BFloat16), DType::Float32);
  EXPECT_EQ(promote_types(DType::UInt8, DType::Int32), DType::Int32);
  EXPECT_EQ(promote_types(DType::Bool, DType::UInt8), DType::UInt8);
  EXPECT_EQ(promote_types(DType::Int64, DType::Float32), DType::Float32);
  EXPECT_EQ(promote_types(DType::Float32, DType::Float64), DType::Float64);
  EXPECT_EQ(promote_types(DType::BFloat16, DType::Float32), DType::Float32);
  EXPECT_EQ(promote_types(DType::Bool, DType::Bool), DType::Bool);
}

TEST(DType, NamesAndSizes) {
  EXPECT_EQ(dtype_name(DType::BFloat16), "bfloat16");
  EXPECT_EQ(element_size(DType::Int64), 8u);
  EXPECT_EQ(element_size(DType::Float16), 2u);
  EXPECT_EQ(element_size(DType::Bool), 1u);
}

TEST(Half, ConvertsExactlyRepresentableValues) {
  for (float f : {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f /* smallest normal */,
                  5.960464477539063e-08f /* smallest subnormal */}) {
    EXPECT_EQ(static_cast<float>(Half(f)), f) << f;
  }
  EXPECT_EQ(Half(1.0f).bits, 0x3c00);
  EXPECT_EQ(Half(-2.0f).bits, 0xc000);
}

TEST(Half, RoundsToNearestEvenAndSaturatesToInfinity) {
  // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: ties to even gives 1.
  EXPECT_EQ(static_cast<float>(Half(1.0f + std::ldexp(1.0f, -11))), 1.0f);
  // 1 + 3 * 2^-11 lies halfway between 1 + 2^-10 and 1 + 2^-9: ties to even gives 1 + 2^-9.
  EXPECT_EQ(static_cast<float>(Half(1.0f + 3 * std::ldexp(1.0f, -11))), 1.0f + std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isinf(static_cast<float>(Half(70000.0f))));
  EXPECT_TRUE(std::isnan(static_cast<float>(Half(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(static_cast<float>(Half(65519.0f)), 65504.0f);
}

TEST(BFloat16, RoundsToNearestEven) {
  EXPECT_EQ(BFloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(static_cast<float>(BFloat16(1.0f + std::ldexp(1.0f, -8))), 1.0f);  // tie -> even
  EXPECT_EQ(static_cast<float>(BFloat16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Device, ParsesAndPrints) {
  EXPECT_EQ(Device("cpu"), Device::cpu());
  EXPECT_EQ(Device("cuda"), Device::cuda(0));
  EXPECT_EQ(Device("cuda:3"), Device::cuda(3));
  EXPECT_EQ(Device::cuda(2).str(), "cuda:2");
  testing::expect_error([] { Device("gpu:0"); }, {"Device", "gpu:0", "cuda:N"});
  testing::expect_error([] { Device("cuda:x"); }, {"cuda:x"});
  testing::expect_error([] { Device("cuda:"); }, {"cuda:"});
}

TEST(Shape, BroadcastsAndWrapsDims) {
  EXPECT_EQ(broadcast_shapes({2, 1, 4}, {3, 1}), (Shape{2, 3, 4}));
  EXPECT_EQ(broadcast_shapes({}, {5}), (Shape{5}));
  EXPECT_EQ(broadcast_shapes({0}, {1}), (Shape{0}));
  testing::expect_error([] { broadcast_shapes({2, 3}, {4}, "add"); }, {"add", "[2, 3]", "[4]"});
  EXPECT_EQ(wrap_dim(-1, 3, "op"), 2);
  EXPECT_EQ(wrap_dim(0, 0, "op"), 0);
  testing::expect_error([] { wrap_dim(3, 3, "sum"); }, {"sum", "dim 3", "rank 3"});
  EXPECT_EQ(contiguous_strides({2, 3, 4}), (Strides{12, 4, 1}));
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// The VmFlags line of the mapping in /proc/self/smaps that holds address p ("" when none does or smaps is absent).
std::string vm_flags_of(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    unsigned long long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      inside = addr >= lo && addr < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

TEST(Storage, LargeHostTensorsLieOnHugePageBoundariesAdvisedAsHugePages) {
  // 40 MiB: at least the 32 MiB from which the CPU allocator takes huge-page blocks (kiln/tensor/huge_pages.h).
  const int64_t n = int64_t{10} << 20;
  Tensor big = arange(n, {.dtype = DType::Int32});
  const void* p = big.data_ptr<void>();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % (uintptr_t{2} << 20), 0u) << "not at a 2 MiB boundary";
  const int32_t* v = big.data_ptr<int32_t>();
  for (int64_t i = 0; i < n; i += 99'991) ASSERT_EQ(v[i], static_cast<int32_t>(i)) << i;
  EXPECT_EQ(big.sum().item<int64_t>(), n * (n - 1) / 2);
  if (!std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled")) {
    GTEST_SKIP() << "this kernel has no transparent huge pages: the advice is refused, the alignment checked above";
  }
  const std::string flags = vm_flags_of(p);
  ASSERT_FALSE(flags.empty()) << "no mapping in /proc/self/smaps holds the tensor's memory";
  EXPECT_NE(flags.find(" hg"), std::string::npos) << "not advised as huge pages (MADV_HUGEPAGE): " << flags;
}

}  // namespace
}  // namespace kiln
