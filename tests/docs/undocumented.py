#!/usr/bin/env python3
"""The public API's undocumented symbols may not grow: Doxygen lists the public symbols without a comment, and each
must be in tests/docs/undocumented.txt, the list of those that were undocumented when it was last written.

    tests/docs/undocumented.py DOXYGEN DOXYFILE WARNINGS_FILE LIST          # check (CTest docs.undocumented)
    tests/docs/undocumented.py DOXYGEN DOXYFILE WARNINGS_FILE LIST --update # rewrite LIST from the headers as they are

DOXYFILE is the build's Doxyfile without output (docs/api/Doxyfile.in, configured by CMake), which writes its
warnings to WARNINGS_FILE. A symbol is a line "<header>: <what Doxygen says is not documented>" (no line number, so
edits elsewhere do not move it); a member that derived classes inherit counts once. Exit 0 when no symbol is
missing from LIST (it says how many of LIST are documented now, which --update takes off); 1, naming each new
undocumented symbol, otherwise; 2 when Doxygen is missing or fails.
"""
import pathlib
import re
import subprocess
import sys

PATTERN = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): warning: (?P<what>.* is not documented)\.?$")


def undocumented(doxygen, doxyfile, warnings, root):
    try:
        done = subprocess.run([doxygen, doxyfile], capture_output=True, text=True)
    except FileNotFoundError:
        print(f"doxygen not found ({doxygen}): scripts/setup.sh installs it (the Debian package doxygen)")
        sys.exit(2)
    if done.returncode != 0:
        print(done.stdout + done.stderr)
        print(f"doxygen failed with {done.returncode}")
        sys.exit(2)
    symbols = set()
    for line in pathlib.Path(warnings).read_text(encoding="utf-8", errors="replace").splitlines():
        m = PATTERN.match(line.strip())
        if not m:
            continue
        path = m.group("path")
        if path.startswith(str(root) + "/"):
            path = path[len(str(root)) + 1:]
        symbols.add(f"{path}: {m.group('what')}")
    return symbols


def main(argv):
    args = argv[1:]
    update = args[-1:] == ["--update"]
    if update:
        args = args[:-1]
    if len(args) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    doxygen, doxyfile, warnings, listing = args
    root = pathlib.Path(__file__).resolve().parents[2]
    now = undocumented(doxygen, doxyfile, warnings, root)
    listing = pathlib.Path(listing)
    if update:
        listing.write_text("".join(f"{s}\n" for s in sorted(now)), encoding="utf-8")
        print(f"{listing}: {len(now)} undocumented public symbols")
        return 0
    known = set(l for l in listing.read_text(encoding="utf-8").splitlines() if l.strip())
    new = sorted(now - known)
    gone = known - now
    if new:
        print(f"{len(new)} public symbols have no comment (the API reference, `cmake --build build --target docs`, "
              "shows the comment above each declaration, or after a member on its line):")
        for s in new:
            print(f"  {s}")
        print("Add a comment to each. (A symbol renamed or moved also shows here: if it had none before either, "
              "run tests/docs/undocumented.py ... --update, as CTest's command line for docs.undocumented shows.)")
        return 1
    print(f"{len(now)} undocumented public symbols, none new (the list: {len(known)})")
    if gone:
        print(f"{len(gone)} of the list are documented now: tests/docs/undocumented.py ... --update takes them off")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
