// nn::conv2d and nn::Conv2d: values against a plain double-loop convolution (stride, padding, dilation,
// groups, bias, non-square kernels, channels-last and unbatched input), gradients with check_gradients,
// the module's parameters and default initialisation, and bad input.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/layers/conv.h"
#include "kiln/layers/window_internal.h"  // detail::space_to_depth_*
#include "support/grad_support.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

class ConvTest : public ExactFloat32Test {};  // float32 references: no TF32

struct ConvCase {
  int64_t n, c_in, h, w, c_out, kh, kw;
  nn::Conv2dOptions o;
};

int64_t conv_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

// y[n, o, i, j] = b[o] + sum over c in o's group, a, e of x[n, c, i sH - pH + a dH, j sW - pW + e dW] w[o, c', a, e],
// with out-of-range input positions reading zero.
std::vector<double> conv_ref(const ConvCase& cc, const std::vector<double>& x, const std::vector<double>& w,
                             const std::vector<double>& b) {
  const auto& o = cc.o;
  const int64_t oh = conv_out(cc.h, cc.kh, o.stride[0], o.padding[0], o.dilation[0]);
  const int64_t ow = conv_out(cc.w, cc.kw, o.stride[1], o.padding[1], o.dilation[1]);
  const int64_t cig = cc.c_in / o.groups, cog = cc.c_out / o.groups;
  std::vector<double> y(static_cast<size_t>(cc.n * cc.c_out * oh * ow));
  for (int64_t n = 0; n < cc.n; ++n)
    for (int64_t co = 0; co < cc.c_out; ++co)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          double acc = b.empty() ? 0.0 : b[co];
          const int64_t g = co / cog;
          for (int64_t ci = 0; ci < cig; ++ci)
            for (int64_t a = 0; a < cc.kh; ++a)
              for (int64_t e = 0; e < cc.kw; ++e) {
                const int64_t r = i * o.stride[0] - o.padding[0] + a * o.dilation[0];
                const int64_t s = j * o.stride[1] - o.padding[1] + e * o.dilation[1];
                if (r < 0 || r >= cc.h || s < 0 || s >= cc.w) continue;
                acc += x[((n * cc.c_in + g * cig + ci) * cc.h + r) * cc.w + s] *
                       w[((co * cig + ci) * cc.kh + a) * cc.kw + e];
              }
          y[((n * cc.c_out + co) * oh + i) * ow + j] = acc;
        }
  return y;
}

void expect_conv_matches(const ConvCase& cc, const TensorOptions& opts, bool channels_last = false) {
  auto xv = uniform(cc.n * cc.c_in * cc.h * cc.w, -1, 1, 11);
  auto wv = uniform(cc.c_out * (cc.c_in / cc.o.groups) * cc.kh * cc.kw, -1, 1, 12);
  auto bv = cc.o.bias ? uniform(cc.c_out, -1, 1, 13) : std::vector<double>{};
  Tensor x = make(xv, {cc.n, cc.c_in, cc.h, cc.w}, opts);
  if (channels_last) x = x.contiguous(MemoryFormat::ChannelsLast);
  Tensor w = make(wv, {cc.c_out, cc.c_in / cc.o.groups, cc.kh, cc.kw}, opts);
  Tensor b = cc.o.bias ? make(bv, {cc.c_out}, opts) : Tensor();
  Tensor y = nn::conv2d(x, w, b, cc.o);
  const int64_t oh = conv_out(cc.h, cc.kh, cc.o.stride[0], cc.o.padding[0], cc.o.dilation[0]);
  const int64_t ow = conv_out(cc.w, cc.kw, cc.o.stride[1], cc.o.padding[1], cc.o.dilation[1]);
  expect_values(y, {cc.n, cc.c_out, oh, ow}, conv_ref(cc, xv, wv, bv), 1e-5, 1e-5);
  EXPECT_EQ(y.device(), opts.device);
  if (channels_last) {
    EXPECT_TRUE(y.is_contiguous(MemoryFormat::ChannelsLast));
  } else {
    EXPECT_TRUE(y.is_contiguous());
  }
}

TEST_P(ConvTest, PlainThreeByThreeWithPadding) { expect_conv_matches({2, 3, 5, 6, 4, 3, 3, {.padding = 1}}, opts()); }

TEST_P(ConvTest, StrideDilationNonSquareKernelWithoutBias) {
  expect_conv_matches({2, 3, 9, 8, 5, 3, 2, {.stride = {2, 1}, .padding = {1, 2}, .dilation = {2, 3}, .bias = false}},
                      opts());
}

