#!/usr/bin/env bash
# Formats kiln's own C++/CUDA sources with clang-format and the root .clang-format.
#
#   scripts/format.sh                 format every tracked source file in place
#   scripts/format.sh --check         change nothing; list the files that need formatting, exit 1 if any
#   scripts/format.sh [--check] PATH...   only these files or folders
#
# Only files git tracks under kiln/ tests/ examples/ bench/ tools/ are touched: build folders,
# generated files and anything vendored stay as they are. CLANG_FORMAT=<binary> picks the binary.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

check=0
paths=()
for arg in "$@"; do
  case "$arg" in
    --check) check=1 ;;
    -h | --help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "format.sh: unknown option '$arg' (try --help)" >&2; exit 2 ;;
    *) paths+=("$arg") ;;
  esac
done
[[ ${#paths[@]} -eq 0 ]] && paths=(kiln tests examples bench tools)

# The newest clang-format on PATH, unversioned or clang-format-N.
clang_format="${CLANG_FORMAT:-}"
if [[ -z "$clang_format" ]]; then
  for candidate in clang-format clang-format-{19,18,17,16,15,14}; do
    if command -v "$candidate" >/dev/null 2>&1; then clang_format="$candidate"; break; fi
  done
fi
if [[ -z "$clang_format" ]]; then
  echo "format.sh: clang-format not found; install it (apt-get install clang-format) or set CLANG_FORMAT" >&2
  exit 1
fi

mapfile -t files < <(git ls-files -- "${paths[@]}" | grep -E '\.(h|hpp|cpp|cc|cu|cuh)$' || true)
if [[ ${#files[@]} -eq 0 ]]; then
  echo "format.sh: no tracked C++/CUDA files under: ${paths[*]}"
  exit 0
fi

if [[ $check -eq 1 ]]; then
  unformatted=()
  for f in "${files[@]}"; do
    if ! "$clang_format" --style=file --dry-run --Werror "$f" >/dev/null 2>&1; then unformatted+=("$f"); fi
  done
  if [[ ${#unformatted[@]} -gt 0 ]]; then
    printf '%s\n' "${unformatted[@]}"
    echo "format.sh: ${#unformatted[@]} of ${#files[@]} files need formatting (run scripts/format.sh)" >&2
    exit 1
  fi
  echo "format.sh: all ${#files[@]} files are formatted ($("$clang_format" --version | head -n1))"
else
  "$clang_format" --style=file -i "${files[@]}"
  echo "format.sh: formatted ${#files[@]} files with $("$clang_format" --version | head -n1)"
fi
