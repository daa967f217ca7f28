// A ResNet's convolutions one by one, pass by pass, as kiln runs them: whether kiln's convolutions lose time against
// PyTorch's, and where. bench/pytorch_conv.py times the same cases through PyTorch and, with --compare, puts two
// logs side by side (this one and PyTorch's, or two of this one's with different --path).
//
//   bench_conv [--net resnet50|resnet18_cifar] [--path auto|cudnn] [--cudnn-api graph|legacy] [--dtype bf16|fp16]
//              [--shape INDEX] [--iters N] [--steps N] [--warmup N] [--sums] [--accumulate] [--quick]
//
// Nets (--net): resnet50 (default): every distinct convolution of torchvision's ResNet-50 (bottleneck v1.5: the
// stride on the 3x3 conv; the 7x7/2 stem on 3 channels, then a 3x3/2 max pool; strided 1x1 downsample convs) at
// batch 256, 224x224 input: 53 convolutions, 23 distinct shapes. resnet18_cifar: ResNet-18 with the CIFAR stem
// (3x3/1, 3 -> 64, no max pool; nn::models::resnet18 with cifar_stem) at batch 512, 32x32 input: the stem, the
// 3x3 convs of the four stages (the first of stages 2-4 strided), the strided 1x1 downsample convs: 20
// convolutions, 11 distinct shapes. Both channels-last, no bias, each shape with how many times it occurs.
//
// Each pass alone: forward y = conv(x, w), backward-data dx, backward-filter dw, through what nn::conv2d and its
// backward run, without the autograd bookkeeping (--path auto, the default):
//   - a 1x1, stride-1, unpadded, ungrouped convolution of a channels-last input (every such shape here) is
//     a matrix product over the (N H W, C) rows of NHWC memory (pointwise_conv2d in kiln/layers/conv.cpp), so its
//     passes are the three products kiln::internal::mm runs there and in PointwiseConvolutionBackward: forward rows
//     (N H W, C_in) x w^T (C_in, C_out), dx = dy_rows (N H W, C_out) x w (C_out, C_in), dw = dy_rows^T
//     (C_out, N H W) x rows; "path": "matmul";
//   - every other shape through kiln's cuDNN passes (kiln/layers/cuda/conv_cudnn.h) with nn::cudnn_benchmark on;
//     "path": "cudnn".
// --path cudnn times cuDNN's passes for every shape (what nn::conv2d ran before its matrix-product branch), to
// compare the two paths on one GPU. kiln's cuDNN passes go through cuDNN's graph API (kiln/layers/cuda/
// conv_cudnn_graph.h) for bf16 and fp16; --cudnn-api legacy sends them through the legacy convolution API instead
// (cudnnFind*AlgorithmEx), what kiln ran before, to compare the two APIs ("cudnn_api" in every line).
//
// --sums (GPU, bf16/fp16, graph API) adds a line per cuDNN-path shape, "pass": "fwd_sums": the forward as one cuDNN
// graph with each output channel's sum and sum of squares (conv2d_graph_forward_with_sums, the statistics batch norm
// takes next), to set beside "fwd"; "error" where cuDNN has no engine for that graph. Not in the totals.
// --accumulate (GPU, bf16/fp16) adds two lines per cuDNN-path shape but the stem: "dx_add", the backward-data pass
// and a separate addition of its result into a gradient sum (a residual block's input), and "dx_accumulate", the two
// as one cuDNN graph (conv2d_graph_backward_data_accumulate, which nn::conv2d's backward takes where it can); "error"
// where cuDNN has no engine for that graph. Not in the totals.
//
// Timing: `--iters` (10) passes back to back between two CUDA events, the median of `--steps` (10) such blocks
// after `--warmup` (2) blocks, divided by `--iters`; the first warm-up pass is where cuDNN's algorithms (or
// cuBLASLt's) are chosen, so it is never timed. Passes queued back to back hide the host's per-call work behind
// the GPU's, as in a training step.
//
// One JSON line per (shape, pass), with TFLOP/s = 2 N C_out OH OW C_in K^2 / time (the same count for all three
// passes), then one line per pass with the count-weighted total ("summary": the net): the time one training step
// of the net spends in that pass. The stem's dx is measured but left out of the dx total ("in_step": false): a
// training step never computes the gradient of its input images.
//
// --quick: batch 2, spatial size / 8, one pass per block, one block: checks that the code runs (CTest:
// bench.conv_quick, bench.conv_quick_resnet18_cifar), on the CPU where there is no GPU; its figures mean nothing.
// There the matmul path runs the same products on the CPU, and the cuDNN path stands in as nn::conv2d through
// autograd (im2col + matmul, or the matrix-product branch), with no separate passes: dx and dw are then forward +
// backward with only x, or only w, requiring a gradient (the forward included in the time).
#include <algorithm>
#include <array>
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
#include "json_text.h"   // bench::json_escape
#include "kiln/kiln.h"
#include "kiln/layers/cuda/conv_cudnn.h"  // nn::cuda_impl::conv2d_forward, conv2d_backward_data, conv2d_backward_filter
#include "kiln/layers/cuda/conv_cudnn_graph.h"  // set_conv2d_graph_api, conv2d_graph_forward_with_sums
#include "kiln/tensor/cuda.h"                   // cuda::is_available
#include "kiln/tensor/internal_ops.h"  // internal::mm, internal::view, internal::permute, internal::transpose: raw ops, nothing recorded