TEST_P(ConvTest, Groups) {
  expect_conv_matches({2, 4, 6, 5, 6, 3, 3, {.stride = 2, .padding = 1, .groups = 2}}, opts());
  // Depthwise: one input channel per group, two outputs each.
  expect_conv_matches({1, 3, 5, 5, 6, 3, 1, {.padding = {1, 0}, .groups = 3}}, opts());
}

TEST_P(ConvTest, OneByOneAndKernelAsLargeAsTheInput) {
  expect_conv_matches({2, 4, 3, 3, 2, 1, 1, {}}, opts());
  expect_conv_matches({2, 2, 4, 3, 3, 4, 3, {}}, opts());
}

TEST_P(ConvTest, ChannelsLastInputGivesChannelsLastOutput) {
  expect_conv_matches({2, 3, 6, 5, 4, 3, 3, {.stride = 2, .padding = 1}}, opts(), /*channels_last=*/true);
  expect_conv_matches({1, 4, 5, 5, 4, 3, 3, {.padding = 1, .groups = 2}}, opts(), /*channels_last=*/true);
  // 1x1, stride 1, no padding, one group: one matrix product over the NHWC rows (with and without bias); the
  // strided and the padded 1x1 ones go the general way.
  expect_conv_matches({2, 8, 5, 4, 6, 1, 1, {}}, opts(), /*channels_last=*/true);
  expect_conv_matches({3, 5, 4, 4, 7, 1, 1, {.bias = false}}, opts(), /*channels_last=*/true);
  expect_conv_matches({2, 6, 5, 5, 4, 1, 1, {.stride = 2}}, opts(), /*channels_last=*/true);
  expect_conv_matches({2, 6, 3, 3, 4, 1, 1, {.padding = 1}}, opts(), /*channels_last=*/true);
}

TEST_P(ConvTest, Float64) {
  expect_conv_matches({1, 2, 5, 4, 3, 2, 3, {.stride = {1, 2}, .padding = 1, .dilation = {2, 1}}},
                      opts(DType::Float64));
}

TEST_P(ConvTest, UnbatchedInputGivesAnUnbatchedOutput) {
  auto xv = uniform(3 * 5 * 5, -1, 1, 21), wv = uniform(2 * 3 * 3 * 3, -1, 1, 22);
  Tensor x = make(xv, {3, 5, 5}, opts()), w = make(wv, {2, 3, 3, 3}, opts());
  Tensor y = nn::conv2d(x, w, {}, {.padding = 1});
  expect_values(y, {2, 5, 5}, conv_ref({1, 3, 5, 5, 2, 3, 3, {.padding = 1, .bias = false}}, xv, wv, {}), 1e-5, 1e-5);
}

// The space-to-depth form of a stride-2 convolution (what nn::conv2d runs for a bf16 first layer on a GPU): values
// against the double loop, the weight's and bias's gradients against nn::conv2d's own, in float64, with the blocks'
// channels exactly 4 C_in and zero-padded beyond.
TEST_P(ConvTest, SpaceToDepthFormGivesTheConvolutionsValuesAndGradients) {
  const ConvCase cases[] = {
      {2, 3, 17, 16, 8, 7, 7, {.stride = 2, .padding = 3, .bias = false}},  // ResNet's stem, odd sizes
      {2, 3, 12, 10, 4, 4, 4, {.stride = 2, .padding = 1}},                 // even kernel
      {1, 1, 9, 9, 5, 3, 3, {.stride = 2, .padding = 1}},                   // one channel
      {2, 4, 8, 6, 6, 2, 2, {.stride = 2}},                                 // no padding
  };
  for (const ConvCase& cc : cases) {
    const Shape x_shape{cc.n, cc.c_in, cc.h, cc.w}, w_shape{cc.c_out, cc.c_in, cc.kh, cc.kw};
    ASSERT_TRUE(nn::detail::space_to_depth_applies(x_shape, w_shape, cc.o.stride, cc.o.padding, cc.o.dilation, 1));
    for (int64_t channels : {4 * cc.c_in, int64_t{16}}) {
      SCOPED_TRACE(::testing::Message() << "input " << cc.c_in << " x " << cc.h << " x " << cc.w << ", kernel " << cc.kh
                                        << " x " << cc.kw << ", " << channels << " channels");
      const TensorOptions o = opts(DType::Float64);
      auto xv = uniform(numel(x_shape), -1, 1, 31), wv = uniform(numel(w_shape), -1, 1, 32);
      auto bv = cc.o.bias ? uniform(cc.c_out, -1, 1, 33) : std::vector<double>{};
      const Tensor x = make(xv, x_shape, o).contiguous(MemoryFormat::ChannelsLast);
      Tensor w = make(wv, w_shape, o).requires_grad_(), w_ref = make(wv, w_shape, o).requires_grad_();
      Tensor b = cc.o.bias ? make(bv, {cc.c_out}, o).requires_grad_() : Tensor();
      Tensor b_ref = cc.o.bias ? make(bv, {cc.c_out}, o).requires_grad_() : Tensor();
      const Tensor y = nn::detail::space_to_depth_conv2d(x, w, b, cc.o.padding, channels);
      const int64_t oh = conv_out(cc.h, cc.kh, 2, cc.o.padding[0], 1),
                    ow = conv_out(cc.w, cc.kw, 2, cc.o.padding[1], 1);
      expect_values(y, {cc.n, cc.c_out, oh, ow}, conv_ref(cc, xv, wv, bv), 1e-12, 1e-12);
      EXPECT_TRUE(y.is_contiguous(MemoryFormat::ChannelsLast));
      const Tensor dy = make(uniform(y.numel(), -1, 1, 34), y.shape(), o);
      y.backward(dy);
      nn::conv2d(x, w_ref, b_ref, cc.o).backward(dy);
      expect_values(w.grad(), w_shape, values(w_ref.grad()), 1e-12, 1e-12);
      if (cc.o.bias) expect_values(b.grad(), {cc.c_out}, values(b_ref.grad()), 1e-12, 1e-12);
    }
  }
}

