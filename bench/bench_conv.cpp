// ResNet-50's convolutions one by one, pass by pass, on kiln's cuDNN path: whether kiln's algorithm choice
// (cuDNN's legacy cudnnFind*AlgorithmEx in benchmark mode) loses time against PyTorch's (cuDNN's graph API in
// benchmark mode). bench/pytorch_conv.py times the same cases through PyTorch and, with --compare, puts the two
// logs side by side.
//
//   bench_conv [--dtype bf16|fp16] [--shape INDEX] [--iters N] [--steps N] [--warmup N] [--quick]
//
// Cases: every distinct convolution of torchvision's ResNet-50 (bottleneck v1.5: the stride on the 3x3 conv;
// the 7x7/2 stem on 3 channels; strided 1x1 downsample convs) at batch 256, 224x224 input, channels-last, no
// bias, with how many times each occurs (53 convolutions, 23 distinct shapes). Each pass alone: forward
// y = conv(x, w), backward-data dx = conv_backward_data(dy, w), backward-filter dw = conv_backward_filter(dy, x),
// through kiln's cuDNN passes (kiln/layers/cuda/conv_cudnn.h, the calls nn::conv2d and its backward node make,
// without the autograd bookkeeping), with nn::cudnn_benchmark on. Timing: `--iters` (10) passes back to back
// between two CUDA events, the median of `--steps` (10) such blocks after `--warmup` (2) blocks, divided by
// `--iters`; the first warm-up pass is where cuDNN's algorithms are timed and one chosen, so it is never timed.
// Passes queued back to back hide the host's per-call work behind the GPU's, as in a training step.
//
// One JSON line per (shape, pass), with TFLOP/s = 2 N C_out OH OW C_in K^2 / time (the same count for all three
// passes), then one line per pass with the count-weighted total: the time one ResNet-50 training step spends in
// that pass. The stem's dx is measured but left out of the dx total ("in_step": false): a training step never
// computes the gradient of its input images.
//
// --quick: batch 2, spatial size / 8, one pass per block, one block: checks that the code runs (CTest:
// bench.conv_quick), on the CPU where there is no GPU; its figures mean nothing. There kiln's convolution is
// im2col + matmul through autograd, with no separate passes: dx and dw are then forward + backward with only x,
// or only w, requiring a gradient (the forward included in the time).
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gpu_timing.h"  // bench::median_step_ms
#include "kiln/kiln.h"
#include "kiln/layers/cuda/conv_cudnn.h"  // nn::cuda_impl::conv2d_forward, conv2d_backward_data, conv2d_backward_filter
#include "kiln/tensor/cuda.h"             // cuda::is_available

using namespace kiln;