using namespace kiln;
using bench::json_escape;

namespace {

// A ResNet as far as its convolutions go: the stem, the optional max pool, the block type and the stages.
struct Net {
  const char* name;   // --net, and the "net" / "summary" of the JSON lines
  const char* title;  // for people
  int64_t n, hw;      // batch and input size
  int64_t stem_k, stem_stride;
  bool max_pool;        // 3x3/2, padding 1, after the stem
  bool bottleneck;      // Bottleneck (1x1, 3x3 strided, 1x1 x4) or BasicBlock (3x3 strided, 3x3)
  int64_t blocks[4];    // per stage; widths 64, 128, 256, 512
  int convs, distinct;  // what the walk must give at the full size: a check on it
};

constexpr Net kNets[] = {
    {"resnet50", "ResNet-50", 256, 224, 7, 2, true, true, {3, 4, 6, 3}, 53, 23},
    {"resnet18_cifar", "ResNet-18 (CIFAR stem)", 512, 32, 3, 1, false, false, {2, 2, 2, 2}, 20, 11},
};

struct ConvShape {
  int64_t c_in, c_out, hw, k, stride;  // hw: the input's height and width; padding k / 2
  int count;                           // how many of the net's convolutions have this shape
};

int64_t out_size(int64_t hw, int64_t k, int64_t stride) { return (hw + 2 * (k / 2) - k) / stride + 1; }

// A net's convolutions for an input of hw x hw: distinct shapes block by block (a block's own convs, then its
// shortcut's downsample), each with its count. Walked from the architecture rather than written out, so the counts
// cannot drift from it; bench/pytorch_conv.py walks it the same way, so --shape INDEX means the same shape on both
// sides. The downsample rule is nn::models::ResNet's (and torchvision's): stride != 1 or a change of width.
std::vector<ConvShape> resnet_convs(const Net& net, int64_t hw) {
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
  add(3, 64, hw, net.stem_k, net.stem_stride);  // the stem
  hw = out_size(hw, net.stem_k, net.stem_stride);
  if (net.max_pool) hw = out_size(hw, 3, 2);
  int64_t in = 64;
  const int64_t expansion = net.bottleneck ? 4 : 1;
  constexpr int64_t kWidths[] = {64, 128, 256, 512};
  for (int stage = 0; stage < 4; ++stage) {
    const int64_t width = kWidths[stage], out = expansion * width;
    for (int64_t b = 0; b < net.blocks[stage]; ++b) {
      const int64_t stride = stage > 0 && b == 0 ? 2 : 1;
      const int64_t next = out_size(hw, 3, stride);
      if (net.bottleneck) {
        add(in, width, hw, 1, 1);          // conv1
        add(width, width, hw, 3, stride);  // conv2, strided in the first block of stages 2-4 (v1.5)
        add(width, out, next, 1, 1);       // conv3
      } else {
        add(in, width, hw, 3, stride);  // conv1, strided in the first block of stages 2-4
        add(width, width, next, 3, 1);  // conv2
      }
      if (stride != 1 || in != out) add(in, out, hw, 1, stride);  // the shortcut's downsample
      in = out;
      hw = next;
    }
  }
  return shapes;
}

// Whether nn::conv2d runs this shape as one matrix product: 1x1, stride 1 (so no padding; groups are 1 and the
// input channels-last in every case here). The same test as kiln/layers/conv.cpp's.
bool matmul_shape(const ConvShape& c) { return c.k == 1 && c.stride == 1; }

enum class PathMode { Auto, Cudnn };

struct Settings {
  const Net* net = &kNets[0];
  PathMode path = PathMode::Auto;
  bool graph_api = true;            // --cudnn-api graph (default) or legacy
  Device device = Device::cuda(0);  // the CPU only for --quick without a GPU (a smoke run of the code)
  DType dtype = DType::BFloat16;
  const char* dtype_name = "bf16";
  int shape = -1;  // -1: all
  int iters = 10, steps = 10, warmup = 2;
  int64_t n = 256, hw = 224;
  bool quick = false;
  bool sums = false;        // --sums: also the forward with its channel sums
  bool accumulate = false;  // --accumulate: also dx added into a gradient sum, separately and fused
};

// The path this shape's passes take: "matmul" or "cudnn".
const char* path_of(const Settings& s, const ConvShape& c) {
  return s.path == PathMode::Auto && matmul_shape(c) ? "matmul" : "cudnn";
}

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

// The fields every line of one shape starts with.
std::string case_fields(const Settings& s, int index, const ConvShape& c) {
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "\"bench\": \"conv\", \"impl\": \"kiln\", \"net\": \"%s\", \"dtype\": \"%s\", \"shape\": %d, "
                "\"n\": %lld, \"c_in\": %lld, \"c_out\": %lld, \"hw\": %lld, \"k\": %lld, \"stride\": %lld, "
                "\"count\": %d, \"path\": \"%s\", \"cudnn_api\": \"%s\"",
                s.net->name, s.dtype_name, index, static_cast<long long>(s.n), static_cast<long long>(c.c_in),
                static_cast<long long>(c.c_out), static_cast<long long>(c.hw), static_cast<long long>(c.k),
                static_cast<long long>(c.stride), c.count, path_of(s, c), s.graph_api ? "graph" : "legacy");
  return buf;
}

