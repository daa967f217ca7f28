// bench/model_cases.h — the model benchmarks' cases, built once for bench_models, bench_ddp and bench_train: a
// model on `dev` in train mode and one random batch that every step reuses.
//
//   auto c = bench::make_resnet50(dev, MemoryFormat::ChannelsLast, /*quick=*/false);
//   Tensor loss = nn::cross_entropy(c.model(c.x), c.y);
//   auto b = bench::make_bert_base(dev, false);
//   Tensor loss = b.model(b.ids, b.types, b.mask, b.labels).loss;
//
// ResNet-50: batch 256, 224x224 standard-normal images, 1000 classes (quick: batch 16, 64x64).
// BERT-base masked-LM: batch 128, sequence 128 (quick: batch 8, 2 layers); the last 16 tokens of every other
// sequence are padding, 15% of positions carry a label, the rest are ignored (-100).
// bench/pytorch_models.py and bench/pytorch_ddp.py build the same batches for PyTorch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>

#include "kiln/kiln.h"

namespace kiln::bench {

struct ResNetCase {
  nn::Handle<nn::models::ResNet> model;
  Tensor x;  // (batch, 3, size, size) float32, in the model's memory format
  Tensor y;  // (batch,) Int64 class indices
  int64_t batch = 0, size = 0;
};

// A ResNet (18, 34, 50 or 101) on `dev` in `format`, and one batch of standard-normal images with random labels.
inline ResNetCase make_resnet(int depth, int64_t batch, int64_t size, int64_t classes, bool cifar_stem, Device dev,
                              MemoryFormat format) {
  ResNetCase c;
  c.batch = batch;
  c.size = size;
  const nn::models::ResNetOptions o{.num_classes = classes, .cifar_stem = cifar_stem};
  c.model = depth == 18   ? nn::models::resnet18(o)
            : depth == 34 ? nn::models::resnet34(o)
            : depth == 50 ? nn::models::resnet50(o)
                          : nn::models::resnet101(o);
  c.model->to(dev, format);
  c.model->train();
  c.x = randn({batch, 3, size, size}, {.device = dev}).contiguous(format);
  c.y = randint(0, classes, {batch}, {.dtype = DType::Int64, .device = dev});
  return c;
}

inline ResNetCase make_resnet50(Device dev, MemoryFormat format, bool quick) {
  return make_resnet(50, quick ? 16 : 256, quick ? 64 : 224, 1000, false, dev, format);
}

struct BertCase {
  nn::models::BertConfig config;
  nn::Handle<nn::models::BertForMaskedLM> model;
  Tensor ids, types, mask, labels;  // (batch, seq) Int64 each
  int64_t batch = 0, seq = 0;
};

// A BERT masked-LM model of `config` on `dev` and one batch of `batch` sequences of `seq` tokens.
inline BertCase make_bert(const nn::models::BertConfig& config, int64_t batch, int64_t seq, Device dev) {
  BertCase c;
  c.batch = batch;
  c.seq = seq;
  c.config = config;
  c.model = nn::make<nn::models::BertForMaskedLM>(c.config);
  c.model->to(dev);
  c.model->train();
  const int64_t b = c.batch, s = c.seq;
  c.ids = randint(0, c.config.vocab_size, {b, s}, {.dtype = DType::Int64, .device = dev});
  c.types = zeros({b, s}, {.dtype = DType::Int64, .device = dev});
  // The last 16 tokens of every other sequence are padding.
  c.mask = ones({b, s}, {.dtype = DType::Int64, .device = dev});
  for (int64_t i = 1; i < b; i += 2)
    c.mask[i].narrow(0, s - std::min<int64_t>(16, s - 1), std::min<int64_t>(16, s - 1)).fill_(0);
  // 15% of positions carry a label; the rest are ignored (-100).
  Tensor pick = rand({b, s}, {.device = dev}) < Scalar(0.15);
  c.labels = where(pick, c.ids, full({b, s}, -100, {.dtype = DType::Int64, .device = dev}));
  return c;
}

inline BertCase make_bert_base(Device dev, bool quick) {
  nn::models::BertConfig config = nn::models::BertConfig::base();
  if (quick) config.num_hidden_layers = 2;
  return make_bert(config, quick ? 8 : 128, 128, dev);
}

}  // namespace kiln::bench
