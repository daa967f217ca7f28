#!/usr/bin/env python3
"""Every C++ snippet of the user-facing documentation is compiled, so the docs cannot rot.

    tests/docs/check_snippets.py REPO_ROOT                       # the fragments are all in snippets.cpp
    tests/docs/check_snippets.py REPO_ROOT --extract-programs DIR  # write the whole programs to DIR
    tests/docs/check_snippets.py --run PROGRAM                     # run one, check its exit (and its loss)

The documents: README.md, docs/*.md and examples/*/README.md. A snippet is a fenced block whose info string is cpp,
c++ or cxx.
- A whole program (a block with `int main(`) is written as it is to DIR/<document>_<line>.cpp by
  --extract-programs (CMake does this when it configures, and again when a document changes); test_docs_programs
  compiles each with -Wall -Wextra -Werror and CTest runs each (docs.program.*): it must exit with 0, and where it
  prints two or more "loss <value>", the last must be below the first.
- A fragment must appear in tests/docs/snippets.cpp, which test_docs compiles with the same flags (and runs where
  the fragment is cheap): its lines in order and together, compared with their trailing spaces removed and their
  common indentation taken off (a fragment sits inside a function there). The plain call checks that, exit 0 when
  every fragment is there, 1 naming each missing one with its file and line.
Exit 2 for a wrong call.
"""
import pathlib
import re
import subprocess
import sys


def snippets(path):
    """(line number, [lines]) of each C++ fenced block of a Markdown file."""
    found, block, start, fence = [], None, 0, None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        stripped = line.strip()
        if block is None:
            m = re.match(r"^(```+|~~~+)\s*(\S*)", stripped)
            if m:
                fence = m.group(1)
                lang = m.group(2).lower()
                block = [] if lang in ("cpp", "c++", "cxx") else False
                start = number
        elif stripped.startswith(fence) and stripped.strip("`~") == "":
            if block is not False:
                found.append((start, block))
            block = None
        elif block is not False:
            block.append(line)
    return found


def normalised(lines):
    lines = [l.rstrip() for l in lines]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    indent = min((len(l) - len(l.lstrip()) for l in lines if l), default=0)
    return [l[indent:] for l in lines]


def contains(haystack, needle):
    """Whether `needle` (lines) occurs in `haystack` (lines) as consecutive lines, each compared without its
    leading indentation beyond the block's own (the block may sit deeper in snippets.cpp)."""
    if not needle:
        return True
    n = len(needle)
    for i in range(len(haystack) - n + 1):
        window = haystack[i:i + n]
        first = window[0]
        indent = len(first) - len(first.lstrip())
        if all((w[indent:] if len(w) - len(w.lstrip()) >= indent else w) == k or (not w.strip() and not k)
               for w, k in zip(window, needle)):
            return True
    return False


def is_program(block):
    return any(re.match(r"^\s*int\s+main\s*\(", l) for l in block)


def documents(root):
    return [root / "README.md", *sorted((root / "docs").glob("*.md")), *sorted(root.glob("examples/*/README.md"))]


def program_name(root, doc, line):
    """README.md:12 -> readme_12; docs/coming-from-pytorch.md:42 -> docs_coming_from_pytorch_42."""
    stem = str(doc.relative_to(root).with_suffix("")).lower()
    return re.sub(r"[^a-z0-9]+", "_", stem).strip("_") + f"_{line}"


def extract_programs(root, out):
    out.mkdir(parents=True, exist_ok=True)
    wanted = {}
    for doc in documents(root):
        for line, block in snippets(doc):
            if is_program(block):
                name = program_name(root, doc, line)
                text = f"// {doc.relative_to(root)}:{line}, as it is written there (tests/docs/check_snippets.py)\n"
                wanted[name + ".cpp"] = text + "\n".join(block) + "\n"
    for old in out.glob("*.cpp"):
        if old.name not in wanted:
            old.unlink()
    for name, text in wanted.items():
        path = out / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:  # unchanged files keep their time
            path.write_text(text, encoding="utf-8")
    print(";".join(sorted(n[:-4] for n in wanted)), end="")
    return 0


def run_program(exe):
    done = subprocess.run([exe], capture_output=True, text=True)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    if done.returncode != 0:
        print(f"{exe} exited with {done.returncode}")
        return 1
    losses = [float(v) for v in re.findall(r"\bloss\s+([-+0-9.eE]+)", done.stdout)]
    if len(losses) >= 2:  # a training program: its loss must fall
        if not losses[-1] < losses[0]:
            print(f"{exe}: the loss went from {losses[0]} to {losses[-1]}; expected it to fall")
            return 1
        print(f"the loss fell from {losses[0]} to {losses[-1]}")
    return 0


def check_fragments(root):
    compiled = [l.rstrip() for l in (root / "tests/docs/snippets.cpp").read_text(encoding="utf-8").splitlines()]
    missing, total, programs = [], 0, 0
    for doc in documents(root):
        for line, block in snippets(doc):
            if is_program(block):
                programs += 1
                continue
            total += 1
            if not contains(compiled, normalised(block)):
                missing.append(f"{doc.relative_to(root)}:{line}")
    if missing:
        print(f"{len(missing)} of {total} C++ fragments of the documentation are not in tests/docs/snippets.cpp, so "
              "nothing compiles them:")
        for m in missing:
            print(f"  {m}")
        print("Copy each into tests/docs/snippets.cpp as it is written in the document (inside a function; see that "
              "file's header), or fix the copy there that drifted from it.")
        return 1
    print(f"all {total} C++ fragments of README.md, docs/ and examples/*/README.md are compiled by test_docs; "
          f"{programs} whole programs by test_docs_programs")
    return 0


def main(argv):
    args = argv[1:]
    if len(args) == 2 and args[0] == "--run":
        return run_program(args[1])
    if len(args) == 3 and args[1] == "--extract-programs":
        return extract_programs(pathlib.Path(args[0]), pathlib.Path(args[2]))
    if len(args) == 1 and not args[0].startswith("-"):
        return check_fragments(pathlib.Path(args[0]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
