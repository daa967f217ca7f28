// HDF5Dataset: files written by write_hdf5_arrays and by the HDF5 C API directly (chunked, compressed,
// big-endian, nested groups, 16-bit floats as h5py stores them), read back exactly; bad files; 8 threads.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "data/format_files.h"
#include "kiln/data/datasets/hdf5_dataset.h"
#include "kiln/tensor/internal_ops.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

// Sample i of the writer tests: images (i, y, x, c) = (i * 11 + y * 5 + x * 3 + c) % 256.
Tensor make_images(int64_t n) {
  std::vector<uint8_t> v;
  for (int64_t i = 0; i < n; ++i)
    for (int y = 0; y < 4; ++y)
      for (int x = 0; x < 5; ++x)
        for (int c = 0; c < 3; ++c) v.push_back(static_cast<uint8_t>((i * 11 + y * 5 + x * 3 + c) % 256));
  return internal::from_vector(v, {n, 4, 5, 3});
}

void expect_image_row(const Tensor& t, int64_t i) {
  ASSERT_EQ(t.dtype(), DType::UInt8);
  ASSERT_EQ(t.shape(), (Shape{4, 5, 3}));
  const uint8_t* p = t.data_ptr<uint8_t>();
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 5; ++x)
      for (int c = 0; c < 3; ++c)
        ASSERT_EQ(p[(y * 5 + x) * 3 + c], static_cast<uint8_t>((i * 11 + y * 5 + x * 3 + c) % 256)) << "row " << i;
}

TEST(DataHDF5, WriterRoundTripEveryDType) {
  TempFolder dir;
  const int64_t n = 10;
  std::vector<float> f32;
  std::vector<double> f64;
  std::vector<int32_t> i32;
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < n; ++i) {
    for (int k = 0; k < 7; ++k) f32.push_back(static_cast<float>(i) + 0.125f * k);
    f64.push_back(1e-3 * static_cast<double>(i) - 0.5);
    i32.push_back(static_cast<int32_t>(-1000 * i));
    i32.push_back(static_cast<int32_t>(i * i));
    labels.push_back(i * 1000000007LL);
  }
  const auto path = dir / "arrays.h5";
  data::write_hdf5_arrays(path, {{"images", make_images(n)},
                                 {"labels", internal::from_vector(labels, {n})},
                                 {"features/f32", internal::from_vector(f32, {n, 7})},
                                 {"features/f64", internal::from_vector(f64, {n})},
                                 {"pairs", internal::from_vector(i32, {n, 2})},
                                 {"half", internal::from_vector(f32, {n, 7}).to(DType::Float16)},
                                 {"brain", internal::from_vector(f32, {n, 7}).to(DType::BFloat16)}});
  data::HDF5Dataset ds(path, {"images", "labels", "features/f32", "features/f64", "pairs", "half", "brain"},
                       {.chunk_rows = 4});
  ASSERT_EQ(ds.size(), n);
  EXPECT_EQ(ds.chunk_rows(), 4);
  for (int64_t i = 0; i < n; ++i) {
    data::Example ex = ds.sample(i);
    ASSERT_EQ(ex.names(),
              (std::vector<std::string>{"images", "labels", "features/f32", "features/f64", "pairs", "half", "brain"}));
    expect_image_row(ex["images"], i);
    EXPECT_EQ(ex["labels"].dtype(), DType::Int64);
    EXPECT_EQ(ex["labels"].dim(), 0);
    EXPECT_EQ(ex["labels"].item<int64_t>(), i * 1000000007LL);
    EXPECT_EQ(ex["features/f32"].dtype(), DType::Float32);
    EXPECT_EQ(ex["features/f32"].to_vector<float>(), std::vector<float>(f32.begin() + 7 * i, f32.begin() + 7 * i + 7));
    EXPECT_EQ(ex["features/f64"].dtype(), DType::Float64);
    EXPECT_EQ(ex["features/f64"].item<double>(), f64[i]);
    EXPECT_EQ(ex["pairs"].dtype(), DType::Int32);
    EXPECT_EQ(ex["pairs"].to_vector<int32_t>(), (std::vector<int32_t>{i32[2 * i], i32[2 * i + 1]}));
    // i + k / 8 with i < 10 is exact in float16 and bfloat16 alike.
    EXPECT_EQ(ex["half"].dtype(), DType::Float16);
    EXPECT_EQ(ex["brain"].dtype(), DType::BFloat16);
    for (int k = 0; k < 7; ++k) {
      EXPECT_EQ(ex["half"][k].item<float>(), f32[7 * i + k]);
      EXPECT_EQ(ex["brain"][k].item<float>(), f32[7 * i + k]);
    }
  }
  EXPECT_EQ(ds.reads(), 3);  // rows [0, 4), [4, 8), [8, 10): one read each
  (void)ds.sample(9);
  (void)ds.sample(0);
  EXPECT_EQ(ds.reads(), 3);  // still cached
  expect_error([&] { ds.sample(10); }, {"arrays.h5", "out of range"});
}

