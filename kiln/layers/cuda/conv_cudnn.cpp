// 2-d convolution through cuDNN (conv_cudnn.h): each pass goes to the graph API first (conv_cudnn_graph.h, float16
// and bfloat16), else to the legacy convolution API here: descriptors, the per-problem algorithm cache, and the three
// passes (forward, backward-data, backward-filter) written once over a pass trait.
#include "kiln/layers/cuda/conv_cudnn.h"
#include "kiln/tensor/trace.h"  // a range per kernel entry

#include <cudnn.h>  // the convolution API

#include <algorithm>
#include <climits>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "kiln/layers/conv.h"                   // nn::cudnn_benchmark
#include "kiln/layers/cuda/conv_cudnn_graph.h"  // conv2d_graph_pass, ConvPass
#include "kiln/layers/cuda/cudnn_util.h"        // cudnn_handle, workspace, cudnn_dtype, KILN_CUDNN_CHECK
#include "kiln/tensor/cuda.h"                   // cuda::allow_tf32
#include "kiln/tensor/determinism.h"            // kiln::deterministic
#include "kiln/tensor/error.h"                  // KILN_CHECK, OutOfMemoryError
#include "kiln/tensor/internal_ops.h"           // internal::empty, internal::contiguous

namespace kiln::nn::cuda_impl {

namespace {

constexpr const char* kOp = "conv2d";

// ---------------------------------------------------------------- descriptors

template <typename T, cudnnStatus_t (*Create)(T*), cudnnStatus_t (*Destroy)(T)>
class Descriptor {
 public:
  Descriptor() { KILN_CUDNN_CHECK(Create(&d_), kOp); }
  ~Descriptor() {
    if (d_ != nullptr) Destroy(d_);  // a destructor must not throw; destroying a valid descriptor cannot fail
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  T get() const { return d_; }

 private:
  T d_ = nullptr;
};
using TensorDescriptor = Descriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDescriptor = Descriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvDescriptor =
    Descriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor, cudnnDestroyConvolutionDescriptor>;

int to_int(int64_t v) { return static_cast<int>(v); }  // conv2d_supported() has checked that every extent fits

int64_t out_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

// input (N, C_in, H, W), weight (C_out, C_in / groups, KH, KW) -> (N, C_out, OH, OW).
Shape output_shape(const Shape& x, const Shape& w, const ConvGeometry& g) {
  return {x[0], w[0], out_size(x[2], w[2], g.stride[0], g.padding[0], g.dilation[0]),
          out_size(x[3], w[3], g.stride[1], g.padding[1], g.dilation[1])};
}

// A dense (N, C, H, W) tensor in NCHW or NHWC order. The strides are computed from the shape rather than
// read from the tensor: a tensor contiguous in a format may carry any stride on its size-1 dims, and the
// canonical ones address the same elements.
void set_tensor(cudnnTensorDescriptor_t d, cudnnDataType_t dtype, const Shape& s, bool channels_last) {
  const int n = to_int(s[0]), c = to_int(s[1]), h = to_int(s[2]), w = to_int(s[3]);
  if (channels_last) {
    KILN_CUDNN_CHECK(cudnnSetTensor4dDescriptorEx(d, dtype, n, c, h, w, h * w * c, 1, w * c, c), kOp);
  } else {
    KILN_CUDNN_CHECK(cudnnSetTensor4dDescriptorEx(d, dtype, n, c, h, w, c * h * w, h * w, w, 1), kOp);
  }
}

// Float32 may use TF32 tensor cores only when the user allows it (cuda::allow_tf32, on by default as for
// matmuls); FMA math keeps full float32 products. Half types run on tensor cores with float accumulation.
cudnnMathType_t base_math(DType dtype) {
  switch (dtype) {
    case DType::Float32: return cuda::allow_tf32() ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
    case DType::Float16:
    case DType::BFloat16: return CUDNN_TENSOR_OP_MATH;
    default: return CUDNN_DEFAULT_MATH;
  }
}

// The cache key: everything an algorithm choice depends on. Pointer alignment is in it because some kernels
// need 16-byte aligned operands, and a view into a tensor may start anywhere; the deterministic-mode switch
// (last) because it narrows the candidates.
using Key = std::array<int64_t, 23>;

// One convolution as cuDNN sees it: x (N, C_in, H, W), w (C_out, C_in / groups, KH, KW), y (N, C_out, OH, OW),
// all of one dtype and one memory format, and the three data pointers (the pass writes one of them).
struct Problem {
  Problem(const Tensor& like, const Shape& x_shape, const Shape& w_shape, const ConvGeometry& g, bool channels_last,
          ConvPass pass, void* x_ptr, void* w_ptr, void* y_ptr)
      : handle(cudnn_handle(like)),
        dtype(cudnn_dtype(like.dtype(), kOp)),
        math(base_math(like.dtype())),
        deterministic(::kiln::deterministic()),
        benchmark(nn::cudnn_benchmark() && !deterministic),
        x_data(x_ptr),
        w_data(w_ptr),
        y_data(y_ptr) {
    const Shape y_shape = output_shape(x_shape, w_shape, g);
    set_tensor(x.get(), dtype, x_shape, channels_last);
    set_tensor(y.get(), dtype, y_shape, channels_last);
    KILN_CUDNN_CHECK(
        cudnnSetFilter4dDescriptor(w.get(), dtype, channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                   to_int(w_shape[0]), to_int(w_shape[1]), to_int(w_shape[2]), to_int(w_shape[3])),
        kOp);
    // Half types accumulate in float; float64 in double.
    const cudnnDataType_t compute = dtype == CUDNN_DATA_DOUBLE ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    KILN_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv.get(), to_int(g.padding[0]), to_int(g.padding[1]),
                                                     to_int(g.stride[0]), to_int(g.stride[1]), to_int(g.dilation[0]),
                                                     to_int(g.dilation[1]), CUDNN_CROSS_CORRELATION, compute),
                     kOp);
    KILN_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv.get(), to_int(g.groups)), kOp);
    KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(conv.get(), math), kOp);
    key = join_key(
        std::array<int64_t, 7>{
            static_cast<int64_t>(pass), like.device().index(), static_cast<int64_t>(like.dtype()),
            channels_last ? 1 : 0, static_cast<int64_t>(math), benchmark ? 1 : 0,
            std::min({pointer_alignment(x_ptr), pointer_alignment(w_ptr), pointer_alignment(y_ptr)})},
        conv_key_dims(x_shape, w_shape, g), std::array<int64_t, 2>{g.groups, deterministic ? 1 : 0});
  }

  cudnnHandle_t handle;  // on the current kiln stream of the tensors' device
  cudnnDataType_t dtype;
  cudnnMathType_t math;  // the descriptor's math type before an algorithm sets its own
  // Read once, so the key and the search agree. Deterministic mode chooses by the heuristics only: timing
  // could pick another (deterministic, but differently rounding) algorithm in another process.
  bool deterministic;
  bool benchmark;
  TensorDescriptor x, y;
  FilterDescriptor w;
  ConvDescriptor conv;
  void* x_data;
  void* w_data;
  void* y_data;
  Key key{};
};

