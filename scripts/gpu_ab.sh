#!/usr/bin/env bash
# Interleaved A/B runs of one benchmark command against two builds of libkiln on the same GPU instance: the baseline
# library (gpu-carry/baseline.tar.xz, a directory baseline/ holding libkiln.so*) and the one in build/kiln, which the
# prebuilt binaries load by default. The binaries are the same; only the library they load differs (LD_LIBRARY_PATH
# before their run path), so a change inside libkiln is measured with everything else equal.
#
#   # on the development machine: the baseline library from an earlier commit, then this tree's binaries
#   git checkout -q REV && ninja -C build kiln && mkdir -p /tmp/baseline && cp -a build/kiln/libkiln.so* /tmp/baseline/
#   git checkout -q main && (cd /tmp && tar -cf - baseline | xz -T0 >"$OLDPWD/gpu-carry/baseline.tar.xz")
#   scripts/gpu_prebuilt.sh bench_train
#   # on the GPU machine (carry gpu-carry): 3 rounds of baseline then new
#   scripts/gpu_ab.sh 3 bench_train --case bert_base_128
#
# Writes $OUT/ab_<round>_<baseline|new>.log (packed with pack_logs where they are many), one per run, and prints each run's JSON lines without their loss lists.
# Needs the prebuilt binaries unpacked (scripts/gpu_focus.sh does that; this script does it too where they are not).
set -euo pipefail

# shellcheck source=scripts/gpu_env.sh
KILN_APPEND_SUMMARY=1 source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"  # root, out, note, use_prebuilt, pack_logs

rounds="${1:?usage: scripts/gpu_ab.sh ROUNDS BENCH [ARGS...]}"
shift
bench="${1:?usage: scripts/gpu_ab.sh ROUNDS BENCH [ARGS...]}"
shift
[[ -f "$root/gpu-carry/baseline.tar.xz" ]] || { echo "gpu_ab.sh: no gpu-carry/baseline.tar.xz (see the header)" >&2; exit 2; }
exe="$root/build/bench/$bench"
if [[ ! -x "$exe" ]]; then
  use_prebuilt "$bench" || { echo "gpu_ab.sh: $bench is not among the prebuilt binaries" >&2; exit 2; }
fi
if [[ -d "$root/build/prebuilt-libs/use" ]]; then
  export LD_LIBRARY_PATH="$root/build/prebuilt-libs/use${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
base_dir="$(mktemp -d)"
tar -xJf "$root/gpu-carry/baseline.tar.xz" -C "$base_dir"
for ((i = 1; i <= rounds; i++)); do
  for side in baseline new; do
    log="$out/ab_${i}_${side}.log"
    if [[ "$side" == baseline ]]; then
      LD_LIBRARY_PATH="$base_dir/baseline:${LD_LIBRARY_PATH:-}" "$exe" "$@" >"$log" 2>&1 || note "round $i $side: exit $?"
    else
      "$exe" "$@" >"$log" 2>&1 || note "round $i $side: exit $?"
    fi
    note "round $i $side: $(grep -o '"case": "[^"]*"\|"step_ms": [0-9.]*\|"eager_step_ms": [0-9.]*\|"trained": [a-z]*' "$log" |
      sed 's/"//g' | paste -sd' ')"
  done
done
pack_logs
