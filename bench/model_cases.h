// bench/model_cases.h — the model benchmarks' cases, built once for bench_models, bench_ddp and bench_train: a
// model on `dev` in train mode and random batches (one, or `batches` distinct ones that bench_train's steps cycle
// through, so that no step trains on the batch of the step before).
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
#include <vector>

#include "kiln/kiln.h"

namespace kiln::bench {

struct ResNetCase {
  nn::Handle<nn::models::ResNet> model;
  Tensor x;                    // (batch, 3, size, size) float32, in the model's memory format: xs[0]
  Tensor y;                    // (batch,) Int64 class indices: ys[0]
  std::vector<Tensor> xs, ys;  // the distinct batches
  int64_t batch = 0, size = 0;
};

// A ResNet (18, 34, 50 or 101) on `dev` in `format`, and `batches` batches of standard-normal images with random
// labels. With `learnable` (bench_train; `size` a multiple of 8), each class has a standard-normal 8x8 pattern per
// channel, drawn first; an image's class pattern, times kPatternGain, is tiled over it and added to its noise, and
// kLabelNoise of the labels are then redrawn uniformly. The loss can fall (pure noise under random labels stays at
// log(classes)) but not to zero (the redrawn labels keep it above their entropy, about 0.50 for 10 classes, so a
// loss near 0 would mean the batches were memorised). pytorch_train.py makes its batches the same way.
inline constexpr double kPatternGain = 0.5;
inline constexpr double kLabelNoise = 0.1;
inline ResNetCase make_resnet(int depth, int64_t batch, int64_t size, int64_t classes, bool cifar_stem, Device dev,
                              MemoryFormat format, int batches = 1, bool learnable = false) {
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
  KILN_CHECK(!learnable || size % 8 == 0, "make_resnet: a learnable batch needs a size divisible by 8, got ", size);
  const Tensor patterns = learnable ? randn({classes, 3, 8, 8}, {.device = dev}) : Tensor();
  for (int i = 0; i < batches; ++i) {
    Tensor x = randn({batch, 3, size, size}, {.device = dev});
    Tensor y = randint(0, classes, {batch}, {.dtype = DType::Int64, .device = dev});
    if (learnable) {  // pixel (h, w) of an image of class k gets kPatternGain * patterns[k][:, h % 8, w % 8]
      x = x + kPatternGain * patterns.index_select(0, y)
                                 .reshape({batch, 3, 1, 8, 1, 8})
                                 .expand({batch, 3, size / 8, 8, size / 8, 8})
                                 .reshape({batch, 3, size, size});
      y = where(rand({batch}, {.device = dev}) < kLabelNoise,
                randint(0, classes, {batch}, {.dtype = DType::Int64, .device = dev}), y);
    }
    c.xs.push_back(x.contiguous(format));
    c.ys.push_back(y);
  }
  c.x = c.xs.at(0);
  c.y = c.ys.at(0);
  return c;
}

inline ResNetCase make_resnet50(Device dev, MemoryFormat format, bool quick) {
  return make_resnet(50, quick ? 16 : 256, quick ? 64 : 224, 1000, false, dev, format);
}

struct BertCase {
  nn::models::BertConfig config;
  nn::Handle<nn::models::BertForMaskedLM> model;
  Tensor ids, types, mask, labels;          // (batch, seq) Int64 each; ids and labels are all_ids[0] and all_labels[0]
  std::vector<Tensor> all_ids, all_labels;  // the distinct batches (types and mask are the same in each)
  std::vector<Tensor> all_positions;        // with predictions > 0: (batch, predictions) Int64, the labelled positions
  int64_t batch = 0, seq = 0;
};

// A BERT masked-LM model of `config` on `dev` and `batches` batches of `batch` sequences of `seq` tokens. With
// predictions = P > 0 each sequence has exactly P labels, at distinct positions drawn uniformly from those no
// sequence pads (1 .. seq - 17), listed ascending in all_positions (as Google's BERT data lists them); else 15% of
// all positions carry a label.
inline BertCase make_bert(const nn::models::BertConfig& config, int64_t batch, int64_t seq, Device dev, int batches = 1,
                          int64_t predictions = 0) {
  BertCase c;
  c.batch = batch;
  c.seq = seq;
  c.config = config;
  c.model = nn::make<nn::models::BertForMaskedLM>(c.config);
  c.model->to(dev);
  c.model->train();
  const int64_t b = c.batch, s = c.seq;
  c.types = zeros({b, s}, {.dtype = DType::Int64, .device = dev});
  // The last 16 tokens of every other sequence are padding.
  c.mask = ones({b, s}, {.dtype = DType::Int64, .device = dev});
  for (int64_t i = 1; i < b; i += 2)
    c.mask[i].narrow(0, s - std::min<int64_t>(16, s - 1), std::min<int64_t>(16, s - 1)).fill_(0);
  // Random tokens; 15% of positions carry a label (the token itself); the rest are ignored (-100).
  const int64_t choices = s - 1 - std::min<int64_t>(16, s - 1);  // positions 1 .. s - 17
  KILN_CHECK(predictions <= choices, "make_bert: ", predictions, " predictions of ", choices, " positions");
  for (int i = 0; i < batches; ++i) {
    c.all_ids.push_back(randint(0, c.config.vocab_size, {b, s}, {.dtype = DType::Int64, .device = dev}));
    if (predictions > 0) {
      std::vector<int64_t> positions, picked(static_cast<size_t>(b * s), 0);
      for (int64_t row = 0; row < b; ++row) {
        std::vector<int64_t> some = (randperm(choices, {.dtype = DType::Int64}) + 1).to_vector<int64_t>();
        some.resize(static_cast<size_t>(predictions));
        std::sort(some.begin(), some.end());
        for (int64_t at : some) picked[static_cast<size_t>(row * s + at)] = 1;
        positions.insert(positions.end(), some.begin(), some.end());
      }
      Tensor pick = from_vector(picked, {b, s}).to(dev) != Scalar(0);
      c.all_positions.push_back(from_vector(positions, {b, predictions}).to(dev));
      c.all_labels.push_back(where(pick, c.all_ids.back(), full({b, s}, -100, {.dtype = DType::Int64, .device = dev})));
      continue;
    }
    Tensor pick = rand({b, s}, {.device = dev}) < Scalar(0.15);
    c.all_labels.push_back(where(pick, c.all_ids.back(), full({b, s}, -100, {.dtype = DType::Int64, .device = dev})));
  }
  c.ids = c.all_ids.at(0);
  c.labels = c.all_labels.at(0);
  return c;
}

inline BertCase make_bert_base(Device dev, bool quick) {
  nn::models::BertConfig config = nn::models::BertConfig::base();
  if (quick) config.num_hidden_layers = 2;
  return make_bert(config, quick ? 8 : 128, 128, dev);
}

}  // namespace kiln::bench
