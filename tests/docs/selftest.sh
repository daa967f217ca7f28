#!/usr/bin/env bash
# The documentation checks fail when they should (CTest docs.selftest): tests/docs/check_snippets.py on a made-up
# repository whose README has a C++ fragment that snippets.cpp lacks, a whole program, and a training program whose
# loss rises; tests/docs/undocumented.py without doxygen; tests/docs/env_vars.py on a table that misses a variable.
# Each must exit as its header says and name the problem.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAILED: $*"; exit 1; }

mkdir -p "$work/repo/tests/docs" "$work/repo/docs"
printf 'int kept_fragment = 1;\n' >"$work/repo/tests/docs/snippets.cpp"
cat >"$work/repo/README.md" <<'MD'
# A page

```cpp
int kept_fragment = 1;
```

```cpp
int missing_fragment = 2;
```

```cpp
int main() { return 0; }
```
MD
out=$(python3 "$here/check_snippets.py" "$work/repo" 2>&1); rc=$?
[[ $rc -eq 1 ]] || fail "a missing fragment: exit $rc, expected 1 ($out)"
grep -q "README.md:7" <<<"$out" || fail "the missing fragment is not named by file and line: $out"
grep -q "README.md:3" <<<"$out" && fail "the fragment that is there was reported: $out"

names=$(python3 "$here/check_snippets.py" "$work/repo" --extract-programs "$work/programs") ||
  fail "--extract-programs failed"
[[ "$names" == readme_11 && -s "$work/programs/readme_11.cpp" ]] || fail "extracted '$names', expected readme_11"
grep -q "int main() { return 0; }" "$work/programs/readme_11.cpp" || fail "the program is not copied as written"

printf '#!/bin/sh\necho "step 1  loss 0.5"\necho "step 2  loss 0.9"\n' >"$work/rising"
chmod +x "$work/rising"
out=$(python3 "$here/check_snippets.py" --run "$work/rising" 2>&1); rc=$?
[[ $rc -eq 1 ]] && grep -q "expected it to fall" <<<"$out" || fail "a rising loss: exit $rc ($out)"
printf '#!/bin/sh\nexit 3\n' >"$work/failing"
chmod +x "$work/failing"
out=$(python3 "$here/check_snippets.py" --run "$work/failing" 2>&1); rc=$?
[[ $rc -eq 1 ]] && grep -q "exited with 3" <<<"$out" || fail "a failing program: exit $rc ($out)"
python3 "$here/check_snippets.py" --bogus >/dev/null 2>&1; rc=$?
[[ $rc -eq 2 ]] || fail "a wrong call: exit $rc, expected 2"

out=$(python3 "$here/undocumented.py" "$work/no-doxygen" "$work/Doxyfile" "$work/w.txt" "$work/list.txt" 2>&1); rc=$?
[[ $rc -eq 2 ]] && grep -q "doxygen not found" <<<"$out" || fail "no doxygen: exit $rc ($out)"
# env_vars.py: a variable read but not in the table, and one in the table that nothing reads.
mkdir -p "$work/env/kiln" "$work/env/docs"
printf 'bool a = env_flag("KILN_READ_ONLY", true);\nconst char* b = std::getenv("KILN_BOTH");\n' >"$work/env/kiln/a.cpp"
printf '# T\n\n## 4. Environment variables kiln reads\n\n| `KILN_BOTH` | x |\n| `KILN_TABLE_ONLY` | x |\n\n## 5. Next\n' \
  >"$work/env/docs/troubleshooting.md"
out=$(python3 "$here/env_vars.py" "$work/env" 2>&1); rc=$?
[[ $rc -eq 1 ]] || fail "env_vars.py on a wrong table: exit $rc, expected 1 ($out)"
grep -q "KILN_READ_ONLY is read by kiln/a.cpp" <<<"$out" && grep -q "KILN_TABLE_ONLY is in" <<<"$out" &&
  ! grep -q "KILN_BOTH" <<<"$out" || fail "env_vars.py did not name exactly the two wrong variables: $out"
echo "the documentation checks fail where they should"
