// tests/io/resume_training.h — the training run that test_resume.cpp and resume_child.cpp share: a 2-layer MLP
// with dropout, AdamW with a warmup + cosine schedule, and a shuffling DataLoader (2 workers) over a
// SyntheticDataset. Every source of randomness (initial weights, dropout, shuffle) is in its state, so N steps,
// a checkpoint, and M steps in another process must equal N + M steps straight. CudaResumeRun is the same
// on cuda:0 in deterministic mode (kiln/tensor/determinism.h), with a conv net (batch norm, dropout) and an
// embedding, so that cuDNN's convolutions and the embedding's scatter-add backward take part.
#pragma once

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kiln/autograd/functions.h"  // mean, relu
#include "kiln/data/dataloader.h"
#include "kiln/data/datasets/synthetic.h"
#include "kiln/io/checkpoint.h"
#include "kiln/layers/containers.h"
#include "kiln/layers/conv.h"
#include "kiln/layers/layers.h"
#include "kiln/layers/loss.h"
#include "kiln/optim/adam.h"
#include "kiln/optim/lr_scheduler.h"
#include "kiln/tensor/determinism.h"
#include "kiln/tensor/generator.h"

namespace kiln::testing {

struct ResumeRun {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<optim::AdamW> opt;
  std::unique_ptr<optim::LambdaLR> sched;
  data::DataLoader loader;
  data::LoaderPosition pos;

  explicit ResumeRun(uint64_t seed)
      : loader(std::make_shared<data::SyntheticDataset>(data::SyntheticOptions{
                   .size = 50, .fields = {{"x", {6}, DType::Float32}, {"y", {}, DType::Int64, 3}}, .seed = 5}),
               {.batch_size = 8, .workers = 2, .shuffle = true, .seed = 11}) {
    manual_seed(seed);
    model = std::make_shared<nn::Sequential>(
        std::vector<nn::ModulePtr>{std::make_shared<nn::Linear>(6, 16), std::make_shared<nn::ReLU>(),
                                   std::make_shared<nn::Dropout>(0.3), std::make_shared<nn::Linear>(16, 3)});
    opt = std::make_unique<optim::AdamW>(model->parameters(), optim::AdamWOptions{.lr = 3e-2, .weight_decay = 0.05});
    sched = optim::linear_warmup_cosine_decay(*opt, 3, 20, 1e-3);
  }

  io::CheckpointParts parts() {
    return {.model = model.get(), .optimizer = opt.get(), .scheduler = sched.get(), .generators = true, .loader = &pos};
  }

  // `steps` more training steps from pos (crossing epochs as needed); each step's loss is appended.
  void train(int steps, std::vector<float>& losses) {
    while (steps > 0) {
      if (pos.batch >= loader.size()) pos = {pos.epoch + 1, 0};
      auto range = loader.epoch(pos.epoch, pos.batch);
      for (data::Batch& batch : range) {
        opt->zero_grad();
        Tensor loss = nn::cross_entropy((*model)(batch["x"]), batch["y"]);
        loss.backward();
        opt->step();
        sched->step();
        losses.push_back(loss.item<float>());
        pos = range.position();
        if (--steps == 0) break;
      }
    }
  }

  // The losses' and the parameters' bytes, for a bit-for-bit comparison across processes.
  std::string fingerprint(const std::vector<float>& losses) const {
    std::string out(reinterpret_cast<const char*>(losses.data()), losses.size() * sizeof(float));
    for (const auto& [name, t] : model->state_dict()) {
      Tensor c = t.contiguous();
      out.append(static_cast<const char*>(c.data_ptr()), c.nbytes());
    }
    return out;
  }
};

// image (N, 3, 8, 8) and token ids (N, 4) -> logits (N, 3): conv-BN-ReLU-dropout, global average pool, plus
// the mean of the tokens' embeddings, then a linear head.
struct ConvEmbedNet : nn::Module {
  ConvEmbedNet() : nn::Module("ConvEmbedNet") {
    conv = register_module("conv", std::make_shared<nn::Conv2d>(3, 8, 3, nn::Conv2dOptions{.padding = 1}));
    bn = register_module("bn", std::make_shared<nn::BatchNorm2d>(8));
    drop = register_module("drop", std::make_shared<nn::Dropout>(0.3));
    embed = register_module("embed", std::make_shared<nn::Embedding>(10, 8));
    head = register_module("head", std::make_shared<nn::Linear>(8, 3));
  }
  Tensor forward(const Tensor& image, const Tensor& ids) {
    const Tensor f = mean((*drop)(relu((*bn)((*conv)(image)))), {2, 3});  // (N, 8)
    return (*head)(f + mean((*embed)(ids), {1}));
  }
  std::shared_ptr<nn::Conv2d> conv;
  std::shared_ptr<nn::BatchNorm2d> bn;
  std::shared_ptr<nn::Dropout> drop;
  std::shared_ptr<nn::Embedding> embed;
  std::shared_ptr<nn::Linear> head;
};

// Call only where kiln::cuda::is_available(). Turns deterministic mode on for the process.
struct CudaResumeRun {
  std::shared_ptr<ConvEmbedNet> model;
  std::unique_ptr<optim::AdamW> opt;
  std::unique_ptr<optim::LambdaLR> sched;
  data::DataLoader loader;
  data::LoaderPosition pos;

  explicit CudaResumeRun(uint64_t seed)
      : loader(
            std::make_shared<data::SyntheticDataset>(data::SyntheticOptions{
                .size = 50,
                .fields = {{"x", {3, 8, 8}, DType::Float32}, {"t", {4}, DType::Int64, 10}, {"y", {}, DType::Int64, 3}},
                .seed = 5}),
            {.batch_size = 8, .workers = 2, .shuffle = true, .seed = 11}) {
    set_deterministic(true);
    manual_seed(seed);
    model = std::make_shared<ConvEmbedNet>();
    model->to(Device::cuda(0));
    opt = std::make_unique<optim::AdamW>(model->parameters(), optim::AdamWOptions{.lr = 3e-2, .weight_decay = 0.05});
    sched = optim::linear_warmup_cosine_decay(*opt, 3, 20, 1e-3);
  }

  io::CheckpointParts parts() {
    return {.model = model.get(), .optimizer = opt.get(), .scheduler = sched.get(), .generators = true, .loader = &pos};
  }

  void train(int steps, std::vector<float>& losses) {
    const Device gpu = Device::cuda(0);
    while (steps > 0) {
      if (pos.batch >= loader.size()) pos = {pos.epoch + 1, 0};
      auto range = loader.epoch(pos.epoch, pos.batch);
      for (data::Batch& batch : range) {
        opt->zero_grad();
        Tensor logits = model->forward(batch["x"].to(gpu), batch["t"].to(gpu));
        Tensor loss = nn::cross_entropy(logits, batch["y"].to(gpu));
        loss.backward();
        opt->step();
        sched->step();
        losses.push_back(loss.item<float>());
        pos = range.position();
        if (--steps == 0) break;
      }
    }
  }

  // The losses' and the parameters' and buffers' (batch norm's running statistics) bytes.
  std::string fingerprint(const std::vector<float>& losses) const {
    std::string out(reinterpret_cast<const char*>(losses.data()), losses.size() * sizeof(float));
    for (const auto& [name, t] : model->state_dict()) {
      Tensor c = t.cpu().contiguous();
      out.append(static_cast<const char*>(c.data_ptr()), c.nbytes());
    }
    return out;
  }
};

}  // namespace kiln::testing
