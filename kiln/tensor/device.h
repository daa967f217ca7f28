// kiln/tensor/device.h — where a tensor's memory lives.
//
//   Device d = Device::cuda(1);        // or Device("cuda:1"), Device::cpu(), Device("cpu")
//   if (d.is_cuda()) ...;  std::cout << d;   // "cuda:1"
#pragma once

#include <cstdint>
#include <functional>  // std::hash
#include <ostream>
#include <string>
#include <string_view>

namespace kiln {

enum class DeviceType : uint8_t { CPU, CUDA };
inline constexpr int kNumDeviceTypes = 2;

// Where a tensor lives: the CPU, or one CUDA GPU by index (Device::cpu(), Device::cuda(0)).
class Device {
 public:
  constexpr Device() = default;  // cpu
  constexpr Device(DeviceType type, int index) : type_(type), index_(type == DeviceType::CPU ? 0 : index) {}
  // Parses "cpu", "cuda" (device 0) or "cuda:N"; throws kiln::Error on anything else.
  explicit Device(std::string_view spec);

  static constexpr Device cpu() { return Device(DeviceType::CPU, 0); }
  static constexpr Device cuda(int index = 0) { return Device(DeviceType::CUDA, index); }

  constexpr DeviceType type() const { return type_; }
  constexpr int index() const { return index_; }
  constexpr bool is_cpu() const { return type_ == DeviceType::CPU; }
  constexpr bool is_cuda() const { return type_ == DeviceType::CUDA; }
  std::string str() const;

  friend constexpr bool operator==(Device a, Device b) { return a.type_ == b.type_ && a.index_ == b.index_; }
  friend constexpr bool operator!=(Device a, Device b) { return !(a == b); }

 private:
  DeviceType type_ = DeviceType::CPU;
  int index_ = 0;
};

std::ostream& operator<<(std::ostream& os, Device d);

}  // namespace kiln

template <>
struct std::hash<kiln::Device> {
  size_t operator()(kiln::Device d) const noexcept {
    return std::hash<int>()(static_cast<int>(d.type()) * 1024 + d.index());
  }
};
