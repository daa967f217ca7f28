#!/usr/bin/env bash
# bench_goals.sh BUILD_DIR OUT_DIR STAGE...: issue 37's measurements of the recsys example (README "Measuring on a
# GPU"), one JSON line per run (recsys --bench-steps, bench/pytorch_recsys.py), then bench/recsys_table.py's table.
#
#   examples/recsys/bench_goals.sh build-gpu /tmp/rs build        # configure (CUDA, sm_90), build the recsys target
#   examples/recsys/bench_goals.sh build-gpu /tmp/rs g1 cold g2   # about 190 s on the H200 (2026-12-05)
#   examples/recsys/bench_goals.sh build-gpu /tmp/rs g3 table     # about 80 s
#   examples/recsys/bench_goals.sh build-gpu /tmp/rs g3sgd table  # about 50 s
#   KILN_RECSYS_SCALE=small examples/recsys/bench_goals.sh build-cpu /tmp/rs g1 g2 g3 table   # the CPU, tiny sizes
#
# Stages:
#   build  configure BUILD_DIR (Release, KILN_CUDA=ON, CUDA architecture 90) unless configured, build recsys
#   g1     the goal model (the largest table 10^8 x 128) with every table on the GPU, and with every table of at
#          least 10^6 rows an nn::HybridEmbedding 10% hot; RowWiseAdagrad on the tables. G1_ROUNDS (1) rounds.
#   cold   g1's hybrid model with each way of reading cold rows on the GPU (--cold-reads copy, mapped), alternating,
#          COLD_ROUNDS (1) rounds: which is faster.
#   g2     the same ids (--id-rows 10^6: each table's ids from its first 10^6 rows) with the largest table at 10^6
#          and at 10^8 rows, all on the GPU and hybrid (10^5 hot rows per hybrid table, so the lookups split the
#          same way): equal k, two table sizes. G2_ROUNDS (1) rounds.
#   g3     kiln and PyTorch (EmbeddingBag(sparse=True) + SparseAdam), alternating, G3_ROUNDS (5) rounds, at the
#          largest size where SparseAdam's state fits (the largest table 10^7 x 128: 33.6M rows, 17 GB of tables,
#          52 GB with state); G3_COMPILE=1 adds a torch.compile run of the dense part to each round.
#   g3sgd  kiln and PyTorch with SGD on the tables, all on the GPU, at g1's size, G3SGD_ROUNDS (3) rounds.
#   profile  g1's models (all on the GPU; hybrid with each --cold-reads) with kiln's profiler over 5 steps after the
#          warm-up (recsys --profile): the top ops of each in the summary (these runs' JSON lines go to
#          recsys_profile.jsonl, which the table leaves out).
#   profile_g2  the same for g2's two hybrid models (the largest table at 10^6 and at 10^8 rows, equal k).
# The first stage to run on a fresh GPU machine is `build`; the measurements then take two invocations (g1 cold g2; g3).
#   table  bench/recsys_table.py over every OUT_DIR/recsys_*.jsonl (also printed after every other stage).
# Each stage appends its JSON lines to OUT_DIR/recsys_<stage>.jsonl and each run's full output to
# OUT_DIR/logs/<run>.log (packed into OUT_DIR/logs.tar.gz at the end, and copied to $OUT with the rest: below).
# An invocation stops starting runs once KILN_RECSYS_BUDGET seconds (570) would be passed: a run is started only if
# its estimate (below, in seconds) fits in what is left, and is killed at the budget's end.
# PYTHON: the Python with PyTorch (python3).
set -uo pipefail

