#include "support/test_support.h"

#include "kiln/tensor/cuda.h"

#include <chrono>
#include <cmath>
#include <cstring>  // std::memcpy: bytes_of
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kiln/tensor/backend.h"

namespace kiln::testing {

std::vector<Device> test_devices() {
  std::vector<Device> devices{Device::cpu()};
  try {
    if (backend(DeviceType::CUDA).device_count() > 0) devices.push_back(Device::cuda(0));
  } catch (const Error&) {
    // no CUDA backend in this build, or no GPU visible
  }
  return devices;
}

std::string device_param_name(const ::testing::TestParamInfo<Device>& info) {
  return info.param.is_cpu() ? "cpu" : "cuda" + std::to_string(info.param.index());
}

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor c = t.detach().cpu().contiguous();
  std::vector<uint8_t> out(c.nbytes());
  if (!out.empty()) std::memcpy(out.data(), c.data_ptr(), out.size());
  return out;
}

double default_rtol(DType dtype) {
  switch (dtype) {
    case DType::Float64: return 1e-12;
    case DType::Float32: return 1e-5;
    case DType::Float16: return 2e-3;
    case DType::BFloat16: return 1.6e-2;
    default: return 0;
  }
}
double default_atol(DType dtype) {
  switch (dtype) {
    case DType::Float64: return 1e-12;
    case DType::Float32: return 1e-6;
    case DType::Float16: return 1e-3;
    case DType::BFloat16: return 1e-2;
    default: return 0;
  }
}

void expect_values(const Tensor& actual, const Shape& shape, const std::vector<double>& expected, double rtol,
                   double atol) {
  ASSERT_TRUE(actual.defined()) << "the tensor is undefined";
  ASSERT_EQ(actual.shape(), shape) << "shape mismatch";
  ASSERT_EQ(static_cast<size_t>(actual.numel()), expected.size()) << "reference has the wrong number of elements";
  if (rtol < 0) rtol = default_rtol(actual.dtype());
  if (atol < 0) atol = default_atol(actual.dtype());
  const std::vector<double> got = values(actual);
  int reported = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double e = expected[i], g = got[i];
    bool ok;
    if (std::isnan(e)) ok = std::isnan(g);
    else if (std::isinf(e)) ok = g == e;
    else ok = std::abs(g - e) <= atol + rtol * std::abs(e);
    if (!ok && reported++ < 8) {
      ADD_FAILURE() << "element " << i << " (index "
                    << ::testing::PrintToString(unravel(static_cast<int64_t>(i), shape)) << ") of a " << actual.dtype()
                    << " tensor on " << actual.device() << ": got " << g << ", expected " << e << " (rtol " << rtol
                    << ", atol " << atol << ")";
    }
  }
}

Tensor make(const std::vector<double>& data, const Shape& shape, const TensorOptions& options) {
  Tensor t = internal::from_vector<double>(data, shape);
  return t.to(options.device, options.dtype.value_or(kDefaultFloat));
}

Tensor non_contiguous(const Tensor& t) {
  // Lay the data out in a buffer twice as long along the last dim and take every other element.
  if (t.dim() == 0) return t;
  Shape wide = t.shape();
  wide.back() *= 2;
  Tensor buffer = internal::zeros(wide, {.dtype = t.dtype(), .device = t.device()});
  Tensor view = buffer.slice(-1, 0, std::nullopt, 2);
  // A raw copy: the result is a fresh leaf (callers make it require grad), whatever t's history.
  NoGradGuard no_grad;
  view.copy_(t);
  return view;
}

void expect_error(const std::function<void()>& fn, const std::vector<std::string>& fragments) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& f : fragments) {
      EXPECT_NE(msg.find(f), std::string::npos) << "the error message lacks \"" << f << "\":\n  " << msg;
    }
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected a kiln::Error, got another exception: " << e.what();
    return;
  }
  ADD_FAILURE() << "expected a kiln::Error, but nothing was thrown";
}

namespace {

// The process's virtual size in bytes (/proc/self/statm counts pages).
size_t address_space_bytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0;
  statm >> pages;
  return pages * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace

ThrownUnderMemoryLimit run_under_memory_limit(const std::function<void()>& fn, size_t headroom_bytes) {
  int fds[2];
  if (pipe(fds) != 0) return {"crash", "pipe() failed"};
  const pid_t pid = fork();
  if (pid < 0) return {"crash", "fork() failed"};
  if (pid == 0) {  // the child: limit, run, write "kind\nmessage" to the pipe, leave without running destructors
    close(fds[0]);
    const rlim_t limit = address_space_bytes() + headroom_bytes;
    const rlimit r{limit, limit};
    std::string out;
    if (setrlimit(RLIMIT_AS, &r) != 0) {
      out = "crash\nsetrlimit(RLIMIT_AS) failed";
    } else {
      try {
        fn();
        out = "nothing\n";
      } catch (const OutOfMemoryError& e) {
        out = std::string("OutOfMemoryError\n") + e.what();
      } catch (const Error& e) {
        out = std::string("Error\n") + e.what();
      } catch (const std::exception& e) {
        out = std::string("other\n") + e.what();
      }
    }
    size_t done = 0;
    while (done < out.size()) {
      const ssize_t n = write(fds[1], out.data() + done, out.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    _exit(0);
  }
  close(fds[1]);
  std::string got;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) got.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  const size_t nl = got.find('\n');
  if (nl == std::string::npos) {
    return {"crash", WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status))
                                         : "exited " + std::to_string(WEXITSTATUS(status)) + " without a report"};
  }
  return {got.substr(0, nl), got.substr(nl + 1)};
}

std::vector<double> uniform(int64_t n, double lo, double hi, uint64_t seed) {
  std::vector<double> v(static_cast<size_t>(n));
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = lo + (hi - lo) * static_cast<double>(s >> 11) / 9007199254740992.0;
  }
  return v;
}

std::vector<double> exact_grid(int64_t n, int half_range, double denominator, uint32_t seed) {
  std::vector<double> v(static_cast<size_t>(n));
  uint32_t s = seed * 2654435761u + 12345u;
  const auto count = static_cast<uint32_t>(2 * half_range + 1);
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<double>(static_cast<int>((s >> 16) % count) - half_range) / denominator;
  }
  return v;
}

std::vector<int64_t> unravel(int64_t flat, const Shape& shape) {
  std::vector<int64_t> index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = shape[d] == 0 ? 0 : flat % shape[d];
    flat = shape[d] == 0 ? 0 : flat / shape[d];
  }
  return index;
}

int64_t ravel(const std::vector<int64_t>& index, const Shape& shape) {
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + index[d];
  return flat;
}

void ExactFloat32Test::SetUp() {
  previous_tf32_ = cuda::allow_tf32();
  cuda::set_allow_tf32(false);
}

void ExactFloat32Test::TearDown() { cuda::set_allow_tf32(previous_tf32_); }

int thread_count() {
  auto count = [] {
    int n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
    return n;
  };
  int last = count(), same = 0;
  for (int i = 0; i < 500 && same < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const int n = count();
    same = n == last ? same + 1 : 0;
    last = n;
  }
  return last;
}

}  // namespace kiln::testing
