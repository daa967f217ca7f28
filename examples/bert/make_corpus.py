#!/usr/bin/env python3
"""Writes a seeded, generated text corpus on which masked-LM pretraining can learn a lot in a few thousand steps.

    python3 examples/bert/make_corpus.py --out corpus            # about 30 M tokens in corpus/text/, corpus/vocab.txt
    bert pretrain --text corpus/text --vocab corpus/vocab.txt ...

It serves the FP8 convergence check (fp8_convergence.sh): a text whose masked-LM loss falls well below the uniform
ln(vocabulary) within 2,000 steps, so that a gap between the bf16 and FP8 curves shows where the model learns, not
where it is still guessing. Plain English text (data/sample.txt) is too small for 2,000 steps of 128 x 128 tokens,
and a large natural corpus cannot be carried in the repository.

What the text looks like. A vocabulary of --words made-up lower-case words (syllables such as "ka", "lu", "dre"), one
sentence per line, each sentence capitalised and ended by " .", and paragraphs of 10 to 40 sentences separated by a
blank line (bert pretrain reads a run of non-blank lines as one document):

    Za repo doste stoda stai tru .
    Ka foli dru bru mo do vizi bema nu gebra pake dru bufo dretre trufu fise faba bu nina nu gebra lo suga runa tefe .

(the first lines of the default corpus; the second is cut short here). Each line is about 14 tokens on average.

How the sentences are made: an order-2 Markov chain over the words. Word frequencies follow Zipf's law (the k-th
most frequent word is drawn in proportion to 1 / (k + 2.7)), and the most frequent words are the shortest, as in
natural languages. Every word b has a set of 12 possible successors drawn from that Zipf distribution (the end of
the sentence among them, for most words); every pair of consecutive words (a, b) allows only 2 to 4 of b's
successors, with random weights (multiples of 1/32). A sentence starts from the pair (start, start), whose successors
are 32 equally likely words drawn from the Zipf distribution, and ends at the end-of-sentence word (or after 40 words).

Why the loss can fall. Given the two words before it, the next word is one of at most 4, so the text has at most
ln 4 = 1.39 nats of entropy per word, and less on average; a masked word is pinned down further by the words
after it (a BERT sees both sides). The uniform guess over the vocabulary costs ln(vocabulary size) = ln 4096 = 8.32
nats with the default --words. A model first learns the Zipf frequencies, then the successor sets of each word
(bigrams), then those of each pair. (Measured on the default corpus: 6.0 nats of unigram entropy, 1.18
nats of entropy of a word given the two before it; about 2,600 of the words occur, the rarest never.)
BERT-Tiny (2 layers, hidden 128) on the CPU, 400 steps of 32 x 128 at lr 1e-3 (--amp off), went from 8.30 through the
unigram plateau (6.0 at step 100) to 5.8, below it; BERT-base over 2,000 steps of 128 sees 20 times as many sequences.

Output, in --out:
  text/part-NNN.txt   the corpus, --sentences-per-file sentences per file (UTF-8, ASCII in fact)
  vocab.txt           a BERT vocabulary: [PAD] [UNK] [CLS] [SEP] [MASK], ".", then the words by frequency rank, so
                      that every word is one token (give it to bert pretrain with --vocab; --build-vocab works too)

The output depends only on the options (Python's random.Random(seed), through random() and getrandbits() only, whose
sequences Python keeps stable across versions). The default, 2.2 M sentences (30.7 M tokens, 130 MB in 11 files), takes
about 10 s.
"""

import argparse
import bisect
import math
import os
import random
import sys
import time

# Special tokens first, as in BERT's vocab.txt; then the sentence end "." (its own token: BERT's tokenizer splits
# punctuation from words).
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PERIOD = "."

