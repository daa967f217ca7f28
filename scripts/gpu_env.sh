# Sourced by the GPU scripts (gpu_check.sh, gpu_focus.sh, gpu_examples.sh as they need): the repository root as the
# working folder, the log folder ($OUT on the GPU runner, else ./gpu-logs), the build folder, NVLink multicast off
# in every process (shared hosts: see GPU.md), and note(), which prints a line and keeps it in the summary.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${OUT:-$root/gpu-logs}"
mkdir -p "$out"
build="${KILN_GPU_BUILD_DIR:-build-gpu}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

summary="$out/summary.txt"
[[ -n "${KILN_APPEND_SUMMARY:-}" ]] || : >"$summary"  # a script run after another in one command keeps its lines
note() { echo "$*" | tee -a "$summary"; }

# The GPU runner brings back at most 8 files from $OUT (/work/.library/device/README.md). pack_logs, called last
# by the scripts, leaves summary.txt beside logs.tar.gz (every other file, packed) when there are more.
pack_logs() {
  local files packs name
  mapfile -t files < <(cd "$out" && find . -maxdepth 1 -type f ! -name summary.txt ! -name 'logs*.tar.gz' -printf '%P\n')
  packs="$(cd "$out" && find . -maxdepth 1 -name 'logs*.tar.gz' | wc -l)"
  if (( ${#files[@]} + packs + 1 > 8 )); then
    name="logs.tar.gz"
    (( packs == 0 )) || name="logs$((packs + 1)).tar.gz"  # a later script's logs beside an earlier one's pack
    (cd "$out" && tar -czf "$name" "${files[@]}" && rm -f "${files[@]}")
    echo "logs packed into $out/$name (${#files[@]} files)"
  fi
}

# A fingerprint of the sources a build reads (the folders below and the top CMakeLists.txt, each file's path and
# content; bench/results and bench/experiments, which no build reads, left out), the same on the development machine (files git tracks or
# would track) and on the GPU machine (the copy of those files it receives, without .git).
source_id() {
  local dirs=(CMakeLists.txt bench cmake examples fuzz kiln tests tools)
  {
    if git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then
      git -C "$root" ls-files -co --exclude-standard -- "${dirs[@]}"
    else
      (cd "$root" && find "${dirs[@]}" -type f ! -path '*/__pycache__/*')
    fi
  } | grep -v '^bench/\(results\|experiments\)/' | LC_ALL=C sort | (cd "$root" && while IFS= read -r f; do [[ -f "$f" ]] && echo "$f"; done | xargs -r -d '\n' sha256sum) |
    sha256sum | cut -c1-32
}

# Binaries built on the development machine (scripts/gpu_prebuilt.sh) and carried along in gpu-carry/: unpacked into
# build/ (their libraries' run path) when they were built from this very tree, hold every target named, and every
# library they need loads here (ldd). Then sets build=build and returns 0; else says why and returns 1 (build here).
use_prebuilt() {
  local pack="$root/gpu-carry/prebuilt.tar.xz" id_file="$root/gpu-carry/prebuilt.id" t
  [[ -f "$pack" && -f "$id_file" ]] || return 1
  if [[ "$(cat "$id_file")" != "$(source_id)" ]]; then
    note "prebuilt binaries: made from another tree than this one; building here"
    return 1
  fi
  tar -xJf "$pack" -C "$root" || { note "prebuilt binaries: the pack does not unpack; building here"; return 1; }
  for t in "$@"; do
    if [[ -z "$(find "$root/build/tests" "$root/build/bench" "$root/build/examples" \( -name "$t" -o -name "lib$t.so" \) -type f -perm -u+x 2>/dev/null | head -n1)" ]]; then
      note "prebuilt binaries: $t is not in the pack; building here"
      return 1
    fi
  done
  local missing binaries lib
  binaries="$(tar -tJf "$pack" | grep -v '/$' | grep -v '^build/prebuilt-libs/')"
  # A system library this machine lacks is taken from the pack's copy (gpu_prebuilt.sh), put on the library path.
  for lib in $(cd "$root" && echo "$binaries" | xargs -r ldd 2>/dev/null | awk '$3 == "not" {print $1}' | sort -u); do
    [[ -f "$root/build/prebuilt-libs/$lib" ]] || continue
    mkdir -p "$root/build/prebuilt-libs/use"
    ln -sf "../$lib" "$root/build/prebuilt-libs/use/$lib"
  done
  if [[ -d "$root/build/prebuilt-libs/use" ]]; then
    export LD_LIBRARY_PATH="$root/build/prebuilt-libs/use${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    note "prebuilt binaries: this machine lacks $(ls "$root/build/prebuilt-libs/use" | paste -sd' '); the pack's copies are used"
  fi
  missing="$(cd "$root" && echo "$binaries" | xargs -r ldd 2>/dev/null | grep 'not found' | sort -u | paste -sd' ')"
  if [[ -n "$missing" ]]; then
    note "prebuilt binaries: libraries missing here ($missing); building here"
    return 1
  fi
  build=build
  note "prebuilt binaries from the development machine ($(cat "$root/gpu-carry/prebuilt.targets")): nothing built"
  return 0
}

# ---- one GPU call that tests and times several libraries (the bench/results/*/scripts/run*.sh) ----
# call_logs X: the call's logs go to /tmp/lX ($logs), and snap packs them into $OUT/logs_X.tgz, so that a call stopped
# at its limit still brings back what it measured (snap after each step).
call_logs() {
  logs="/tmp/l$1"
  logs_pack="${OUT:-$out}/logs_$1.tgz"
  mkdir -p "$logs"
}
snap() { tar -czf "$logs_pack" -C "$logs" .; }
# The device (name, driver, top SM clock) and the tree's fingerprint: a call's first lines.
gpu_banner() {
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  echo "tree $(source_id)"
}
# with_lib REV CMD...: CMD with the libkiln of REV, main's build (REV main) or one unpacked into /tmp/lib_REV.
with_lib() {
  local rev=$1 dir
  shift
  if [[ $rev == main ]]; then dir="$root/build/kiln"; else dir="/tmp/lib_$rev"; fi
  LD_LIBRARY_PATH="$dir:${LD_LIBRARY_PATH:-}" "$@"
}
# unpack_libs PACK: the branches' builds in PACK (one tar.xz) to where with_lib finds them: libkiln_REV.so.0.1 into
# /tmp/lib_REV/libkiln.so.0.1, test_BIN_NAME (test_layers_NAME, test_optim_NAME, ...) into /tmp/lib_NAME/test_BIN
# (run it with the library it was built with: with_lib REV /tmp/lib_NAME/test_BIN).
unpack_libs() {
  local f name bin
  mkdir -p /tmp/ab && tar -xJf "$1" -C /tmp/ab || return 1
  for f in /tmp/ab/libkiln_*.so.0.1 /tmp/ab/test_*_*; do
    [[ -f $f ]] || continue
    name=${f#/tmp/ab/}
    if [[ $name == libkiln_* ]]; then
      name=${name#libkiln_} && name=${name%.so.0.1}
      mkdir -p "/tmp/lib_$name" && mv "$f" "/tmp/lib_$name/libkiln.so.0.1"
    else
      bin=${name%_*} && name=${name##*_}
      mkdir -p "/tmp/lib_$name" && mv "$f" "/tmp/lib_$name/$bin" && chmod +x "/tmp/lib_$name/$bin"
    fi
  done
}
# begin_call NAME: how a results folder's call script starts: logs in /tmp/lNAME (call_logs), the GPU's banner, and
# main's prebuilt bench_train, kernel_trace, test_autograd and test_layers (use_prebuilt); bt is then the prebuilt
# bench_train. Returns 1 without those binaries.
begin_call() {
  call_logs "$1"
  gpu_banner
  use_prebuilt bench_train kernel_trace test_autograd test_layers || return 1
  bt=$PWD/build/bench/bench_train
}
# ab_runs "REV..." NAME BENCH_TRAIN ARGS...: BENCH_TRAIN ARGS with main's libkiln and each REV's (with_lib), AB_ROUNDS
# (default 2) alternated rounds; each run's log in $logs/NAME_LIB_ROUND.log and one line with its step times.
ab_runs() {
  local revs=$1 name=$2 bench=$3 r lib
  local times='"case": "[a-z0-9_]*"\|"step_ms": [0-9.]*\|"eager_step_ms": [0-9.]*\|"trained": [a-z]*'
  shift 3
  for r in $(seq 1 "${AB_ROUNDS:-2}"); do
    for lib in main $revs; do
      with_lib "$lib" timeout 100 "$bench" "$@" > "$logs/${name}_${lib}_$r.log" 2>&1
      echo "round $r $lib: exit $? $(grep -o "$times" "$logs/${name}_${lib}_$r.log" | paste -sd' ') at $SECONDS s"
    done
    snap
  done
}
# vs_torch_runs NAME MODES BENCH_TRAIN CASE...: scripts/bench_vs_torch.sh ROUNDS (default 5) CASE... against PyTorch's
# MODES with VS_LIB's libkiln (default main) and BENCH_TRAIN; its logs packed into $OUT/vs_torch_NAME.tgz.
vs_torch_runs() {
  local name=$1 modes=$2 bench=$3
  shift 3
  with_lib "${VS_LIB:-main}" env OUT="/tmp/vs_$name" KILN_TORCH_MODES="$modes" KILN_BENCH_TRAIN="$bench" \
    scripts/bench_vs_torch.sh "${ROUNDS:-5}" "$@" > "$logs/vs_torch_$name.log" 2>&1
  echo "vs torch $name (${VS_LIB:-main}): exit $? at $SECONDS s"; tail -14 "$logs/vs_torch_$name.log"
  tar -czf "$OUT/vs_torch_$name.tgz" -C /tmp "vs_$name"; snap
}
# golden_at DIR: a test binary built in the checkout DIR reads PyTorch's golden files from DIR/tests/golden/data; where
# DIR is not this checkout and has no such folder, a link to this checkout's.
golden_at() {
  [[ $1 == "$root" || -d $1/tests/golden/data ]] && return 0
  mkdir -p "$1/tests/golden" && ln -sfn "$root/tests/golden/data" "$1/tests/golden/data"
}
# gtest_run NAME BINARY FILTER: BINARY --gtest_filter=FILTER (at most 200 s) into $logs/NAME.log, then one line:
# NAME, the filter, the exit status and gtest_counts. A library to test with goes in front: with_lib REV gtest_run ...
gtest_run() {
  local name=$1 bin=$2 filter=$3
  timeout 200 "$bin" --gtest_filter="$filter" > "$logs/$name.log" 2>&1
  echo "$name ($filter): exit $? $(gtest_counts "$logs/$name.log") at $SECONDS s"
}
# gtest_counts LOG: "(N ok, M skipped)", then the failed and skipped tests and the first failures.
gtest_counts() {
  echo "($(grep -c '^\[       OK ' "$1") ok, $(grep -c '^\[  SKIPPED ' "$1") skipped)"
  grep -E '^\[  (FAILED|SKIPPED) ' "$1" | head -8
  grep -A6 "Failure" "$1" | head -24
}
