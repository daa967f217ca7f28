// kiln/data/datasets/cifar.cpp — fixed-size binary records: label byte(s), then a 3 x 32 x 32 image (CHW).
#include "kiln/data/datasets/cifar.h"

#include <fstream>
#include <utility>

#include "kiln/data/datasets/file_bytes.h"
#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln::data {

namespace {

constexpr int64_t kSide = 32, kChannels = 3, kImageBytes = kSide * kSide * kChannels;

const std::vector<std::string> kCifar10Classes = {"airplane", "automobile", "bird",  "cat",  "deer",
                                                  "dog",      "frog",       "horse", "ship", "truck"};

// The folder of `root` or `root/subdir` that holds every one of `names`.
std::filesystem::path find_dir(const std::filesystem::path& root, const std::string& subdir,
                               const std::vector<std::string>& names, const std::string& dataset) {
  const std::vector<std::filesystem::path> dirs = {root, root / subdir};
  std::error_code ec;
  for (const auto& dir : dirs) {
    bool all = true;
    for (const auto& n : names) all = all && std::filesystem::is_regular_file(dir / n, ec);
    if (all) return dir;
  }
  std::string missing;
  for (const auto& n : names) missing += (missing.empty() ? "" : ", ") + n;
  KILN_CHECK(false, dataset, ": cannot find ", missing, " in ", detail::join_paths(dirs),
             "; download and unpack the binary version of the dataset there");
  return {};
}

std::vector<std::string> read_names(const std::filesystem::path& file, size_t expected) {
  std::vector<std::string> names;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) return names;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (!line.empty()) names.push_back(line);
  }
  KILN_CHECK(names.size() == expected, file.string(), " lists ", names.size(), " class names, expected ", expected);
  return names;
}

}  // namespace

CIFARBase::CIFARBase(std::string name, Split split, ImageTransform transform)
    : name_(std::move(name)), split_(split), transform_(std::move(transform)) {}

void CIFARBase::load(const std::vector<std::filesystem::path>& files, const std::vector<int64_t>& label_bounds,
                     int label_byte) {
  const int64_t label_bytes = static_cast<int64_t>(label_bounds.size());
  const int64_t record = label_bytes + kImageBytes;
  std::vector<std::vector<uint8_t>> contents;
  int64_t n = 0;
  for (const auto& file : files) {
    contents.push_back(detail::read_maybe_gzip(file));
    const int64_t bytes = static_cast<int64_t>(contents.back().size());
    KILN_CHECK(bytes > 0, file.string(), " is empty: expected ", name_, " records of ", record,
               " bytes; download it again");
    KILN_CHECK(bytes % record == 0, file.string(), " is not a whole number of ", record, "-byte ", name_, " records (",
               bytes, " bytes = ", bytes / record, " records and ", bytes % record, " bytes more): truncated or not a ",
               name_, " binary file");
    n += bytes / record;
  }
  images_ = internal::empty({n, kSide, kSide, kChannels}, {.dtype = DType::UInt8});
  std::vector<int64_t> labels(n);
  uint8_t* out = images_.data_ptr<uint8_t>();
  int64_t i = 0;
  for (size_t f = 0; f < files.size(); ++f) {
    const std::vector<uint8_t>& in = contents[f];
    const int64_t count = static_cast<int64_t>(in.size()) / record;
    for (int64_t r = 0; r < count; ++r, ++i) {
      const uint8_t* rec = in.data() + r * record;
      for (int64_t b = 0; b < label_bytes; ++b)
        KILN_CHECK(rec[b] < label_bounds[b], files[f].string(), ": record ", r, " has label ", int(rec[b]),
                   ", not below ", label_bounds[b], "; not a ", name_, " binary file, or corrupt");
      labels[i] = rec[label_byte];
      // CHW -> HWC
      const uint8_t* chw = rec + label_bytes;
      uint8_t* hwc = out + i * kImageBytes;
      for (int64_t p = 0; p < kSide * kSide; ++p)
        for (int64_t c = 0; c < kChannels; ++c) hwc[p * kChannels + c] = chw[c * kSide * kSide + p];
    }
  }
  targets_ = internal::from_vector(labels, {n});
}

Example CIFARBase::get(int64_t index, SampleRng& rng) const {
  KILN_CHECK(index >= 0 && index < size(), describe(), ": index ", index, " is out of range [0, ", size(), ")");
  Tensor image =
      internal::from_blob(images_.data_ptr<uint8_t>() + index * kImageBytes, {kSide, kSide, kChannels}, DType::UInt8);
  if (transform_) image = transform_(std::move(image), rng);
  return {{"image", std::move(image)},
          {"label", internal::scalar_tensor(targets_.data_ptr<int64_t>()[index], {.dtype = DType::Int64})}};
}

std::string CIFARBase::describe() const {
  return name_ + "(" + (split_ == Split::Train ? "train" : "test") + ", " + std::to_string(size()) + " images, " +
         dir_.string() + ")";
}

CIFAR10::CIFAR10(const std::filesystem::path& root, CIFAR10Options options)
    : CIFARBase("CIFAR10", options.split, std::move(options.transform)) {
  std::vector<std::string> names;
  if (split_ == Split::Train)
    for (int b = 1; b <= 5; ++b) names.push_back("data_batch_" + std::to_string(b) + ".bin");
  else names.push_back("test_batch.bin");
  dir_ = find_dir(root, "cifar-10-batches-bin", names, name_);
  std::vector<std::filesystem::path> files;
  for (const auto& n : names) files.push_back(dir_ / n);
  load(files, {10}, 0);
  classes_ = kCifar10Classes;
}

CIFAR100::CIFAR100(const std::filesystem::path& root, CIFAR100Options options)
    : CIFARBase("CIFAR100", options.split, std::move(options.transform)) {
  const std::string file = split_ == Split::Train ? "train.bin" : "test.bin";
  dir_ = find_dir(root, "cifar-100-binary", {file}, name_);
  const bool fine = options.label == CIFAR100Label::Fine;
  load({dir_ / file}, {20, 100}, fine ? 1 : 0);
  classes_ = fine ? read_names(dir_ / "fine_label_names.txt", 100) : read_names(dir_ / "coarse_label_names.txt", 20);
}

}  // namespace kiln::data
