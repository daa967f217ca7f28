// tests/io/checkpoint_test_util.h — what the checkpoint tests share: a small model with a buffer of every
// dtype, byte-exact tensor comparison, and reading a file's bytes.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "kiln/autograd/functions.h"
#include "kiln/layers/layers.h"
#include "kiln/layers/module.h"
#include "kiln/tensor/internal_ops.h"
#include "support/test_support.h"  // bytes_of

namespace kiln::testing {

// fc1 (4 -> hidden), fc2 (hidden -> 3), and persistent buffers of every dtype kiln stores, a 0-d one and an
// empty one. Parameters start from the default CPU generator (seed it first).
struct TinyNet : nn::Module {
  explicit TinyNet(int64_t hidden = 8) : Module("TinyNet") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(4, hidden));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(hidden, 3));
    register_buffer("steps", internal::from_vector<int64_t>({int64_t{1} << 40, -3}, {2}));
    register_buffer("mask", internal::cast(internal::from_vector<uint8_t>({1, 0, 1}, {3}), DType::Bool));
    register_buffer(
        "half", internal::cast(internal::from_vector<float>({0.5f, -2.25f, 65504.f, 1e-4f}, {2, 2}), DType::Float16));
    register_buffer("bhalf", internal::cast(internal::from_vector<float>({1.5f, -3e38f, 7.f}, {3}), DType::BFloat16));
    register_buffer("bytes", internal::from_vector<uint8_t>({0, 255, 7}, {3}));
    register_buffer("ints", internal::from_vector<int32_t>({-7, 1 << 30}, {2}));
    register_buffer("wide", internal::from_vector<double>({1.0 / 3.0, -1e300}, {1, 2}));
    register_buffer("scalar", internal::full({}, 2.5, {.dtype = DType::Float32}));
    register_buffer("nothing", internal::zeros({0, 3}));
  }
  Tensor forward(const Tensor& x) override { return (*fc2)(relu((*fc1)(x))); }
  std::shared_ptr<nn::Linear> fc1, fc2;
};

// Same names, dtypes, shapes and bytes.
inline void expect_same_state(const nn::StateDict& a, const nn::StateDict& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(a[i].second.dtype(), b[i].second.dtype()) << a[i].first;
    EXPECT_EQ(a[i].second.shape(), b[i].second.shape()) << a[i].first;
    EXPECT_EQ(bytes_of(a[i].second), bytes_of(b[i].second)) << a[i].first;
  }
}

inline nn::StateDict snapshot(const nn::Module& m) {
  nn::StateDict out;
  for (const auto& [name, t] : m.state_dict()) out.emplace_back(name, t.clone());
  return out;
}

inline std::string read_file_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace kiln::testing
