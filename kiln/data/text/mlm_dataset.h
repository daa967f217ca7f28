// kiln/data/text/mlm_dataset.h — masked-LM pretraining samples (BERT) from raw UTF-8 text files.
//
//   auto tok = data::WordPieceTokenizer::from_vocab_file("vocab.txt");
//   data::MaskedLMDataset ds({"wiki_0.txt", "wiki_1.txt"}, tok, {.seq_len = 128});
//   data::Example ex = ds.sample(0, /*seed=*/1, /*epoch=*/0);
//   ex["input_ids"];       // (L) int64: [CLS] tokens... [SEP] [PAD]..., some tokens masked
//   ex["token_type_ids"];  // (L) int64 zeros
//   ex["attention_mask"];  // (L) int64: 1 on [CLS], tokens and [SEP]; 0 on padding
//   ex["labels"];          // (L) int64: the original id where a token was chosen for prediction, else -100
//   ex["masked_positions"];  // (P) int64, with max_predictions = P > 0 only: the chosen positions, ascending,
//                            // then 0 (the [CLS] token, never predicted) up to P
//
// Construction tokenizes everything once (several threads; the result does not depend on their number). A
// document is a run of non-blank lines; its lines' tokens are concatenated and cut into sequences of
// seq_len - 2 tokens (the last one shorter), each wrapped as [CLS] ... [SEP] and padded with [PAD].
//
// Masking happens in get(), from the sample's SampleRng, so each epoch masks differently: every token other
// than [CLS]/[SEP]/[PAD] is chosen with probability mask_prob; when none is, one position is chosen uniformly
// (every sequence then has a loss term, as Google's BERT, which predicts max(1, round(n * 0.15)) tokens). With
// max_predictions = P > 0 the choice is Google's instead: min(P, max(1, round(n * mask_prob))) of the n tokens,
// uniformly without replacement, and the sample lists them in "masked_positions", so that
// BertForMaskedLM::forward computes its head on those P rows of each sequence only. A
// chosen token becomes [MASK] (mask_token_prob), a uniform random token that is none of [PAD] [UNK] [CLS] [SEP]
// [MASK] (random_token_prob), or stays (the rest). labels use -100, nn::cross_entropy's default ignore_index.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "kiln/data/dataset.h"
#include "kiln/data/text/wordpiece.h"

namespace kiln::data {

// Options of MaskedLMDataset: the sequence length and BERT's masking probabilities (see the top of this file).
struct MaskedLMOptions {
  int64_t seq_len = 128;           // L, including [CLS] and [SEP]
  double mask_prob = 0.15;         // the chance that a token is chosen for prediction, in (0, 1]
  double mask_token_prob = 0.8;    // the chance that a chosen token becomes [MASK]
  double random_token_prob = 0.1;  // the chance that a chosen token becomes a random one (the rest stay)
  // With this probability a sequence is cut shorter: a length drawn uniformly in [2, seq_len - 2] (as Google's
  // create_pretraining_data.py), from SampleRng(short_seq_seed, 0, document index), so it is fixed at construction.
  double short_seq_prob = 0;
  uint64_t short_seq_seed = 0;  // the seed of the short-sequence draws
  // > 0: at most this many predictions per sequence, chosen as Google's BERT chooses them (see the top of this
  // file), and each sample has "masked_positions" (max_predictions). At most seq_len - 2. 20 is Google's for
  // seq_len 128 (15% of 126 tokens is 19).
  int64_t max_predictions = 0;
  int threads = 0;  // tokenizer threads at construction; 0: std::thread::hardware_concurrency()
};

inline constexpr int64_t kIgnoreLabel = -100;  // labels where nothing is predicted (nn::cross_entropy's default)

// BERT's masked-LM pretraining samples from UTF-8 text files, tokenized once at construction (see the top of this
// file).
class MaskedLMDataset : public Dataset {
 public:
  // Reads, checks (TextCheck) and tokenizes `files`. kiln::Error for no files, options out of range, a vocabulary
  // without the special tokens, or a file that is unreadable or not UTF-8 text.
  MaskedLMDataset(const std::vector<std::filesystem::path>& files, const WordPieceTokenizer& tokenizer,
                  MaskedLMOptions options = {});

  int64_t size() const override { return static_cast<int64_t>(offsets_.size()) - 1; }
  Example get(int64_t index, SampleRng& rng) const override;
  std::string describe() const override;

  // The unmasked tokens of sequence i, without [CLS]/[SEP]/padding.
  std::vector<int32_t> tokens(int64_t index) const;
  // The documents (runs of non-blank lines) found in the files.
  int64_t num_documents() const { return num_documents_; }
  // The tokens of every sequence together, without special tokens and padding.
  int64_t num_tokens() const { return static_cast<int64_t>(ids_.size()); }
  // The options as given.
  const MaskedLMOptions& options() const { return options_; }

 private:
  MaskedLMOptions options_;
  std::vector<int32_t> ids_;         // every sequence's tokens, back to back
  std::vector<int64_t> offsets_;     // sequence i is ids_[offsets_[i], offsets_[i + 1])
  std::vector<int32_t> random_ids_;  // what a "random token" is drawn from
  int32_t cls_ = 0, sep_ = 0, pad_ = 0, mask_ = 0;
  int64_t num_documents_ = 0;
  std::string files_;  // for messages
};

}  // namespace kiln::data