// The form applies to stride-2, undilated, ungrouped convolutions whose blocks give conv2d's output size.
TEST(Conv, SpaceToDepthAppliesWhereTheBlocksGiveTheOutputSize) {
  using nn::detail::space_to_depth_applies;
  const Shape stem_x{256, 3, 224, 224}, stem_w{64, 3, 7, 7};
  EXPECT_TRUE(space_to_depth_applies(stem_x, stem_w, 2, 3, 1, 1));
  EXPECT_TRUE(space_to_depth_applies({1, 3, 33, 33}, {8, 3, 3, 3}, 2, 1, 1, 1));  // 35 rows: 18 blocks, 17 outputs
  // 229 padded rows and an 8-row kernel: 115 blocks less 4 + 1 is 112, one more than conv2d's 111 outputs.
  EXPECT_FALSE(space_to_depth_applies({1, 3, 223, 223}, {8, 3, 8, 8}, 2, 3, 1, 1));
  EXPECT_FALSE(space_to_depth_applies(stem_x, stem_w, 1, 3, 1, 1));         // stride 1
  EXPECT_FALSE(space_to_depth_applies(stem_x, stem_w, {2, 1}, 3, 1, 1));    // stride 2 one way only
  EXPECT_FALSE(space_to_depth_applies(stem_x, stem_w, 2, 3, 2, 1));         // dilated
  EXPECT_FALSE(space_to_depth_applies(stem_x, {64, 1, 7, 7}, 2, 3, 1, 3));  // grouped
  EXPECT_FALSE(space_to_depth_applies(stem_x, {64, 3, 1, 1}, 2, 0, 1, 1));  // 1x1
}

// Too few block channels for the input's 2 x 2 blocks: a clear error, not a short write.
TEST(Conv, SpaceToDepthRefusesTooFewBlockChannels) {
  const Tensor x = make(uniform(2 * 3 * 6 * 6, -1, 1, 41), {2, 3, 6, 6}).contiguous(MemoryFormat::ChannelsLast);
  expect_error([&] { (void)nn::detail::space_to_depth_input(x, {1, 1}, 11); },
               {"space_to_depth_input", "11 channels", "2 x 2 blocks of 3"});
}

TEST(Conv, Gradients) {
  auto plain = [](const TensorList& in) { return TensorList{nn::conv2d(in[0], in[1], in[2], {.padding = 1})}; };
  check_gradients(plain,
                  {make_input({2, 2, 4, 4}, -1, 1, 1), make_input({3, 2, 3, 3}, -1, 1, 2), make_input({3}, -1, 1, 3)});
  auto grouped = [](const TensorList& in) {
    return TensorList{
        nn::conv2d(in[0], in[1], in[2], {.stride = {2, 1}, .padding = {2, 1}, .dilation = {2, 1}, .groups = 2})};
  };
  check_gradients(grouped,
                  {make_input({2, 4, 5, 4}, -1, 1, 4), make_input({4, 2, 2, 3}, -1, 1, 5), make_input({4}, -1, 1, 6)});
  auto no_bias = [](const TensorList& in) { return TensorList{nn::conv2d(in[0], in[1], {}, {.stride = 2})}; };
  check_gradients(no_bias, {make_input({1, 3, 5, 5}, -1, 1, 7), make_input({2, 3, 3, 2}, -1, 1, 8)});
}

