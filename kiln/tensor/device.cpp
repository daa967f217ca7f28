#include "kiln/tensor/device.h"

#include <charconv>

#include "kiln/tensor/error.h"

namespace kiln {

Device::Device(std::string_view spec) {
  auto bad = [&] {
    return Error(detail::str_cat("Device: cannot parse \"", spec, "\"; expected \"cpu\", \"cuda\" or \"cuda:N\""));
  };
  if (spec == "cpu") return;
  if (spec.substr(0, 4) != "cuda") throw bad();
  type_ = DeviceType::CUDA;
  index_ = 0;
  if (spec.size() == 4) return;
  if (spec[4] != ':' || spec.size() == 5) throw bad();
  auto rest = spec.substr(5);
  auto [ptr, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), index_);
  if (ec != std::errc() || ptr != rest.data() + rest.size() || index_ < 0) throw bad();
}

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index_); }

std::ostream& operator<<(std::ostream& os, Device d) { return os << d.str(); }

}  // namespace kiln