TEST(DataHDF5, NoNamesTakesEveryTopLevelDataset) {
  TempFolder dir;
  const auto path = dir / "top.h5";
  data::write_hdf5_arrays(path, {{"x", make_images(6)},
                                 {"y", internal::arange(6)},
                                 {"meta/vocab", internal::arange(3)}});  // in a group: not taken
  data::HDF5Dataset ds(path);
  EXPECT_EQ(ds.names(), (std::vector<std::string>{"x", "y"}));
  ASSERT_EQ(ds.size(), 6);
  expect_image_row(ds.sample(5)["x"], 5);
  EXPECT_EQ(ds.sample(5)["y"].item<int64_t>(), 5);
}

TEST(DataHDF5, LargeRowsShrinkTheChunk) {
  TempFolder dir;
  const auto path = dir / "big.h5";
  data::write_hdf5_arrays(path, {{"x", internal::zeros({8, 1000})}});  // 4000 bytes a row
  data::HDF5Dataset ds(path, {"x"}, {.chunk_rows = 1024, .max_chunk_bytes = 10000});
  EXPECT_EQ(ds.chunk_rows(), 2);
  data::HDF5Dataset one(path, {"x"}, {.chunk_rows = 1024, .max_chunk_bytes = 10});
  EXPECT_EQ(one.chunk_rows(), 1);
}

// Handles of the raw C API, closed at the end of the test.
struct H5 {
  hid_t id;
  herr_t (*close)(hid_t);
  ~H5() {
    if (id >= 0) close(id);
  }
};

hid_t half_type() {  // IEEE half as h5py defines it
  hid_t t = H5Tcopy(H5T_IEEE_F32LE);
  H5Tset_fields(t, 15, 10, 5, 0, 10);
  H5Tset_size(t, 2);
  H5Tset_ebias(t, 15);
  return t;
}

uint16_t half_bits(float f) { return Half(f).bits; }

