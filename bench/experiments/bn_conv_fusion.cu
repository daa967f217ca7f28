// Experiment: a ResNet convolution together with the batch norm and ReLU before it, as cuDNN's fused convolution
// engines compute it, against kiln's path, on a GPU. The question: how much of the batch-norm time of a ResNet step
// (about 46% of ResNet-50's bf16 step on an H100) goes away when the normalisation moves into the convolutions.
//
// kiln's path, per convolution whose input is relu(bn(y1)) (y1 the previous convolution's output):
//   forward:  nn::cuda_impl::batch_norm_forward (statistics of y1, then y1 normalised, ReLU, a1 written),
//             conv2d_forward(a1);
//   backward: conv2d_backward_data (da1), conv2d_backward_filter(dy, a1) (dW), batch_norm_backward (its reduction
//             over da1 and y1, then dy1).
// The fused path (cuDNN's graph API; the patterns of NVIDIA's ResNet training):
//   forward:  one graph: relu(y1 * scale + bias) as the convolution's prologue, the convolution, and the per-channel
//             sum and sum of squares of its output (genstats) in the epilogue, which give the next batch norm's
//             statistics without a pass of their own; a small kernel turns a layer's sums into scale and bias;
//   backward: one graph: backward-data, the ReLU's mask recomputed from y1 ((y1 - mean) invstd gamma + beta > 0),
//             and the batch norm's weight gradients (dbn_weight: dgamma, dbeta and the coefficients of dy1); one graph:
//             backward-filter with the same prologue as the forward (a1 is never stored); one elementwise kernel for
//             dy1 = eq_dy g + eq_x y1 + eq_b.
// Shapes: the stride-1 3x3 and the last 1x1 convolutions of ResNet-50's bottlenecks at batch 256 (224x224 images), and
// the second 3x3 convolution of ResNet-18's basic blocks on CIFAR images at batch 512, channels-last. Each time is the
// median of 20 runs after 5 (bench::median_step_ms); each fused result is compared with kiln's (largest absolute
// difference, and kiln's largest magnitude); the statistics against float64 sums of the fused output. A graph cuDNN
// cannot build prints the step that failed. At the end, the time per step either path would take over these
// convolutions (each shape times its count in the network).
//
//   nvcc -std=c++20 -O2 -arch=sm_90 --expt-relaxed-constexpr -I . -I build/include -I bench \
//       -I third_party/cudnn_frontend/include bench/experiments/bn_conv_fusion.cu -L build/kiln -lkiln -lcudnn \
//       -lnvrtc -Xlinker -rpath -Xlinker '$ORIGIN' -o bn_conv_fusion
//   ./bn_conv_fusion [bf16|fp16] [name filter]
//
// Not part of the build: a measurement, run where the choice of moving the batch norm into the convolutions is to
// be made.
//
// Known limits, found by reading cuDNN's graph API guide before any GPU run (to settle on the GPU):
// - The guide lists the engines for these patterns (ConvBNfprop, ConvBNwgrad, DgradDreluBNBwdWeight) as float16 only:
//   X, W, dy, scale and bias in FP16 (the batch norm's mean and invstd in FP32). Run fp16 first; a bf16 run is
//   expected to print "no plan" for the forward and backward-data graphs, and kiln's bf16 ResNet steps could then
//   not use this path at all. Variant 0 of the prologue (FP32 scale and bias) is expected to fail for the same
//   reason.
// - The backward-data pattern expects its ADD to subtract the mean (alpha2 = -1), which the frontend cannot express;
//   variant 2 builds (the samples' form) but recomputes the ReLU mask from y1 + mean, so its dy1 and dgamma differ
//   from kiln's and its time is that of a wrong computation. A faithful version passes one tensor holding -mean to
//   both the ADD and dbn_weight and corrects dgamma and the dy1 coefficients per channel afterwards.
// - Each timed step runs alone after a synchronize, so host work (descriptors, the variant pack) is in the time; for
//   the CIFAR shapes, whose kernels take tens of microseconds, times of K back-to-back repetitions per event pair
//   would be fairer.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "experiments/cudnn_graph_bench.h"  // handle, new_graph, finish, execute, plan_name, max_diff
#include "gpu_timing.h"                     // bench::median_step_ms
#include "kiln/kiln.h"
#include "kiln/layers/cuda/batch_norm.h"
#include "kiln/layers/cuda/conv_cudnn.h"
#include "kiln/tensor/cuda/device_types.cuh"  // device_t, to_compute, from_compute
#include "kiln/tensor/internal_ops.h"

