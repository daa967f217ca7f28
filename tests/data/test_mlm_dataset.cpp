// MaskedLMDataset: cutting and padding (hand-derived), masking statistics, determinism, errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "kiln/data/text/mlm_dataset.h"
#include "support/temp_folder.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

using data::MaskedLMDataset;
using data::WordPieceTokenizer;
using Ids = std::vector<int64_t>;

// [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4, then a..h = 5..12, then w0..w99 = 13..112.
WordPieceTokenizer tokenizer() {
  std::vector<std::string> vocab = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b",
                                    "c",     "d",     "e",     "f",     "g",      "h"};
  for (int i = 0; i < 100; ++i)
    vocab.push_back(std::string(1, 'w').append(std::to_string(i)));  // not "w" + ...: GCC 12 -Wrestrict
  return WordPieceTokenizer(vocab, {}, "mlm test vocabulary");
}

Ids ints(const Tensor& t) {
  EXPECT_EQ(t.dtype(), DType::Int64);
  std::vector<int64_t> out;
  for (double v : values(t)) out.push_back(static_cast<int64_t>(v));
  return out;
}

TEST(DataMaskedLM, CutsDocumentsIntoPaddedSequences) {
  TempFolder dir;
  // Document 1: a b c d e (two lines), document 2: f g, document 3 (second file): h. Blank lines with spaces
  // count as blank; several blank lines make no empty document.
  auto f1 = dir.write("one.txt", "a b c\nD e\n  \n\n\nf g\n");
  auto f2 = dir.write("two.txt", "h");
  MaskedLMDataset ds({f1, f2}, tokenizer(), {.seq_len = 5});
  ASSERT_EQ(ds.size(), 4);
  EXPECT_EQ(ds.num_documents(), 3);
  EXPECT_EQ(ds.tokens(0), (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(ds.tokens(1), (std::vector<int32_t>{8, 9}));
  EXPECT_EQ(ds.tokens(2), (std::vector<int32_t>{10, 11}));
  EXPECT_EQ(ds.tokens(3), (std::vector<int32_t>{12}));
  auto ex = ds.sample(1, /*seed=*/3);
  EXPECT_EQ(ex.names(), (std::vector<std::string>{"input_ids", "token_type_ids", "attention_mask", "labels"}));
  EXPECT_EQ(ex["input_ids"].shape(), (Shape{5}));
  EXPECT_EQ(ints(ex["attention_mask"]), (Ids{1, 1, 1, 1, 0}));
  EXPECT_EQ(ints(ex["token_type_ids"]), (Ids{0, 0, 0, 0, 0}));
  const Ids input = ints(ex["input_ids"]), labels = ints(ex["labels"]);
  EXPECT_EQ(input[0], 2);
  EXPECT_EQ(input[3], 3);
  EXPECT_EQ(input[4], 0);
  // The unmasked sequence: [CLS] d e [SEP] [PAD]; where a label is set it is the original token.
  const Ids original = {2, 8, 9, 3, 0};
  for (int i = 0; i < 5; ++i) {
    if (labels[i] == -100) {
      EXPECT_EQ(input[i], original[i]) << i;
    } else {
      EXPECT_EQ(labels[i], original[i]) << i;
    }
  }
  // A one-token sequence always has its token chosen (at least one per sequence).
  for (uint64_t seed = 0; seed < 20; ++seed)
    EXPECT_EQ(ints(ds.sample(3, seed)["labels"]), (Ids{-100, 12, -100, -100, -100}));
  // seq_len 3: one token per sequence.
  EXPECT_EQ(MaskedLMDataset({f1, f2}, tokenizer(), {.seq_len = 3}).size(), 8);
}

std::filesystem::path big_corpus(const TempFolder& dir, int lines) {
  std::string text;
  uint64_t x = 12345;
  for (int i = 0; i < lines; ++i) {
    const int words = 1 + static_cast<int>(i % 23);
    for (int w = 0; w < words; ++w) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      text += 'w';
      text += std::to_string((x >> 33) % 100);
      text += ' ';
    }
    text += (i % 17 == 16) ? "\n\n" : "\n";  // documents of 17 lines
  }
  return dir.write("big.txt", text);
}

TEST(DataMaskedLM, TokenizationDoesNotDependOnThreads) {
  TempFolder dir;
  auto f = big_corpus(dir, 3000);
  MaskedLMDataset one({f}, tokenizer(), {.seq_len = 64, .threads = 1});
  MaskedLMDataset four({f}, tokenizer(), {.seq_len = 64, .threads = 4});
  MaskedLMDataset seven({f}, tokenizer(), {.seq_len = 64, .threads = 7});
  ASSERT_EQ(one.size(), four.size());
  ASSERT_EQ(one.size(), seven.size());
  EXPECT_EQ(one.num_documents(), 3000 / 17 + 1);
  for (int64_t i = 0; i < one.size(); ++i) {
    ASSERT_EQ(one.tokens(i), four.tokens(i)) << i;
    ASSERT_EQ(one.tokens(i), seven.tokens(i)) << i;
  }
  // Every document's tokens: full sequences of 62, then the remainder.
  EXPECT_EQ(static_cast<int64_t>(one.tokens(0).size()), 62);
}

TEST(DataMaskedLM, MaskingStatistics) {
  TempFolder dir;
  auto f = big_corpus(dir, 2000);
  MaskedLMDataset ds({f}, tokenizer(), {.seq_len = 128});
  int64_t tokens = 0, chosen = 0, masked = 0, random = 0, kept = 0;
  for (int64_t i = 0; i < ds.size(); ++i) {
    for (uint64_t epoch = 0; epoch < 4; ++epoch) {
      auto ex = ds.sample(i, /*seed=*/7, epoch);
      const Ids input = ints(ex["input_ids"]), labels = ints(ex["labels"]), attention = ints(ex["attention_mask"]);
      const auto original = ds.tokens(i);
      const int64_t n = static_cast<int64_t>(original.size());
      ASSERT_EQ(input[0], 2);
      ASSERT_EQ(labels[0], -100);
      ASSERT_EQ(input[static_cast<size_t>(n + 1)], 3);
      ASSERT_EQ(labels[static_cast<size_t>(n + 1)], -100);
      for (int64_t p = n + 2; p < 128; ++p) {
        ASSERT_EQ(input[static_cast<size_t>(p)], 0);
        ASSERT_EQ(labels[static_cast<size_t>(p)], -100);
        ASSERT_EQ(attention[static_cast<size_t>(p)], 0);
      }
      for (int64_t p = 1; p <= n; ++p) {
        const auto k = static_cast<size_t>(p);
        const int64_t orig = original[k - 1];
        ++tokens;
        if (labels[k] == -100) {
          ASSERT_EQ(input[k], orig);  // not chosen: unchanged
          continue;
        }
        ASSERT_EQ(labels[k], orig);
        ++chosen;
        if (input[k] == 4) {
          ++masked;
        } else if (input[k] == orig) {
          ++kept;
        } else {
          ++random;
          ASSERT_GE(input[k], 5);  // never a special token
        }
      }
    }
  }
  ASSERT_GT(tokens, 50000);
  const double rate = double(chosen) / double(tokens);
  EXPECT_NEAR(rate, 0.15, 0.006) << chosen << " of " << tokens;
  // Random replacement draws from 108 tokens: 1 in 108 of them is the original token.
  EXPECT_NEAR(double(masked) / double(chosen), 0.8, 0.015);
  EXPECT_NEAR(double(random) / double(chosen), 0.1 * 107.0 / 108.0, 0.01);
  EXPECT_NEAR(double(kept) / double(chosen), 0.1 + 0.1 / 108.0, 0.01);
}

// max_predictions: Google's count min(P, max(1, round(n * 0.15))) of distinct token positions, uniform over the
// tokens, listed ascending in "masked_positions" and padded with 0; labels exactly there; nothing without it.
TEST(DataMaskedLM, MaxPredictionsChoosesGooglesCountAndListsThePositions) {
  TempFolder dir;
  auto f = big_corpus(dir, 600);
  constexpr int64_t P = 6;
  MaskedLMDataset ds({f}, tokenizer(), {.seq_len = 48, .max_predictions = P});
  std::vector<int64_t> hits(47, 0);  // how often each position of sequence 0 is chosen
  int64_t draws = 0, chosen_total = 0, masked = 0;
  for (int64_t i = 0; i < ds.size(); ++i) {
    for (uint64_t epoch = 0; epoch < (i == 0 ? 2000u : 2u); ++epoch) {
      auto ex = ds.sample(i, /*seed=*/3, epoch);
      ASSERT_TRUE(ex.contains("masked_positions"));
      const Ids positions = ints(ex["masked_positions"]), labels = ints(ex["labels"]), input = ints(ex["input_ids"]);
      ASSERT_EQ(positions.size(), static_cast<size_t>(P));
      const auto original = ds.tokens(i);
      const auto n = static_cast<int64_t>(original.size());
      const int64_t count = std::min<int64_t>(P, std::max<int64_t>(1, std::llround(0.15 * static_cast<double>(n))));
      for (int64_t j = 0; j < P; ++j) {
        const int64_t at = positions[static_cast<size_t>(j)];
        if (j >= count) {
          ASSERT_EQ(at, 0) << "padding entry " << j << " of sequence " << i;
          continue;
        }
        ASSERT_GE(at, 1);
        ASSERT_LE(at, n);
        if (j > 0) {
          ASSERT_GT(at, positions[static_cast<size_t>(j - 1)]) << "not ascending";
        }
        ASSERT_EQ(labels[static_cast<size_t>(at)], original[static_cast<size_t>(at - 1)]);
        masked += input[static_cast<size_t>(at)] == 4;
        if (i == 0) ++hits[static_cast<size_t>(at)];
      }
      int64_t labelled = 0;
      for (int64_t l : labels) labelled += l != -100;
      ASSERT_EQ(labelled, count) << "sequence " << i;
      chosen_total += count;
      if (i == 0) draws += count;
    }
  }
  EXPECT_NEAR(static_cast<double>(masked) / static_cast<double>(chosen_total), 0.8, 0.03);
  // Uniform over sequence 0's tokens: each is chosen count / n of the time (within 5 standard deviations).
  const auto n0 = static_cast<int64_t>(ds.tokens(0).size());
  ASSERT_GT(n0, 10);
  const double expected = static_cast<double>(draws) / static_cast<double>(n0);
  for (int64_t at = 1; at <= n0; ++at) {
    EXPECT_NEAR(static_cast<double>(hits[static_cast<size_t>(at)]), expected, 5 * std::sqrt(expected))
        << "position " << at;
  }
  // Without max_predictions there is no list.
  MaskedLMDataset plain({f}, tokenizer(), {.seq_len = 48});
  EXPECT_FALSE(plain.sample(0, 3, 0).contains("masked_positions"));
}

TEST(DataMaskedLM, MaskingIsAFunctionOfSeedEpochIndex) {
  TempFolder dir;
  auto f = big_corpus(dir, 200);
  MaskedLMDataset ds({f}, tokenizer(), {.seq_len = 64});
  for (int64_t i : {int64_t{0}, ds.size() / 2, ds.size() - 1}) {
    const Ids a = ints(ds.sample(i, 5, 1)["input_ids"]), b = ints(ds.sample(i, 5, 1)["input_ids"]);
    EXPECT_EQ(a, b);
    EXPECT_EQ(ints(ds.sample(i, 5, 1)["labels"]), ints(ds.sample(i, 5, 1)["labels"]));
  }
  int differ_epoch = 0, differ_seed = 0;
  for (int64_t i = 0; i < 20; ++i) {
    differ_epoch += ints(ds.sample(i, 5, 1)["labels"]) != ints(ds.sample(i, 5, 2)["labels"]);
    differ_seed += ints(ds.sample(i, 5, 1)["labels"]) != ints(ds.sample(i, 6, 1)["labels"]);
  }
  EXPECT_GE(differ_epoch, 18);
  EXPECT_GE(differ_seed, 18);
}

TEST(DataMaskedLM, ShortSequencesAreDeterministic) {
  TempFolder dir;
  auto f = big_corpus(dir, 400);
  MaskedLMDataset full({f}, tokenizer(), {.seq_len = 32});
  MaskedLMDataset a({f}, tokenizer(), {.seq_len = 32, .short_seq_prob = 0.5, .short_seq_seed = 3});
  MaskedLMDataset b({f}, tokenizer(), {.seq_len = 32, .short_seq_prob = 0.5, .short_seq_seed = 3, .threads = 3});
  EXPECT_GT(a.size(), full.size());
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(a.num_tokens(), full.num_tokens());
  for (int64_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a.tokens(i), b.tokens(i));
    ASSERT_LE(a.tokens(i).size(), 30u);
  }
}

