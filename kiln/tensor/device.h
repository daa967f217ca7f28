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

// The kinds of device.
enum class DeviceType : uint8_t { CPU, CUDA };
inline constexpr int kNumDeviceTypes = 2;  // the number of DeviceType values

// Where a tensor lives: the CPU, or one CUDA GPU by index (Device::cpu(), Device::cuda(0)).
class Device {
 public:
  constexpr Device() = default;  // cpu
  // A device of `type`; the index is kept for CUDA and is always 0 for the CPU.
  constexpr Device(DeviceType type, int index) : type_(type), index_(type == DeviceType::CPU ? 0 : index) {}
  // Parses "cpu", "cuda" (device 0) or "cuda:N"; throws kiln::Error on anything else.
  explicit Device(std::string_view spec);

  // The CPU.
  static constexpr Device cpu() { return Device(DeviceType::CPU, 0); }
  // CUDA GPU `index` (not checked against the GPUs present).
  static constexpr Device cuda(int index = 0) { return Device(DeviceType::CUDA, index); }

  // CPU or CUDA.
  constexpr DeviceType type() const { return type_; }
  // The CUDA device index; 0 for the CPU.
  constexpr int index() const { return index_; }
  // True for the CPU.
  constexpr bool is_cpu() const { return type_ == DeviceType::CPU; }
  // True for a CUDA GPU.
  constexpr bool is_cuda() const { return type_ == DeviceType::CUDA; }
  std::string str() const;  // "cpu" or "cuda:N"

  // Same type and index.
  friend constexpr bool operator==(Device a, Device b) { return a.type_ == b.type_ && a.index_ == b.index_; }
  // Different type or index.
  friend constexpr bool operator!=(Device a, Device b) { return !(a == b); }

 private:
  DeviceType type_ = DeviceType::CPU;
  int index_ = 0;
};

std::ostream& operator<<(std::ostream& os, Device d);  // writes d.str()

}  // namespace kiln

template <>
// Hashes a Device by type and index, for unordered containers.
struct std::hash<kiln::Device> {
  size_t operator()(kiln::Device d) const noexcept {  // mixes type and index
    return std::hash<int>()(static_cast<int>(d.type()) * 1024 + d.index());
  }
};
