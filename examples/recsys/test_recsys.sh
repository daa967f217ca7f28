#!/usr/bin/env bash
# test_recsys.sh RECSYS DIR resume|hybrid
# test_recsys.sh RECSYS DIR mpi-hybrid MPIEXEC [NUMPROC_FLAG]
#   resume: 60 steps straight through, and 30 steps, a checkpoint, then the other 30 resumed from it, must end with the
#           same parameters (the printed digest of every parameter's bytes).
#   hybrid: the 100,000-row tables as nn::HybridEmbedding (10% of rows hot, the hot set chosen after 20 steps) must
#           train exactly as with plain tables: the same loss at every logged step and the same AUC.
#   mpi-hybrid: the same on 2 processes (mpirun, the ranks agreeing on the hot sets), whose replicas must also agree.
set -euo pipefail
recsys="$1" dir="$2" mode="${3:-resume}"
rm -rf "$dir" && mkdir -p "$dir"
common=(--device cpu --table-sizes 500,5000,100000 --batch-size 64 --eval-size 2000 --log-every 10)
case "$mode" in
  resume)
    straight="$("$recsys" "${common[@]}" --steps 60 | grep '^parameters digest')"
    "$recsys" "${common[@]}" --steps 30 --checkpoint "$dir/ckpt.h5" >/dev/null
    resumed="$("$recsys" "${common[@]}" --steps 60 --checkpoint "$dir/ckpt.h5" --resume | grep '^parameters digest')"
    echo "straight: $straight"
    echo "resumed:  $resumed"
    [[ -n "$straight" && "$straight" == "$resumed" ]] || { echo "test_recsys.sh: the resumed run ended elsewhere" >&2; exit 1; }
    echo "recsys resume: the same parameters (${straight#parameters digest })"
    ;;
  hybrid)
    "$recsys" "${common[@]}" --steps 60 | grep -E '^(step|AUC)' >"$dir/plain.txt"
    "$recsys" "${common[@]}" --steps 60 --hybrid-rows 100000 --hot-fraction 0.1 | grep -E '^(step|AUC)' >"$dir/hybrid.txt"
    cat "$dir/hybrid.txt"
    [[ $(wc -l <"$dir/plain.txt") -eq 7 ]] || { echo "test_recsys.sh: expected 6 loss lines and the AUC" >&2; exit 1; }
    diff "$dir/plain.txt" "$dir/hybrid.txt" || { echo "test_recsys.sh: the hybrid tables trained differently" >&2; exit 1; }
    echo "recsys hybrid: the same losses and AUC as plain tables"
    ;;
  mpi-hybrid)
    mpiexec=("${4:?mpi-hybrid needs the MPIEXEC path}" "${5:--np}" 2 --oversubscribe)
    flags=(--device cpu --table-sizes 500,5000,100000 --batch-size 64 --eval-size 1000 --log-every 10 --steps 60)
    "${mpiexec[@]}" "$recsys" "${flags[@]}" >"$dir/plain.out"
    "${mpiexec[@]}" "$recsys" "${flags[@]}" --hybrid-rows 100000 --hot-fraction 0.1 >"$dir/hybrid.out"
    grep -E '^(step|AUC)' "$dir/plain.out" >"$dir/plain.txt"
    grep -E '^(step|AUC)' "$dir/hybrid.out" >"$dir/hybrid.txt"
    cat "$dir/hybrid.out"
    [[ $(wc -l <"$dir/plain.txt") -eq 7 ]] || { echo "test_recsys.sh: expected 6 loss lines and the AUC" >&2; exit 1; }
    grep -q '^replicas: the same parameters on all 2 ranks, and the same placement' "$dir/hybrid.out" ||
      { echo "test_recsys.sh: the hybrid run's replicas were not checked equal" >&2; exit 1; }
    diff "$dir/plain.txt" "$dir/hybrid.txt" || { echo "test_recsys.sh: the hybrid tables trained differently" >&2; exit 1; }
    echo "recsys mpi-hybrid: the same losses and AUC as plain tables on 2 processes"
    ;;
  *) echo "usage: test_recsys.sh RECSYS DIR resume|hybrid, or RECSYS DIR mpi-hybrid MPIEXEC [NUMPROC_FLAG]" >&2; exit 2 ;;
esac