// ---------------------------------------------------------------- the three passes

// The three operands of a problem: x (or dx), w (or dw), y (or dy).
enum class Role { X, W, Y };

template <Role R>
auto descriptor(const Problem& p) {
  if constexpr (R == Role::X) return p.x.get();
  else if constexpr (R == Role::W) return p.w.get();
  else return p.y.get();
}

template <Role R>
void* data(const Problem& p) {
  if constexpr (R == Role::X) return p.x_data;
  else if constexpr (R == Role::W) return p.w_data;
  else return p.y_data;
}

// A pass through cuDNN's five calls for it, which all take the operands in one order: the two the pass reads (A,
// B), then the one it writes (Out).
template <typename PerfT, typename AlgoT, auto kMaxCount, auto kHeuristics, auto kFind, auto kWorkspaceSize, auto kRun,
          Role A, Role B, Role Out, const char* kPassName>
struct Pass {
  using Perf = PerfT;
  using Algo = AlgoT;
  static constexpr const char* kName = kPassName;
  static cudnnStatus_t max_count(const Problem& p, int* n) { return kMaxCount(p.handle, n); }
  static cudnnStatus_t heuristics(const Problem& p, int requested, int* n, Perf* out) {
    return kHeuristics(p.handle, descriptor<A>(p), descriptor<B>(p), p.conv.get(), descriptor<Out>(p), requested, n,
                       out);
  }
  static cudnnStatus_t find(const Problem& p, int requested, int* n, Perf* out, void* ws, size_t bytes) {
    return kFind(p.handle, descriptor<A>(p), data<A>(p), descriptor<B>(p), data<B>(p), p.conv.get(), descriptor<Out>(p),
                 data<Out>(p), requested, n, out, ws, bytes);
  }
  static cudnnStatus_t workspace_size(const Problem& p, Algo a, size_t* bytes) {
    return kWorkspaceSize(p.handle, descriptor<A>(p), descriptor<B>(p), p.conv.get(), descriptor<Out>(p), a, bytes);
  }
  static cudnnStatus_t run(const Problem& p, Algo a, void* ws, size_t bytes, const void* alpha, const void* beta) {
    return kRun(p.handle, alpha, descriptor<A>(p), data<A>(p), descriptor<B>(p), data<B>(p), p.conv.get(), a, ws, bytes,
                beta, descriptor<Out>(p), data<Out>(p));
  }
};

