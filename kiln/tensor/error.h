// kiln/tensor/error.h — the exceptions kiln throws, and the check macros that build their messages.
//
//   KILN_CHECK(a.dim() == 2, "matmul: expected a 2-D tensor, got shape ", a.shape());
//   try { ... } catch (const kiln::Error& e) { std::cerr << e.what(); }
//
// Every user mistake becomes a kiln::Error whose message names the op, the shapes, dtypes and devices
// involved, and what to do. Nothing in kiln aborts the process on bad input.
#pragma once

#include <sstream>    // std::ostringstream, to build messages
#include <stdexcept>  // std::runtime_error
#include <string>
#include <vector>

namespace kiln {

// Base class of every error kiln raises.
class Error : public std::runtime_error {
 public:
  // An error whose what() is message.
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A device allocation failed even after cached memory was released.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;  // (message), as Error
};

// A CUDA runtime, driver or library call failed.
class CudaError : public Error {
 public:
  using Error::Error;  // (message), as Error
};

// Something kiln does not implement (yet) for these arguments, e.g. an op on a dtype it does not support.
class NotImplementedError : public Error {
 public:
  using Error::Error;  // (message), as Error
};

// An out-of-range index that a CUDA kernel found. The GPU runs behind the host, so it may be raised by a later
// call than the one that launched the kernel (an index op, or a synchronisation); the message names the op.
class IndexError : public Error {
 public:
  using Error::Error;  // (message), as Error
};

namespace detail {
template <typename T>
void append(std::ostringstream& out, const T& v) {
  out << v;
}
// Shapes and other vectors print as [2, 3, 4].
template <typename T>
void append(std::ostringstream& out, const std::vector<T>& v) {
  out << '[';
  for (size_t i = 0; i < v.size(); ++i) out << (i ? ", " : "") << v[i];
  out << ']';
}
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream out;
  (append(out, args), ...);
  return out.str();
}
}  // namespace detail

}  // namespace kiln

// Throws kiln::Error with the concatenated message when cond is false.
#define KILN_CHECK(cond, ...)                                    \
  do {                                                           \
    if (!(cond)) [[unlikely]] {                                  \
      throw ::kiln::Error(::kiln::detail::str_cat(__VA_ARGS__)); \
    }                                                            \
  } while (false)

// Same, with a chosen exception type.
#define KILN_CHECK_AS(ExceptionType, cond, ...)                  \
  do {                                                           \
    if (!(cond)) [[unlikely]] {                                  \
      throw ExceptionType(::kiln::detail::str_cat(__VA_ARGS__)); \
    }                                                            \
  } while (false)

#define KILN_FAIL(...) throw ::kiln::Error(::kiln::detail::str_cat(__VA_ARGS__))
