"""Writes kiln/data/text/unicode_tables.cpp: the Unicode data the WordPiece tokenizer needs, from Python's unicodedata.

    python3 scripts/gen_unicode_tables.py kiln/data/text/unicode_tables.cpp

The tokenizer must behave as Hugging Face's BertTokenizer, which is written in Python, so the tables are Python's
view of Unicode (unicodedata, str.lower, str.isspace), stored as ranges:
  - kFlagRanges: (first code point, flags) where the flags change; flags hold the categories the tokenizer asks
    about (C* "control": Cc, Cf, Cn, Co, Cs, Zs, Mn, P*, str.isspace) and how str.lower's final-sigma rule sees the character.
  - kLowerRuns: runs of code points first, first + stride, ... whose str.lower() is one character at a fixed
    offset; kLowerSpecial: the few whose lower() is longer.
  - kDecompositions: every canonical decomposition mapping (one level, as UnicodeData.txt gives it: one or two
    characters), flagged when NFC composes the pair back (a primary composite, not a composition exclusion);
    kCombiningClasses: (first code point, canonical combining class) ranges. With them kiln does NFD (accent
    stripping: NFD, then the Mn marks dropped) and NFC (what Hugging Face applies before splitting). Hangul
    syllables are (de)composed by formula in C++.
"""
import sys
import unicodedata

MAX = 0x110000
HANGUL_FIRST, HANGUL_LAST = 0xAC00, 0xD7A3
F_CONTROL, F_ZS, F_MN, F_PUNCT, F_CASED, F_IGNORABLE, F_PYSPACE = 1, 2, 4, 8, 16, 32, 64


def flags(cp):
    c = chr(cp)
    cat = unicodedata.category(c)
    f = 0
    if cat.startswith("C"):  # Hugging Face's _is_control: Cc, Cf, and also Cn (unassigned), Co, Cs
        f |= F_CONTROL
    if cat == "Zs":
        f |= F_ZS
    if cat == "Mn":
        f |= F_MN
    if cat.startswith("P"):
        f |= F_PUNCT
    if c.isspace():
        f |= F_PYSPACE
    if 0xD800 <= cp <= 0xDFFF:
        return f  # surrogates never reach the tokenizer
    # How CPython's final-sigma rule treats c, observed through str.lower itself: skipped (case-ignorable)
    # when scanning for context, or a cased letter that makes a following capital sigma final.
    if ("A" + c + "\u03a3").lower()[-1] == "\u03c2" and (c + "\u03a3").lower()[-1] == "\u03c3":
        f |= F_IGNORABLE
    elif (c + "\u03a3").lower()[-1] == "\u03c2":
        f |= F_CASED
    return f


def runs(mapping):
    """mapping: sorted [(cp, target_cp)] -> [(first, count, stride, target, target_step)], greedy."""
    out = []
    i = 0
    while i < len(mapping):
        cp, t = mapping[i]
        best = (1, 1, 0)
        if i + 1 < len(mapping):
            # Try the run started by this and each of the next few entries; keep the longest.
            for j in range(i + 1, min(i + 4, len(mapping))):
                stride, step = mapping[j][0] - cp, mapping[j][1] - t
                n, k, last = 1, j, i
                while k < len(mapping) and mapping[k][0] == cp + n * stride and mapping[k][1] == t + n * step:
                    n += 1
                    k += 1
                    # entries between runs members must not be skipped
                    while k < len(mapping) and mapping[k][0] < cp + n * stride:
                        k += 1
                if n > best[0]:
                    best = (n, stride, step)
        n, stride, step = best
        out.append((cp, n, stride, t, step))
        members = {cp + m * stride for m in range(n)}
        rest = [e for e in mapping[i:] if e[0] not in members]
        mapping = mapping[:i] + rest
    return out


