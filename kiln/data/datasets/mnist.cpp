// kiln/data/datasets/mnist.cpp — IDX files: a big-endian header (magic, counts, dims), then the bytes.
#include "kiln/data/datasets/mnist.h"

#include <cstring>
#include <utility>
#include <vector>

#include "kiln/data/datasets/file_bytes.h"
#include "kiln/tensor/checked_size.h"  // mul_overflows: the header's dims multiply without wrapping
#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln::data {

namespace {

constexpr uint32_t kImagesMagic = 2051;  // 0x00000803: unsigned bytes, 3 dims
constexpr uint32_t kLabelsMagic = 2049;  // 0x00000801: unsigned bytes, 1 dim
constexpr int64_t kNumClasses = 10;

uint32_t big_endian_u32(const uint8_t* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]);
}

// Checks an IDX file's header and length; returns its dims (count first).
std::vector<int64_t> idx_dims(const std::vector<uint8_t>& bytes, const std::filesystem::path& file, uint32_t magic,
                              int ndim) {
  const std::string what = magic == kImagesMagic ? "an IDX image file" : "an IDX label file";
  const size_t header = 4 * (1 + static_cast<size_t>(ndim));
  KILN_CHECK(!bytes.empty(), file.string(), " is empty: expected ", what, "; download it again");
  KILN_CHECK(bytes.size() >= header, file.string(), " is truncated: ", bytes.size(), " bytes, shorter than the ",
             header, "-byte header of ", what);
  const uint32_t got = big_endian_u32(bytes.data());
  KILN_CHECK(got == magic, file.string(), " is not ", what, ": magic number ", got, ", expected ", magic,
             " (big-endian); is it the right file, or an unpacked archive of another kind?");
  std::vector<int64_t> dims(ndim);
  int64_t expected = static_cast<int64_t>(header), elements = 1;
  for (int d = 0; d < ndim; ++d) {
    dims[d] = big_endian_u32(bytes.data() + 4 * (1 + d));
    KILN_CHECK(d == 0 || dims[d] > 0, file.string(), ": dim ", d, " of the header is 0");
  }
  // The header's dims come from the file: their product is checked, never wrapped (a wrapped 0 would accept a
  // tiny file whose header claims a huge array).
  bool overflow = false;
  for (int d = 0; d < ndim; ++d) overflow |= mul_overflows(elements, dims[d], &elements);
  KILN_CHECK(!overflow && !add_overflows(expected, elements, &expected), file.string(),
             " is not a valid IDX file: its header claims dims ", dims, ", more than 2^63-1 bytes, but the file has ",
             bytes.size(), " bytes; download it again");
  KILN_CHECK(static_cast<int64_t>(bytes.size()) >= expected, file.string(), " is truncated: expected ", expected,
             " bytes for the ", dims[0], " items its header announces, got ", bytes.size(),
             " bytes; download it again");
  KILN_CHECK(static_cast<int64_t>(bytes.size()) == expected, file.string(), " has ",
             static_cast<int64_t>(bytes.size()) - expected, " bytes after the ", expected,
             " its header announces: not a valid IDX file");
  return dims;
}

std::filesystem::path locate(const std::vector<std::filesystem::path>& dirs, const std::string& base,
                             const std::string& name) {
  auto found = detail::find_file(dirs, {base, base + ".gz"});
  KILN_CHECK(found.has_value(), name, ": cannot find ", base, " or ", base, ".gz in ", detail::join_paths(dirs),
             "; download the dataset there (e.g. with torchvision's ", name, "(root, download=True))");
  return *found;
}

}  // namespace

MNIST::MNIST(const std::filesystem::path& root, MNISTOptions options)
    : MNIST(root, std::move(options), "MNIST", "MNIST") {}

FashionMNIST::FashionMNIST(const std::filesystem::path& root, MNISTOptions options)
    : MNIST(root, std::move(options), "FashionMNIST", "FashionMNIST") {}

MNIST::MNIST(const std::filesystem::path& root, MNISTOptions options, std::string name, const std::string& subdir)
    : name_(std::move(name)), options_(std::move(options)) {
  const std::string prefix = options_.split == Split::Train ? "train" : "t10k";
  const std::vector<std::filesystem::path> dirs = {root, root / subdir / "raw"};
  images_file_ = locate(dirs, prefix + "-images-idx3-ubyte", name_);
  labels_file_ = locate(dirs, prefix + "-labels-idx1-ubyte", name_);

  const std::vector<uint8_t> image_bytes = detail::read_maybe_gzip(images_file_);
  const std::vector<int64_t> idims = idx_dims(image_bytes, images_file_, kImagesMagic, 3);
  const std::vector<uint8_t> label_bytes = detail::read_maybe_gzip(labels_file_);
  const std::vector<int64_t> ldims = idx_dims(label_bytes, labels_file_, kLabelsMagic, 1);
  KILN_CHECK(idims[0] == ldims[0], name_, ": ", images_file_.string(), " holds ", idims[0], " images but ",
             labels_file_.string(), " holds ", ldims[0], " labels; the files do not belong together");

  const int64_t n = idims[0];
  images_ = internal::from_blob(image_bytes.data() + 16, {n, idims[1], idims[2]}, DType::UInt8);
  std::vector<int64_t> labels(n);
  for (int64_t i = 0; i < n; ++i) {
    labels[i] = label_bytes[8 + i];
    KILN_CHECK(labels[i] < kNumClasses, labels_file_.string(), ": label ", i, " is ", labels[i], ", not below ",
               kNumClasses, "; the file is corrupt");
  }
  targets_ = internal::from_vector(labels, {n});
}

Example MNIST::get(int64_t index, SampleRng& rng) const {
  KILN_CHECK(index >= 0 && index < size(), describe(), ": index ", index, " is out of range [0, ", size(), ")");
  const int64_t h = images_.shape()[1], w = images_.shape()[2];
  Tensor image = internal::from_blob(images_.data_ptr<uint8_t>() + index * h * w, {h, w, 1}, DType::UInt8);
  if (options_.transform) image = options_.transform(std::move(image), rng);
  return {{"image", std::move(image)},
          {"label", internal::scalar_tensor(targets_.data_ptr<int64_t>()[index], {.dtype = DType::Int64})}};
}

std::string MNIST::describe() const {
  return name_ + "(" + (options_.split == Split::Train ? "train" : "test") + ", " + std::to_string(size()) +
         " images, " + images_file_.parent_path().string() + ")";
}

}  // namespace kiln::data
