// kiln/data/text/vocab_builder.h — builds a WordPiece vocabulary from text when no vocab.txt is given, in the
// spirit of Hugging Face tokenizers' WordPieceTrainer: BPE merges over the counts of BasicTokenizer's words,
// with "##" on the pieces that continue a word.
//
//   auto vocab = data::build_wordpiece_vocab_from_files({"corpus.txt"}, {.vocab_size = 30522});
//   data::save_vocab(vocab, "vocab.txt");
//   auto tok = data::WordPieceTokenizer::from_vocab_file("vocab.txt");
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace kiln::data {

// Options of build_wordpiece_vocab: the vocabulary's size and the pre-tokenization it is built for.
struct WordPieceTrainerOptions {
  int64_t vocab_size = 30522;              // merges stop here (the specials and the alphabet are kept even beyond it)
  int64_t min_frequency = 2;               // a pair seen fewer times (in the whole corpus) is never merged
  bool lower_case = true;                  // as the tokenizer that will use the vocabulary
  std::optional<bool> strip_accents{};     // as the tokenizer's (unset: = lower_case)
  bool tokenize_chinese_chars = true;      // as the tokenizer's
  int64_t max_input_chars_per_word = 100;  // longer words are left out (the tokenizer makes them unknown)
  // The first ids of the vocabulary, in this order.
  std::vector<std::string> special_tokens = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
};

// The vocabulary, in id order: the special tokens; every character seen, by code point; "##" + every character
// seen; then each merge's result, in merge order. Each step merges the adjacent pair with the highest count
// (word counts times occurrences); ties go to the pair whose (left id, right id) is smallest, so the result is a
// pure function of the text.
std::vector<std::string> build_wordpiece_vocab(const std::vector<std::string>& lines,
                                               const WordPieceTrainerOptions& options = {});
// The same over the lines of UTF-8 text files (a missing or unreadable file throws, naming it).
std::vector<std::string> build_wordpiece_vocab_from_files(const std::vector<std::filesystem::path>& files,
                                                          const WordPieceTrainerOptions& options = {});

}  // namespace kiln::data
