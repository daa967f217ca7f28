// kiln/layers/embedding.h — nn::Embedding: rows of a table by integer index.
//
//   auto emb = std::make_shared<nn::Embedding>(30522, 768, nn::EmbeddingOptions{.padding_idx = 0});
//   Tensor h = (*emb)(ids);   // ids Int64 (N, S) -> (N, S, 768)
#pragma once

#include <cstdint>
#include <optional>

#include "kiln/layers/module.h"     // nn::Module
#include "kiln/tensor/generator.h"  // Generator (reset_parameters)

namespace kiln::nn {

struct EmbeddingOptions {
  std::optional<int64_t> padding_idx{};  // that row starts at zero and gets no gradient; negative counts from the end
};

// Integer indices (...) -> (..., embedding_dim). "weight" (num_embeddings, embedding_dim) starts N(0, 1).
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, EmbeddingOptions options = {});
  Tensor forward(const Tensor& indices) override;
  void reset_parameters(Generator* gen = nullptr);

  int64_t num_embeddings, embedding_dim;
  std::optional<int64_t> padding_idx;  // non-negative once constructed
  Tensor weight;
};

}  // namespace kiln::nn
