"""Golden WordPiece tokenizations for kiln's tokenizer (tests/data/test_wordpiece.cpp), made by Hugging Face
transformers' slow (Python) BertTokenizer and its BasicTokenizer. No network: the vocabulary is written here.

    python3 tests/golden/make_golden_wordpiece.py tests/golden/data

Reads tests/golden/data/wordpiece_text.txt (committed: English, accented European text, Greek, Cyrillic, CJK,
Korean, Arabic, Hindi, Thai, emoji, punctuation, odd whitespace, control characters, invalid UTF-8). Lines are
split on b"\\n" only and decoded with errors="replace", as kiln sees raw bytes. Writes:
  - wordpiece_vocab.txt: a vocabulary made from the text's words by a fixed rule (specials; most characters,
    alone and with "##"; some whole words, prefixes and "##" suffixes), so both greedy matching and [UNK] occur;
  - wordpiece.golden (format: tests/golden/make_golden.py), for <mode> = uncased (do_lower_case=True, accents
    stripped) and cased (do_lower_case=False):
      <mode>_ids (N), <mode>_ids_offsets (lines + 1): BertTokenizer.tokenize + convert_tokens_to_ids, all lines
      back to back; <mode>_basic (M), <mode>_basic_offsets (lines + 1): BasicTokenizer.tokenize, every word's
      code points followed by -1.
"""
import os
import sys

try:  # transformers 5 keeps the Python tokenizer as BertTokenizerLegacy; in 4.x it is BertTokenizer
    from transformers.models.bert.tokenization_bert_legacy import BasicTokenizer
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy as SlowBertTokenizer
except ImportError:
    from transformers.models.bert.tokenization_bert import BasicTokenizer
    from transformers.models.bert.tokenization_bert import BertTokenizer as SlowBertTokenizer
import transformers

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]"]


def read_lines(path):
    data = open(path, "rb").read()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [line.decode("utf-8", errors="replace") for line in lines]


def make_vocab(lines):
    basic = BasicTokenizer(do_lower_case=True)
    words = sorted({w for line in lines for w in basic.tokenize(line)})
    vocab = list(SPECIALS)

    def add(t):
        if t not in seen:
            seen.add(t)
            vocab.append(t)

    seen = set(vocab)
    chars = sorted({c for w in words for c in w})
    for c in chars:
        if ord(c) % 11 != 5:  # some characters stay out of the vocabulary: words holding them are [UNK]
            add(c)
            add("##" + c)
    for w in words:
        h = sum(ord(c) for c in w)
        if h % 3 == 0 and len(w) > 1:
            add(w)
        if len(w) > 4:
            add(w[:3])
            add("##" + w[-2:])
            if h % 2 == 0:
                add("##" + w[3:-2])
    return vocab


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "data")
    lines = read_lines(os.path.join(out, "wordpiece_text.txt"))
    vocab = make_vocab(lines)
    vocab_path = os.path.join(out, "wordpiece_vocab.txt")
    with open(vocab_path, "w", encoding="utf-8", newline="\n") as f:
        f.write("".join(t + "\n" for t in vocab))
    tensors = {}
    for mode, lower in (("uncased", True), ("cased", False)):
        tok = SlowBertTokenizer(vocab_path, do_lower_case=lower)
        basic = BasicTokenizer(do_lower_case=lower)
        ids, ids_offsets, cps, cps_offsets = [], [0], [], [0]
        for line in lines:
            ids += tok.convert_tokens_to_ids(tok.tokenize(line))
            ids_offsets.append(len(ids))
            for w in basic.tokenize(line):
                cps += [ord(c) for c in w] + [-1]
            cps_offsets.append(len(cps))
        tensors.update({f"{mode}_ids": ids, f"{mode}_ids_offsets": ids_offsets, f"{mode}_basic": cps,
                        f"{mode}_basic_offsets": cps_offsets})
    with open(os.path.join(out, "wordpiece.golden"), "w") as f:
        f.write(f"# kiln golden file 'wordpiece', made by tests/golden/make_golden_wordpiece.py with transformers "
                f"{transformers.__version__}, Python {sys.version.split()[0]}\n")
        for name, values in tensors.items():
            f.write(f"tensor {name} 1 {len(values)}\n")
            f.write(" ".join(str(v) for v in values) + "\n")
    print(f"wrote {vocab_path} ({len(vocab)} tokens) and wordpiece.golden ({len(lines)} lines)")


if __name__ == "__main__":
    main()