TEST(DataHDF5, ReadsChunkedCompressedBigEndianArraysInGroupsWrittenByTheCApi) {
  TempFolder dir;
  const std::string path = (dir / "raw.h5").string();
  const hsize_t n = 13;
  std::vector<int16_t> images(n * 3 * 4);
  for (size_t k = 0; k < images.size(); ++k) images[k] = static_cast<int16_t>(static_cast<int>(k) * 97 - 2000);
  std::vector<uint8_t> labels(n);
  for (hsize_t i = 0; i < n; ++i) labels[i] = static_cast<uint8_t>(250 - i);
  std::vector<uint16_t> halves(n * 2);
  for (size_t k = 0; k < halves.size(); ++k) halves[k] = half_bits(0.25f * static_cast<float>(k) - 3.0f);
  {
    H5 file{H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose};
    ASSERT_GE(file.id, 0);
    H5 train{H5Gcreate2(file.id, "train", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose};
    H5 inner{H5Gcreate2(train.id, "inner", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose};
    // train/images: int16 big-endian, (13, 3, 4), chunks of (5, 3, 4), deflate-compressed.
    const hsize_t idims[3] = {n, 3, 4}, ichunk[3] = {5, 3, 4};
    H5 ispace{H5Screate_simple(3, idims, nullptr), H5Sclose};
    H5 iprops{H5Pcreate(H5P_DATASET_CREATE), H5Pclose};
    H5Pset_chunk(iprops.id, 3, ichunk);
    if (H5Zfilter_avail(H5Z_FILTER_DEFLATE) > 0) H5Pset_deflate(iprops.id, 6);
    H5 iset{H5Dcreate2(train.id, "images", H5T_STD_I16BE, ispace.id, H5P_DEFAULT, iprops.id, H5P_DEFAULT), H5Dclose};
    ASSERT_GE(H5Dwrite(iset.id, H5T_NATIVE_INT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, images.data()), 0);
    // train/inner/labels: uint8 (13), chunks of 4.
    const hsize_t ldims[1] = {n}, lchunk[1] = {4};
    H5 lspace{H5Screate_simple(1, ldims, nullptr), H5Sclose};
    H5 lprops{H5Pcreate(H5P_DATASET_CREATE), H5Pclose};
    H5Pset_chunk(lprops.id, 1, lchunk);
    H5 lset{H5Dcreate2(inner.id, "labels", H5T_STD_U8LE, lspace.id, H5P_DEFAULT, lprops.id, H5P_DEFAULT), H5Dclose};
    ASSERT_GE(H5Dwrite(lset.id, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels.data()), 0);
    // half: IEEE 16-bit floats (13, 2), contiguous, at the top level.
    const hsize_t hdims[2] = {n, 2};
    H5 hspace{H5Screate_simple(2, hdims, nullptr), H5Sclose};
    H5 htype{half_type(), H5Tclose};
    H5 hset{H5Dcreate2(file.id, "half", htype.id, hspace.id, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose};
    ASSERT_GE(H5Dwrite(hset.id, htype.id, H5S_ALL, H5S_ALL, H5P_DEFAULT, halves.data()), 0);
  }
  data::HDF5Dataset ds(path, {"train/images", "train/inner/labels", "half"}, {.chunk_rows = 3, .cache_chunks = 2});
  ASSERT_EQ(ds.size(), static_cast<int64_t>(n));
  for (int64_t i : {0, 1, 2, 3, 7, 12, 4, 11}) {
    data::Example ex = ds.sample(i);
    EXPECT_EQ(ex["train/images"].dtype(), DType::Int32);  // int16 is widened
    EXPECT_EQ(ex["train/images"].shape(), (Shape{3, 4}));
    std::vector<int32_t> want(images.begin() + 12 * i, images.begin() + 12 * i + 12);
    EXPECT_EQ(ex["train/images"].to_vector<int32_t>(), want) << "row " << i;
    EXPECT_EQ(ex["train/inner/labels"].dtype(), DType::UInt8);
    EXPECT_EQ(ex["train/inner/labels"].item<uint8_t>(), 250 - i);
    EXPECT_EQ(ex["half"].dtype(), DType::Float16);
    EXPECT_EQ(ex["half"][1].item<float>(), 0.25f * static_cast<float>(2 * i + 1) - 3.0f);
  }
  data::HDF5Dataset as_float(path, {"half"}, {.float16_as_float32 = true});
  EXPECT_EQ(as_float.sample(12)["half"].dtype(), DType::Float32);
  EXPECT_EQ(as_float.sample(12)["half"].to_vector<float>(), (std::vector<float>{3.0f, 3.25f}));
  // Without names: the top level holds one dataset ("half"); the group is skipped.
  EXPECT_EQ(data::HDF5Dataset(path).names(), std::vector<std::string>{"half"});
}

TEST(DataHDF5, BadFilesNameTheFileAndTheProblem) {
  TempFolder dir;
  expect_error([&] { data::HDF5Dataset ds(dir / "absent.h5"); }, {"absent.h5", "no such file"});
  write_bytes(dir / "text.h5", {'n', 'o', 't', ' ', 'h', 'd', 'f', '5', '\n'});
  expect_error([&] { data::HDF5Dataset ds(dir / "text.h5"); }, {"text.h5", "not an HDF5 file"});
  write_bytes(dir / "empty.h5", {});
  expect_error([&] { data::HDF5Dataset ds(dir / "empty.h5"); }, {"empty.h5", "not an HDF5 file"});

  const auto path = dir / "ok.h5";
  data::write_hdf5_arrays(
      path,
      {{"images", internal::zeros({10, 3})}, {"labels", internal::arange(9)}, {"train/x", internal::zeros({10})}});
  expect_error(
      [&] {
        data::HDF5Dataset ds(path, {"images", "targets"});
      },
      {"ok.h5", "no dataset 'targets'", "images, labels, train/x"});
  expect_error([&] { data::HDF5Dataset ds(path, {"test/x"}); }, {"ok.h5", "no dataset 'test/x'"});
  expect_error([&] { data::HDF5Dataset ds(path, {"train"}); }, {"ok.h5", "'train'", "not a dataset"});
  expect_error(
      [&] {
        data::HDF5Dataset ds(path, {"images", "labels"});
      },
      {"ok.h5", "different first dims", "images (10, 3)", "labels (9)"});
  expect_error([&] { data::HDF5Dataset ds(path); }, {"ok.h5", "different first dims"});
  expect_error([&] { data::HDF5Dataset ds(path, {"images"}, {.chunk_rows = 0}); }, {"ok.h5", "chunk_rows"});

  // A truncated HDF5 file: the signature is there, the rest is not.
  std::vector<uint8_t> bytes = read_bytes(path);
  bytes.resize(600);
  write_bytes(dir / "cut.h5", bytes);
  expect_error([&] { data::HDF5Dataset ds(dir / "cut.h5", {"images"}); }, {"cut.h5"});

  // Strings, compound records and scalars are not arrays of numbers.
  const std::string odd = (dir / "odd.h5").string();
  {
    H5 file{H5Fcreate(odd.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose};
    const hsize_t dims[1] = {4};
    H5 space{H5Screate_simple(1, dims, nullptr), H5Sclose};
    H5 str{H5Tcopy(H5T_C_S1), H5Tclose};
    H5Tset_size(str.id, 8);
    H5 s{H5Dcreate2(file.id, "names", str.id, space.id, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose};
    H5 compound{H5Tcreate(H5T_COMPOUND, 8), H5Tclose};
    H5Tinsert(compound.id, "a", 0, H5T_NATIVE_INT32);
    H5Tinsert(compound.id, "b", 4, H5T_NATIVE_FLOAT);
    H5 c{H5Dcreate2(file.id, "records", compound.id, space.id, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose};
    H5 scalar_space{H5Screate(H5S_SCALAR), H5Sclose};
    H5 sc{H5Dcreate2(file.id, "count", H5T_NATIVE_INT32, scalar_space.id, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
          H5Dclose};
    ASSERT_GE(s.id, 0);
    ASSERT_GE(c.id, 0);
    ASSERT_GE(sc.id, 0);
  }
  expect_error([&] { data::HDF5Dataset ds(odd, {"names"}); }, {"odd.h5", "'names'", "unsupported type (string"});
  expect_error([&] { data::HDF5Dataset ds(odd, {"records"}); }, {"odd.h5", "'records'", "unsupported type (compound"});
  expect_error([&] { data::HDF5Dataset ds(odd, {"count"}); }, {"odd.h5", "'count'", "scalar"});
}

TEST(DataHDF5, RowWhoseByteCountOverflowsIsRefused) {
  // A header can claim any dims: (2, 2^31, 2^31) int64 rows are 2^65 bytes each, which wrapped to 0 before.
  // The dataset is chunked and never written, so the file stays small.
  TempFolder dir;
  const std::string path = (dir / "huge_rows.h5").string();
  {
    H5 file{H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose};
    const hsize_t dims[3] = {2, hsize_t{1} << 31, hsize_t{1} << 31}, chunk[3] = {1, 1024, 1024};
    H5 space{H5Screate_simple(3, dims, nullptr), H5Sclose};
    H5 props{H5Pcreate(H5P_DATASET_CREATE), H5Pclose};
    H5Pset_chunk(props.id, 3, chunk);
    H5 set{H5Dcreate2(file.id, "x", H5T_STD_I64LE, space.id, H5P_DEFAULT, props.id, H5P_DEFAULT), H5Dclose};
    ASSERT_GE(set.id, 0);
  }
  EXPECT_LT(std::filesystem::file_size(path), 1u << 20);
  expect_error([&] { data::HDF5Dataset ds(path, {"x"}); },
               {"huge_rows.h5", "'x'", "one row", "[2147483648, 2147483648]", "2^63-1"});
}

TEST(DataHDF5, EightThreadsReadRandomRowsConcurrently) {
  TempFolder dir;
  const auto path = dir / "shared.h5";
  const int64_t n = 1000;
  std::vector<float> x(n * 6);
  for (size_t k = 0; k < x.size(); ++k) x[k] = static_cast<float>(k);
  data::write_hdf5_arrays(path, {{"x", internal::from_vector(x, {n, 6})}, {"i", internal::arange(n)}});
  data::HDF5Dataset ds(path, {}, {.chunk_rows = 16, .cache_chunks = 3});
  std::vector<std::thread> threads;
  std::vector<int> failures(8, 0), errors(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 gen(t);
      std::uniform_int_distribution<int64_t> pick(0, n - 1);
      for (int k = 0; k < 1500; ++k) {
        // Half the time a run of consecutive rows (the cache's case), else a random row.
        const int64_t i = (k % 2) ? pick(gen) : (t * 97 + k) % n;
        try {
          data::Example ex = ds.sample(i);
          const float* p = ex["x"].data_ptr<float>();
          bool ok = ex["i"].item<int64_t>() == i;
          for (int j = 0; j < 6; ++j) ok = ok && p[j] == static_cast<float>(i * 6 + j);
          failures[t] += !ok;
        } catch (const std::exception&) {
          ++errors[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 8; ++t) {
    EXPECT_EQ(failures[t], 0) << "thread " << t;
    EXPECT_EQ(errors[t], 0) << "thread " << t;
  }
  EXPECT_GE(ds.reads(), n / 16);  // every chunk was read at least once
}

}  // namespace
}  // namespace kiln::testing
