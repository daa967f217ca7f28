// The WordPiece tokenizer (hand-derived cases and golden ids from Hugging Face's slow BertTokenizer) and the
// WordPiece vocabulary builder.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "kiln/data/text/text_check.h"
#include "kiln/data/text/vocab_builder.h"
#include "kiln/data/text/wordpiece.h"
#include "support/golden.h"
#include "support/temp_folder.h"
#include "support/test_support.h"

namespace kiln::testing {
namespace {

using data::BasicTokenizer;
using data::WordPieceTokenizer;
using Strings = std::vector<std::string>;

const Strings kVocab = {"[PAD]", "[UNK]", "[CLS]", "[SEP]",  "[MASK]", "hello", "world", ",",     "!",
                        ".",     "un",    "##aff", "##able", "want",   "##ed",  "runn",  "##ing", "a",
                        "##a",   "caf",   "##e",   "中",     "国",     "hel",   "##lo",  "x",     "##y"};

WordPieceTokenizer small_tokenizer(data::WordPieceOptions options = {}) {
  return WordPieceTokenizer(kVocab, std::move(options), "test vocabulary");
}

std::u32string cps(std::initializer_list<char32_t> c) { return std::u32string(c); }

TEST(DataBasicTokenizer, PunctuationSplitsAndWhitespaceSeparates) {
  BasicTokenizer basic;
  EXPECT_EQ(basic.tokenize("Hello, World!"), (Strings{"hello", ",", "world", "!"}));
  // ASCII symbols count as punctuation even where Unicode says Sc/Sk/Sm ($ ^ ` ~ + <).
  EXPECT_EQ(basic.tokenize("a.b,c$d^e`f~g+h<i"),
            (Strings{"a", ".", "b", ",", "c", "$", "d", "^", "e", "`", "f", "~", "g", "+", "h", "<", "i"}));
  EXPECT_EQ(basic.tokenize("«hi»—don't"), (Strings{"«", "hi", "»", "—", "don", "'", "t"}));
  EXPECT_EQ(basic.tokenize("  \t\n "), Strings{});
  // No-break space, ideographic space (Zs) and line/paragraph separators (str.isspace) separate words.
  EXPECT_EQ(basic.tokenize("a\u00a0b\u3000c\u2028d\u2029e"), (Strings{"a", "b", "c", "d", "e"}));
  // U+20AC (Sc) is not punctuation: it stays inside its word.
  EXPECT_EQ(basic.tokenize("5€x"), Strings{"5€x"});
}

TEST(DataBasicTokenizer, LowerCasesAndStripsAccents) {
  BasicTokenizer basic;
  EXPECT_EQ(basic.tokenize("Héllo CAFÉ naïve Ångström"), (Strings{"hello", "cafe", "naive", "angstrom"}));
  EXPECT_EQ(basic.tokenize("e\u0301"), Strings{"e"});  // decomposed: the mark is dropped
  // Python's str.lower: İ -> i + U+0307, whose mark accent stripping then drops.
  EXPECT_EQ(basic.split("İ"), std::vector<std::u32string>{U"i"});
  // CPython's final sigma: capital sigma at the end of a word after a letter lowers to ς, elsewhere to σ.
  EXPECT_EQ(basic.split("ΟΔΟΣ ΣΑ Σ"),
            (std::vector<std::u32string>{cps({0x3BF, 0x3B4, 0x3BF, 0x3C2}), cps({0x3C3, 0x3B1}), cps({0x3C3})}));
  // Hangul syllables decompose (NFD) into jamo, which are not marks: 한 -> ᄒ ᅡ ᆫ.
  EXPECT_EQ(basic.split("한"), std::vector<std::u32string>{cps({0x1112, 0x1161, 0x11AB})});
  // Devanagari vowel signs and viramas are Mn: dropped, as Hugging Face does. नमस्ते -> नमसत
  EXPECT_EQ(basic.split("नमस्ते"), std::vector<std::u32string>{cps({0x928, 0x92E, 0x938, 0x924})});
  // Outside the BMP: Deseret capital -> small.
  EXPECT_EQ(basic.split("\U00010400"), std::vector<std::u32string>{cps({0x10428})});
}

TEST(DataBasicTokenizer, CasedKeepsCaseAndAccentsUnlessAsked) {
  EXPECT_EQ(BasicTokenizer({.lower_case = false}).tokenize("Héllo World"), (Strings{"Héllo", "World"}));
  // NFC first: a decomposed é is composed, a CJK compatibility ideograph becomes its unified one, Hangul jamo
  // compose into a syllable, marks are put in canonical order (dot below before acute) before composing.
  BasicTokenizer cased({.lower_case = false});
  EXPECT_EQ(cased.split("e\u0301"), std::vector<std::u32string>{cps({0xE9})});
  EXPECT_EQ(cased.split("\uf906"), std::vector<std::u32string>{cps({0x53E5})});
  EXPECT_EQ(cased.split("\u1112\u1161\u11ab"), std::vector<std::u32string>{cps({0xD55C})});
  EXPECT_EQ(cased.split("a\u0301\u0323"), std::vector<std::u32string>{cps({0x1EA1, 0x301})});
  EXPECT_EQ(BasicTokenizer({.lower_case = false, .strip_accents = true}).tokenize("Héllo"), Strings{"Hello"});
  EXPECT_EQ(BasicTokenizer({.lower_case = true, .strip_accents = false}).tokenize("HÉllo"), Strings{"héllo"});
}

TEST(DataBasicTokenizer, CjkIdeographsAreWordsOfTheirOwn) {
  BasicTokenizer basic;
  EXPECT_EQ(basic.tokenize("中国abc日本"), (Strings{"中", "国", "abc", "日", "本"}));
  // Kana and Hangul are not in BERT's CJK ranges: they stay together.
  EXPECT_EQ(basic.tokenize("カタカナ"), Strings{"カタカナ"});
  EXPECT_EQ(BasicTokenizer({.tokenize_chinese_chars = false}).tokenize("中国abc"), Strings{"中国abc"});
}

TEST(DataBasicTokenizer, ControlCharactersAreDroppedAndWhitespaceKept) {
  BasicTokenizer basic;
  EXPECT_EQ(basic.tokenize("hel\x07lo\tworld\r\nx\x1b y"), (Strings{"hello", "world", "x", "y"}));
  EXPECT_EQ(basic.tokenize(std::string("a\0b", 3)), Strings{"ab"});                                     // NUL dropped
  EXPECT_EQ(basic.tokenize("soft\u00adhyphen zero\u200bwidth"), (Strings{"softhyphen", "zerowidth"}));  // Cf
  EXPECT_EQ(basic.tokenize("a\ufffdb"), Strings{"ab"});
}

TEST(DataBasicTokenizer, InvalidUtf8IsDroppedNeverFatal) {
  BasicTokenizer basic;
  EXPECT_EQ(basic.tokenize("hel\xfflo"), Strings{"hello"});
  EXPECT_EQ(basic.tokenize("\xe4\xb8"
                           "a"),
            Strings{"a"});                                     // truncated 3-byte sequence, then 'a'
  EXPECT_EQ(basic.tokenize("hello\xe4"), Strings{"hello"});    // truncated at the end
  EXPECT_EQ(basic.tokenize("x\xc0\xafy"), Strings{"xy"});      // overlong '/' is not a slash
  EXPECT_EQ(basic.tokenize("x\xed\xa0\x80y"), Strings{"xy"});  // an encoded surrogate
  EXPECT_EQ(basic.tokenize("\x80\x80\xbf"), Strings{});
  EXPECT_EQ(basic.tokenize("caf\xc3\xa9\xf0\x9f"), Strings{"cafe"});
  // Every byte string decodes without crashing.
  for (int b = 0; b < 256; ++b) {
    std::string s = "a";
    s += static_cast<char>(b);
    s += static_cast<char>(0x80 + (b * 7) % 64);
    EXPECT_NO_THROW(basic.tokenize(s));
  }
}

TEST(DataWordPiece, GreedyLongestMatchWithContinuations) {
  auto tok = small_tokenizer();
  EXPECT_EQ(tok.tokenize("unaffable"), (Strings{"un", "##aff", "##able"}));
  EXPECT_EQ(tok.tokenize("Wanted running, HELLO!"), (Strings{"want", "##ed", "runn", "##ing", ",", "hello", "!"}));
  EXPECT_EQ(tok.tokenize("Café"), (Strings{"caf", "##e"}));
  EXPECT_EQ(tok.tokenize("hello hellos"), (Strings{"hello", "[UNK]"}));  // "##s" is missing: the word is unknown
  EXPECT_EQ(tok.tokenize("helo"), Strings{"[UNK]"});  // "hel" then no "##o": the whole word is unknown
  EXPECT_EQ(tok.tokenize("xyyy"), (Strings{"x", "##y", "##y", "##y"}));
  EXPECT_EQ(tok.tokenize("中国x"), (Strings{"中", "国", "x"}));
  EXPECT_EQ(tok.encode("hello, world!"), (std::vector<int32_t>{5, 7, 6, 8}));
  EXPECT_EQ(tok.encode(""), std::vector<int32_t>{});
}

TEST(DataWordPiece, LongWordsAreUnknown) {
  auto tok = small_tokenizer();
  const std::string a100(100, 'a');
  auto pieces = tok.tokenize(a100);
  ASSERT_EQ(pieces.size(), 100u);
  EXPECT_EQ(pieces[0], "a");
  EXPECT_EQ(pieces[99], "##a");
  EXPECT_EQ(tok.tokenize(a100 + "a"), Strings{"[UNK]"});
  EXPECT_EQ(small_tokenizer({.max_input_chars_per_word = 3}).tokenize("aaa aaaa"),
            (Strings{"a", "##a", "##a", "[UNK]"}));
  // Characters, not bytes: 4 two-byte characters are 4.
  auto short_tok = small_tokenizer({.max_input_chars_per_word = 4});
  EXPECT_EQ(short_tok.basic().tokenize("éééé"), Strings{"eeee"});
}

TEST(DataWordPiece, IdsAndTokens) {
  auto tok = small_tokenizer();
  EXPECT_EQ(tok.vocab_size(), static_cast<int64_t>(kVocab.size()));
  EXPECT_EQ(tok.pad_id(), 0);
  EXPECT_EQ(tok.unk_id(), 1);
  EXPECT_EQ(tok.cls_id(), 2);
  EXPECT_EQ(tok.sep_id(), 3);
  EXPECT_EQ(tok.mask_id(), 4);
  EXPECT_EQ(tok.token_to_id("##able"), 12);
  EXPECT_EQ(tok.id_to_token(12), "##able");
  EXPECT_EQ(tok.convert_tokens_to_ids({"hello", "nope", "!"}), (std::vector<int32_t>{5, 1, 8}));
  EXPECT_EQ(tok.convert_ids_to_tokens({2, 5, 3}), (Strings{"[CLS]", "hello", "[SEP]"}));
  expect_error([&] { (void)tok.token_to_id("nope"); }, {"test vocabulary", "no token 'nope'"});
  expect_error([&] { (void)tok.id_to_token(27); }, {"id 27", "out of range"});
  expect_error([&] { (void)tok.convert_ids_to_tokens({-1}); }, {"id -1"});
  WordPieceTokenizer no_mask(Strings{"[UNK]", "a"});
  expect_error([&] { (void)no_mask.mask_id(); }, {"no token '[MASK]'"});
}

TEST(DataWordPiece, VocabFiles) {
  TempFolder dir;
  // Windows line ends and a final empty line.
  auto path = dir.write("vocab.txt", "[PAD]\r\n[UNK]\r\nhello\r\n##s\r\n\r\n");
  auto tok = WordPieceTokenizer::from_vocab_file(path);
  EXPECT_EQ(tok.vocab_size(), 4);
  EXPECT_EQ(tok.tokenize("hellos"), (Strings{"hello", "##s"}));
  EXPECT_EQ(tok.source(), path.string());
  // save_vocab writes what from_vocab_file reads back.
  auto saved = dir.path() / "saved.txt";
  tok.save_vocab(saved);
  EXPECT_EQ(WordPieceTokenizer::from_vocab_file(saved).vocab(), tok.vocab());

  auto dup = dir.write("dup.txt", "[UNK]\na\nb\na\n");
  expect_error([&] { WordPieceTokenizer::from_vocab_file(dup); }, {dup.string(), "'a' twice", "line 2", "line 4"});
  expect_error([&] { WordPieceTokenizer::from_vocab_file(dir.path() / "absent.txt"); }, {"absent.txt", "cannot open"});
  auto empty = dir.write("empty.txt", "");
  expect_error([&] { WordPieceTokenizer::from_vocab_file(empty); }, {"empty.txt", "empty"});
  auto no_unk = dir.write("no_unk.txt", "a\nb\n");
  expect_error([&] { WordPieceTokenizer::from_vocab_file(no_unk); }, {"no_unk.txt", "'[UNK]'"});
  EXPECT_EQ(WordPieceTokenizer::from_vocab_file(no_unk, {.unk_token = "b"}).tokenize("c"), Strings{"b"});
}

// ------------------------------------------------------------------ golden: Hugging Face's slow BertTokenizer

std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<int64_t> as_ints(const Tensor& t) {
  std::vector<int64_t> out;
  for (double v : values(t)) out.push_back(static_cast<int64_t>(v));
  return out;
}

// Each line of wordpiece_text.txt (raw bytes, invalid UTF-8 included) against the golden ids and words of the
// `mode` (uncased: lower_case, accents stripped; cased: neither).
void expect_golden_wordpiece(const std::string& mode, bool lower_case) {
  const std::filesystem::path dir = KILN_GOLDEN_DIR;
  const Golden g =
      load_golden("wordpiece", "python3 tests/golden/make_golden_wordpiece.py tests/golden/data (needs transformers)");
  auto tok = WordPieceTokenizer::from_vocab_file(dir / "wordpiece_vocab.txt", {.lower_case = lower_case});
  const std::string text = read_bytes(dir / "wordpiece_text.txt");
  std::vector<std::string> lines;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  const auto ids = as_ints(g.get(mode + "_ids")), ids_offsets = as_ints(g.get(mode + "_ids_offsets"));
  const auto basic = as_ints(g.get(mode + "_basic")), basic_offsets = as_ints(g.get(mode + "_basic_offsets"));
  ASSERT_EQ(ids_offsets.size(), lines.size() + 1);
  ASSERT_EQ(basic_offsets.size(), lines.size() + 1);
  for (size_t i = 0; i < lines.size(); ++i) {
    SCOPED_TRACE(mode + " line " + std::to_string(i + 1) + ": " + lines[i]);
    const std::vector<int32_t> expected_ids(ids.begin() + ids_offsets[i], ids.begin() + ids_offsets[i + 1]);
    const auto actual_ids = tok.encode(lines[i]);
    EXPECT_EQ(actual_ids, expected_ids) << "kiln: " << ::testing::PrintToString(tok.convert_ids_to_tokens(actual_ids))
                                        << "\nHF:   "
                                        << ::testing::PrintToString(tok.convert_ids_to_tokens(expected_ids));
    std::vector<std::u32string> expected_words(1);
    for (int64_t k = basic_offsets[i]; k < basic_offsets[i + 1]; ++k) {
      if (basic[static_cast<size_t>(k)] < 0) {
        expected_words.emplace_back();
      } else {
        expected_words.back().push_back(static_cast<char32_t>(basic[static_cast<size_t>(k)]));
      }
    }
    expected_words.pop_back();
    EXPECT_EQ(tok.basic().split(lines[i]), expected_words) << "the words of BasicTokenizer differ";
  }
}

// A missing wordpiece.golden fails these (expect_golden_wordpiece's load_golden names the script).
TEST(DataWordPiece, MatchesHuggingFaceBertTokenizerUncased) { expect_golden_wordpiece("uncased", true); }

TEST(DataWordPiece, MatchesHuggingFaceBertTokenizerCased) { expect_golden_wordpiece("cased", false); }

// ------------------------------------------------------------------ vocabulary builder

TEST(DataWordPieceVocab, MergesMostFrequentPairsWithFixedTieBreak) {
  // "ab" and "cd" 3 times each: both pairs count 3; (a, ##b) has the smaller ids, so it merges first.
  const Strings lines = {"ab cd", "cd ab", "ab cd"};
  const Strings expected_base = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a",  "b",
                                 "c",     "d",     "##a",   "##b",   "##c",    "##d"};
  Strings expected = expected_base;
  expected.push_back("ab");
  expected.push_back("cd");
  EXPECT_EQ(data::build_wordpiece_vocab(lines, {.vocab_size = 100, .min_frequency = 2}), expected);
  EXPECT_EQ(data::build_wordpiece_vocab(lines, {.vocab_size = 14, .min_frequency = 2}),
            Strings(expected.begin(), expected.end() - 1));
  EXPECT_EQ(data::build_wordpiece_vocab(lines, {.vocab_size = 100, .min_frequency = 4}), expected_base);
  // Continuation pieces merge into "##" pieces: "xyz" x2 -> (x, ##y) -> "xy", then ("xy", ##z) -> "xyz".
  EXPECT_EQ(data::build_wordpiece_vocab({"xyz xyz"}, {.vocab_size = 100, .special_tokens = {"[UNK]"}}),
            (Strings{"[UNK]", "x", "y", "z", "##x", "##y", "##z", "xy", "xyz"}));
}

TEST(DataWordPieceVocab, BuildsAVocabularyTheTokenizerUses) {
  const Strings corpus = {
      "The quick brown fox jumps over the lazy dog.",      "The dog sleeps; the fox runs away quickly!",
      "Quickly, quickly, the foxes jumped over the dogs.", "Crème brûlée is a dessert — the dessert of the day.",
      "中文也可以。 Jumping, running, sleeping.",
  };
  TempFolder dir;
  auto corpus_file = dir.write_lines("corpus.txt", corpus);
  const auto vocab = data::build_wordpiece_vocab_from_files({corpus_file}, {.vocab_size = 120, .min_frequency = 2});
  EXPECT_EQ(vocab, data::build_wordpiece_vocab(corpus, {.vocab_size = 120, .min_frequency = 2}));  // same lines
  EXPECT_EQ(vocab, data::build_wordpiece_vocab(corpus, {.vocab_size = 120, .min_frequency = 2}));  // deterministic
  ASSERT_LE(vocab.size(), 120u);
  EXPECT_EQ(Strings(vocab.begin(), vocab.begin() + 5), (Strings{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}));
  const auto path = dir.path() / "vocab.txt";
  data::save_vocab(vocab, path);
  auto tok = WordPieceTokenizer::from_vocab_file(path);
  BasicTokenizer basic;
  for (const auto& line : corpus) {
    for (const auto& word : basic.tokenize(line)) {
      const auto pieces = tok.tokenize(word);
      std::string joined;
      for (const auto& p : pieces) {
        EXPECT_NE(p, "[UNK]") << word;
        joined += p.rfind("##", 0) == 0 ? p.substr(2) : p;
      }
      EXPECT_EQ(joined, word);
    }
  }
  // The most frequent word is one token; the alphabet is all there.
  EXPECT_EQ(tok.tokenize("the"), Strings{"the"});
  for (const char* ch : {"q", "##q", "z", "##z", "中", "##中", "e", "##e", "—", "##—"}) {
    EXPECT_TRUE(tok.find(ch).has_value()) << ch;
  }
  expect_error([&] { data::build_wordpiece_vocab_from_files({dir.path() / "absent.txt"}); }, {"absent.txt"});
}

// TextCheck: the byte offset and line of the first byte that is not UTF-8 text, for each kind of bad sequence
// (offsets counted by hand), and valid text of every UTF-8 length passes whatever the split into lines.
TEST(DataTextCheck, NamesTheFirstInvalidByteAndItsLine) {
  auto first_problem = [](const std::string& text) -> std::string {
    try {
      data::TextCheck check("t.txt", "test");
      std::istringstream in(text);
      for (std::string line; std::getline(in, line);) check.line(line);
      check.finish();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  // Valid: ASCII, 2-, 3- and 4-byte sequences (é, 中, U+10FFFF, 𝄞), a BOM, tabs, CR and form feeds.
  EXPECT_EQ(first_problem("\xEF\xBB\xBF"
                          "caf\xC3\xA9 \xE4\xB8\xAD\t\r\n\f\xF4\x8F\xBF\xBF \xF0\x9D\x84\x9E\n"),
            "");
  struct Case {
    std::string text, byte, offset, line;
  };
  for (const Case& c : std::vector<Case>{
           {std::string("ab\ncd\0e", 8), "a NUL byte", "5", "2"},
           {"ab\n\n\xFF", "0xFF", "4", "3"},        // never in UTF-8
           {"x\xC0\x80", "0xC0", "1", "1"},         // an overlong NUL
           {"\xE0\x80\xAF", "0xE0", "0", "1"},      // an overlong '/'
           {"ok\n\xED\xA0\x80", "0xED", "3", "2"},  // a UTF-16 surrogate, U+D800
           {"\xF4\x90\x80\x80", "0xF4", "0", "1"},  // U+110000, beyond Unicode
           {"abc\xE4\xB8", "0xE4", "3", "1"},       // cut short by the end of the file
           {"abc\xE4\xB8\nx", "0xE4", "3", "1"},    // cut short by the end of the line
           {"\x80"
            "abc",
            "0x80", "0", "1"},  // a continuation byte with no start
       }) {
    const std::string what = first_problem(c.text);
    EXPECT_NE(what.find("test: t.txt is not UTF-8 text: "), std::string::npos) << what;
    EXPECT_NE(what.find(c.byte), std::string::npos) << what;
    EXPECT_NE(what.find("at byte offset " + c.offset + " (line " + c.line + ")"), std::string::npos) << what;
  }
  // Control characters: a few are text (BEL in old files), many are a binary file.
  EXPECT_EQ(first_problem(std::string(15, '\x01') + std::string(100, 'a')), "");
  const std::string binary = "text\n" + std::string(20, '\x02') + std::string(100, 'a');
  const std::string what = first_problem(binary);
  EXPECT_NE(what.find("t.txt does not look like text: 20 of its 126 characters are control characters (the first at "
                      "byte offset 5, line 2)"),
            std::string::npos)
      << what;
}

// The files a vocabulary is built from are checked (so are those of MaskedLMDataset: test_mlm_dataset.cpp).
TEST(DataWordPieceVocab, RefusesFilesThatAreNotText) {
  TempFolder dir;
  auto latin1 = dir.write("latin1.txt", "na\xEFve\ncaf\xE9\n");
  expect_error([&] { data::build_wordpiece_vocab_from_files({latin1}); },
               {"build_wordpiece_vocab_from_files: ",
                "latin1.txt is not UTF-8 text: the byte 0xEF is not valid UTF-8 at "
                "byte offset 2 (line 1)"});
  auto nul = dir.write("nul.txt", std::string("abc\ndef\0", 8));
  expect_error([&] { data::build_wordpiece_vocab_from_files({nul}); }, {"nul.txt", "a NUL byte", "offset 7 (line 2)"});
}

}  // namespace
}  // namespace kiln::testing
