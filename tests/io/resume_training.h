// tests/io/resume_training.h — the training run that test_resume.cpp and resume_child.cpp share: a 2-layer MLP
// with dropout, AdamW with a warmup + cosine schedule, and a shuffling DataLoader (2 workers) over a
// SyntheticDataset. Every source of randomness (initial weights, dropout, shuffle) is in its state, so N steps,
// a checkpoint, and M steps in another process must equal N + M steps straight.
#pragma once

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kiln/data/dataloader.h"
#include "kiln/data/datasets/synthetic.h"
#include "kiln/io/checkpoint.h"
#include "kiln/layers/containers.h"
#include "kiln/layers/layers.h"
#include "kiln/layers/loss.h"
#include "kiln/optim/adam.h"
#include "kiln/optim/lr_scheduler.h"
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

}  // namespace kiln::testing