// The three passes of a shape on the matmul path: the products pointwise_conv2d (forward) and
// PointwiseConvolutionBackward (dx, dw) hand to internal::mm, on views of the same x, w and dy. internal::view, unlike
// reshape, never copies (it throws where it would have to), so every operand here is a view of x's, w's or dy's memory:
// (N, C, H, W) channels-last is NHWC, i.e. (N H W, C) rows, and the 1x1 weight (C_out, C_in, 1, 1) is (C_out, C_in) in
// either memory format. Nor does internal::mm copy them: the CUDA backend (kiln/tensor/cuda/matmul.cpp) hands cuBLASLt
// a row-major operand as it is and a transposed one (w^T, dy_rows^T: unit stride along the rows) as column-major with
// the transpose flag; it copies only an operand with no unit stride, which none of these is. The products' outputs are
// new tensors, as in nn::conv2d: (N H W, C_out) rows are y in channels-last, (N H W, C_in) rows dx in channels-last (in
// a residual block the node adds dx into the shortcut's gradient instead, beta = 1: not timed here), and dw = dy_rows^T
// rows is (C_out, C_in), the weight's gradient in its own layout. On the way to the weight's .grad, autocast's cast
// back to float32 is not timed here.
std::array<std::function<void()>, 3> matmul_passes(const Tensor& x, const Tensor& w, const Tensor& dy) {
  const int64_t n = x.size(0), c_in = x.size(1), h = x.size(2), wd = x.size(3), c_out = w.size(0);
  const Tensor rows = internal::view(internal::permute(x, {0, 2, 3, 1}), {n * h * wd, c_in});       // (N H W, C_in)
  const Tensor dy_rows = internal::view(internal::permute(dy, {0, 2, 3, 1}), {n * h * wd, c_out});  // (N H W, C_out)
  const Tensor w2 = internal::view(w, {c_out, c_in});                                               // (C_out, C_in)
  const Tensor w2_t = internal::transpose(w2, 0, 1);                                                // (C_in, C_out)
  const Tensor dy_rows_t = internal::transpose(dy_rows, 0, 1);                                      // (C_out, N H W)
  return {
      [rows, w2_t] { (void)internal::mm(rows, w2_t); },            // y rows (N H W, C_out): x w^T
      [dy_rows, w2] { (void)internal::mm(dy_rows, w2); },          // dx rows (N H W, C_in): g w
      [dy_rows_t, rows] { (void)internal::mm(dy_rows_t, rows); },  // dw (C_out, C_in): g^T x
  };
}

