#!/usr/bin/env bash
# Builds kiln's CPU code with sanitizers, in a build folder of its own, and runs the tests that exercise it.
# Exits non-zero when a test fails or a sanitizer reports anything.
#
#   scripts/sanitize.sh asan    AddressSanitizer + UndefinedBehaviorSanitizer, leak checking on: the tensor,
#                               autograd, data (DataLoader), io, profiler and distributed tests (single-process,
#                               and the MPI tests under mpirun -np 2)
#   scripts/sanitize.sh tsan    ThreadSanitizer over the threaded code: the DataLoader, the CPU thread pool, the
#                               profiler's worker threads, distributed (TCP rendezvous, MPI collectives)
#   scripts/sanitize.sh asan -- --gtest_filter=Softmax*   extra arguments after -- go to every test binary
#
# Environment (all optional):
#   KILN_SANITIZE_BUILD_DIR   build folder (default: build-asan or build-tsan)
#   KILN_JOBS                 parallel compile jobs (default: the number of cores)
#
# CUDA, examples, tools and benchmarks are off in these builds: the stages test CPU code. The suppression files
# in scripts/sanitizers/ name third-party libraries only (Open MPI); kiln's own code gets none.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

say() { echo "sanitize.sh: $*"; }
die() {
  echo "sanitize.sh: error: $*" >&2
  exit 2
}

mode="${1:-}"
shift || true
if [[ "${1:-}" == "--" ]]; then shift; fi
extra=("$@")

case "$mode" in
  asan) sanitizers="address,undefined" ;;
  tsan) sanitizers="thread" ;;
  *) die "usage: scripts/sanitize.sh asan|tsan [-- gtest arguments]" ;;
esac
build_dir="${KILN_SANITIZE_BUILD_DIR:-build-$mode}"
jobs="${KILN_JOBS:-$(nproc 2>/dev/null || echo 2)}"
supp="$root/scripts/sanitizers"

# What each stage builds and runs: "binary|gtest filter" (an empty filter runs every CPU case). GPU cases skip
# without a GPU anyway; they are left out so that the log lists only what ran.
cpu_only="-*cuda0*:*Cuda*"
if [[ "$mode" == asan ]]; then
  runs=(
    "test_tensor|"
    "test_autograd|"
    "test_data|"
    "test_io|"
    "test_profiler|"
    "test_distributed|"
  )
else
  # The threaded code: the DataLoader and the datasets it drives (all of test_data: it mostly waits), the thread
  # pool (large ops split over threads, per-thread state), the profiler (worker threads record on their own rows),
  # distributed (the TCP rendezvous runs a thread per rank).
  runs=(
    "test_data|"
    "test_tensor|*Thread*:*Parallel*:Determinism*"
    "test_profiler|"
    "test_distributed|"
  )
fi
mpi_run=1  # the MPI tests (test_distributed_mpi under mpirun -np 2), where MPI is found

# ---- configure
if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
  args=(-S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release "-DKILN_SANITIZE=$sanitizers" -DKILN_CUDA=OFF
        -DKILN_BUILD_EXAMPLES=OFF -DKILN_BUILD_TOOLS=OFF -DKILN_BUILD_BENCHMARKS=OFF -DKILN_INSTALL=OFF)
  if command -v ninja >/dev/null; then args+=(-G Ninja); fi
  say "configuring $build_dir ($sanitizers)"
  cmake "${args[@]}" >"$build_dir.configure.log" 2>&1 || {
    cat "$build_dir.configure.log"
    die "CMake configure of $build_dir failed"
  }
  mv "$build_dir.configure.log" "$build_dir/configure.log"
fi
have_mpi=0
if grep -q '^KILN_MPI:BOOL=ON' "$build_dir/CMakeCache.txt" && [[ -n "$(command -v mpirun || true)" ]]; then have_mpi=1; fi

# ---- build
targets=()
for r in "${runs[@]}"; do targets+=("${r%%|*}"); done
if [[ $mpi_run -eq 1 && $have_mpi -eq 1 ]]; then targets+=(test_distributed_mpi); fi
start=$SECONDS
say "building ${targets[*]} in $build_dir with $jobs jobs"
cmake --build "$build_dir" --parallel "$jobs" --target "${targets[@]}" || die "build of $build_dir failed"
build_s=$((SECONDS - start))
say "build took ${build_s} s"

# ---- run
# Every report stops the program with a non-zero exit status, so the test binary fails. allocator_may_return_null:
# an allocation too large for the machine returns null, as the C library's does, so that the tests of kiln's
# out-of-memory errors (a tensor of 2^50 bytes) see what a user's program would.
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=0:strict_string_checks=1:check_initialization_order=1:detect_stack_use_after_return=0:allocator_may_return_null=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp:print_suppressions=0:allocator_may_return_null=1"
# Open MPI started as root (CI containers), with 2 ranks where it counts fewer slots; as tests/distributed does.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export KILN_DIST_TIMEOUT_S="${KILN_DIST_TIMEOUT_S:-300}"

log_dir="$build_dir/sanitize-logs"
mkdir -p "$log_dir"
results=()
failed=0
run_one() {  # name, command...
  local name="$1"
  shift
  local log="$log_dir/$name.log" t0=$SECONDS status=0
  say "running $name"
  "$@" >"$log" 2>&1 || status=$?
  local took=$((SECONDS - t0))
  if [[ $status -eq 0 ]]; then
    results+=("  passed  ${took}s  $name")
  else
    failed=1
    results+=("  FAILED  ${took}s  $name (exit $status; log: $log)")
    # The sanitizer's report, or the failing tests, and the end of the log.
    grep -E -A40 '^(==[0-9]+==ERROR|WARNING: ThreadSanitizer|SUMMARY: |.*runtime error:)' "$log" | head -120 || true
    grep -E '^\[  FAILED  \]' "$log" | head -40 || true
    tail -n 30 "$log"
  fi
}

start=$SECONDS
for r in "${runs[@]}"; do
  bin="${r%%|*}"
  filter="${r#*|}"
  if [[ -z "$filter" ]]; then filter="*${cpu_only}"; else filter="${filter}${cpu_only}"; fi
  run_one "$bin" "$build_dir/tests/$bin" "--gtest_filter=$filter" "${extra[@]}"
done
if [[ $mpi_run -eq 1 && $have_mpi -eq 1 ]]; then
  # Each rank writes its own report; mpirun fails when a rank does. Leak checking is off for this job only: Open MPI
  # leaves ~116 KB in ~3,300 allocations at exit from its components, which it has unloaded by then, so LeakSanitizer
  # can neither name nor suppress them by library (their stacks end in "<unknown module>").
  ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0" \
    run_one test_distributed_mpi mpirun -np 2 --oversubscribe -x ASAN_OPTIONS -x UBSAN_OPTIONS -x LSAN_OPTIONS \
    -x TSAN_OPTIONS -x KILN_DIST_TIMEOUT_S "$build_dir/tests/test_distributed_mpi" "--gtest_filter=*${cpu_only}" \
    "${extra[@]}"
fi
run_s=$((SECONDS - start))

echo
say "$mode summary ($sanitizers; build ${build_s}s, tests ${run_s}s; logs in $log_dir):"
printf '%s\n' "${results[@]}"
if [[ $failed -ne 0 ]]; then
  say "$mode: FAILED"
  exit 1
fi
say "$mode: PASSED"