using namespace kiln;
using namespace kiln::bench::cudnn_graph;

namespace {

enum Uid : int64_t {
  kX = 1,
  kW,
  kScale,
  kBias,
  kY,
  kSum,
  kSqSum,
  kDy,
  kNegMean,
  kInvstd,
  kGamma,
  kBeta,
  kMean,
  kG,
  kDscale,
  kDbias,
  kEqDy,
  kEqX,
  kEqB,
  kDw
};

// scale = gamma invstd and bias = beta - mean scale per channel from a layer's sums (count elements a channel).
__global__ void finalize_kernel(const float* sum, const float* sq, const float* gamma, const float* beta, int c,
                                float count, float eps, float* scale, float* bias, float* mean_out, float* invstd_out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= c) return;
  const float mean = sum[i] / count, var = fmaxf(sq[i] / count - mean * mean, 0.0f), r = rsqrtf(var + eps);
  scale[i] = gamma[i] * r;
  bias[i] = beta[i] - mean * gamma[i] * r;
  mean_out[i] = mean;
  invstd_out[i] = r;
}

// dx = a g + b x + c, per channel (channels-last: the channel of element e is e % C); 8 elements a thread
// (C % 8 == 0, 16-byte aligned rows). T: kiln's BFloat16 or Half.
template <typename T>
__global__ void dx_kernel(const void* g, const void* x, const float* a, const float* b, const float* c, void* dx,
                          int64_t n8, int channels) {
  using D = cuda::device_t<T>;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n8) return;
  const uint4 gv = static_cast<const uint4*>(g)[i], xv = static_cast<const uint4*>(x)[i];
  const D* gp = reinterpret_cast<const D*>(&gv);
  const D* xp = reinterpret_cast<const D*>(&xv);
  uint4 out;
  D* op = reinterpret_cast<D*>(&out);
  const int ch = static_cast<int>((i * 8) % channels);
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    op[k] = cuda::from_compute<T>(a[ch + k] * cuda::to_compute<T>(gp[k]) + b[ch + k] * cuda::to_compute<T>(xp[k]) +
                                  c[ch + k]);
  }
  static_cast<uint4*>(dx)[i] = out;
}

struct ConvShape {
  const char* net;
  const char* name;
  int64_t n, c, h, w, k, r, stride, pad;
  int count;  // how many convolutions of the network have this shape
};

// NHWC strides of an (n, c, h, w) tensor.
std::vector<int64_t> nhwc(int64_t n, int64_t c, int64_t h, int64_t w) { return {c * h * w, 1, c * w, c}; }

struct Totals {
  double kiln = 0.0, fused = 0.0;
  bool complete = true;
};

