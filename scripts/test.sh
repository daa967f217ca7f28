#!/usr/bin/env bash
# Builds kiln if needed and runs the whole test suite with CTest. Exits non-zero when anything fails.
#
#   scripts/test.sh                 set up (first time) or rebuild, then run every test
#   scripts/test.sh -R Softmax      extra arguments go to ctest (-R regex, -L label, -E exclude, ...)
#
# Environment (all optional):
#   KILN_BUILD_DIR     build folder (default: build); configured by scripts/setup.sh if it is not yet
#   KILN_TEST_JOBS     tests run at once (default: 2)
#   KILN_TEST_TIMEOUT  seconds a test may take when it sets no timeout of its own (default: 300)
#   KILN_SANITIZERS    sanitizer stages to run after the suite (scripts/sanitize.sh): "asan tsan", "asan", "tsan",
#                      or "none"; default: "asan tsan" when CI=true, none otherwise. Each builds a CPU-only build
#                      folder of its own (build-asan, build-tsan); a failure there fails the run.
# Plus those of scripts/setup.sh (KILN_JOBS, KILN_CUDA, ...) for the first configure.
#
# The full ctest output is also written to <build>/Testing/test.log.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

say() { echo "test.sh: $*"; }

build_dir="${KILN_BUILD_DIR:-build}"
test_jobs="${KILN_TEST_JOBS:-2}"
timeout="${KILN_TEST_TIMEOUT:-300}"
export KILN_BUILD_DIR="$build_dir"

start=$SECONDS
if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
  say "$build_dir is not configured: running scripts/setup.sh"
  scripts/setup.sh
else
  # A build folder made by scripts/quickstart.sh lacks the test-only packages: installed now (a no-op when there).
  scripts/setup.sh --test-deps
  say "building $build_dir"
  cmake --build "$build_dir" --parallel "${KILN_JOBS:-$(nproc 2>/dev/null || echo 2)}"
fi
say "build took $((SECONDS - start)) s"

mkdir -p "$build_dir/Testing"
log="$build_dir/Testing/test.log"
say "running the tests ($test_jobs at a time, ${timeout} s per test unless it sets its own)"
start=$SECONDS
set +e
ctest --test-dir "$build_dir" --output-on-failure -j "$test_jobs" --timeout "$timeout" "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
suite_s=$((SECONDS - start))
if [[ $status -eq 0 ]]; then
  say "PASSED in ${suite_s} s (log: $log)"
else
  say "FAILED (ctest exit $status) after ${suite_s} s (log: $log)"
fi

stages="${KILN_SANITIZERS:-}"
if [[ -z "$stages" && "${CI:-}" == true ]]; then stages="asan tsan"; fi
if [[ -n "$stages" && "$stages" != none ]]; then
  summary=("test suite: $([[ $status -eq 0 ]] && echo passed || echo FAILED) (${suite_s} s)")
  for stage in $stages; do
    say "sanitizer stage: $stage"
    start=$SECONDS
    stage_status=0
    scripts/sanitize.sh "$stage" || stage_status=$?
    summary+=("sanitizer stage $stage: $([[ $stage_status -eq 0 ]] && echo passed || echo FAILED) ($((SECONDS - start)) s)")
    if [[ $stage_status -ne 0 && $status -eq 0 ]]; then status=$stage_status; fi
  done
  echo
  say "summary:"
  printf '  %s\n' "${summary[@]}"
fi
exit "$status"