TEST(DataMaskedLM, Errors) {
  TempFolder dir;
  auto good = dir.write("good.txt", "a b\n");
  expect_error([&] { MaskedLMDataset({dir.path() / "absent.txt"}, tokenizer()); }, {"absent.txt", "cannot open"});
  auto empty = dir.write("empty.txt", "");
  expect_error([&] { MaskedLMDataset({good, empty}, tokenizer()); }, {"empty.txt", "is empty"});
  auto blank = dir.write("blank.txt", "\n  \n\x07\n");
  expect_error([&] { MaskedLMDataset({blank}, tokenizer()); }, {"blank.txt", "no text"});
  expect_error([&] { MaskedLMDataset({}, tokenizer()); }, {"no text files"});
  expect_error([&] { MaskedLMDataset({good}, tokenizer(), {.seq_len = 16, .max_predictions = 15}); },
               {"max_predictions", "[0, seq_len - 2 = 14]", "15"});
  expect_error([&] { MaskedLMDataset({good}, tokenizer(), {.max_predictions = -1}); }, {"max_predictions", "-1"});
  // Binary or non-UTF-8 files are refused, naming the file and where, not tokenized into [UNK]s.
  auto binary = dir.write("model.bin", std::string("\x7F"
                                                   "ELF\x02\x01\x01\0\0\0",
                                                   10));
  expect_error(
      [&] {
        MaskedLMDataset({good, binary}, tokenizer());
      },
      {"MaskedLMDataset: ", "model.bin is not UTF-8 text: a NUL byte", "at byte offset 7 (line 1)"});
  auto latin1 = dir.write("latin1.txt", "ok\ncaf\xE9 au lait\n");
  expect_error([&] { MaskedLMDataset({latin1}, tokenizer()); },
               {"latin1.txt is not UTF-8 text: the byte 0xE9 is not valid UTF-8 at byte offset 6 (line 2)"});
  expect_error([&] { MaskedLMDataset({good}, tokenizer(), {.seq_len = 2}); }, {"seq_len", ">= 3", "2"});
  expect_error([&] { MaskedLMDataset({good}, tokenizer(), {.mask_prob = 0}); }, {"mask_prob"});
  expect_error([&] { MaskedLMDataset({good}, tokenizer(), {.mask_prob = 1.5}); }, {"mask_prob"});
  expect_error([&] { MaskedLMDataset({good}, tokenizer(), {.mask_token_prob = -0.1}); }, {"mask_token_prob"});
  expect_error([&] { MaskedLMDataset({good}, tokenizer(), {.mask_token_prob = 0.8, .random_token_prob = 0.3}); },
               {"mask_token_prob + random_token_prob"});
  expect_error([&] { MaskedLMDataset({good}, tokenizer(), {.short_seq_prob = 2}); }, {"short_seq_prob"});
  WordPieceTokenizer no_mask(std::vector<std::string>{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "a"}, {}, "/tmp/v.txt");
  expect_error([&] { MaskedLMDataset({good}, no_mask); }, {"/tmp/v.txt", "'[MASK]'"});
  MaskedLMDataset ds({good}, tokenizer(), {.seq_len = 8});
  expect_error([&] { (void)ds.sample(1); }, {"out of range"});
  EXPECT_NE(ds.describe().find("good.txt"), std::string::npos);
}

}  // namespace
}  // namespace kiln::testing