ONSETS = ["", "b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "st", "tr"]
VOWELS = ["a", "e", "i", "o", "u"]

SUCCESSORS_PER_WORD = 12  # the successor set of each word
PAIR_CHOICES = (2, 3, 4)  # how many of them a pair of words allows
WEIGHT_SLOTS = 32  # a pair's successor weights are multiples of 1 / WEIGHT_SLOTS
STARTERS = 32  # first words of sentences, equally likely (WEIGHT_SLOTS of them)
END_PROBABILITY = 0.8  # share of the words whose successor set holds the end of the sentence
MAX_SENTENCE_WORDS = 40
PARAGRAPH_SENTENCES = (10, 40)
ZIPF_OFFSET, ZIPF_EXPONENT = 2.7, 1.0


def make_words(rng, count):
    """count distinct made-up words, shortest first (the most frequent words get the shortest spellings)."""
    words, seen = [], set()
    syllables = [o + v for o in ONSETS for v in VOWELS]
    length = 1
    attempts = 0
    while len(words) < count:
        # 1 syllable while there are enough unused ones, then 2, 3, ...: the words come out shortest first.
        word = "".join(syllables[int(rng.random() * len(syllables))] for _ in range(length))
        attempts += 1
        if word not in seen:
            seen.add(word)
            words.append(word)
            attempts = 0
        elif attempts > 20 * len(syllables) ** min(length, 2):
            length += 1
            attempts = 0
        if length == 1 and len(words) >= len(syllables) // 2:
            length = 2  # keep most single syllables for the longer words' variety
    return words


class Chain:
    """The order-2 Markov chain: word ids 0..V-1, END = V, START = V + 1."""

    def __init__(self, rng, num_words):
        self.num_words = num_words
        self.end = num_words
        self.start = num_words + 1
        cumulative, total = [], 0.0
        for rank in range(num_words):
            total += 1.0 / (rank + 1 + ZIPF_OFFSET) ** ZIPF_EXPONENT
            cumulative.append(total)

        def zipf_draws(n, exclude=()):
            picked = []
            while len(picked) < n:
                w = min(bisect.bisect_left(cumulative, rng.random() * total), num_words - 1)
                if w not in picked and w not in exclude:
                    picked.append(w)
            return picked

        # successors[b]: the successor set of word b (and of START)
        self.successors = []
        for _ in range(num_words):
            s = zipf_draws(SUCCESSORS_PER_WORD)
            if rng.random() < END_PROBABILITY:
                s[int(rng.random() * len(s))] = self.end
            self.successors.append(s)
        self.successors.append([])  # END has none: a sentence stops there
        self.successors.append(zipf_draws(STARTERS))  # START
        self.rng = rng
        self.pairs = {}  # (a * (V + 2) + b) -> a tuple of WEIGHT_SLOTS successors, made when first met
        stride = num_words + 2
        self.pairs[self.start * stride + self.start] = tuple(self.successors[self.start])  # any of the starters

    def pair_table(self, a, b):
        """What may follow (a, b): a few of b's successors, each repeated in proportion to its weight."""
        rng = self.rng
        pool = list(self.successors[b])
        n = min(PAIR_CHOICES[int(rng.random() * len(PAIR_CHOICES))], len(pool))
        chosen = []
        for _ in range(n):
            chosen.append(pool.pop(int(rng.random() * len(pool))))
        weights = [rng.random() + 0.1 for _ in chosen]
        scale = (WEIGHT_SLOTS - n) / sum(weights)
        slots = [1 + int(w * scale) for w in weights]  # at least one slot each
        slots[0] += WEIGHT_SLOTS - sum(slots)
        table = []
        for word, k in zip(chosen, slots):
            table.extend([word] * k)
        return tuple(table)

    def sentence(self):
        """The word ids of one sentence (without the end)."""
        rng_bits = self.rng.getrandbits
        pairs, stride, end = self.pairs, self.num_words + 2, self.end
        bits = WEIGHT_SLOTS.bit_length() - 1
        a = b = self.start
        out = []
        while len(out) < MAX_SENTENCE_WORDS:
            key = a * stride + b
            table = pairs.get(key)
            if table is None:
                table = pairs[key] = self.pair_table(a, b)
            w = table[rng_bits(bits)]
            if w == end:
                break
            out.append(w)
            a, b = b, w
        return out


def main(argv):
    parser = argparse.ArgumentParser(
        description="Writes a seeded, generated corpus for masked-LM pretraining (an order-2 Markov chain over "
        "made-up words with Zipf frequencies) and its vocab.txt."
    )
    parser.add_argument("--out", required=True, help="folder for text/ and vocab.txt (created)")
    parser.add_argument(
        "--sentences", type=int, default=2_200_000,
        help="sentences in all (default: 2,200,000, about 30 M tokens: 2,000 steps of 128 x 128 without repeats)",
    )
    parser.add_argument("--sentences-per-file", type=int, default=200_000, help="sentences per text file")
    parser.add_argument("--words", type=int, default=4090,
                        help="made-up words (default 4090: with the 6 other tokens, a vocabulary of 4,096)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the words, the chain and the text")
    args = parser.parse_args(argv)
    if args.sentences <= 0 or args.sentences_per_file <= 0:
        parser.error("--sentences and --sentences-per-file must be positive")
    if not 10 <= args.words <= 100_000:
        parser.error(f"--words takes 10 to 100000, got {args.words}")
    text_dir = os.path.join(args.out, "text")
    if os.path.isdir(text_dir) and os.listdir(text_dir):
        sys.exit(f"make_corpus.py: {text_dir} already holds files; remove it or give another --out")

    began = time.time()
    rng = random.Random(args.seed)
    words = make_words(rng, args.words)
    chain = Chain(rng, args.words)
    capitalised = [w.capitalize() for w in words]

    os.makedirs(text_dir, exist_ok=True)

    written = tokens = 0
    part = 0
    left_in_paragraph = 0
    lo, hi = PARAGRAPH_SENTENCES
    while written < args.sentences:
        path = os.path.join(text_dir, f"part-{part:03d}.txt")
        n = min(args.sentences_per_file, args.sentences - written)
        lines = []
        for _ in range(n):
            if left_in_paragraph == 0:
                if lines:
                    lines.append("")  # a blank line ends the paragraph (the document)
                left_in_paragraph = lo + int(rng.random() * (hi - lo + 1))
            ids = chain.sentence()
            if not ids:  # the chain may end at once; a sentence has at least one word
                ids = chain.sentence() or [0]
            lines.append(" ".join([capitalised[ids[0]]] + [words[i] for i in ids[1:]]) + " " + PERIOD)
            tokens += len(ids) + 1
            left_in_paragraph -= 1
        # A file ends a paragraph: each file is a run of whole documents.
        left_in_paragraph = 0
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        written += n
        part += 1
    # vocab.txt last: a folder with it holds a whole corpus (fp8_convergence.sh reuses one only then).
    with open(os.path.join(args.out, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(SPECIAL_TOKENS + [PERIOD] + words) + "\n")
    vocab_size = len(SPECIAL_TOKENS) + 1 + len(words)
    print(
        f"make_corpus.py: {written} sentences, {tokens} tokens in {part} file(s) under {text_dir}; "
        f"vocabulary of {vocab_size} tokens (ln {vocab_size} = {math.log(vocab_size):.2f}) in "
        f"{os.path.join(args.out, 'vocab.txt')}; {len(chain.pairs)} word pairs met; {time.time() - began:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