namespace {

struct ConvShape {
  int64_t c_in, c_out, hw, k, stride;  // hw: the input's height and width; padding k / 2
  int count;                           // how many of ResNet-50's convolutions have this shape
};

int64_t out_size(int64_t hw, int64_t k, int64_t stride) { return (hw + 2 * (k / 2) - k) / stride + 1; }

// ResNet-50's convolutions for an input of hw x hw, distinct shapes in the order the forward meets them, each
// with its count. Walked from the architecture rather than written out, so the counts cannot drift from it;
// bench/pytorch_conv.py walks it the same way, so --shape INDEX means the same shape on both sides.
std::vector<ConvShape> resnet50_convs(int64_t hw) {
  std::vector<ConvShape> shapes;
  auto add = [&](int64_t c_in, int64_t c_out, int64_t h, int64_t k, int64_t stride) {
    for (ConvShape& s : shapes) {
      if (s.c_in == c_in && s.c_out == c_out && s.hw == h && s.k == k && s.stride == stride) {
        ++s.count;
        return;
      }
    }
    shapes.push_back({c_in, c_out, h, k, stride, 1});
  };
  add(3, 64, hw, 7, 2);  // the stem
  hw = out_size(hw, 7, 2);
  hw = out_size(hw, 3, 2);  // max pool 3x3/2, padding 1
  int64_t in = 64;
  constexpr int64_t kWidths[] = {64, 128, 256, 512}, kBlocks[] = {3, 4, 6, 3};
  for (int stage = 0; stage < 4; ++stage) {
    const int64_t width = kWidths[stage], out = 4 * width;
    for (int64_t b = 0; b < kBlocks[stage]; ++b) {
      const int64_t stride = stage > 0 && b == 0 ? 2 : 1;
      const int64_t next = out_size(hw, 3, stride);
      add(in, width, hw, 1, 1);                 // conv1
      add(width, width, hw, 3, stride);         // conv2, strided in the first block of stages 2-4 (v1.5)
      add(width, out, next, 1, 1);              // conv3
      if (b == 0) add(in, out, hw, 1, stride);  // the shortcut's downsample
      in = out;
      hw = next;
    }
  }
  return shapes;
}

struct Settings {
  Device device = Device::cuda(0);  // the CPU only for --quick without a GPU (a smoke run of the code)
  DType dtype = DType::BFloat16;
  const char* dtype_name = "bf16";
  int shape = -1;  // -1: all
  int iters = 10, steps = 10, warmup = 2;
  int64_t n = 256, hw = 224;
  bool quick = false;
};

// Milliseconds per pass: blocks of s.iters passes, timed as bench/gpu_timing.h does on a GPU, by the wall clock on
// the CPU (--quick only).
double ms_per_pass(const Settings& s, const std::function<void()>& pass) {
  auto block = [&] {
    for (int i = 0; i < s.iters; ++i) pass();
  };
  if (s.device.is_cuda()) return bench::median_step_ms(s.warmup, s.steps, block) / s.iters;
  for (int i = 0; i < s.warmup; ++i) block();
  std::vector<double> ms;
  for (int i = 0; i < s.steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    block();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] / s.iters;
}

constexpr const char* kPasses[] = {"fwd", "dx", "dw"};

// Count-weighted sums per pass over the shapes run.
struct Totals {
  double ms[3] = {0, 0, 0};
  double flop[3] = {0, 0, 0};
  int layers[3] = {0, 0, 0};
  bool failed[3] = {false, false, false};  // a shape's pass failed: no total for that pass
};

std::string json_escape(const std::string& text) {
  std::string out;
  for (char ch : text) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (ch == '\n') {
      out += "\\n";
      continue;
    }
    out += ch;
  }
  return out;
}

// The fields every line of one shape starts with.
std::string case_fields(const Settings& s, int index, const ConvShape& c) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "\"bench\": \"conv\", \"impl\": \"kiln\", \"dtype\": \"%s\", \"shape\": %d, \"n\": %lld, "
                "\"c_in\": %lld, \"c_out\": %lld, \"hw\": %lld, \"k\": %lld, \"stride\": %lld, \"count\": %d",
                s.dtype_name, index, static_cast<long long>(s.n), static_cast<long long>(c.c_in),
                static_cast<long long>(c.c_out), static_cast<long long>(c.hw), static_cast<long long>(c.k),
                static_cast<long long>(c.stride), c.count);
  return buf;
}

