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

// Options of nn::Embedding.
struct EmbeddingOptions {
  std::optional<int64_t> padding_idx{};  // that row starts at zero and gets no gradient; negative counts from the end
  // Row-sparse gradients (kiln/autograd/sparse_grad.h): backward writes only the looked-up rows, for
  // optim::SparseAdam, optim::RowWiseAdagrad or optim::SGD; weight.grad() stays undefined.
  bool sparse = false;
  Device device = Device::cpu();  // where the weight is made and drawn (the numbers are the same on every device)
};

// Integer indices (...) -> (..., embedding_dim). "weight" (num_embeddings, embedding_dim) starts N(0, 1).
class Embedding : public Module {
 public:
  // kiln::Error unless both sizes are positive and padding_idx lies in [-num_embeddings, num_embeddings).
  Embedding(int64_t num_embeddings, int64_t embedding_dim, EmbeddingOptions options = {});
  // Integer indices (...) -> (..., embedding_dim). An index outside [0, num_embeddings) is a kiln::Error naming the
  // table by its place in the model (path()), its shape and the index: `Embedding "tables.17" (1000 x 16 table):
  // index 1000 is out of range for dim 0 of size 1000 ...` (`Embedding (1000 x 16 table): ...` outside a model).
  // On a GPU the kernel finds it, and a later call raises it (kiln::IndexError) with the same name.
  Tensor forward(const Tensor& indices) override;
  // Redraws weight from N(0, 1) (from gen, or the default generator) and zeroes the padding row.
  void reset_parameters(Generator* gen = nullptr);

  // The number of rows (the vocabulary size).
  int64_t num_embeddings, embedding_dim;  // the size of each row
  std::optional<int64_t> padding_idx;     // non-negative once constructed
  bool sparse = false;                    // row-sparse gradients (EmbeddingOptions::sparse)
  Tensor weight;                          // (num_embeddings, embedding_dim)
};

}  // namespace kiln::nn
