#!/usr/bin/env bash
# test_recsys.sh RECSYS DIR resume|resume-hybrid|hybrid|timing
# test_recsys.sh RECSYS DIR mpi-hybrid MPIEXEC [NUMPROC_FLAG]
#   resume: 60 steps straight through, and 30 steps, a checkpoint, then the other 30 resumed from it, must end with the
#           same parameters (the printed digest of every parameter's bytes).
#   resume-hybrid: the same with the 100,000-row table as nn::HybridEmbedding, stopped at step 10 (its hot rows still
#           being counted) and at step 30 (after its rebalance).
#   hybrid: the 100,000-row tables as nn::HybridEmbedding (10% of rows hot, the hot set chosen after 20 steps) must
#           train exactly as with plain tables: the same loss at every logged step and the same AUC.
#   timing: the timing mode (--bench-steps) with plain tables and SparseAdam, then with hybrid tables and
#           RowWiseAdagrad: each prints one JSON line that parses, with a finite loss for every step, a loss that
#           fell, the step times, and (hybrid) the hot and cold tiers' memory; bench/recsys_table.py reads both.
#   mpi-hybrid: as hybrid, on 2 processes (mpirun, the ranks agreeing on the hot sets), whose replicas must also agree.
# RECSYS_DEVICE (cpu) runs resume, resume-hybrid and hybrid on another device, and RECSYS_ARGS adds options to every
# run of them: on a GPU, RECSYS_DEVICE=cuda RECSYS_ARGS="--cold-reads mapped" checks the mapped cold tier's exact
# resume and its losses against whole tables on the GPU.
set -euo pipefail
recsys="$1" dir="$2" mode="${3:-resume}"
rm -rf "$dir" && mkdir -p "$dir"
read -r -a extra <<<"${RECSYS_ARGS:-}"
common=(--device "${RECSYS_DEVICE:-cpu}" --table-sizes 500,5000,100000 --batch-size 64 --eval-size 2000 --log-every 10
        "${extra[@]}")
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
  timing)
    bench=(--batch-size 256 --bench-warmup 25 --bench-steps 10 --bench-cycle 10 --lr 0.1)
    "$recsys" "${common[@]}" "${bench[@]}" --table-optimizer sparse_adam --bench-name plain | grep '^{' >"$dir/runs.jsonl"
    "$recsys" "${common[@]}" "${bench[@]}" --table-optimizer rowwise_adagrad --hybrid-rows 100000 --bench-name hybrid |
      grep '^{' >>"$dir/runs.jsonl"
    python3 - "$dir/runs.jsonl" <<'PY'
import json, math, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
assert [r["case"] for r in runs] == ["plain", "hybrid"], runs
for r in runs:
    assert r["bench"] == "recsys" and r["framework"] == "kiln" and r["trained"] is True, r.get("failed")
    assert len(r["losses"]) == 35 and all(math.isfinite(v) for v in r["losses"]), r["losses"]
    assert len(r["step_ms_all"]) == 10 and r["step_ms_min"] <= r["step_ms"] <= r["step_ms_max"]
    assert r["throughput"] > 0 and r["rows_touched_per_step"] > 0 and r["emb_total_gib"] > 0
plain, hybrid = runs
assert plain["table_optimizer"] == "sparse_adam" and plain["hybrid_tables"] == 0 and plain["hot_gib"] == 0
# SparseAdam's two state tables: the tables' memory is three times their parameters'.
params_gib = sum(plain["table_sizes"]) * plain["embedding_dim"] * 4 / 2**30
assert abs(plain["emb_total_gib"] - 3 * params_gib) < 1e-3, (plain["emb_total_gib"], params_gib)
assert hybrid["hybrid_tables"] == 8 and hybrid["hot_gib"] > 0 and hybrid["cold_gib"] > 8 * hybrid["hot_gib"]
print("recsys timing: %s %.3f ms/step, %s %.3f ms/step, losses finite and falling"
      % (plain["case"], plain["step_ms"], hybrid["case"], hybrid["step_ms"]))
PY
    python3 "$(dirname "$0")/../../bench/recsys_table.py" "$dir/runs.jsonl" >"$dir/table.md"
    grep -q '| kiln | hybrid | 1 (<5) |' "$dir/table.md" || { cat "$dir/table.md"; echo "test_recsys.sh: no table" >&2; exit 1; }
    ;;
  *) echo "usage: test_recsys.sh RECSYS DIR resume|resume-hybrid|hybrid|timing, or RECSYS DIR mpi-hybrid MPIEXEC [NUMPROC_FLAG]" >&2; exit 2 ;;
esac