// Times the three passes of one shape and prints their lines.
void run_shape(const Settings& s, int index, const ConvShape& c, Totals& totals) {
  const TensorOptions opts{.dtype = s.dtype, .device = s.device};
  const MemoryFormat cl = MemoryFormat::ChannelsLast;
  const int64_t oh = out_size(c.hw, c.k, c.stride), pad = c.k / 2;
  // Random normal data: zeros could take shortcuts no real step takes. The weight is scaled as He's
  // initialisation is (std 1 / sqrt(fan_in) here), so the outputs stay in the dtype's range.
  const double w_std = 1.0 / std::sqrt(static_cast<double>(c.c_in * c.k * c.k));
  const Tensor x = randn({s.n, c.c_in, c.hw, c.hw}, opts).contiguous(cl);              // (N, C_in, H, W)
  const Tensor w = (randn({c.c_out, c.c_in, c.k, c.k}, opts) * w_std).contiguous(cl);  // (C_out, C_in, K, K)
  const Tensor dy = randn({s.n, c.c_out, oh, oh}, opts).contiguous(cl);                // (N, C_out, OH, OW)
  const double flop = 2.0 * static_cast<double>(s.n * c.c_out * oh * oh) * static_cast<double>(c.c_in * c.k * c.k);
  const bool stem = index == 0;  // its input is the images: no training step computes its dx

  // On a GPU, kiln's cuDNN passes themselves; on the CPU (--quick), nn::conv2d through autograd (see the top).
  const nn::cuda_impl::ConvGeometry g{.stride = {c.stride, c.stride}, .padding = {pad, pad}};
  const nn::Conv2dOptions o{.stride = c.stride, .padding = pad, .bias = false};
  Tensor x_leaf = x.detach(), w_leaf = w.detach();  // the CPU's dx and dw: only the one leaf requires a gradient
  x_leaf.requires_grad_();
  w_leaf.requires_grad_();
  const std::function<void()> passes[3] = {
      [&] {
        if (s.device.is_cuda()) {
          (void)nn::cuda_impl::conv2d_forward(x, w, g, cl);  // (N, C_out, OH, OW)
        } else {
          NoGradGuard no_grad;
          (void)nn::conv2d(x, w, {}, o);
        }
      },
      [&] {
        if (s.device.is_cuda()) {
          (void)nn::cuda_impl::conv2d_backward_data(dy, w, x.shape(), g, cl);  // (N, C_in, H, W)
        } else {
          x_leaf.mutable_grad() = Tensor();
          nn::conv2d(x_leaf, w, {}, o).backward(dy);
        }
      },
      [&] {
        if (s.device.is_cuda()) {
          (void)nn::cuda_impl::conv2d_backward_filter(dy, x, w.shape(), g, cl);  // (C_out, C_in, K, K)
        } else {
          w_leaf.mutable_grad() = Tensor();
          nn::conv2d(x, w_leaf, {}, o).backward(dy);
        }
      },
  };
  for (int p = 0; p < 3; ++p) {
    const std::string fields = case_fields(s, index, c) + ", \"pass\": \"" + kPasses[p] + "\"";
    try {
      const double ms = ms_per_pass(s, passes[p]);
      const bool in_step = !(stem && p == 1);
      std::printf("{%s, \"ms\": %.4f, \"tflops\": %.1f, \"in_step\": %s}\n", fields.c_str(), ms, flop / ms / 1e9,
                  in_step ? "true" : "false");
      if (in_step) {
        totals.ms[p] += ms * c.count;
        totals.flop[p] += flop * c.count;
        totals.layers[p] += c.count;
      }
    } catch (const std::exception& e) {  // one failing pass (out of memory, say) does not end the run
      std::string what = e.what();
      if (what.size() > 400) what.resize(400);
      std::printf("{%s, \"error\": \"%s\"}\n", fields.c_str(), json_escape(what).c_str());
      totals.failed[p] = true;
    }
    std::fflush(stdout);
  }
}

void print_shapes(FILE* out, const std::vector<ConvShape>& shapes) {
  std::fprintf(out, "ResNet-50's distinct convolutions at 224x224 (--shape INDEX):\n");
  for (size_t i = 0; i < shapes.size(); ++i) {
    const ConvShape& c = shapes[i];
    std::fprintf(out, "  %2zu: %4lld -> %4lld  %lldx%lld/%lld  on %3lldx%-3lld  x%d\n", i,
                 static_cast<long long>(c.c_in), static_cast<long long>(c.c_out), static_cast<long long>(c.k),
                 static_cast<long long>(c.k), static_cast<long long>(c.stride), static_cast<long long>(c.hw),
                 static_cast<long long>(c.hw), c.count);
  }
}