void print_error(const std::string& fields, const std::exception& e) {
  std::string what = e.what();
  if (what.size() > 400) what.resize(400);
  std::printf("{%s, \"error\": \"%s\"}\n", fields.c_str(), json_escape(what).c_str());
  std::fflush(stdout);
}

// A line for one of the fused cuDNN graphs (not in the totals): its time, or why cuDNN has no engine for it. `run`
// runs the graph once, returning false (with the reason in *why_not) where it did not.
void fused_line(const Settings& s, const std::string& fields, double flop, const char* graph,
                const std::function<bool(std::string*)>& run) {
  try {
    std::string why_not = "the graph API path is off for this problem";
    if (!run(&why_not)) {
      std::printf("{%s, \"error\": \"no cuDNN engine for %s: %s\"}\n", fields.c_str(), graph,
                  json_escape(why_not).c_str());
    } else {
      const double ms = ms_per_pass(s, [&] { (void)run(nullptr); });
      std::printf("{%s, \"ms\": %.4f, \"tflops\": %.1f, \"in_step\": false}\n", fields.c_str(), ms, flop / ms / 1e9);
    }
    std::fflush(stdout);
  } catch (const std::exception& e) {
    print_error(fields, e);
  }
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

  std::array<std::function<void()>, 3> passes;
  // Only for the CPU's stand-in for cuDNN (see the top), where only the one leaf requires a gradient; they outlive
  // the passes, which hold them by reference.
  Tensor x_leaf = x.detach(), w_leaf = w.detach();
  if (std::string(path_of(s, c)) == "matmul") {
    passes = matmul_passes(x, w, dy);  // the same products on the CPU (--quick) as on a GPU
  } else {
    // On a GPU, kiln's cuDNN passes themselves; on the CPU (--quick), nn::conv2d through autograd (see the top).
    const nn::cuda_impl::ConvGeometry g{.stride = {c.stride, c.stride}, .padding = {pad, pad}};
    const nn::Conv2dOptions o{.stride = c.stride, .padding = pad, .bias = false};
    x_leaf.requires_grad_();
    w_leaf.requires_grad_();
    const bool gpu = s.device.is_cuda();
    passes = {
        [=] {
          if (gpu) {
            (void)nn::cuda_impl::conv2d_forward(x, w, g, cl);  // (N, C_out, OH, OW)
          } else {
            NoGradGuard no_grad;
            (void)nn::conv2d(x, w, {}, o);
          }
        },
        [=, &x_leaf] {
          if (gpu) {
            (void)nn::cuda_impl::conv2d_backward_data(dy, w, x.shape(), g, cl);  // (N, C_in, H, W)
          } else {
            x_leaf.mutable_grad() = Tensor();
            nn::conv2d(x_leaf, w, {}, o).backward(dy);
          }
        },
        [=, &w_leaf] {
          if (gpu) {
            (void)nn::cuda_impl::conv2d_backward_filter(dy, x, w.shape(), g, cl);  // (C_out, C_in, K, K)
          } else {
            w_leaf.mutable_grad() = Tensor();
            nn::conv2d(x, w_leaf, {}, o).backward(dy);
          }
        },
    };
  }
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
      print_error(fields, e);
      totals.failed[p] = true;
    }
    std::fflush(stdout);
  }
  if (!s.device.is_cuda() || std::string(path_of(s, c)) != "cudnn") return;
  const nn::cuda_impl::ConvGeometry g{.stride = {c.stride, c.stride}, .padding = {pad, pad}};
  if (s.sums) {
    const Tensor y = empty({s.n, c.c_out, oh, oh}, opts).contiguous(cl);
    const TensorOptions f32{.dtype = DType::Float32, .device = s.device};
    const nn::cuda_impl::ConvChannelSums sums{empty({c.c_out}, f32), empty({c.c_out}, f32)};
    fused_line(s, case_fields(s, index, c) + ", \"pass\": \"fwd_sums\"", flop, "the convolution + statistics graph",
               [&](std::string* why_not) {
                 return nn::cuda_impl::conv2d_graph_forward_with_sums(x, w, y, sums, g, /*channels_last=*/true,
                                                                      why_not);
               });
  }
  if (s.accumulate && !stem) {
    // dx added into a gradient sum: the pass and a separate addition (what runs where the fused graph is off or has
    // no engine), then the fused graph. The sum's values grow with every pass; only the time is of interest.
    Tensor sum = randn(x.shape(), opts).contiguous(cl);
    const std::string fields = case_fields(s, index, c);
    try {
      const double ms =
          ms_per_pass(s, [&] { internal::add_(sum, nn::cuda_impl::conv2d_backward_data(dy, w, x.shape(), g, cl)); });
      std::printf("{%s, \"pass\": \"dx_add\", \"ms\": %.4f, \"tflops\": %.1f, \"in_step\": false}\n", fields.c_str(),
                  ms, flop / ms / 1e9);
    } catch (const std::exception& e) {
      print_error(fields + ", \"pass\": \"dx_add\"", e);
    }
    fused_line(
        s, fields + ", \"pass\": \"dx_accumulate\"", flop, "the backward-data + add graph", [&](std::string* why_not) {
          return nn::cuda_impl::conv2d_graph_backward_data_accumulate(sum, w, dy, g, /*channels_last=*/true, why_not);
        });
  }
}

