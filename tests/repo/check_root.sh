#!/usr/bin/env bash
# tests/repo/check_root.sh SOURCE_DIR — the repository's root keeps only its listed entries (.gitignore): a file
# made at the root (a log, a scratch file) is ignored, and nothing tracked is matched by an ignore rule (a new
# top-level folder must be listed in .gitignore). Skipped (77) outside a git checkout or without git.
set -euo pipefail
src=$1
command -v git >/dev/null || { echo "git is not installed: skipped"; exit 77; }
git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1 || { echo "$src is not a git checkout: skipped"; exit 77; }
for stray in log.txt notes.md scratch.cpp out; do
  git -C "$src" check-ignore -q -- "$stray" || { echo "FAILED: a file '$stray' at the root would not be ignored" >&2; exit 1; }
done
tracked_but_ignored=$(git -C "$src" ls-files --cached --ignored --exclude-standard)
if [[ -n "$tracked_but_ignored" ]]; then
  echo "FAILED: tracked paths that .gitignore matches (list their top-level folder in .gitignore):" >&2
  echo "$tracked_but_ignored" | head -20 >&2
  exit 1
fi
echo "ok: stray root files are ignored, and every tracked path is allowed"
