// Layer and model sizes from user input (DESIGN.md rule 11): an Embedding or a BERT config whose weights count
// more than 2^63-1 elements or bytes is refused naming the sizes. Both once built a weight whose element count
// had wrapped (Embedding(2^62, 4): numel 0), whose forward then segfaulted.
#include <gtest/gtest.h>

#include <cstdint>

#include "kiln/layers/layers.h"
#include "kiln/layers/models/bert.h"
#include "kiln/tensor/internal_ops.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

TEST(LayerSizeChecks, EmbeddingRefusesAWeightWhoseSizeOverflows) {
  // 2^62 x 4 elements: the count wraps to 0 in int64.
  expect_error([] { nn::Embedding e(int64_t{1} << 62, 4); },
               {"Embedding (num_embeddings, embedding_dim) weight: shape [4611686018427387904, 4]",
                "more than 2^63-1 elements"});
  // 2^60 x 4 elements fit; their float32 bytes (2^64) do not.
  expect_error([] { nn::Embedding e(int64_t{1} << 60, 4); }, {"Embedding", "[1152921504606846976, 4]", "2^63-1"});
  // The forward of the case that segfaulted cannot be reached: the module is never built. A small one works.
  nn::Embedding ok(5, 3);
  EXPECT_EQ(ok.forward(internal::from_vector<int64_t>({4, 0}, {2})).shape(), (Shape{2, 3}));
}

TEST(LayerSizeChecks, BertConfigRefusesSizesWhoseWeightsOverflow) {
  // The bert example's --size custom --hidden 4 --heads 1 --layers 1 --intermediate 4 --max-positions 2^62.
  nn::models::BertConfig c{.vocab_size = 100,
                           .hidden_size = 4,
                           .num_hidden_layers = 1,
                           .num_attention_heads = 1,
                           .intermediate_size = 4,
                           .max_position_embeddings = int64_t{1} << 62};
  expect_error([&] { c.validate(); },
               {"BertConfig: max_position_embeddings (4611686018427387904) x hidden_size (4)", "exceed 2^63-1 bytes"});
  expect_error([&] { nn::models::BertModel m(c); }, {"BertConfig", "max_position_embeddings"});
  // A parameter count that overflows only in the sum over layers.
  nn::models::BertConfig layers{.vocab_size = 100,
                                .hidden_size = 1 << 20,
                                .num_hidden_layers = int64_t{1} << 40,
                                .num_attention_heads = 1,
                                .intermediate_size = 4,
                                .max_position_embeddings = 8};
  expect_error([&] { layers.validate(); }, {"BertConfig: the parameter count", "overflows"});
  // Sizes that fit still count exactly: base's 109,482,240 parameters, as Hugging Face's bert-base-uncased.
  EXPECT_EQ(nn::models::BertConfig::base().num_parameters(), 109482240);
  EXPECT_NO_THROW(nn::models::BertConfig::base().validate());
}

}  // namespace
}  // namespace kiln::testing