constexpr char kForward[] = "forward";
constexpr char kBackwardData[] = "backward-data";
constexpr char kBackwardFilter[] = "backward-filter";

// y = conv(x, w)
using ForwardPass =
    Pass<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t, cudnnGetConvolutionForwardAlgorithmMaxCount,
         cudnnGetConvolutionForwardAlgorithm_v7, cudnnFindConvolutionForwardAlgorithmEx,
         cudnnGetConvolutionForwardWorkspaceSize, cudnnConvolutionForward, Role::X, Role::W, Role::Y, kForward>;
// dx = conv_backward_data(w, dy)
using BackwardDataPass =
    Pass<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t,
         cudnnGetConvolutionBackwardDataAlgorithmMaxCount, cudnnGetConvolutionBackwardDataAlgorithm_v7,
         cudnnFindConvolutionBackwardDataAlgorithmEx, cudnnGetConvolutionBackwardDataWorkspaceSize,
         cudnnConvolutionBackwardData, Role::W, Role::Y, Role::X, kBackwardData>;
// dw = conv_backward_filter(x, dy)
using BackwardFilterPass =
    Pass<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t,
         cudnnGetConvolutionBackwardFilterAlgorithmMaxCount, cudnnGetConvolutionBackwardFilterAlgorithm_v7,
         cudnnFindConvolutionBackwardFilterAlgorithmEx, cudnnGetConvolutionBackwardFilterWorkspaceSize,
         cudnnConvolutionBackwardFilter, Role::X, Role::Y, Role::W, kBackwardFilter>;

// ---------------------------------------------------------------- the algorithm cache

struct Choice {
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  size_t workspace_bytes = 0;
};

struct AlgorithmCache {
  std::mutex mutex;
  std::unordered_map<Key, Choice, ArrayHash> choices;
};

// Never destroyed: threads may convolve until the process exits.
AlgorithmCache& algorithm_cache() {
  static auto* cache = new AlgorithmCache;
  return *cache;
}

std::optional<Choice> cached_choice(const Key& key) {
  AlgorithmCache& c = algorithm_cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto it = c.choices.find(key);
  if (it == c.choices.end()) return std::nullopt;
  return it->second;
}

void cache_choice(const Key& key, const Choice& choice) {
  AlgorithmCache& c = algorithm_cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.choices.emplace(key, choice);  // a choice another thread made meanwhile stays: either is fine
}

bool is_not_supported(cudnnStatus_t s) {
  return static_cast<int>(s) / 1000 == static_cast<int>(CUDNN_STATUS_NOT_SUPPORTED) / 1000;
}

// Whether a candidate may run: it succeeded in the search, it is deterministic when deterministic mode is on
// (kiln/tensor/determinism.h), and for float32 without TF32 it uses no tensor cores (which would round float32 inputs
// to TF32's 10-bit mantissa).
template <typename Perf>
bool usable(const Perf& perf, const Problem& p) {
  if (perf.status != CUDNN_STATUS_SUCCESS) return false;
  if (p.deterministic && perf.determinism != CUDNN_DETERMINISTIC) return false;
  if (p.dtype == CUDNN_DATA_FLOAT && p.math == CUDNN_FMA_MATH) {
    return perf.mathType != CUDNN_TENSOR_OP_MATH && perf.mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
  }
  // Down-conversion of float32 data to half precision is never wanted.
  return !(p.dtype == CUDNN_DATA_FLOAT && perf.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION);
}