void run(const ConvShape& s, DType dt, Totals& totals) {
  const Device dev = Device::cuda(0);
  const TensorOptions io{.dtype = dt, .device = dev};
  const TensorOptions f32{.dtype = DType::Float32, .device = dev};
  const fe::DataType_t fe_io = dt == DType::BFloat16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
  const int64_t oh = (s.h + 2 * s.pad - s.r) / s.stride + 1, ow = (s.w + 2 * s.pad - s.r) / s.stride + 1;
  manual_seed(7);
  NoGradGuard no_grad;
  const Tensor y1 = add(randn({s.n, s.c, s.h, s.w}, io), 0.3).contiguous(MemoryFormat::ChannelsLast);
  const Tensor gamma = add(mul(randn({s.c}, f32), 0.1), 1.0), beta = mul(randn({s.c}, f32), 0.1);
  Tensor rm = zeros({s.c}, f32), rv = ones({s.c}, f32);
  const Tensor wt = mul(randn({s.k, s.c, s.r, s.r}, io), std::sqrt(2.0 / static_cast<double>(s.c * s.r * s.r)))
                        .contiguous(MemoryFormat::ChannelsLast);
  const Tensor dy = mul(randn({s.n, s.k, oh, ow}, io), 0.01).contiguous(MemoryFormat::ChannelsLast);
  const nn::cuda_impl::ConvGeometry geo{.stride = {s.stride, s.stride}, .padding = {s.pad, s.pad}};
  const auto cl = MemoryFormat::ChannelsLast;
  std::printf("%s %s: %lld x %lld x %lld x %lld -> %lld, %lldx%lld stride %lld (x%d in the network)\n", s.net, s.name,
              static_cast<long long>(s.n), static_cast<long long>(s.c), static_cast<long long>(s.h),
              static_cast<long long>(s.w), static_cast<long long>(s.k), static_cast<long long>(s.r),
              static_cast<long long>(s.r), static_cast<long long>(s.stride), s.count);

  // ---- kiln
  auto f = nn::cuda_impl::batch_norm_forward(y1, gamma, beta, rm, rv, true, 0.1, 1e-5, true);
  Tensor y2 = nn::cuda_impl::conv2d_forward(f.y, wt, geo, cl);
  Tensor da1 = nn::cuda_impl::conv2d_backward_data(dy, wt, f.y.shape(), geo, cl);
  Tensor dw = nn::cuda_impl::conv2d_backward_filter(dy, f.y, wt.shape(), geo, cl);
  auto gr = nn::cuda_impl::batch_norm_backward(da1, y1, Tensor(), f.relu_mask, gamma, f.mean, f.invstd, true, {});
  const double k_bn = bench::median_step_ms(
      5, 20, [&] { (void)nn::cuda_impl::batch_norm_forward(y1, gamma, beta, rm, rv, true, 0.1, 1e-5, true); });
  const double k_conv = bench::median_step_ms(5, 20, [&] { (void)nn::cuda_impl::conv2d_forward(f.y, wt, geo, cl); });
  const double k_dgrad =
      bench::median_step_ms(5, 20, [&] { (void)nn::cuda_impl::conv2d_backward_data(dy, wt, f.y.shape(), geo, cl); });
  const double k_wgrad =
      bench::median_step_ms(5, 20, [&] { (void)nn::cuda_impl::conv2d_backward_filter(dy, f.y, wt.shape(), geo, cl); });
  const double k_bnb = bench::median_step_ms(5, 20, [&] {
    (void)nn::cuda_impl::batch_norm_backward(da1, y1, Tensor(), f.relu_mask, gamma, f.mean, f.invstd, true, {});
  });
  const double k_total = k_bn + k_conv + k_dgrad + k_wgrad + k_bnb;
  std::printf("  kiln:  bn+relu %.4f  conv %.4f | dgrad %.4f  wgrad %.4f  bn backward %.4f | total %.4f ms\n", k_bn,
              k_conv, k_dgrad, k_wgrad, k_bnb, k_total);

  // The normalisation's coefficients, as the fused path's finalize kernel gives them from the previous layer's sums.
  const Tensor scale = mul(gamma, f.invstd), bias = sub(beta, mul(f.mean, scale)), neg_mean = mul(f.mean, -1.0);
  const float count = static_cast<float>(s.n * s.h * s.w);
  Tensor sum1 = mul(f.mean, count), sq1 = mul(add(div(1.0, mul(f.invstd, f.invstd)), mul(f.mean, f.mean)),
                                              count);  // var + mean^2 (eps is negligible here)
  Tensor fs = empty({s.c}, f32), fb = empty({s.c}, f32), fm = empty({s.c}, f32), fi = empty({s.c}, f32);
  auto stream = static_cast<cudaStream_t>(cuda::current_stream(0).handle());
  const double t_fin = bench::median_step_ms(5, 20, [&] {
    finalize_kernel<<<static_cast<unsigned>((s.c + 127) / 128), 128, 0, stream>>>(
        sum1.data_ptr<float>(), sq1.data_ptr<float>(), gamma.data_ptr<float>(), beta.data_ptr<float>(),
        static_cast<int>(s.c), count, 0.0f, fs.data_ptr<float>(), fb.data_ptr<float>(), fm.data_ptr<float>(),
        fi.data_ptr<float>());
  });

  auto per_channel = [&](fe::graph::Graph& g, const char* name, int64_t uid, int64_t c,
                         fe::DataType_t type = fe::DataType_t::FLOAT) {
    Attr t = tensor(g, name, uid, {1, c, 1, 1}, {c, 1, c, c});
    t->set_data_type(type);
    return t;
  };
  // The prologue's scale and bias: float, or (variant 1, where cuDNN builds no plan for float ones) the io dtype.
  const Tensor scale_io = scale.to(dt), bias_io = bias.to(dt);
  auto prologue_type = [&](int v) { return v == 0 ? fe::DataType_t::FLOAT : fe_io; };
  auto prologue_ptr = [&](int v, const Tensor& f32_values, const Tensor& io_values) {
    return v == 0 ? f32_values.data_ptr() : io_values.data_ptr();
  };
  auto conv_attrs = [&](auto attrs) {
    return attrs.set_padding({s.pad, s.pad}).set_stride({s.stride, s.stride}).set_dilation({1, 1});
  };
  auto graph = [&] {
    auto g = new_graph();
    g->set_io_data_type(fe_io);
    return g;
  };
  auto report = [&](const char* what, const Built& b, double t) {
    std::printf("  %s: %.4f ms  (plan %s of %lld, built and timed in %.1f s)", what, t, plan_name(*b.graph).c_str(),
                static_cast<long long>(b.plans), b.build_s);
  };
  bool complete = true;
  double fused = t_fin;

  // ---- fused forward: relu(y1 scale + bias) -> convolution -> y2, and y2's per-channel sums
  for (int v = 0; v < 2; ++v) {
    auto g = graph();
    Attr X = tensor(*g, "y1", kX, {s.n, s.c, s.h, s.w}, nhwc(s.n, s.c, s.h, s.w));
    Attr Wt = tensor(*g, "w", kW, {s.k, s.c, s.r, s.r}, nhwc(s.k, s.c, s.r, s.r));
    Attr S = per_channel(*g, "scale", kScale, s.c, prologue_type(v));
    Attr B = per_channel(*g, "bias", kBias, s.c, prologue_type(v));
    Attr a = g->pointwise(X, S, fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::MUL));
    a = g->pointwise(a, B, fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::ADD));
    a = g->pointwise(a, fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::RELU_FWD));
    Attr Y = g->conv_fprop(a, Wt, conv_attrs(fe::graph::Conv_fprop_attributes()));
    Y->set_output(true).set_uid(kY).set_dim({s.n, s.k, oh, ow}).set_stride(nhwc(s.n, s.k, oh, ow)).set_data_type(fe_io);
    auto [Sum, Sq] = g->genstats(Y, fe::graph::Genstats_attributes());
    Sum->set_output(true).set_uid(kSum).set_dim({1, s.k, 1, 1}).set_stride({s.k, 1, s.k, s.k});
    Sum->set_data_type(fe::DataType_t::FLOAT);
    Sq->set_output(true).set_uid(kSqSum).set_dim({1, s.k, 1, 1}).set_stride({s.k, 1, s.k, s.k});
    Sq->set_data_type(fe::DataType_t::FLOAT);
    Tensor y2f = empty_like(y2), sum2 = zeros({s.k}, f32), sq2 = zeros({s.k}, f32);
    Pack pack{{kX, y1.data_ptr()},
              {kW, wt.data_ptr()},
              {kScale, prologue_ptr(v, scale, scale_io)},
              {kBias, prologue_ptr(v, bias, bias_io)},
              {kY, y2f.data_ptr()},
              {kSum, sum2.data_ptr()},
              {kSqSum, sq2.data_ptr()}};
    Built b = finish(g, pack, dev);
    if (!b.graph) {
      std::printf("  fused forward, %s scale and bias: no plan (%s)\n", v == 0 ? "float" : "io-dtype",
                  b.why_not.c_str());
      if (v == 1) complete = false;
    } else {
      const double t = bench::median_step_ms(5, 20, [&] { execute(b, pack); });
      sum2.zero_();
      sq2.zero_();
      execute(b, pack);
      cuda::synchronize();
      const Tensor y64 = y2f.to(DType::Float64);
      const Tensor ref_sum = internal::sum(y64, {0, 2, 3}, false, DType::Float64);
      const Tensor ref_sq = internal::sum(mul(y64, y64), {0, 2, 3}, false, DType::Float64);
      report(v == 0 ? "fused scale-bias-relu-conv-genstats" : "fused scale-bias-relu-conv-genstats (io-dtype scale)", b,
             t);
      std::printf("  y2: max |diff| %.4g of max %.4g; sums: %.3g of %.4g, squares: %.3g of %.4g; finalize %.4f ms\n",
                  max_diff(y2f, y2), max_abs(y2), max_diff(sum2, ref_sum), max_abs(ref_sum), max_diff(sq2, ref_sq),
                  max_abs(ref_sq), t_fin);
      fused += t;
      break;
    }
  }

  // ---- fused backward-data + ReLU mask + the batch norm's weight gradients, then dy1
  // Variants of the mask's recomputation: 0 adds -mean (a tensor of its own); 1 subtracts the mean that dbn_weight
  // takes too; 2 is the form of cuDNN's own sample, which adds that mean (a mask unlike the network's: timing only).
  for (int v = 0; v < 3; ++v) {
    auto g = graph();
    Attr DY = tensor(*g, "dy", kDy, {s.n, s.k, oh, ow}, nhwc(s.n, s.k, oh, ow));
    Attr Wt = tensor(*g, "w", kW, {s.k, s.c, s.r, s.r}, nhwc(s.k, s.c, s.r, s.r));
    Attr D = g->conv_dgrad(DY, Wt, conv_attrs(fe::graph::Conv_dgrad_attributes()));
    D->set_dim({s.n, s.c, s.h, s.w});
    Attr X = tensor(*g, "y1", kX, {s.n, s.c, s.h, s.w}, nhwc(s.n, s.c, s.h, s.w));
    Attr V = per_channel(*g, "invstd", kInvstd, s.c), Mean = per_channel(*g, "mean", kMean, s.c);
    Attr Ga = per_channel(*g, "gamma", kGamma, s.c), Be = per_channel(*g, "beta", kBeta, s.c);
    Attr z = v == 0   ? g->pointwise(X, per_channel(*g, "neg_mean", kNegMean, s.c),
                                     fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::ADD))
             : v == 1 ? g->pointwise(X, Mean, fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::SUB))
                      : g->pointwise(X, Mean, fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::ADD));
    z = g->pointwise(z, V, fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::MUL));
    z = g->pointwise(z, Ga, fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::MUL));
    z = g->pointwise(z, Be, fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::ADD));
    Attr G = g->pointwise(D, z, fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::RELU_BWD));
    G->set_output(true).set_uid(kG).set_data_type(fe_io);
    auto [Dscale, Dbias, EqDy, EqX, EqB] = g->dbn_weight(G, X, Mean, V, Ga, fe::graph::DBN_weight_attributes());
    const std::pair<Attr, int64_t> outs[] = {
        {Dscale, kDscale}, {Dbias, kDbias}, {EqDy, kEqDy}, {EqX, kEqX}, {EqB, kEqB}};
    for (const auto& [t, uid] : outs) t->set_output(true).set_uid(uid).set_data_type(fe::DataType_t::FLOAT);
    Tensor gbuf = empty_like(y1), dscale = zeros({s.c}, f32), dbias = zeros({s.c}, f32), eq_dy = zeros({s.c}, f32),
           eq_x = zeros({s.c}, f32), eq_b = zeros({s.c}, f32), dx = empty_like(y1);
    Pack pack{{kDy, dy.data_ptr()},           {kW, wt.data_ptr()},        {kX, y1.data_ptr()},
              {kInvstd, f.invstd.data_ptr()}, {kGamma, gamma.data_ptr()}, {kBeta, beta.data_ptr()},
              {kMean, f.mean.data_ptr()},     {kG, gbuf.data_ptr()},      {kDscale, dscale.data_ptr()},
              {kDbias, dbias.data_ptr()},     {kEqDy, eq_dy.data_ptr()},  {kEqX, eq_x.data_ptr()},
              {kEqB, eq_b.data_ptr()}};
    if (v == 0) pack[kNegMean] = neg_mean.data_ptr();
    Built b = finish(g, pack, dev);
    if (!b.graph) {
      std::printf("  fused dgrad-drelu-dbn_weight, variant %d: no plan (%s)\n", v, b.why_not.c_str());
      if (v == 2) complete = false;
    } else {
      const double t = bench::median_step_ms(5, 20, [&] { execute(b, pack); });
      const int64_t n8 = y1.numel() / 8;
      auto dx_run = [&] {
        const unsigned blocks = static_cast<unsigned>((n8 + 255) / 256);
        const auto kernel = dt == DType::BFloat16 ? dx_kernel<BFloat16> : dx_kernel<Half>;
        kernel<<<blocks, 256, 0, stream>>>(gbuf.data_ptr(), y1.data_ptr(), eq_dy.data_ptr<float>(),
                                           eq_x.data_ptr<float>(), eq_b.data_ptr<float>(), dx.data_ptr(), n8,
                                           static_cast<int>(s.c));
      };
      const double t_dx = bench::median_step_ms(5, 20, dx_run);
      execute(b, pack);
      dx_run();
      cuda::synchronize();
      report(v == 0   ? "fused dgrad-drelu-dbn_weight"
             : v == 1 ? "fused dgrad-drelu-dbn_weight (mask: y1 - mean)"
                      : "fused dgrad-drelu-dbn_weight (cuDNN's sample's form: y1 + mean, timing only)",
             b, t);
      std::printf("  + dy1 kernel %.4f ms; dy1: max |diff| %.4g of max %.4g; dgamma %.3g of %.4g; dbeta %.3g of %.4g\n",
                  t_dx, max_diff(dx, gr.input), max_abs(gr.input), max_diff(dscale, gr.weight), max_abs(gr.weight),
                  max_diff(dbias, gr.bias), max_abs(gr.bias));
      fused += t + t_dx;
      break;
    }
  }

  // ---- fused backward-filter over relu(y1 scale + bias)
  for (int v = 0; v < 2; ++v) {
    auto g = graph();
    Attr X = tensor(*g, "y1", kX, {s.n, s.c, s.h, s.w}, nhwc(s.n, s.c, s.h, s.w));
    Attr S = per_channel(*g, "scale", kScale, s.c, prologue_type(v));
    Attr B = per_channel(*g, "bias", kBias, s.c, prologue_type(v));
    Attr a = g->pointwise(X, S, fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::MUL));
    a = g->pointwise(a, B, fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::ADD));
    a = g->pointwise(a, fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::RELU_FWD));
    Attr DY = tensor(*g, "dy", kDy, {s.n, s.k, oh, ow}, nhwc(s.n, s.k, oh, ow));
    Attr DW = g->conv_wgrad(DY, a, conv_attrs(fe::graph::Conv_wgrad_attributes()));
    DW->set_output(true).set_uid(kDw).set_dim({s.k, s.c, s.r, s.r}).set_stride(nhwc(s.k, s.c, s.r, s.r));
    DW->set_data_type(fe_io);
    Tensor dwf = empty_like(dw);
    Pack pack{{kX, y1.data_ptr()},
              {kScale, prologue_ptr(v, scale, scale_io)},
              {kBias, prologue_ptr(v, bias, bias_io)},
              {kDy, dy.data_ptr()},
              {kDw, dwf.data_ptr()}};
    Built b = finish(g, pack, dev);
    if (!b.graph) {
      std::printf("  fused scale-bias-relu-wgrad, %s scale and bias: no plan (%s)\n", v == 0 ? "float" : "io-dtype",
                  b.why_not.c_str());
      if (v == 1) complete = false;
    } else {
      const double t = bench::median_step_ms(5, 20, [&] { execute(b, pack); });
      execute(b, pack);
      cuda::synchronize();
      report("fused scale-bias-relu-wgrad", b, t);
      std::printf("  dW: max |diff| %.4g of max %.4g\n", max_diff(dwf, dw), max_abs(dw));
      fused += t;
      break;
    }
  }
  if (complete) {
    std::printf("  fused total %.4f ms (kiln %.4f): %.4f ms saved, x%d = %.3f ms a step\n", fused, k_total,
                k_total - fused, s.count, (k_total - fused) * s.count);
    totals.kiln += k_total * s.count;
    totals.fused += fused * s.count;
  } else {
    totals.complete = false;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (!cuda::is_available()) {
    std::printf("no CUDA device\n");
    return 1;
  }
  const DType dt = argc > 1 && std::strcmp(argv[1], "fp16") == 0 ? DType::Float16 : DType::BFloat16;
  const std::string filter = argc > 2 ? argv[2] : "";
  nn::set_cudnn_benchmark(true);
  std::printf("cuDNN %zu, %s\n", cudnnGetVersion(), dt == DType::BFloat16 ? "bf16" : "fp16");
  // ResNet-50 (torchvision's v1.5: the stride in the 3x3), batch 256: per stage, the stride-1 3x3 convolutions and the
  // last 1x1 of every block. ResNet-18 on 32x32 CIFAR images, batch 512: each block's second 3x3 convolution.
  const ConvShape shapes[] = {
      {"resnet50", "stage1 3x3", 256, 64, 56, 56, 64, 3, 1, 1, 3},
      {"resnet50", "stage1 1x1", 256, 64, 56, 56, 256, 1, 1, 0, 3},
      {"resnet50", "stage2 3x3", 256, 128, 28, 28, 128, 3, 1, 1, 3},
      {"resnet50", "stage2 1x1", 256, 128, 28, 28, 512, 1, 1, 0, 4},
      {"resnet50", "stage3 3x3", 256, 256, 14, 14, 256, 3, 1, 1, 5},
      {"resnet50", "stage3 1x1", 256, 256, 14, 14, 1024, 1, 1, 0, 6},
      {"resnet50", "stage4 3x3", 256, 512, 7, 7, 512, 3, 1, 1, 2},
      {"resnet50", "stage4 1x1", 256, 512, 7, 7, 2048, 1, 1, 0, 3},
      {"resnet18_cifar", "stage1 3x3", 512, 64, 32, 32, 64, 3, 1, 1, 2},
      {"resnet18_cifar", "stage2 3x3", 512, 128, 16, 16, 128, 3, 1, 1, 2},
      {"resnet18_cifar", "stage3 3x3", 512, 256, 8, 8, 256, 3, 1, 1, 2},
      {"resnet18_cifar", "stage4 3x3", 512, 512, 4, 4, 512, 3, 1, 1, 2},
  };
  Totals r50, r18;
  for (const ConvShape& s : shapes) {
    const std::string name = std::string(s.net) + " " + s.name;
    if (!filter.empty() && name.find(filter) == std::string::npos) continue;
    run(s, dt, std::strcmp(s.net, "resnet50") == 0 ? r50 : r18);
  }
  for (const auto& [net, t] : {std::pair<const char*, Totals&>{"resnet50", r50}, {"resnet18_cifar", r18}}) {
    if (t.kiln == 0.0) continue;
    std::printf("%s, the shapes above (%s): kiln %.3f ms a step, fused %.3f ms, %.3f ms saved\n", net,
                t.complete ? "every one fused" : "some did not build; those are left out", t.kiln, t.fused,
                t.kiln - t.fused);
  }
  return 0;
}