// A whole non-negative number, or nullopt.
std::optional<int> parse_count(const char* text) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || errno != 0 || v < 0 || v > 1000000) return std::nullopt;
  return static_cast<int>(v);
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  const std::vector<ConvShape> full = resnet50_convs(224);
  auto usage = [&] {
    std::fprintf(stderr,
                 "usage: bench_conv [--dtype bf16|fp16] [--shape INDEX] [--iters N] [--steps N] [--warmup N] "
                 "[--quick]\n");
    print_shapes(stderr, full);
    return 2;
  };
  int iters = -1, steps = -1, warmup = -1;  // -1: the default of the mode
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--quick") {
      s.quick = true;
    } else if (a == "--help" || a == "-h") {
      usage();
      return 0;
    } else if (a == "--dtype" && has_value) {
      const std::string d = argv[++i];
      if (d == "bf16") {
        s.dtype = DType::BFloat16;
        s.dtype_name = "bf16";
      } else if (d == "fp16") {
        s.dtype = DType::Float16;
        s.dtype_name = "fp16";
      } else {
        std::fprintf(stderr, "bench_conv: --dtype must be bf16 or fp16, got '%s'\n", d.c_str());
        return usage();
      }
    } else if (a == "--shape" && has_value) {
      const std::optional<int> v = parse_count(argv[++i]);
      if (!v || *v >= static_cast<int>(full.size())) {
        std::fprintf(stderr, "bench_conv: --shape takes an index from 0 to %zu (the list below), got '%s'\n",
                     full.size() - 1, argv[i]);
        return usage();
      }
      s.shape = *v;
    } else if ((a == "--iters" || a == "--steps" || a == "--warmup") && has_value) {
      const std::optional<int> v = parse_count(argv[++i]);
      if (!v || (*v == 0 && a != "--warmup")) {
        std::fprintf(stderr, "bench_conv: %s takes a whole number%s, got '%s'\n", a.c_str(),
                     a == "--warmup" ? "" : " of at least 1", argv[i]);
        return usage();
      }
      (a == "--iters" ? iters : a == "--steps" ? steps : warmup) = *v;
    } else {
      std::fprintf(stderr, "bench_conv: unknown option or missing value: '%s'\n", a.c_str());
      return usage();
    }
  }
  if (s.quick) {
    s.n = 2;
    s.hw = 224 / 8;
    s.iters = s.steps = s.warmup = 1;
  }
  if (iters > 0) s.iters = iters;
  if (steps > 0) s.steps = steps;
  if (warmup >= 0) s.warmup = warmup;
  if (!cuda::is_available()) {
    if (!s.quick) {
      std::printf("bench_conv: no GPU visible; nothing to measure (--quick runs the code on the CPU)\n");
      return 0;
    }
    s.device = Device::cpu();
  } else {
    nn::set_cudnn_benchmark(true);  // as torch.backends.cudnn.benchmark = True on the PyTorch side
  }
  manual_seed(1234);
  const std::vector<ConvShape> shapes = resnet50_convs(s.hw);  // the same list at --quick's size
  std::printf(
      "kiln %s conv on %s: %s, batch %lld, %lldx%lld input, channels-last; %d passes per block, median of "
      "%d blocks after %d\n",
      KILN_VERSION_STRING, s.device.str().c_str(), s.dtype_name, static_cast<long long>(s.n),
      static_cast<long long>(s.hw), static_cast<long long>(s.hw), s.iters, s.steps, s.warmup);
  Totals totals;
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (s.shape >= 0 && static_cast<int>(i) != s.shape) continue;
    try {
      run_shape(s, static_cast<int>(i), shapes[i], totals);
    } catch (const std::exception& e) {  // making the shape's tensors failed (out of memory, say): the others go on
      std::string what = e.what();
      if (what.size() > 400) what.resize(400);
      std::printf("{%s, \"error\": \"%s\"}\n", case_fields(s, static_cast<int>(i), shapes[i]).c_str(),
                  json_escape(what).c_str());
      for (bool& f : totals.failed) f = true;
    }
  }
  // The totals need every shape: one --shape alone is not a training step.
  if (s.shape < 0) {
    for (int p = 0; p < 3; ++p) {
      if (totals.failed[p]) continue;  // its error line says why
      std::printf(
          "{\"bench\": \"conv\", \"impl\": \"kiln\", \"dtype\": \"%s\", \"n\": %lld, \"input_hw\": %lld, "
          "\"summary\": \"resnet50\", \"pass\": \"%s\", \"layers\": %d, \"ms\": %.3f, \"tflops\": %.1f}\n",
          s.dtype_name, static_cast<long long>(s.n), static_cast<long long>(s.hw), kPasses[p], totals.layers[p],
          totals.ms[p], totals.flop[p] / totals.ms[p] / 1e9);
    }
  }
  return 0;
}