build="${1:?usage: bench_goals.sh BUILD_DIR OUT_DIR STAGE...}"
out="${2:?usage: bench_goals.sh BUILD_DIR OUT_DIR STAGE...}"
shift 2
[[ $# -gt 0 ]] || { echo "bench_goals.sh: name at least one stage: build g1 cold g2 g3 g3sgd profile profile_g2 table" >&2; exit 2; }
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root" || exit 2
mkdir -p "$out/logs"
python="${PYTHON:-python3}"
budget="${KILN_RECSYS_BUDGET:-570}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
recsys="$build/examples/recsys/recsys"
summary="$out/summary.txt"
note() { echo "$*" | tee -a "$summary"; }

# ---------------------------------------------------------------- the configurations
# Criteo Kaggle's 26 categorical features' row counts (as DLRM's reference counts them); the largest, 10,131,227,
# is replaced by the size each goal asks for.
kaggle=(1460 583 10131227 2202608 305 24 12517 633 3 93145 5683 8351593 3194 27 14992 5461306 10 5652 2173 4 7046547 18
        15 286181 105 142572)
sizes_with_largest() {  # the list with the largest table at $1 rows
  local s=() r
  for r in "${kaggle[@]}"; do s+=("$([[ $r -eq 10131227 ]] && echo "$1" || echo "$r")"); done
  (IFS=,; echo "${s[*]}")
}
if [[ "${KILN_RECSYS_SCALE:-full}" == small ]]; then  # the same runs at sizes a CPU takes in seconds
  kaggle=(14 5 101312 22026 3 1 125 6 1 931 56 83515 31 1 149 54613 1 56 21 1 70465 1 1 2861 1 1425)
  largest_goal=1000000 largest_g2_small=10000 largest_g3=100000 id_rows=10000 hybrid_rows=10000 g2_hot=1000
  model=(--embedding-dim 16 --bottom-mlp 64 --top-mlp 64,32 --batch-size 256 --lr 0.1)
  timing=(--bench-warmup 25 --bench-steps 10 --bench-cycle 10)
  device=cpu
  declare -A estimate=([g1_gpu]=30 [g1_hybrid]=30 [g2_small]=20 [g2_large]=30 [g2_large_hybrid]=30 [g3_kiln]=20
                       [g3_torch]=30 [g3sgd_kiln]=30 [g3sgd_torch]=40 [cold]=30)
else
  largest_goal=100000000 largest_g2_small=1000000 largest_g3=10000000 id_rows=1000000 hybrid_rows=1000000 g2_hot=100000
  # MLPerf DLRM's MLPs and row length; SGD at 0.1 for the MLPs (the example's recipe, a rate at which these wider
  # MLPs train from the first step).
  model=(--embedding-dim 128 --bottom-mlp 512,256 --top-mlp 1024,1024,512,256 --batch-size 4096 --lr 0.1)
  timing=(--bench-warmup 30 --bench-steps 100 --bench-cycle 10)
  device=cuda
  # Seconds per run: what the runs of 2026-12-05 on an H200 took (bench/results/2026-12-05/summary.txt), with about
  # half again as margin. A hybrid model spends most of its time pinning its cold tier (46 GB at 10^8 rows: about 23 s);
  # PyTorch's runs draw their tables on the GPU (about 4 s). The steps themselves take seconds.
  declare -A estimate=([g1_gpu]=10 [g1_hybrid]=60 [g2_small]=20 [g2_large]=10 [g2_large_hybrid]=60 [g3_kiln]=10
                       [g3_torch]=20 [g3sgd_kiln]=10 [g3sgd_torch]=20 [cold]=60)
fi
goal_sizes="$(sizes_with_largest "$largest_goal")"
g2_small_sizes="$(sizes_with_largest "$largest_g2_small")"
g3_sizes="$(sizes_with_largest "$largest_g3")"

start=$SECONDS
left() { echo $((budget - (SECONDS - start))); }

# run STAGE ESTIMATE_KEY NAME COMMAND...: the command's output in logs/NAME.log, its JSON line in recsys_STAGE.jsonl,
# a line in the summary; skipped when its estimate does not fit in the budget left, killed at the budget's end.
run() {
  local stage="$1" key="$2" name="$3"
  shift 3
  local est="${estimate[$key]}" remaining
  remaining="$(left)"
  if ((remaining < est)); then
    note "$name: SKIPPED (estimate ${est} s, ${remaining} s of the budget left)"
    return
  fi
  local t=$SECONDS log="$out/logs/$name.log"
  PYTHONUNBUFFERED=1 timeout --signal=KILL "$remaining" "$@" >"$log" 2>&1
  local rc=$?
  grep '^{"bench": "recsys"' "$log" >>"$out/recsys_$stage.jsonl"
  note "$name: exit $rc, $((SECONDS - t)) s (estimate $est): $(grep -o '"step_ms": [0-9.]*\|"emb_device_gib": [0-9.]*\|"trained": [a-z]*\|"build_s": [0-9.]*\|"error": "[^"]*"' "$log" | tr '\n' ' ')"
  ((rc == 0)) || tail -5 "$log" | sed 's/^/    /' | tee -a "$summary"
}

kiln() {  # kiln NAME SIZES ARGS...: the example in timing mode
  local name="$1" sizes="$2"
  shift 2
  echo "$recsys" --device "$device" --table-sizes "$sizes" "${model[@]}" "${timing[@]}" --bench-name "$name" "$@"
}
torch() {
  local name="$1" sizes="$2"
  shift 2
  echo "$python" bench/pytorch_recsys.py --device "$device" --table-sizes "$sizes" "${model[@]}" "${timing[@]}" \
    --bench-name "$name" "$@"
}
need_recsys() {
  [[ -x "$recsys" ]] && return 0
  note "no $recsys: run the build stage first"
  return 1
}
need_torch() {
  "$python" -c "import torch" 2>/dev/null && return 0
  note "$python has no torch: the PyTorch runs are left out"
  return 1
}

table() {
  local files=()
  for f in "$out"/recsys_*.jsonl; do [[ "$f" == */recsys_profile.jsonl ]] || files+=("$f"); done
  [[ ${#files[@]} -gt 0 && -e "${files[0]}" ]] || { note "no JSON lines in $out yet"; return; }
  python3 bench/recsys_table.py "${files[@]}" | tee "$out/recsys_table.md"
}

for stage in "$@"; do
  case "$stage" in
    build)
      t=$SECONDS
      if { [[ -f "$build/build.ninja" ]] || cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON \
           -DCMAKE_CUDA_ARCHITECTURES=90 >"$out/logs/configure.log" 2>&1; } &&
         cmake --build "$build" -j "$(nproc)" --target recsys >"$out/logs/build.log" 2>&1; then
        note "build recsys: $((SECONDS - t)) s"
      else
        note "configure or build FAILED"; tail -20 "$out/logs/build.log" "$out/logs/configure.log" 2>/dev/null; exit 1
      fi
      ;;
    g1)
      need_recsys || continue
      for ((r = 1; r <= ${G1_ROUNDS:-1}; ++r)); do
        # shellcheck disable=SC2046  # kiln/torch print the command as words
        run g1 g1_gpu "g1_gpu_r$r" $(kiln g1_gpu "$goal_sizes" --table-optimizer rowwise_adagrad)
        run g1 g1_hybrid "g1_hybrid_r$r" $(kiln g1_hybrid "$goal_sizes" --table-optimizer rowwise_adagrad \
          --hybrid-rows "$hybrid_rows" --hot-fraction 0.1)
      done
      ;;
    cold)
      need_recsys || continue
      for ((r = 1; r <= ${COLD_ROUNDS:-1}; ++r)); do
        for reads in copy mapped; do
          # shellcheck disable=SC2046
          run cold cold "cold_${reads}_r$r" $(kiln "cold_$reads" "$goal_sizes" --table-optimizer rowwise_adagrad \
            --hybrid-rows "$hybrid_rows" --hot-fraction 0.1 --cold-reads "$reads")
        done
      done
      ;;
    g2)
      need_recsys || continue
      for ((r = 1; r <= ${G2_ROUNDS:-1}; ++r)); do
        common=(--table-optimizer rowwise_adagrad --id-rows "$id_rows")
        hybrid=(--hybrid-rows "$hybrid_rows" --hot-rows "$g2_hot")
        # shellcheck disable=SC2046
        {
          run g2 g2_small "g2_small_gpu_r$r" $(kiln g2_small_gpu "$g2_small_sizes" "${common[@]}")
          run g2 g2_large "g2_large_gpu_r$r" $(kiln g2_large_gpu "$goal_sizes" "${common[@]}")
          run g2 g2_small "g2_small_hybrid_r$r" $(kiln g2_small_hybrid "$g2_small_sizes" "${common[@]}" "${hybrid[@]}")
          run g2 g2_large_hybrid "g2_large_hybrid_r$r" $(kiln g2_large_hybrid "$goal_sizes" "${common[@]}" "${hybrid[@]}")
        }
      done
      ;;
    g3 | g3sgd)
      need_recsys || continue
      need_torch || continue
      if [[ $stage == g3 ]]; then
        rounds="${G3_ROUNDS:-5}" sizes="$g3_sizes" opt=sparse_adam name=g3_sparse_adam
      else
        rounds="${G3SGD_ROUNDS:-3}" sizes="$goal_sizes" opt=sgd name=g3sgd_sgd
      fi
      for ((r = 1; r <= rounds; ++r)); do  # alternating, kiln first in odd rounds and PyTorch first in even ones
        # shellcheck disable=SC2046
        if ((r % 2)); then
          run "$stage" "${stage}_kiln" "${name}_kiln_r$r" $(kiln "$name" "$sizes" --table-optimizer "$opt")
          run "$stage" "${stage}_torch" "${name}_torch_r$r" $(torch "$name" "$sizes" --table-optimizer "$opt")
        else
          run "$stage" "${stage}_torch" "${name}_torch_r$r" $(torch "$name" "$sizes" --table-optimizer "$opt")
          run "$stage" "${stage}_kiln" "${name}_kiln_r$r" $(kiln "$name" "$sizes" --table-optimizer "$opt")
        fi
        if [[ "${G3_COMPILE:-0}" == 1 ]]; then
          # shellcheck disable=SC2046
          run "$stage" "${stage}_torch" "${name}_torch_compile_r$r" $(torch "$name" "$sizes" --table-optimizer "$opt" --compile)
        fi
      done
      ;;
    profile)
      need_recsys || continue
      # shellcheck disable=SC2046
      {
        run profile g1_gpu profile_g1_gpu $(kiln profile_g1_gpu "$goal_sizes" --table-optimizer rowwise_adagrad \
          --profile "${timing[1]},3,5" --trace "$out/logs/profile_g1_gpu.json")
        for reads in copy mapped; do
          run profile g1_hybrid "profile_g1_hybrid_$reads" $(kiln "profile_g1_hybrid_$reads" "$goal_sizes" \
            --table-optimizer rowwise_adagrad --hybrid-rows "$hybrid_rows" --hot-fraction 0.1 --cold-reads "$reads" \
            --profile "${timing[1]},3,5" --trace "$out/logs/profile_g1_hybrid_$reads.json")
        done
      }
      sed -n '/^profile of/,/ ops in .* steps/p' "$out/logs/profile_g1_gpu.log" "$out/logs/profile_g1_hybrid_copy.log" \
        "$out/logs/profile_g1_hybrid_mapped.log" | tee -a "$summary"
      ;;
    profile_g2)
      need_recsys || continue
      # shellcheck disable=SC2046
      {
        common=(--table-optimizer rowwise_adagrad --id-rows "$id_rows" --hybrid-rows "$hybrid_rows" --hot-rows "$g2_hot")
        run profile g2_small profile_g2_small_hybrid $(kiln profile_g2_small_hybrid "$g2_small_sizes" \
          "${common[@]}" --profile "${timing[1]},3,5" --trace "$out/logs/profile_g2_small_hybrid.json")
        run profile g2_large_hybrid profile_g2_large_hybrid $(kiln profile_g2_large_hybrid "$goal_sizes" \
          "${common[@]}" --profile "${timing[1]},3,5" --trace "$out/logs/profile_g2_large_hybrid.json")
      }
      sed -n '/^profile of/,/ ops in .* steps/p' "$out/logs/profile_g2_small_hybrid.log" \
        "$out/logs/profile_g2_large_hybrid.log" | tee -a "$summary"
      ;;
    table) ;;
    *) echo "bench_goals.sh: unknown stage '$stage' (build g1 cold g2 g3 g3sgd profile profile_g2 table)" >&2; exit 2 ;;
  esac
done
note "bench_goals.sh $*: $((SECONDS - start)) s"
table
# The GPU runner brings back at most 8 files from its $OUT, a new empty folder per command: the logs (of every
# invocation into OUT_DIR) go packed into one file, and when $OUT is set and is not OUT_DIR, the JSON lines, the
# table, the summary and the packed logs are copied there. (So give an OUT_DIR that outlives the command, /tmp/rs,
# and the second command's table holds the first's runs too.)
tar -czf "$out/logs.tar.gz" -C "$out" logs
if [[ -n "${OUT:-}" && "$(cd "$OUT" 2>/dev/null && pwd)" != "$(cd "$out" && pwd)" ]]; then
  cp "$out"/recsys_*.jsonl "$out/recsys_table.md" "$summary" "$out/logs.tar.gz" "$OUT"/ 2>/dev/null
fi
