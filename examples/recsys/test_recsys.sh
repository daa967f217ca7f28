#!/usr/bin/env bash
# test_recsys.sh RECSYS DIR resume|resume-hybrid|hybrid
#   resume: 60 steps straight through, and 30 steps, a checkpoint, then the other 30 resumed from it, must end with the
#           same parameters (the printed digest of every parameter's bytes).
#   resume-hybrid: the same with the 100,000-row table as nn::HybridEmbedding, stopped at step 10 (its hot rows still
#           being counted) and at step 30 (after its rebalance).
#   hybrid: the 100,000-row tables as nn::HybridEmbedding (10% of rows hot, the hot set chosen after 20 steps) must
#           train exactly as with plain tables: the same loss at every logged step and the same AUC.
set -euo pipefail
recsys="$1" dir="$2" mode="${3:-resume}"
rm -rf "$dir" && mkdir -p "$dir"
common=(--device cpu --table-sizes 500,5000,100000 --batch-size 64 --eval-size 2000 --log-every 10)
case "$mode" in
  resume | resume-hybrid)
    stops=(30)
    if [[ "$mode" == resume-hybrid ]]; then
      # Stopped while the hot rows are still being counted (the rebalance comes after step 20), and after it.
      common+=(--hybrid-rows 100000 --hot-fraction 0.1)
      stops=(10 30)
    fi
    straight="$("$recsys" "${common[@]}" --steps 60 | grep '^parameters digest')"
    echo "straight:           $straight"
    for stop in "${stops[@]}"; do
      "$recsys" "${common[@]}" --steps "$stop" --checkpoint "$dir/ckpt$stop.h5" >/dev/null
      resumed="$("$recsys" "${common[@]}" --steps 60 --checkpoint "$dir/ckpt$stop.h5" --resume | grep '^parameters digest')"
      echo "resumed at step $stop: $resumed"
      [[ -n "$straight" && "$straight" == "$resumed" ]] ||
        { echo "test_recsys.sh: the run resumed at step $stop ended elsewhere" >&2; exit 1; }
    done
    echo "recsys $mode: the same parameters (${straight#parameters digest })"
    ;;
  hybrid)
    "$recsys" "${common[@]}" --steps 60 | grep -E '^(step|AUC)' >"$dir/plain.txt"
    "$recsys" "${common[@]}" --steps 60 --hybrid-rows 100000 --hot-fraction 0.1 | grep -E '^(step|AUC)' >"$dir/hybrid.txt"
    cat "$dir/hybrid.txt"
    [[ $(wc -l <"$dir/plain.txt") -eq 7 ]] || { echo "test_recsys.sh: expected 6 loss lines and the AUC" >&2; exit 1; }
    diff "$dir/plain.txt" "$dir/hybrid.txt" || { echo "test_recsys.sh: the hybrid tables trained differently" >&2; exit 1; }
    echo "recsys hybrid: the same losses and AUC as plain tables"
    ;;
  *) echo "usage: test_recsys.sh RECSYS DIR resume|resume-hybrid|hybrid" >&2; exit 2 ;;
esac