def main():
    path = sys.argv[1]
    flag_ranges, prev = [], None
    for cp in range(MAX):
        f = flags(cp)
        if f != prev:
            flag_ranges.append((cp, f))
            prev = f
    lower_single, lower_special = [], []
    decompositions, ccc_ranges, prev = [], [], None
    for cp in range(MAX):
        c = chr(cp)
        ccc = unicodedata.combining(c)
        if ccc != prev:
            ccc_ranges.append((cp, ccc))
            prev = ccc
        if 0xD800 <= cp <= 0xDFFF:
            continue
        lo = c.lower()
        if lo != c:
            (lower_single if len(lo) == 1 else lower_special).append((cp, [ord(x) for x in lo]))
        d = unicodedata.decomposition(c)
        if d and not d.startswith("<") and not HANGUL_FIRST <= cp <= HANGUL_LAST:
            parts = [int(x, 16) for x in d.split()]
            assert len(parts) in (1, 2)
            composes = len(parts) == 2 and unicodedata.normalize("NFC", "".join(map(chr, parts))) == c
            decompositions.append((cp, parts[0], parts[1] if len(parts) == 2 else 0, int(composes)))
    lower_runs = runs([(cp, t[0]) for cp, t in lower_single])
    rebuilt = {a + m * s: t + m * st for a, n, s, t, st in lower_runs for m in range(n)}  # the runs cover it all
    assert rebuilt == {cp: t[0] for cp, t in lower_single} and sum(r[1] for r in lower_runs) == len(lower_single)

    def special(name, entries):
        pool, rows = [], []
        for cp, t in entries:
            rows.append(f"{{0x{cp:X}, {len(pool)}, {len(t)}}}")
            pool.extend(t)
        s = f"const SpecialMapping {name}[] = {{\n" + wrap(rows) + "};\n"
        s += f"const char32_t {name}Pool[] = {{\n" + wrap([f"0x{x:X}" for x in pool] or ["0"]) + "};\n"
        return s

    def wrap(items, width=116):
        lines, line = [], "    "
        for it in items:
            if len(line) + len(it) + 2 > width:
                lines.append(line.rstrip())
                line = "    "
            line += it + ", "
        lines.append(line.rstrip())
        return "\n".join(lines) + "\n"

    with open(path, "w") as f:
        f.write(f"// kiln/data/text/unicode_tables.cpp — GENERATED by scripts/gen_unicode_tables.py from Python "
                f"{sys.version.split()[0]}'s\n// unicodedata (Unicode {unicodedata.unidata_version}). Do not edit; "
                "re-run the script.\n// clang-format off\n")
        f.write('#include "kiln/data/text/unicode_tables.h"\n\nnamespace kiln::data::text_detail {\n\n')
        f.write(f'const char* const kUnicodeVersion = "{unicodedata.unidata_version}";\n\n')
        f.write("const FlagRange kFlagRanges[] = {\n" +
                wrap([f"{{0x{cp:X}, {fl}}}" for cp, fl in flag_ranges]) + "};\n")
        f.write("const size_t kFlagRangeCount = sizeof(kFlagRanges) / sizeof(kFlagRanges[0]);\n\n")
        f.write("const MappingRun kLowerRuns[] = {\n" +
                wrap([f"{{0x{a:X}, {n}, {s}, 0x{t:X}, {st}}}" for a, n, s, t, st in sorted(lower_runs)]) + "};\n")
        f.write("const size_t kLowerRunCount = sizeof(kLowerRuns) / sizeof(kLowerRuns[0]);\n\n")
        f.write(special("kLowerSpecial", lower_special))
        f.write(f"const size_t kLowerSpecialCount = {len(lower_special)};\n\n")
        f.write("const Decomposition kDecompositions[] = {\n" +
                wrap([f"{{0x{cp:X}, 0x{a:X}, 0x{b:X}, {k}}}" for cp, a, b, k in decompositions]) + "};\n")
        f.write("const size_t kDecompositionCount = sizeof(kDecompositions) / sizeof(kDecompositions[0]);\n\n")
        f.write("const CombiningClassRange kCombiningClasses[] = {\n" +
                wrap([f"{{0x{cp:X}, {c}}}" for cp, c in ccc_ranges]) + "};\n")
        f.write("const size_t kCombiningClassCount = sizeof(kCombiningClasses) / sizeof(kCombiningClasses[0]);\n\n")
        f.write("}  // namespace kiln::data::text_detail\n")
    print(f"{path}: {len(flag_ranges)} flag ranges, {len(lower_runs)} lower runs, {len(lower_special)} special, "
          f"{len(decompositions)} decompositions, {len(ccc_ranges)} combining class ranges")


if __name__ == "__main__":
    main()