// The math type to run a candidate with: its own, except that float32 without TF32 stays on FMA math
// (a candidate reporting DEFAULT math would be allowed TF32 on Ampere and later).
template <typename Perf>
cudnnMathType_t run_math(const Perf& perf, const Problem& p) {
  return p.math == CUDNN_FMA_MATH ? CUDNN_FMA_MATH : perf.mathType;
}

template <typename P>
int requested_count(const Problem& p) {
  int n = 0;
  KILN_CUDNN_CHECK(P::max_count(p, &n), kOp);
  return std::max(n, 1);
}

// Default mode: cuDNN's heuristics, best first.
template <typename P>
std::vector<typename P::Perf> heuristic_candidates(const Problem& p) {
  const int requested = requested_count<P>(p);
  std::vector<typename P::Perf> perfs(static_cast<size_t>(requested));
  int n = 0;
  KILN_CUDNN_CHECK(P::heuristics(p, requested, &n, perfs.data()), kOp);
  perfs.resize(static_cast<size_t>(std::clamp(n, 0, requested)));
  return perfs;
}

// Benchmark mode: every algorithm timed on the problem's own buffers (their contents are overwritten where
// the pass writes), fastest first. The workspace offered is the largest any algorithm asks for, or the
// largest of those sizes that the caching allocator can provide; it goes back to the allocator's cache
// afterwards, where the chosen algorithm's workspace is taken from on every run.
template <typename P>
std::vector<typename P::Perf> benchmark_candidates(const Problem& p, const Tensor& like) {
  const int requested = requested_count<P>(p);
  std::vector<size_t> sizes;
  for (int a = 0; a < requested; ++a) {
    size_t bytes = 0;
    if (P::workspace_size(p, static_cast<typename P::Algo>(a), &bytes) == CUDNN_STATUS_SUCCESS) sizes.push_back(bytes);
  }
  std::sort(sizes.begin(), sizes.end(), std::greater<>());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  const size_t reachable = reachable_workspace_bytes(like, kOp);
  Tensor ws;
  size_t ws_bytes = 0;
  for (size_t bytes : sizes) {
    if (bytes > reachable) continue;
    try {
      ws = workspace(like, bytes);
      ws_bytes = bytes;
      break;
    } catch (const OutOfMemoryError&) {
      // try the next smaller size
    }
  }
  std::vector<typename P::Perf> perfs(static_cast<size_t>(requested));
  int n = 0;
  KILN_CUDNN_CHECK(P::find(p, requested, &n, perfs.data(), workspace_ptr(ws), ws_bytes), kOp);
  perfs.resize(static_cast<size_t>(std::clamp(n, 0, requested)));
  return perfs;
}

// Runs pass P on problem p (writing its output with beta = 0), with the cached algorithm, or, the first
// time the problem is seen, with the first candidate that is usable, whose workspace the caching allocator
// can provide and that cuDNN accepts; that choice is cached.
template <typename P>
void run_pass(const Problem& p, const Tensor& like) {
  const double one_d = 1.0, zero_d = 0.0;
  const float one_f = 1.0f, zero_f = 0.0f;
  const bool is_double = p.dtype == CUDNN_DATA_DOUBLE;
  const void* alpha = is_double ? static_cast<const void*>(&one_d) : static_cast<const void*>(&one_f);
  const void* beta = is_double ? static_cast<const void*>(&zero_d) : static_cast<const void*>(&zero_f);

  if (const std::optional<Choice> c = cached_choice(p.key)) {
    KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv.get(), c->math), kOp);
    const Tensor ws = workspace(like, c->workspace_bytes);
    KILN_CUDNN_CHECK(
        P::run(p, static_cast<typename P::Algo>(c->algo), workspace_ptr(ws), c->workspace_bytes, alpha, beta), kOp);
    return;
  }

  const std::vector<typename P::Perf> candidates =
      p.benchmark ? benchmark_candidates<P>(p, like) : heuristic_candidates<P>(p);
  for (const typename P::Perf& perf : candidates) {
    if (!usable(perf, p)) continue;
    const cudnnMathType_t math = run_math(perf, p);
    KILN_CUDNN_CHECK(cudnnSetConvolutionMathType(p.conv.get(), math), kOp);
    size_t bytes = 0;
    if (P::workspace_size(p, perf.algo, &bytes) != CUDNN_STATUS_SUCCESS) continue;
    Tensor ws;
    try {
      ws = workspace(like, bytes);
    } catch (const OutOfMemoryError&) {
      continue;  // a later candidate may need less
    }
    const cudnnStatus_t status = P::run(p, perf.algo, workspace_ptr(ws), bytes, alpha, beta);
    if (is_not_supported(status)) continue;
    KILN_CUDNN_CHECK(status, kOp);
    cache_choice(p.key, Choice{.algo = static_cast<int>(perf.algo), .math = math, .workspace_bytes = bytes});
    return;
  }
  throw NotImplementedError(::kiln::detail::str_cat(
      "conv2d: cuDNN offers no ", p.deterministic ? "deterministic " : "", P::kName, " algorithm that runs for input ",
      Shape{p.key[7], p.key[8], p.key[9], p.key[10]}, ", weight ", Shape{p.key[11], p.key[12], p.key[13], p.key[14]},
      " (", like.dtype(), ", groups ", p.key[21],
      ") within the memory available; free memory (kiln::cuda::empty_cache()) or use a smaller batch",
      p.deterministic ? ", or turn deterministic mode off (kiln::set_deterministic(false))" : ""));
}

