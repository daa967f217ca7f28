#!/usr/bin/env bash
# kiln against PyTorch's modes on one GPU instance, interleaved: builds bench_train, then REPEATS rounds, each
# running every CASE once through bench_train and once through bench/pytorch_train.py (every mode in
# KILN_TORCH_MODES), so that the machine's drift falls on both sides alike. Prints the table of
# bench/train_table.py (median [min..max] of the runs that trained, per side) last.
#
#   scripts/bench_vs_torch.sh 5 bert_base_128 resnet18_cifar_bf16
#   KILN_TORCH_MODES="eager compile_graph" scripts/bench_vs_torch.sh 3 resnet50_bf16
#
# KILN_TORCH_MODES: pytorch_train.py's --mode values (default: eager compile eager_graph compile_graph).
# KILN_BENCH_TRAIN: a bench_train already built (with its libraries on LD_LIBRARY_PATH): nothing is built.
# Logs (kiln_<case>_<round>.log, torch_<case>_<round>.log, table.md) and a summary go to $OUT (else ./gpu-logs);
# the build goes to $KILN_GPU_BUILD_DIR (build-gpu).
set -uo pipefail

# shellcheck source=scripts/gpu_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"  # root, out, build, note

repeats="${1:?usage: bench_vs_torch.sh REPEATS CASE...}"
shift
[[ "$repeats" =~ ^[1-9][0-9]*$ ]] || { echo "bench_vs_torch.sh: REPEATS must be a whole number of at least 1, not '$repeats'" >&2; exit 2; }
cases=("$@")
[[ ${#cases[@]} -gt 0 ]] || { echo "name at least one bench_train case" >&2; exit 2; }
read -r -a modes <<<"${KILN_TORCH_MODES:-eager compile eager_graph compile_graph}"
mode_args=()
for m in "${modes[@]}"; do mode_args+=(--mode "$m"); done

start=$SECONDS
bench_train="${KILN_BENCH_TRAIN:-$build/bench/bench_train}"
if [[ -n "${KILN_BENCH_TRAIN:-}" ]]; then
  [[ -x "$bench_train" ]] || { echo "bench_vs_torch.sh: KILN_BENCH_TRAIN=$bench_train is not an executable" >&2; exit 2; }
  note "bench_train: $bench_train (prebuilt)"
elif ! { [[ -f "$build/build.ninja" ]] || cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 >"$out/configure.log" 2>&1; } ||
  ! cmake --build "$build" -j "$(nproc)" --target bench_train >"$out/build.log" 2>&1; then
  note "configure or build FAILED"; tail -20 "$out/build.log" "$out/configure.log" 2>/dev/null; exit 1
else
  note "build bench_train: $((SECONDS - start)) s"
fi

for ((r = 1; r <= repeats; ++r)); do
  for c in "${cases[@]}"; do
    t=$SECONDS
    "$bench_train" --case "$c" >"$out/kiln_${c}_$r.log" 2>&1
    note "round $r $c kiln: exit $?, $((SECONDS - t)) s: $(grep -o '"step_ms": [0-9.]*\|"eager_step_ms": [0-9.]*\|"trained": [a-z]*' "$out/kiln_${c}_$r.log" | tr '\n' ' ')"
    t=$SECONDS
    PYTHONUNBUFFERED=1 python3 bench/pytorch_train.py --case "$c" "${mode_args[@]}" >"$out/torch_${c}_$r.log" 2>&1
    note "round $r $c torch: exit $?, $((SECONDS - t)) s: $(grep -o '"framework": "[a-z_-]*"\|"step_ms": [0-9.]*\|"trained": [a-z]*\|"error"\|"skipped"' "$out/torch_${c}_$r.log" | tr '\n' ' ')"
  done
done
python3 bench/train_table.py "$out"/kiln_*.log "$out"/torch_*.log | tee "$out/table.md"
pack_logs
