// kiln/data/image_folder.cpp — scanning root/<class>/** as torchvision's make_dataset, and loading samples.
#include "kiln/data/image_folder.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <iostream>
#include <system_error>

#include "kiln/data/gpu_decode/gpu_sample.h"
#include "kiln/data/image.h"
#include "kiln/data/transforms.h"
#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln::data {

namespace fs = std::filesystem;

namespace {

constexpr int kMaxDepth = 64;  // guards against symlink loops (directory links are followed, as os.walk)

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

bool has_extension(const std::string& filename, const std::vector<std::string>& extensions) {
  const std::string name = lower(filename);
  return std::any_of(extensions.begin(), extensions.end(), [&](const std::string& ext) {
    return name.size() >= ext.size() && name.compare(name.size() - ext.size(), ext.size(), ext) == 0;
  });
}

bool is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);  // follows symlinks
}

// Every directory under `dir` (itself included), as os.walk(followlinks=True) visits them.
void walk(const fs::path& dir, int depth, std::vector<std::string>& dirs) {
  KILN_CHECK(depth < kMaxDepth, "ImageFolder: folders nest deeper than ", kMaxDepth, " levels at '", dir.string(),
             "' (a symbolic link loop?)");
  dirs.push_back(dir.string());
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (is_dir(it->path())) walk(it->path(), depth + 1, dirs);
  }
  KILN_CHECK(!ec, "ImageFolder: cannot list '", dir.string(), "': ", ec.message());
}

std::vector<std::string> sorted_files(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!is_dir(it->path())) names.push_back(it->path().filename().string());
  }
  KILN_CHECK(!ec, "ImageFolder: cannot list '", dir, "': ", ec.message());
  std::sort(names.begin(), names.end());
  return names;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

ImageFolder::ImageFolder(std::string root, ImageTransform transform, ImageFolderOptions options)
    : root_(std::move(root)), transform_(std::move(transform)), options_(std::move(options)) {
  KILN_CHECK(!options_.extensions.empty(), "ImageFolder: the list of extensions is empty");
  if (options_.decode == Decode::Gpu) {
    const auto* compose = transform_.target<transforms::Compose>();
    KILN_CHECK(compose != nullptr, "ImageFolder: decoding on the GPU needs a transforms::Compose transform (such as ",
               "transforms::imagenet_train(224)) that it can run on the GPU; decode other transforms on the CPU");
    gpu_ = GpuTransform::from(*compose, options_.gpu);
  }
  for (auto& ext : options_.extensions) ext = lower(ext);
  std::error_code ec;
  KILN_CHECK(fs::exists(root_, ec), "ImageFolder: the root folder '", root_, "' does not exist");
  KILN_CHECK(is_dir(root_), "ImageFolder: the root '", root_, "' is not a folder (expected root/<class>/<images>)");

  // Classes: the sorted names of root's subfolders.
  for (fs::directory_iterator it(root_, ec), end; !ec && it != end; it.increment(ec)) {
    if (is_dir(it->path())) classes_.push_back(it->path().filename().string());
  }
  KILN_CHECK(!ec, "ImageFolder: cannot list '", root_, "': ", ec.message());
  KILN_CHECK(!classes_.empty(), "ImageFolder: found no class folders in '", root_,
             "' (expected root/<class>/<image files>, one folder per class)");
  std::sort(classes_.begin(), classes_.end());

  for (size_t c = 0; c < classes_.size(); ++c) {
    class_to_idx_[classes_[c]] = static_cast<int64_t>(c);
    std::vector<std::string> dirs;
    walk(fs::path(root_) / classes_[c], 0, dirs);
    std::sort(dirs.begin(), dirs.end());  // os.walk's tuples sorted: by directory path
    size_t found = 0, kept = 0;
    for (const auto& dir : dirs) {
      for (const auto& name : sorted_files(dir)) {
        if (!has_extension(name, options_.extensions)) continue;
        ++found;
        std::string path = (fs::path(dir) / name).string();
        if (options_.skip_bad_files) {
          try {
            image_size(path);
          } catch (const std::exception& e) {
            std::cerr << "kiln: ImageFolder skips a bad image: " << e.what() << "\n";
            skipped_.emplace_back(path, e.what());
            continue;
          }
        }
        samples_.push_back({std::move(path), static_cast<int64_t>(c)});
        ++kept;
      }
    }
    KILN_CHECK(found > 0, "ImageFolder: the class folder '", (fs::path(root_) / classes_[c]).string(),
               "' has no image files (extensions: ", joined(options_.extensions), "); remove the folder or add images");
    if (kept == 0) {
      std::cerr << "kiln: ImageFolder: every image of class '" << classes_[c] << "' was bad; the class keeps index "
                << c << " with no samples\n";
    }
  }
}

Example ImageFolder::get(int64_t index, SampleRng& rng) const {
  KILN_CHECK(index >= 0 && index < size(), "ImageFolder.get: index ", index, " out of range for ", describe());
  const Sample& s = samples_[static_cast<size_t>(index)];
  if (gpu_) return gpu_sample(read_file_bytes(s.path), s.path, *gpu_, rng, s.label, index);
  const std::vector<uint8_t> bytes = read_file_bytes(s.path);
  Tensor image;
  if (const auto* compose = transform_.target<transforms::Compose>()) {
    image = compose->load(bytes, s.path, rng);
  } else {
    image = decode_image(bytes, s.path);
    if (transform_) image = transform_(std::move(image), rng);
  }
  return {{"image", std::move(image)}, {"label", internal::scalar_tensor(s.label, {.dtype = DType::Int64})}};
}

CollateFn ImageFolder::collate_fn() const {
  if (!gpu_) return {};
  // The loader that calls it holds this dataset (shared_ptr), so `this` outlives it.
  return gpu_decode_collate(*gpu_, [this](int64_t i) {
    return i >= 0 && i < size() ? samples_[static_cast<size_t>(i)].path : "sample " + std::to_string(i);
  });
}

std::string ImageFolder::describe() const {
  return "ImageFolder(" + root_ + ", " + std::to_string(samples_.size()) + " images, " +
         std::to_string(classes_.size()) + " classes)";
}

std::vector<int64_t> ImageFolder::targets() const {
  std::vector<int64_t> t;
  t.reserve(samples_.size());
  for (const auto& s : samples_) t.push_back(s.label);
  return t;
}

}  // namespace kiln::data
