// kiln/data/image.cpp — reading image files and dispatching on the magic number (decoders: image_jpeg.cpp,
// image_png.cpp).
#include "kiln/data/image.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "kiln/tensor/error.h"

namespace kiln::data {

namespace {

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
