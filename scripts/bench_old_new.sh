#!/usr/bin/env bash
# Old against new on one GPU instance: builds bench_train from a second source tree beside this one's, then runs
# each case alternately (old, new, old, new, ...), REPEATS times each, and prints one line per run and the
# medians. Instances of the same GPU differ by a few percent, so a change is only ever judged this way.
#
#   git archive <rev> | (mkdir -p oldsrc && tar -x -C oldsrc)      # the old tree (e.g. before a change)
#   scripts/bench_old_new.sh oldsrc 3 bert_base_128 resnet50_bf16
#
# Builds: build-gpu (this tree) and OLD/build-gpu. Logs and a summary go to $OUT (else ./gpu-logs).
# KILN_OLD_NEW_BENCH=current: build the old library with this tree's bench/ (copied over OLD/bench first), so both
# sides run the same harness and only the library differs (when the harness itself changed between the trees).
set -uo pipefail

# shellcheck source=scripts/gpu_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"  # root, out, build, note

old_src="$(cd "${1:?usage: bench_old_new.sh OLD_SOURCE_DIR REPEATS CASE...}" && pwd)"
repeats="${2:?REPEATS}"
shift 2
cases=("$@")
[[ ${#cases[@]} -gt 0 ]] || { echo "name at least one bench_train case" >&2; exit 2; }

configure_and_build() {  # source dir, build dir, label
  local start=$SECONDS
  if ! cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    >"$out/configure_$3.log" 2>&1; then
    note "$3: configure FAILED"; tail -20 "$out/configure_$3.log"; exit 1
  fi
  if ! cmake --build "$2" -j "$(nproc)" --target bench_train >"$out/build_$3.log" 2>&1; then
    note "$3: build FAILED"; grep -E "error" "$out/build_$3.log" | head -20; exit 1
  fi
  note "$3: configure + build bench_train: $((SECONDS - start)) s"
}
[[ -d "$old_src/third_party" ]] || ln -s "$root/third_party" "$old_src/third_party"
if [[ "${KILN_OLD_NEW_BENCH:-}" == current ]]; then
  rm -rf "$old_src/bench" && cp -r "$root/bench" "$old_src/bench"
  note "old: built with this tree's bench/"
fi
configure_and_build "$old_src" "$old_src/build-gpu" old
configure_and_build "$root" "$root/$build" new

field() { grep -o "\"$2\": [0-9.]*" <<<"$1" | head -1 | awk '{print $2}'; }
declare -A graph eager
for c in "${cases[@]}"; do
  for ((r = 1; r <= repeats; ++r)); do
    for which in old new; do
      exe="$old_src/build-gpu/bench/bench_train"
      [[ $which == new ]] && exe="$root/$build/bench/bench_train"
      line="$("$exe" --case "$c" 2>>"$out/bench_stderr.log" | grep "\"case\": \"$c\"" | tail -1)"
      g="$(field "$line" step_ms)" e="$(field "$line" eager_step_ms)" loss="$(field "$line" loss)"
      note "$c $which run $r: graph ${g:-?} ms, eager ${e:-?} ms, loss ${loss:-?}"
      graph[$c,$which]+="${g:-nan} " eager[$c,$which]+="${e:-nan} "
    done
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
for c in "${cases[@]}"; do
  for which in old new; do
    note "$c $which: median graph $(median <<<"${graph[$c,$which]}") ms (${graph[$c,$which]% }), median eager" \
      "$(median <<<"${eager[$c,$which]}") ms (${eager[$c,$which]% })"
  done
done