void check_operands(const Tensor& a, const Tensor& b, const char* what) {
  KILN_CHECK(a.is_cuda() && a.device() == b.device() && a.dtype() == b.dtype(), "conv2d (cuDNN ", what,
             "): operands must be CUDA tensors of one device and dtype, got ", a.device(), " ", a.dtype(), " and ",
             b.device(), " ", b.dtype());
}

TensorOptions options_like(const Tensor& t, MemoryFormat format) {
  return {.dtype = t.dtype(), .device = t.device(), .memory_format = format};
}

}  // namespace

std::array<int64_t, 14> conv_key_dims(const Shape& x, const Shape& w, const ConvGeometry& g) {
  return {x[0], x[1],        x[2],        x[3],         w[0],         w[1],          w[2],
          w[3], g.stride[0], g.stride[1], g.padding[0], g.padding[1], g.dilation[0], g.dilation[1]};
}

bool conv2d_supported(const Tensor& input, const Tensor& weight, const ConvGeometry& g) {
  if (input.dim() != 4 || weight.dim() != 4 || input.numel() == 0 || weight.numel() == 0) return false;
  const Shape y = output_shape(input.shape(), weight.shape(), g);
  auto fits = [](int64_t v) { return v > 0 && v <= INT_MAX; };
  bool ok = fits(input.numel()) && fits(weight.numel()) && fits(y[2]) && fits(y[3]) && fits(g.groups) &&
            fits(y[0] * y[1]) && fits(y[0] * y[1] * y[2]) && fits(y[0] * y[1] * y[2] * y[3]);
  for (size_t i = 0; i < 2; ++i) {
    ok = ok && fits(g.stride[i]) && fits(g.dilation[i]) && g.padding[i] >= 0 && g.padding[i] <= INT_MAX;
  }
  return ok;
}

Tensor conv2d_forward(const Tensor& input, const Tensor& weight, const ConvGeometry& g, MemoryFormat format) {
  trace::Scope range(trace::Kind::Op, "cudnn_conv2d_forward", input.device(), {&input, &weight});
  check_operands(input, weight, "forward");
  const Tensor x = internal::contiguous(input, format);   // (N, C_in, H, W)
  const Tensor w = internal::contiguous(weight, format);  // (C_out, C_in / groups, KH, KW)
  Tensor y = internal::empty(output_shape(x.shape(), w.shape(), g), options_like(x, format));  // (N, C_out, OH, OW)
  if (conv2d_graph_pass(ConvPass::Forward, x, w, y, g, format == MemoryFormat::ChannelsLast)) return y;
  const Problem p(x, x.shape(), w.shape(), g, format == MemoryFormat::ChannelsLast, ConvPass::Forward, x.data_ptr(),
                  w.data_ptr(), y.data_ptr());
  run_pass<ForwardPass>(p, x);
  return y;
}

