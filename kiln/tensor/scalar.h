// kiln/tensor/scalar.h — a number passed to an op beside tensors (x + 2, x.clamp(0, 6), full({2}, 1.5)).
//
// A Scalar remembers whether it was written as a bool, an integer or a floating-point number, because
// type promotion depends on it: int_tensor + 2 stays int, int_tensor + 2.5 becomes float32.
#pragma once

#include <cstdint>
#include <ostream>
#include <type_traits>

#include "kiln/tensor/dtype.h"  // DType, Half, BFloat16, Float8_e4m3fn, Float8_e5m2

namespace kiln {

// A bool, integer or floating-point number, kept as int64 or double with its kind (see above).
class Scalar {
 public:
  // How the number was written.
  enum class Kind : uint8_t { Bool, Integral, Floating };

  Scalar() : Scalar(int64_t{0}) {}
  // A Bool scalar.
  Scalar(bool v) : kind_(Kind::Bool), i_(v) {}  // NOLINT: implicit, like a literal
  template <typename T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  // An Integral scalar from any integer type, stored as int64.
  Scalar(T v) : kind_(Kind::Integral), i_(static_cast<int64_t>(v)) {}  // NOLINT
  template <typename T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  // A Floating scalar from float or double, stored as double.
  Scalar(T v) : kind_(Kind::Floating), d_(static_cast<double>(v)) {}  // NOLINT
  // A Floating scalar of the value of v (likewise for the other 16-bit and 8-bit float types below).
  Scalar(Half v) : Scalar(static_cast<float>(v)) {}  // NOLINT
  // A Floating scalar of the value of v.
  Scalar(BFloat16 v) : Scalar(static_cast<float>(v)) {}  // NOLINT
  // A Floating scalar of the value of v.
  Scalar(Float8_e4m3fn v) : Scalar(static_cast<float>(v)) {}  // NOLINT
  // A Floating scalar of the value of v.
  Scalar(Float8_e5m2 v) : Scalar(static_cast<float>(v)) {}  // NOLINT

  // Bool, Integral or Floating.
  Kind kind() const { return kind_; }
  // Written as a floating-point number.
  bool is_floating_point() const { return kind_ == Kind::Floating; }
  // Written as an integer (not a bool).
  bool is_integral() const { return kind_ == Kind::Integral; }
  // Written as a bool.
  bool is_bool() const { return kind_ == Kind::Bool; }

  // The value as a double.
  double to_double() const { return kind_ == Kind::Floating ? d_ : static_cast<double>(i_); }
  // The value as int64; a floating value is truncated toward zero.
  int64_t to_int64() const { return kind_ == Kind::Floating ? static_cast<int64_t>(d_) : i_; }
  // Whether the value is nonzero.
  bool to_bool() const { return kind_ == Kind::Floating ? d_ != 0.0 : i_ != 0; }

  // Converts to an element type, e.g. to<float>() or to<Half>().
  template <typename T>
  T to() const {
    if constexpr (std::is_same_v<T, bool>) {
      return to_bool();
    } else if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(to_int64());
    } else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      return T(static_cast<float>(to_double()));
    } else if constexpr (std::is_same_v<T, Float8_e4m3fn> || std::is_same_v<T, Float8_e5m2>) {
      return T(to_double());  // one rounding, saturating (float8.h)
    } else {
      return static_cast<T>(to_double());
    }
  }

  // The dtype a tensor made from this scalar alone would have: Bool, Int64 or kDefaultFloat.
  DType natural_dtype() const {
    return kind_ == Kind::Bool ? DType::Bool : kind_ == Kind::Integral ? DType::Int64 : kDefaultFloat;
  }

 private:
  Kind kind_;
  union {
    int64_t i_;
    double d_;
  };
};

std::ostream& operator<<(std::ostream& os, const Scalar& s);  // true/false, an integer or a double

}  // namespace kiln