void print_shapes(FILE* out, const Net& net, const std::vector<ConvShape>& shapes) {
  std::fprintf(out, "%s's distinct convolutions at %lldx%lld (--net %s --shape INDEX; the path --path auto takes):\n",
               net.title, static_cast<long long>(net.hw), static_cast<long long>(net.hw), net.name);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const ConvShape& c = shapes[i];
    std::fprintf(out, "  %2zu: %4lld -> %4lld  %lldx%lld/%lld  on %3lldx%-3lld  x%-2d  %s\n", i,
                 static_cast<long long>(c.c_in), static_cast<long long>(c.c_out), static_cast<long long>(c.k),
                 static_cast<long long>(c.k), static_cast<long long>(c.stride), static_cast<long long>(c.hw),
                 static_cast<long long>(c.hw), c.count, matmul_shape(c) ? "matmul" : "cudnn");
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
  auto usage = [&] {
    std::fprintf(
        stderr,
        "usage: bench_conv [--net resnet50|resnet18_cifar] [--path auto|cudnn] [--cudnn-api graph|legacy] "
        "[--dtype bf16|fp16] [--shape INDEX] [--iters N] [--steps N] [--warmup N] [--sums] [--accumulate] [--quick]\n");
    print_shapes(stderr, *s.net, resnet_convs(*s.net, s.net->hw));
    return 2;
  };
  int iters = -1, steps = -1, warmup = -1;  // -1: the default of the mode
  const char* shape_arg = nullptr;          // checked once --net is known
  bool help = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--quick") {
      s.quick = true;
    } else if (a == "--sums") {
      s.sums = true;
    } else if (a == "--accumulate") {
      s.accumulate = true;
    } else if (a == "--help" || a == "-h") {
      help = true;
    } else if (a == "--net" && has_value) {
      const std::string name = argv[++i];
      const Net* found = nullptr;
      for (const Net& net : kNets) {
        if (name == net.name) found = &net;
      }
      if (found == nullptr) {
        std::fprintf(stderr, "bench_conv: --net must be resnet50 or resnet18_cifar, got '%s'\n", name.c_str());
        return usage();
      }
      s.net = found;
    } else if (a == "--path" && has_value) {
      const std::string p = argv[++i];
      if (p == "auto") {
        s.path = PathMode::Auto;
      } else if (p == "cudnn") {
        s.path = PathMode::Cudnn;
      } else {
        std::fprintf(stderr, "bench_conv: --path must be auto or cudnn, got '%s'\n", p.c_str());
        return usage();
      }
    } else if (a == "--cudnn-api" && has_value) {
      const std::string api = argv[++i];
      if (api != "graph" && api != "legacy") {
        std::fprintf(stderr, "bench_conv: --cudnn-api must be graph or legacy, got '%s'\n", api.c_str());
        return usage();
      }
      s.graph_api = api == "graph";
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
      shape_arg = argv[++i];
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
  const Net& net = *s.net;
  const std::vector<ConvShape> full = resnet_convs(net, net.hw);
  int convs = 0;
  for (const ConvShape& c : full) convs += c.count;
  if (convs != net.convs || static_cast<int>(full.size()) != net.distinct) {  // the walk is wrong: say so
    std::fprintf(stderr, "bench_conv: %s walked to %d convolutions in %zu shapes, expected %d in %d\n", net.name, convs,
                 full.size(), net.convs, net.distinct);
    return 1;
  }
  if (help) {
    usage();
    return 0;
  }
  if (shape_arg != nullptr) {
    const std::optional<int> v = parse_count(shape_arg);
    if (!v || *v >= static_cast<int>(full.size())) {
      std::fprintf(stderr, "bench_conv: --shape takes an index from 0 to %zu for %s (the list below), got '%s'\n",
                   full.size() - 1, net.name, shape_arg);
      return usage();
    }
    s.shape = *v;
  }
  s.n = net.n;
  s.hw = net.hw;
  if (s.quick) {
    s.n = 2;
    s.hw = net.hw / 8;
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
    nn::cuda_impl::set_conv2d_graph_api(s.graph_api);
  }
  manual_seed(1234);
  const std::vector<ConvShape> shapes = resnet_convs(net, s.hw);  // the same walk at --quick's size
  const char* mode = s.path == PathMode::Auto ? "auto" : "cudnn";
  std::printf(
      "kiln %s conv on %s: %s, %s, batch %lld, %lldx%lld input, channels-last, --path %s (%s), cuDNN's %s API; %d "
      "passes per block, median of %d blocks after %d\n",
      KILN_VERSION_STRING, s.device.str().c_str(), net.name, s.dtype_name, static_cast<long long>(s.n),
      static_cast<long long>(s.hw), static_cast<long long>(s.hw), mode,
      s.path == PathMode::Auto ? "as nn::conv2d: stride-1 1x1 shapes as matrix products, the rest through cuDNN"
                               : "every shape through cuDNN",
      s.graph_api ? "graph" : "legacy convolution", s.iters, s.steps, s.warmup);
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
          "\"summary\": \"%s\", \"path\": \"%s\", \"cudnn_api\": \"%s\", \"pass\": \"%s\", \"layers\": %d, \"ms\": "
          "%.3f, "
          "\"tflops\": %.1f}\n",
          s.dtype_name, static_cast<long long>(s.n), static_cast<long long>(s.hw), net.name, mode,
          s.graph_api ? "graph" : "legacy", kPasses[p], totals.layers[p], totals.ms[p],
          totals.flop[p] / totals.ms[p] / 1e9);
    }
  }
  return 0;
}