Tensor conv2d_backward_data(const Tensor& grad_output, const Tensor& weight, const Shape& input_shape,
                            const ConvGeometry& g, MemoryFormat format) {
  trace::Scope range(trace::Kind::Op, "cudnn_conv2d_backward_data", grad_output.device(), {&grad_output, &weight});
  check_operands(grad_output, weight, "backward-data");
  const Tensor dy = internal::contiguous(grad_output, format);  // (N, C_out, OH, OW)
  const Tensor w = internal::contiguous(weight, format);        // (C_out, C_in / groups, KH, KW)
  KILN_CHECK(dy.shape() == output_shape(input_shape, w.shape(), g), "conv2d backward: a gradient of shape ", dy.shape(),
             " does not match the output ", output_shape(input_shape, w.shape(), g));
  Tensor dx = internal::empty(input_shape, options_like(dy, format));  // (N, C_in, H, W)
  if (conv2d_graph_pass(ConvPass::BackwardData, dx, w, dy, g, format == MemoryFormat::ChannelsLast)) return dx;
  const Problem p(dy, input_shape, w.shape(), g, format == MemoryFormat::ChannelsLast, ConvPass::BackwardData,
                  dx.data_ptr(), w.data_ptr(), dy.data_ptr());
  run_pass<BackwardDataPass>(p, dy);
  return dx;
}

bool conv2d_backward_data_accumulate(const Tensor& grad_output, const Tensor& weight, const Tensor& grad_input_sum,
                                     const ConvGeometry& g, MemoryFormat format) {
  trace::Scope range(trace::Kind::Op, "cudnn_conv2d_backward_data_accumulate", grad_output.device(),
                     {&grad_output, &weight});
  check_operands(grad_output, weight, "backward-data");
  KILN_CHECK(grad_input_sum.defined() && grad_input_sum.dim() == 4 && grad_input_sum.is_contiguous(format),
             "conv2d backward: the gradient sum to add into must be a 4-d tensor dense in the pass's memory format");
  if (!conv2d_backward_data_can_accumulate(g, weight.shape(), grad_output.dtype())) return false;
  const Tensor dy = internal::contiguous(grad_output, format);  // (N, C_out, OH, OW)
  const Tensor w = internal::contiguous(weight, format);        // (C_out, C_in / groups, KH, KW)
  KILN_CHECK(dy.shape() == output_shape(grad_input_sum.shape(), w.shape(), g), "conv2d backward: a gradient of shape ",
             dy.shape(), " does not match the output ", output_shape(grad_input_sum.shape(), w.shape(), g));
  return conv2d_graph_backward_data_accumulate(grad_input_sum, w, dy, g, format == MemoryFormat::ChannelsLast);
}

bool conv2d_backward_data_can_accumulate(const ConvGeometry& g, const Shape& weight_shape, DType dtype) {
  // Strided convolutions with a kernel larger than 1x1 stay with the pass and a separate addition: on the H200 (cuDNN
  // 9.14, bf16, ResNet-18/CIFAR's shapes, bench_conv --accumulate) the fused graph took 0.159 / 0.085 / 0.064 ms for
  // the three strided 3x3 ones against 0.115 / 0.073 / 0.056 separately, where it was faster for every stride-1 3x3
  // (0.106 against 0.140 ms at 64 channels, 32x32) and strided 1x1 one.
  const bool strided = g.stride[0] > 1 || g.stride[1] > 1;
  return (dtype == DType::Float16 || dtype == DType::BFloat16) && g.groups == 1 && weight_shape.size() == 4 &&
         !(strided && weight_shape[2] * weight_shape[3] > 1);
}

Tensor conv2d_backward_filter(const Tensor& grad_output, const Tensor& input, const Shape& weight_shape,
                              const ConvGeometry& g, MemoryFormat format) {
  trace::Scope range(trace::Kind::Op, "cudnn_conv2d_backward_filter", grad_output.device(), {&grad_output, &input});
  check_operands(grad_output, input, "backward-filter");
  const Tensor dy = internal::contiguous(grad_output, format);  // (N, C_out, OH, OW)
  const Tensor x = internal::contiguous(input, format);         // (N, C_in, H, W)
  KILN_CHECK(dy.shape() == output_shape(x.shape(), weight_shape, g), "conv2d backward: a gradient of shape ",
             dy.shape(), " does not match the output ", output_shape(x.shape(), weight_shape, g));
  Tensor dw = internal::empty(weight_shape, options_like(dy, format));  // (C_out, C_in / groups, KH, KW)
  if (conv2d_graph_pass(ConvPass::BackwardFilter, x, dw, dy, g, format == MemoryFormat::ChannelsLast)) return dw;
  const Problem p(dy, x.shape(), weight_shape, g, format == MemoryFormat::ChannelsLast, ConvPass::BackwardFilter,
                  x.data_ptr(), dw.data_ptr(), dy.data_ptr());
  run_pass<BackwardFilterPass>(p, dy);
  return dw;
}

}  // namespace kiln::nn::cuda_impl
