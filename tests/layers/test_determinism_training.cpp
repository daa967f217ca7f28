// Deterministic mode on the GPU (kiln/tensor/determinism.h): training runs repeated from the same seed give
// the same losses and parameters bit for bit — a tiny BERT masked-LM (dropout on, in float32 and under
// bfloat16 autocast, where attention may run cuDNN's fused kernels), and a small conv net with batch norm,
// dropout, max pooling and an embedding. The embedding's weight gradient (a scatter-add that would use
// atomics) is checked against a float64 CPU reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kiln/autograd/autocast.h"
#include "kiln/autograd/functions.h"
#include "kiln/layers/containers.h"
#include "kiln/layers/conv.h"
#include "kiln/layers/layers.h"
#include "kiln/layers/loss.h"
#include "kiln/layers/models/bert.h"
#include "kiln/layers/pooling.h"
#include "kiln/optim/adam.h"
#include "kiln/tensor/cuda.h"
#include "kiln/tensor/determinism.h"
#include "kiln/tensor/generator.h"
#include "kiln/tensor/internal_ops.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

const Device kGpu = Device::cuda(0);

class CudaDeterministicTraining : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
    previous_ = deterministic();
    set_deterministic(true);
  }
  void TearDown() override {
    if (cuda::is_available()) set_deterministic(previous_);
  }
  bool previous_ = false;
};

void append_bytes(std::string& out, const Tensor& t) {
  const Tensor c = t.cpu().contiguous();
  out.append(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.nbytes()));
}

// The losses' and the parameters' bytes.
std::string fingerprint(const std::vector<float>& losses, const nn::Module& model) {
  std::string out(reinterpret_cast<const char*>(losses.data()), losses.size() * sizeof(float));
  for (const auto& [name, t] : model.state_dict()) append_bytes(out, t);
  return out;
}

// ---------------------------------------------------------------- BERT

models::BertConfig tiny_bert() {
  return {.vocab_size = 96,
          .hidden_size = 64,
          .num_hidden_layers = 2,
          .num_attention_heads = 2,  // head dim 32: cuDNN's fused attention takes it under autocast
          .intermediate_size = 128,
          .max_position_embeddings = 32,
          .hidden_dropout_prob = 0.1,
          .attention_probs_dropout_prob = 0.1};
}

// `steps` AdamW steps on fixed random batches (N = 8, S = 24, the last 5 positions of half the rows padded,
// 15% of the positions labelled); the losses, then the parameters, as bytes.
std::string train_bert(int steps, bool bf16) {
  manual_seed(2024);
  auto mlm = std::make_shared<models::BertForMaskedLM>(tiny_bert());
  mlm->to(kGpu);
  mlm->train();
  optim::AdamW opt(mlm->parameters(), {.lr = 1e-3});
  Generator data_gen(99);
  const int64_t N = 8, S = 24;
  std::vector<float> losses;
  for (int step = 0; step < steps; ++step) {
    Tensor ids = internal::randint(1, 96, {N, S}, {.dtype = DType::Int64}, &data_gen);
    Tensor mask = internal::ones({N, S}, {.dtype = DType::Int64});
    internal::slice(internal::slice(mask, 0, 0, N / 2), 1, S - 5, S).fill_(0);
    const Tensor picked = internal::lt(internal::rand({N, S}, {}, &data_gen), 0.15);
    Tensor labels = internal::where(picked, ids, internal::full({N, S}, -100, {.dtype = DType::Int64}));
    Tensor types = internal::zeros({N, S}, {.dtype = DType::Int64});
    opt.zero_grad();
    Tensor loss;
    if (bf16) {
      autocast::Guard cast(DeviceType::CUDA, DType::BFloat16);
      loss = mlm->forward(ids.to(kGpu), types.to(kGpu), mask.to(kGpu), labels.to(kGpu)).loss;
    } else {
      loss = mlm->forward(ids.to(kGpu), types.to(kGpu), mask.to(kGpu), labels.to(kGpu)).loss;
    }
    loss.backward();
    opt.step();
    losses.push_back(loss.to(DType::Float32).item<float>());
  }
  for (float l : losses) EXPECT_TRUE(std::isfinite(l));
  return fingerprint(losses, *mlm);
}

TEST_F(CudaDeterministicTraining, BertMaskedLmRepeatsBitForBit) {
  const std::string first = train_bert(6, /*bf16=*/false);
  EXPECT_TRUE(first == train_bert(6, false)) << "float32 BERT training is not reproducible";
}

TEST_F(CudaDeterministicTraining, BertMaskedLmUnderBf16AutocastRepeatsBitForBit) {
  const std::string first = train_bert(6, /*bf16=*/true);
  EXPECT_TRUE(first == train_bert(6, true)) << "bfloat16 BERT training is not reproducible";
}

// ---------------------------------------------------------------- a conv net with an embedding