TEST(Conv, ChannelsLastGradients) {
  auto fn = [](const TensorList& in) {
    return TensorList{nn::conv2d(in[0].contiguous(MemoryFormat::ChannelsLast), in[1], in[2], {.padding = 1})};
  };
  check_gradients(
      fn, {make_input({2, 3, 4, 3}, -1, 1, 9), make_input({2, 3, 3, 3}, -1, 1, 10), make_input({2}, -1, 1, 11)});
  // The 1x1 matrix-product path: gradients of the input, the weight (also a channels-last one) and the bias.
  auto one_by_one = [](const TensorList& in) {
    return TensorList{nn::conv2d(in[0].contiguous(MemoryFormat::ChannelsLast),
                                 in[1].contiguous(MemoryFormat::ChannelsLast), in[2], {})};
  };
  check_gradients(one_by_one, {make_input({2, 4, 3, 2}, -1, 1, 12), make_input({5, 4, 1, 1}, -1, 1, 13),
                               make_input({5}, -1, 1, 14)});
  auto one_by_one_no_bias = [](const TensorList& in) {
    return TensorList{nn::conv2d(in[0].contiguous(MemoryFormat::ChannelsLast), in[1], {}, {})};
  };
  check_gradients(one_by_one_no_bias, {make_input({1, 3, 2, 3}, -1, 1, 15), make_input({2, 3, 1, 1}, -1, 1, 16)});
}

// A 1x1 convolution whose input also takes another path (a residual block's input: the 1x1 conv and the shortcut).
// Its backward adds its input gradient into the sum the engine has begun for that input with the shortcut's gradient
// (the engine runs it after the shortcut, whichever was made first); both orders, with the input a leaf and an
// intermediate, give the gradients of the same computation through the general (NCHW, im2col) path.
TEST(Conv, OneByOneGradientJoinsTheShortcutGradient) {
  const Tensor x0 = make_input({2, 4, 3, 2}, -1, 1, 21), w = make_input({4, 4, 1, 1}, -1, 1, 22);
  const Tensor r1 = make_input({2, 4, 3, 2}, -1, 1, 23), r2 = make_input({2, 4, 3, 2}, -1, 1, 24);
  for (bool shortcut_first : {true, false}) {
    for (bool intermediate : {false, true}) {
      SCOPED_TRACE(std::string(shortcut_first ? "shortcut's gradient first" : "conv's gradient first") +
                   (intermediate ? ", intermediate input" : ", leaf input"));
      auto grads = [&](bool channels_last) {
        Tensor leaf = (channels_last ? x0.contiguous(MemoryFormat::ChannelsLast) : x0.contiguous()).detach().clone();
        leaf.requires_grad_();
        Tensor wl = w.detach().clone().requires_grad_();
        const Tensor in = intermediate ? leaf * 1.5 : leaf;  // keeps the layout
        Tensor loss;
        if (shortcut_first) {
          const Tensor y = nn::conv2d(in, wl, {}, {});
          loss = (y * r1).sum() + (in.exp() * r2).sum();
        } else {
          const Tensor s = (in.exp() * r2).sum();
          loss = (nn::conv2d(in, wl, {}, {}) * r1).sum() + s;
        }
        loss.backward();
        return std::make_pair(leaf.grad(), wl.grad());
      };
      const auto [gx, gw] = grads(/*channels_last=*/true);
      const auto [rx, rw] = grads(/*channels_last=*/false);
      expect_values(gx, rx.shape(), values(rx), 1e-5, 1e-6);
      expect_values(gw, rw.shape(), values(rw), 1e-5, 1e-6);
    }
  }
}

