// float8 tensors in files: HDF5 tensors and checkpoints keep their codes (NaNs and ±0 included) and dtype,
// stored as uint8 with a dtype attribute; safetensors as F8_E4M3 / F8_E5M2.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "io/checkpoint_test_util.h"
#include "kiln/io/checkpoint.h"
#include "kiln/io/hdf5_tensors.h"
#include "kiln/io/safetensors.h"
#include "support/temp_folder.h"
#include "support/test_support.h"

namespace kiln {
namespace {

using testing::bytes_of;
using testing::TempFolder;

// Every code, as a (16, 16) tensor of `dtype`.
Tensor every_code(DType dtype) {
  std::vector<uint8_t> codes(256);
  for (int i = 0; i < 256; ++i) codes[i] = static_cast<uint8_t>(i);
  return internal::from_blob(codes.data(), {16, 16}, dtype);
}

const DType kFloat8Types[] = {DType::Float8_e4m3fn, DType::Float8_e5m2};

TEST(IoFloat8, H5FileKeepsEveryCodeAndTheDtype) {
  TempFolder dir;
  const std::string path = dir.file("f8.h5");
  {
    io::H5File f(path, io::H5File::Mode::Create);
    f.create_group("/t");
    for (DType d : kFloat8Types) {
      f.write_tensor("/t", std::string(dtype_name(d)), every_code(d));
      f.write_tensor("/t", std::string(dtype_name(d)) + "_t", every_code(d).t());  // a transposed view
      f.write_tensor("/t", std::string(dtype_name(d)) + "_0d", every_code(d).select(0, 7).select(0, 15));
    }
    f.close();
  }
  io::H5File g(path, io::H5File::Mode::Read);
  for (DType d : kFloat8Types) {
    SCOPED_TRACE(::testing::Message() << d);
    const std::string name(dtype_name(d));
    const io::TensorInfo info = g.tensor_info("/t", name);
    EXPECT_EQ(info.dtype, d);
    EXPECT_EQ(info.shape, (Shape{16, 16}));
    const Tensor back = g.read_tensor("/t", name);
    EXPECT_EQ(back.dtype(), d);
    EXPECT_EQ(back.shape(), (Shape{16, 16}));
    EXPECT_EQ(bytes_of(back), bytes_of(every_code(d)));
    const Tensor back_t = g.read_tensor("/t", name + "_t");
    EXPECT_EQ(back_t.dtype(), d);
    EXPECT_EQ(bytes_of(back_t), bytes_of(every_code(d).t()));
    const Tensor back_0d = g.read_tensor("/t", name + "_0d");
    EXPECT_EQ(back_0d.dim(), 0);
    EXPECT_EQ(bytes_of(back_0d), std::vector<uint8_t>{7 * 16 + 15});
    // What h5py sees: uint8 data and the dtype's name in an attribute.
    EXPECT_EQ(g.attr_string("/t/" + name, "dtype"), name);
  }
}

TEST(IoFloat8, ADtypeAttributeThatDoesNotFitTheDataIsRefused) {
  TempFolder dir;
  const std::string path = dir.file("bad.h5");
  {
    io::H5File f(path, io::H5File::Mode::Create);
    f.create_group("/t");
    f.write_tensor("/t", "x", internal::zeros({4}, {.dtype = DType::Int32}));
    f.set_attr("/t/x", "dtype", std::string("float8_e4m3fn"));  // 4-byte signed data called float8
    f.close();
  }
  io::H5File g(path, io::H5File::Mode::Read);
  testing::expect_error([&] { (void)g.read_tensor("/t", "x"); }, {path, "/t/x", "float8_e4m3fn", "4-byte"});
}

// A module with float8 buffers (as an FP8 recipe's scaled weights would be) saved in a checkpoint and loaded back.
struct Float8Holder : nn::Module {
  Float8Holder() : Module("Float8Holder") {
    register_buffer("e4m3", every_code(DType::Float8_e4m3fn));
    register_buffer("e5m2", internal::zeros({16, 16}, {.dtype = DType::Float8_e5m2}));
  }
  Tensor forward(const Tensor& x) override { return x; }
};

Tensor buffer(const nn::Module& m, const std::string& name) {
  for (const auto& [n, t] : m.named_buffers())
    if (n == name) return t;
  ADD_FAILURE() << "no buffer " << name;
  return {};
}

TEST(IoFloat8, CheckpointRoundTripIsBitExact) {
  TempFolder dir;
  Float8Holder a;
  buffer(a, "e5m2").copy_(every_code(DType::Float8_e5m2));
  io::save_checkpoint(dir.file("c.h5"), {.model = &a});
  Float8Holder b;  // e4m3 starts equal to a's, e5m2 all zeros: overwrite both with junk first
  buffer(b, "e4m3").fill_(1);
  io::load_checkpoint(dir.file("c.h5"), {.model = &b});
  for (const char* name : {"e4m3", "e5m2"}) {
    const Tensor ta = buffer(a, name), tb = buffer(b, name);
    EXPECT_EQ(tb.dtype(), ta.dtype()) << name;
    EXPECT_EQ(bytes_of(tb), bytes_of(ta)) << name;
  }
  EXPECT_EQ(bytes_of(buffer(b, "e5m2")), bytes_of(every_code(DType::Float8_e5m2)));
}

TEST(IoFloat8, SafetensorsRoundTrip) {
  TempFolder dir;
  io::NamedTensors tensors = {{"a", every_code(DType::Float8_e4m3fn)}, {"b", every_code(DType::Float8_e5m2)}};
  io::save_safetensors(dir.file("w.safetensors"), tensors);
  const io::NamedTensors back = io::load_safetensors(dir.file("w.safetensors"));
  ASSERT_EQ(back.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(back[i].first, tensors[i].first);
    EXPECT_EQ(back[i].second.dtype(), tensors[i].second.dtype());
    EXPECT_EQ(bytes_of(back[i].second), bytes_of(tensors[i].second));
  }
}

}  // namespace
}  // namespace kiln
