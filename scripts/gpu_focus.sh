#!/usr/bin/env bash
# A focused GPU check, for a change that touches a few parts (scripts/gpu_check.sh is the whole one): configure
# natively, build only the test binaries and benchmarks named, run each test binary with its gtest filter, then
# each benchmark command. Full logs go to $OUT (the GPU runner's folder; else ./gpu-logs; packed into logs.tar.gz
# beside summary.txt when they are more than the runner brings back); a summary is printed last.
#
#   KILN_FOCUS_TESTS="test_tensor=*MatmulTest*cuda*:CudaGraph* test_layers=CudaBatchNorm.*" \
#   KILN_FOCUS_BENCH="bench_train --case bert_base_128;bench_batch_norm" scripts/gpu_focus.sh
#
# KILN_FOCUS_TESTS: space-separated BINARY=FILTER pairs (the binary under build-gpu/tests/<module>/).
# KILN_FOCUS_BENCH: ';'-separated commands; the first word is a target under build-gpu/bench/, or "python3 ..."
#                   run as is from the repository root.
# KILN_FOCUS_TARGETS: extra build targets.
# KILN_FOCUS_TEST_TIMEOUT: seconds each test binary may run (default 900).
# With gpu-carry/ carried along (scripts/gpu_prebuilt.sh TARGET... on the development machine, from this same tree),
# its binaries are used and nothing is built here.
set -uo pipefail

# shellcheck source=scripts/gpu_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"  # root, out, build, note; NVLink multicast off

read -r -a test_pairs <<<"${KILN_FOCUS_TESTS:-}"
IFS=';' read -r -a benches <<<"${KILN_FOCUS_BENCH:-}"
targets=()
for pair in "${test_pairs[@]}"; do targets+=("${pair%%=*}"); done
for cmd in "${benches[@]}"; do
  first="$(echo "$cmd" | awk '{print $1}')"
  [[ -n "$first" && "$first" != python3 ]] && targets+=("$first")
done
read -r -a extra <<<"${KILN_FOCUS_TARGETS:-}"
targets+=("${extra[@]}")

note "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | paste -sd';')"
start=$SECONDS
if ! use_prebuilt "${targets[@]}"; then  # gpu-carry/ from scripts/gpu_prebuilt.sh, where it matches this tree
  if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    >"$out/configure.log" 2>&1; then
    note "configure FAILED"; tail -30 "$out/configure.log"; exit 1
  fi
  if ! cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" >"$out/build.log" 2>&1; then
    note "build FAILED"; grep -E "error|Error" "$out/build.log" | head -40; exit 1
  fi
  note "configure + build (${targets[*]}): $((SECONDS - start)) s"
fi

status=0
for pair in "${test_pairs[@]}"; do
  bin="${pair%%=*}" filter="${pair#*=}"
  exe="$(find "$build/tests" -name "$bin" -type f -perm -u+x | head -n1)"
  log="$out/$bin.log"
  start=$SECONDS
  timeout "${KILN_FOCUS_TEST_TIMEOUT:-900}" "$exe" --gtest_filter="$filter" >"$log" 2>&1
  rc=$?
  [[ $rc -ne 0 ]] && status=1
  note "$bin ($filter): exit $rc, $((SECONDS - start)) s; $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \]' "$log" | head -3 | paste -sd' ')"
  grep -E '^\[  FAILED  \] .*\(' "$log" | head -20 | tee -a "$summary"
done

i=0
for cmd in "${benches[@]}"; do
  [[ -z "${cmd// /}" ]] && continue
  i=$((i + 1))
  read -r -a words <<<"$cmd"
  log="$out/bench_${i}_${words[0]##*/}.log"
  start=$SECONDS
  if [[ "${words[0]}" == python3 ]]; then
    PYTHONUNBUFFERED=1 timeout 1200 "${words[@]}" >"$log" 2>&1
  else
    timeout 1200 "$build/bench/${words[0]}" "${words[@]:1}" >"$log" 2>&1
  fi
  rc=$?
  note "bench [$cmd]: exit $rc, $((SECONDS - start)) s"
  tail -n "${KILN_FOCUS_BENCH_TAIL:-20}" "$log"
done
pack_logs
exit $status
