// Printing tensors as PyTorch does: aligned values, summarised when large, then shape, dtype and device.
//
//   tensor([[ 0.1000, -2.0000],
//           [ 3.5000,  4.0000]], shape=[2, 2], dtype=float32, device=cpu)
#include <cmath>
#include <cstdio>
#include <sstream>

#include "kiln/tensor/internal_ops.h"

namespace kiln {
namespace {

constexpr int64_t kSummariseAbove = 1000;  // elements; larger tensors show kEdgeItems at each end of each dim
constexpr int64_t kEdgeItems = 3;
constexpr int kLineWidth = 80;

enum class Style { Bool, Integer, IntegralFloat, Fixed, Scientific };

struct Formatter {
  Style style = Style::Fixed;
  size_t width = 1;

  std::string format(double v) const {
    char buf[64];
    switch (style) {
      case Style::Bool: return v != 0 ? "true" : "false";
      case Style::Integer: std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v)); break;
      case Style::IntegralFloat:
        if (std::isfinite(v)) std::snprintf(buf, sizeof buf, "%.0f.", v);
        else std::snprintf(buf, sizeof buf, "%s", std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
        break;
      case Style::Fixed:
        if (std::isfinite(v)) std::snprintf(buf, sizeof buf, "%.4f", v);
        else std::snprintf(buf, sizeof buf, "%s", std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
        break;
      case Style::Scientific:
        if (std::isfinite(v)) std::snprintf(buf, sizeof buf, "%.4e", v);
        else std::snprintf(buf, sizeof buf, "%s", std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
        break;
    }
    return buf;
  }
};

// Picks one style for all shown values, as PyTorch does: integers stay integers; floats whose finite values
// are all whole print as "3."; a large dynamic range (or very large/small magnitudes) switches to scientific.
Formatter make_formatter(const std::vector<double>& shown, DType dtype) {
  Formatter f;
  if (dtype == DType::Bool) f.style = Style::Bool;
  else if (!is_floating_point(dtype)) f.style = Style::Integer;
  else {
    bool all_whole = true;
    double lo = INFINITY, hi = 0;
    for (double v : shown) {
      if (!std::isfinite(v)) continue;
      if (v != std::nearbyint(v)) all_whole = false;
      const double a = std::abs(v);
      if (a != 0) {
        lo = std::min(lo, a);
        hi = std::max(hi, a);
      }
    }
    if (all_whole) f.style = hi > 1e8 ? Style::Scientific : Style::IntegralFloat;
    else f.style = (hi / lo > 1000 || hi > 1e8 || lo < 1e-4) ? Style::Scientific : Style::Fixed;
  }
  for (double v : shown) f.width = std::max(f.width, f.format(v).size());
  return f;
}

// The indices shown along a dim of size n: all, or the first and last kEdgeItems with a gap marker (-1).
std::vector<int64_t> shown_indices(int64_t n, bool summarise) {
  std::vector<int64_t> idx;
  if (!summarise || n <= 2 * kEdgeItems) {
    for (int64_t i = 0; i < n; ++i) idx.push_back(i);
  } else {
    for (int64_t i = 0; i < kEdgeItems; ++i) idx.push_back(i);
    idx.push_back(-1);
    for (int64_t i = n - kEdgeItems; i < n; ++i) idx.push_back(i);
  }
  return idx;
}

void collect(const Tensor& host, int64_t dim, int64_t offset, bool summarise, std::vector<double>& out,
             const std::vector<double>& data) {
  if (dim == host.dim()) {
    out.push_back(data[static_cast<size_t>(offset)]);
    return;
  }
  const int64_t inner = numel(Shape(host.shape().begin() + dim + 1, host.shape().end()));
  for (int64_t i : shown_indices(host.size(dim), summarise)) {
    if (i >= 0) collect(host, dim + 1, offset + i * inner, summarise, out, data);
  }
}

void write(std::ostream& os, const Tensor& host, int64_t dim, int64_t offset, bool summarise, const Formatter& f,
           const std::vector<double>& data, int indent) {
  if (dim == host.dim()) {
    const std::string s = f.format(data[static_cast<size_t>(offset)]);
    os << std::string(f.width - s.size(), ' ') << s;
    return;
  }
  const int64_t inner = numel(Shape(host.shape().begin() + dim + 1, host.shape().end()));
  const auto idx = shown_indices(host.size(dim), summarise);
  const bool last_dim = dim + 1 == host.dim();
  const int per_line = std::max<int>(1, (kLineWidth - indent) / static_cast<int>(f.width + 2));
  os << '[';
  int on_line = 0;
  for (size_t k = 0; k < idx.size(); ++k) {
    if (k > 0) {
      os << ',';
      if (last_dim) {
        if (++on_line >= per_line) {
          os << '\n' << std::string(indent + dim + 1, ' ');
          on_line = 0;
        } else {
          os << ' ';
        }
      } else {
        os << std::string(host.dim() - dim - 1, '\n') << std::string(indent + dim + 1, ' ');
      }
    }
    if (idx[k] < 0) os << "...";
    else write(os, host, dim + 1, offset + idx[k] * inner, summarise, f, data, indent);
  }
  os << ']';
}

}  // namespace

std::string Tensor::str() const {
  std::ostringstream os;
  if (!defined()) return "tensor(undefined)";
  const Tensor host = internal::contiguous(internal::to(*this, Device::cpu()));
  const std::vector<double> data = host.to_vector<double>();
  const bool summarise = numel() > kSummariseAbove;
  std::vector<double> shown;
  collect(host, 0, 0, summarise, shown, data);
  const Formatter f = make_formatter(shown, dtype());
  constexpr int kIndent = 7;  // strlen("tensor(")
  os << "tensor(";
  if (numel() == 0) os << "[]";
  else write(os, host, 0, 0, summarise, f, data, kIndent);
  os << ", shape=" << detail::str_cat(shape()) << ", dtype=" << dtype() << ", device=" << device() << ')';
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

}  // namespace kiln
