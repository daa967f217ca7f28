#!/usr/bin/env bash
# test_recsys.sh RECSYS DIR: exact resume. 60 steps straight through, and 30 steps, a checkpoint, then the other
# 30 resumed from it, must end with the same parameters (the printed digest of every parameter's bytes).
set -euo pipefail
recsys="$1" dir="$2"
rm -rf "$dir" && mkdir -p "$dir"
common=(--device cpu --table-sizes 500,5000 --batch-size 64 --eval-size 200 --log-every 30)
straight="$("$recsys" "${common[@]}" --steps 60 | grep '^parameters digest')"
"$recsys" "${common[@]}" --steps 30 --checkpoint "$dir/ckpt.h5" >/dev/null
resumed="$("$recsys" "${common[@]}" --steps 60 --checkpoint "$dir/ckpt.h5" --resume | grep '^parameters digest')"
echo "straight: $straight"
echo "resumed:  $resumed"
[[ -n "$straight" && "$straight" == "$resumed" ]] || { echo "test_recsys.sh: the resumed run ended elsewhere" >&2; exit 1; }
echo "recsys resume: the same parameters (${straight#parameters digest })"