TEST(Conv, ModuleParametersAndDefaultInitialisation) {
  nn::Conv2d conv(6, 8, {3, 2}, {.groups = 2});
  EXPECT_EQ(conv.type_name(), "Conv2d");
  auto named = conv.named_parameters();
  ASSERT_EQ(named.size(), 2u);
  EXPECT_EQ(named[0].first, "weight");
  EXPECT_EQ(named[0].second.shape(), (Shape{8, 3, 3, 2}));
  EXPECT_EQ(named[1].first, "bias");
  EXPECT_EQ(named[1].second.shape(), (Shape{8}));
  // fan_in = 3 * 3 * 2 = 18: weight and bias both within 1 / sqrt(18) (float32 rounding allowed).
  const double bound = 1 / std::sqrt(18.0) * (1 + 1e-6);
  EXPECT_LE(conv.weight.abs().max().item<double>(), bound);
  EXPECT_LE(conv.bias.abs().max().item<double>(), bound);
  EXPECT_GT(conv.weight.abs().max().item<double>(), 0.5 * bound);  // spread over the range, not all zero
  nn::Conv2d no_bias(3, 4, 3, {.bias = false});
  EXPECT_EQ(no_bias.named_parameters().size(), 1u);
  EXPECT_FALSE(no_bias.bias.defined());
}

TEST_P(ConvTest, ModuleForwardIsConv2d) {
  nn::Conv2d conv(3, 4, 3, {.stride = 2, .padding = 1});
  conv.to(dev());
  Tensor x = make(uniform(2 * 3 * 7 * 7, -1, 1, 31), {2, 3, 7, 7}, opts());
  Tensor y = conv(x);
  EXPECT_EQ(y.shape(), (Shape{2, 4, 4, 4}));
  EXPECT_TRUE(allclose(y, nn::conv2d(x, conv.weight, conv.bias, conv.options)));
  y.sum().backward();
  EXPECT_EQ(conv.weight.grad().shape(), (Shape{4, 3, 3, 3}));
  EXPECT_EQ(conv.bias.grad().shape(), (Shape{4}));
}

TEST(Conv, BadInput) {
  Tensor w = zeros({4, 3, 3, 3});
  expect_error([&] { nn::conv2d(zeros({1, 1, 2, 3, 5}), w); }, {"conv2d", "4-d input", "[1, 1, 2, 3, 5]"});
  expect_error([&] { nn::conv2d(zeros({5, 5}), w); }, {"conv2d", "4-d input", "[5, 5]"});
  expect_error(
      [&] {
        nn::conv2d(zeros({1, 2, 5, 5}), w);
      },
      {"conv2d", "[1, 2, 5, 5]", "2 channels", "[4, 3, 3, 3]", "expects 3"});
  expect_error(
      [&] {
        nn::conv2d(zeros({1, 6, 5, 5}), zeros({4, 2, 3, 3}), {}, {.groups = 3});
      },
      {"conv2d", "4 output channels", "groups = 3"});
  expect_error(
      [&] {
        nn::conv2d(zeros({1, 3, 2, 5}), w);
      },
      {"conv2d", "[1, 3, 2, 5]", "smaller than the dilated kernel"});
  expect_error([&] { nn::conv2d(zeros({1, 3, 5, 5}), w, {}, {.dilation = 3}); }, {"conv2d", "dilated kernel (7, 7)"});
  expect_error([&] { nn::conv2d(zeros({1, 3, 5, 5}), w, zeros({3})); }, {"conv2d", "bias of shape (4)", "[3]"});
  expect_error(
      [&] {
        nn::conv2d(zeros({1, 3, 5, 5}, {.dtype = DType::Float64}), w);
      },
      {"conv2d", "float64", "one dtype"});
  expect_error([&] { nn::conv2d(zeros({1, 3, 5, 5}), w, {}, {.stride = 0}); }, {"conv2d", "stride", "positive"});
  expect_error([&] { nn::conv2d(zeros({1, 3, 5, 5}), w, {}, {.groups = 0}); }, {"conv2d", "groups must be positive"});
  expect_error([] { nn::Conv2d(3, 4, 3, {.groups = 2}); }, {"Conv2d", "groups = 2", "in_channels = 3"});
  expect_error([] { nn::Conv2d(0, 4, 3); }, {"Conv2d", "positive"});
  nn::Conv2d conv(3, 4, 3);
  expect_error([&] { conv(zeros({1, 2, 5, 5})); }, {"Conv2d", "in_channels = 3", "[1, 2, 5, 5]"});
  for (Device d : test_devices()) {
    if (d.is_cpu()) continue;
    expect_error([&] { nn::conv2d(zeros({1, 3, 5, 5}, {.device = d}), w); }, {"conv2d", "one device"});
  }
}

KILN_INSTANTIATE_BACKENDS(ConvTest);

}  // namespace
}  // namespace kiln::testing
