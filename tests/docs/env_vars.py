#!/usr/bin/env python3
"""docs/troubleshooting.md's table of environment variables names every KILN_* variable that kiln's sources read, and
no other.

    python3 tests/docs/env_vars.py [ROOT]

A variable is read where a source under kiln/ calls getenv, env_flag or env_positive_int with its name as a literal.
The table is the one under the heading "Environment variables kiln reads"; its rows start with the name in backquotes.
Exits 1 and names each variable that is read but not in the table, or in the table but never read.
"""
import pathlib
import re
import sys

READ = re.compile(r'(?:getenv|env_flag|env_positive_int)\(\s*"(KILN_[A-Z0-9_]+)"')
ROW = re.compile(r"^\| `(KILN_[A-Z0-9_]+)` \|", re.M)


def read_in_sources(root):
    names = {}
    for path in sorted((root / "kiln").rglob("*")):
        if path.suffix not in (".cpp", ".h", ".cu", ".cuh"):
            continue
        for name in READ.findall(path.read_text(encoding="utf-8", errors="replace")):
            names.setdefault(name, str(path.relative_to(root)))
    return names


def documented(root):
    text = (root / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    start = text.find("Environment variables kiln reads")
    if start < 0:
        sys.exit("env_vars.py: docs/troubleshooting.md has no section 'Environment variables kiln reads'")
    end = text.find("\n## ", start)
    return set(ROW.findall(text[start:end if end >= 0 else len(text)]))


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
    read, table = read_in_sources(root), documented(root)
    if not read:
        sys.exit("env_vars.py: found no KILN_* variable read under kiln/; the pattern no longer matches the sources")
    errors = [f"{name} is read by {where} but missing from docs/troubleshooting.md's table"
              for name, where in sorted(read.items()) if name not in table]
    errors += [f"{name} is in docs/troubleshooting.md's table, but no source under kiln/ reads it"
               for name in sorted(table - set(read))]
    for e in errors:
        print(e)
    if errors:
        return 1
    print(f"env_vars.py: the table names the {len(read)} variables kiln reads: {', '.join(sorted(read))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