// x (N, 3, 16, 16) and a class id per sample (N) -> logits (N, 10): conv-BN-ReLU-pool twice, dropout, a
// linear head, plus an embedding of the id (many samples share an id: the scatter-add has duplicates).
struct ConvNet : nn::Module {
  ConvNet() : nn::Module("ConvNet") {
    features = register_module(
        "features", std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
                        std::make_shared<nn::Conv2d>(3, 16, 3, nn::Conv2dOptions{.padding = 1, .bias = false}),
                        std::make_shared<nn::BatchNorm2d>(16), std::make_shared<nn::ReLU>(),
                        std::make_shared<nn::MaxPool2d>(nn::Pool2dOptions{.kernel_size = 2}),
                        std::make_shared<nn::Conv2d>(16, 32, 3, nn::Conv2dOptions{.stride = 2, .padding = 1}),
                        std::make_shared<nn::BatchNorm2d>(32), std::make_shared<nn::ReLU>(),
                        std::make_shared<nn::AdaptiveAvgPool2d>(1), std::make_shared<nn::Flatten>(),
                        std::make_shared<nn::Dropout>(0.2)}));
    embed = register_module("embed", std::make_shared<nn::Embedding>(7, 32));
    head = register_module("head", std::make_shared<nn::Linear>(32, 10));
  }
  Tensor forward(const Tensor& x, const Tensor& ids) { return (*head)((*features)(x) + (*embed)(ids)); }

  std::shared_ptr<nn::Sequential> features;
  std::shared_ptr<nn::Embedding> embed;
  std::shared_ptr<nn::Linear> head;
};

std::string train_conv_net(int steps, MemoryFormat format) {
  manual_seed(7);
  auto net = std::make_shared<ConvNet>();
  net->to(kGpu, format);
  net->train();
  optim::AdamW opt(net->parameters(), {.lr = 1e-2});
  Generator data_gen(3);
  std::vector<float> losses;
  for (int step = 0; step < steps; ++step) {
    const Tensor x = internal::randn({32, 3, 16, 16}, {}, &data_gen).to(kGpu).to(format);
    const Tensor ids = internal::randint(0, 7, {32}, {.dtype = DType::Int64}, &data_gen).to(kGpu);
    const Tensor y = internal::randint(0, 10, {32}, {.dtype = DType::Int64}, &data_gen).to(kGpu);
    opt.zero_grad();
    Tensor loss = nn::cross_entropy(net->forward(x, ids), y);
    loss.backward();
    opt.step();
    losses.push_back(loss.item<float>());
  }
  for (float l : losses) EXPECT_TRUE(std::isfinite(l));
  return fingerprint(losses, *net);
}

TEST_F(CudaDeterministicTraining, ConvNetRepeatsBitForBit) {
  for (MemoryFormat format : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
    const std::string first = train_conv_net(8, format);
    EXPECT_TRUE(first == train_conv_net(8, format)) << "conv net training is not reproducible";
  }
}

TEST_F(CudaDeterministicTraining, ConvNetRepeatsWithBenchmarkModeRequested) {
  // Benchmark mode is ignored in deterministic mode: the heuristics' deterministic choice is kept.
  const bool bench = nn::cudnn_benchmark();
  const std::string first = train_conv_net(4, MemoryFormat::Contiguous);
  nn::set_cudnn_benchmark(true);
  const std::string second = train_conv_net(4, MemoryFormat::Contiguous);
  nn::set_cudnn_benchmark(bench);
  EXPECT_TRUE(first == second);
}

// ---------------------------------------------------------------- the embedding backward

TEST_F(CudaDeterministicTraining, EmbeddingBackwardMatchesAFloat64ReferenceAndRepeats) {
  Generator gen(11);
  const Tensor weight = internal::randn({50, 48}, {}, &gen);                       // (V, D)
  Tensor ids = internal::randint(0, 50, {64, 40}, {.dtype = DType::Int64}, &gen);  // 2560 lookups, ~51 per row
  internal::slice(ids, 1, 30, 40).fill_(0);                                        // a "padding" row used 640 times
  const Tensor g = internal::randn({64, 40, 48}, {}, &gen);                        // d loss / d output

  auto gpu_grad = [&] {
    Tensor w = weight.to(kGpu).detach().requires_grad_(true);
    Tensor out = embedding(w, ids.to(kGpu));
    out.backward(g.to(kGpu));
    return w.grad().cpu();
  };
  const Tensor first = gpu_grad();
  const Tensor second = gpu_grad();
  ASSERT_EQ(first.shape(), (Shape{50, 48}));
  EXPECT_EQ(std::memcmp(first.data_ptr(), second.data_ptr(), static_cast<size_t>(first.nbytes())), 0);

  // Reference: the rows of g summed per id in float64.
  const std::vector<int64_t> id = ids.to_vector<int64_t>();
  const std::vector<float> gv = g.to_vector<float>();
  std::vector<double> ref(50 * 48, 0.0), mag(50 * 48, 0.0);
  std::vector<int64_t> count(50, 0);
  for (size_t r = 0; r < id.size(); ++r) {
    ++count[static_cast<size_t>(id[r])];
    for (size_t d = 0; d < 48; ++d) {
      ref[static_cast<size_t>(id[r]) * 48 + d] += gv[r * 48 + d];
      mag[static_cast<size_t>(id[r]) * 48 + d] += std::abs(gv[r * 48 + d]);
    }
  }
  const std::vector<float> got = first.to_vector<float>();
  for (size_t i = 0; i < ref.size(); ++i) {
    // Float32 summation of count terms: |error| <= count * 2^-24 * sum |terms| (generous factor 2).
    const double tol = 2.0 * static_cast<double>(count[i / 48]) * std::ldexp(1.0, -24) * mag[i] + 1e-6;
    ASSERT_NEAR(got[i], ref[i], tol) << "row " << i / 48 << " col " << i % 48;
  }
}

}  // namespace
}  // namespace kiln::testing
