// kiln/data/image.cpp — reading image files and dispatching on the magic number (decoders: image_jpeg.cpp,
// image_png.cpp).
#include "kiln/data/image.h"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "kiln/tensor/error.h"
#include "kiln/tensor/internal_ops.h"

namespace kiln::data {

namespace {

std::atomic<int64_t> g_max_image_pixels{kDefaultMaxImagePixels};  // -1: no limit

constexpr uint8_t kPngMagic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
constexpr size_t kHeaderPrefix = 64 * 1024;  // enough for the JPEG SOF marker behind most EXIF blocks

std::vector<uint8_t> read_bytes(const std::string& path, size_t limit) {
  std::ifstream f(path, std::ios::binary);
  KILN_CHECK(f.good(), "image: cannot open '", path, "': ", std::strerror(errno));
  f.seekg(0, std::ios::end);
  const auto size = static_cast<size_t>(f.tellg());
  f.seekg(0);
  std::vector<uint8_t> bytes(std::min(size, limit));
  f.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  KILN_CHECK(f.good() || bytes.empty(), "image: cannot read '", path, "' (", size, " bytes)");
  return bytes;
}

void check_known(std::span<const uint8_t> bytes, const std::string& name) {
  KILN_CHECK(!bytes.empty(), "image: '", name, "' is empty (0 bytes); expected a JPEG or PNG file");
  KILN_CHECK(image_format(bytes) != ImageFormat::Unknown, "image: '", name,
             "' is neither JPEG nor PNG (its first bytes are not a JPEG or PNG signature); kiln decodes .jpg, "
             ".jpeg and .png files");
}

}  // namespace

std::optional<int64_t> max_image_pixels() {
  const int64_t v = g_max_image_pixels.load(std::memory_order_relaxed);
  return v < 0 ? std::nullopt : std::optional<int64_t>(v);
}

void set_max_image_pixels(std::optional<int64_t> limit) {
  KILN_CHECK(!limit || *limit > 0, "set_max_image_pixels: the limit must be positive (or std::nullopt for none), got ",
             limit.value_or(0));
  g_max_image_pixels.store(limit ? *limit : -1, std::memory_order_relaxed);
}

void detail::check_image_pixels(int64_t height, int64_t width, const std::string& name, std::string_view op) {
  const std::optional<int64_t> limit = max_image_pixels();
  if (!limit) return;
  int64_t pixels = 0;
  const bool overflow = __builtin_mul_overflow(height, width, &pixels);
  KILN_CHECK(!overflow && pixels <= *limit, op, ": '", name, "' claims ", height, " x ", width, " = ",
             overflow ? std::string("more than 2^63-1") : std::to_string(pixels), " pixels, more than the limit of ",
             *limit, " (a decompression bomb, or a damaged header?); if the image is genuine, raise the limit with ",
             "kiln::data::set_max_image_pixels(n) (std::nullopt removes it), as PIL's Image.MAX_IMAGE_PIXELS");
}

Tensor detail::empty_image(int64_t height, int64_t width, const std::string& name, std::string_view op) {
  try {
    return internal::empty({height, width, 3}, {.dtype = DType::UInt8});
  } catch (const OutOfMemoryError& e) {
    throw OutOfMemoryError(kiln::detail::str_cat(op, ": '", name, "' (", height, " x ", width, " pixels): ", e.what()));
  } catch (const std::bad_alloc&) {
    throw OutOfMemoryError(kiln::detail::str_cat(op, ": '", name, "' (", height, " x ", width,
                                                 " pixels): out of host memory for its pixels"));
  }
}

ImageFormat image_format(std::span<const uint8_t> bytes) {
  if (bytes.size() >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF) return ImageFormat::Jpeg;
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), kPngMagic, 8) == 0) return ImageFormat::Png;
  return ImageFormat::Unknown;
}

std::vector<uint8_t> read_file_bytes(const std::string& path) { return read_bytes(path, SIZE_MAX); }

Tensor read_image(const std::string& path) { return decode_image(read_file_bytes(path), path); }

Tensor decode_image(std::span<const uint8_t> bytes, const std::string& name) {
  check_known(bytes, name);
  if (image_format(bytes) == ImageFormat::Png) return detail::decode_png(bytes, name);
  return detail::decode_jpeg(bytes, name, nullptr).image;
}

DecodedRegion decode_image_region(std::span<const uint8_t> bytes, const std::string& name, const DecodePlan& plan) {
  check_known(bytes, name);
  KILN_CHECK(plan.box.height > 0 && plan.box.width > 0 && plan.out_height > 0 && plan.out_width > 0,
             "decode_image_region: '", name, "': the plan's box (", plan.box.height, " x ", plan.box.width,
             ") and output size (", plan.out_height, " x ", plan.out_width, ") must be positive");
  if (image_format(bytes) == ImageFormat::Jpeg) return detail::decode_jpeg(bytes, name, &plan);
  return {detail::decode_png(bytes, name), plan.box, 1.0};  // PNG has no partial decoding: the whole image
}

ImageSize image_size(std::span<const uint8_t> bytes, const std::string& name) {
  check_known(bytes, name);
  if (image_format(bytes) == ImageFormat::Png) return detail::png_size(bytes, name);
  return detail::jpeg_size(bytes, name);
}

ImageSize image_size(const std::string& path) {
  std::vector<uint8_t> head = read_bytes(path, kHeaderPrefix);
  if (head.size() < kHeaderPrefix || image_format(head) != ImageFormat::Jpeg) return image_size(head, path);
  try {
    return image_size(head, path);
  } catch (const Error&) {
    return image_size(read_file_bytes(path), path);  // the header lies further in: read it all
  }
}

}  // namespace kiln::data
