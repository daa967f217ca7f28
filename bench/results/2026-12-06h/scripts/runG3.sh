#!/usr/bin/env bash
# The layer norm backward with its sums in shared memory (branch ln-backward-smem-sums, in this build): layer norm
# and parity tests, then bert_large_128 and bert_base_128 alternating main's library and this one, while time lasts.
set -u
mkdir -p /tmp/focus_out
OUT=/tmp/focus_out KILN_FOCUS_TEST_TIMEOUT=150 KILN_FOCUS_TESTS="test_layers=*LayerNorm*:*Parity*" KILN_FOCUS_TARGETS="bench_train" scripts/gpu_focus.sh > /tmp/focus.log 2>&1
grep -E "GPU:|prebuilt binaries from" /tmp/focus.log | cut -c1-120 | head -3; grep -E "^test_" /tmp/focus.log | cut -c1-200 | head -4
grep -h "FAILED  \]" /tmp/focus_out/*.log | sort -u | head; grep -h -A4 "Failure" /tmp/focus_out/*.log | head -20
cp /tmp/focus_out/test_layers.log $OUT/test_layers.log 2>/dev/null
export LD_LIBRARY_PATH=$PWD/build/prebuilt-libs/use:${LD_LIBRARY_PATH:-}
base=$(mktemp -d); tar -xJf gpu-carry/baseline.tar.xz -C $base
for r in 1 2 3; do
  for c in bert_large_128 bert_base_128; do
    for lib in base new; do
      [[ $SECONDS -gt 400 ]] && { echo "stopped at $SECONDS s"; break 3; }
      [[ $lib == base ]] && L=$base/baseline:$LD_LIBRARY_PATH || L=$LD_LIBRARY_PATH
      LD_LIBRARY_PATH=$L timeout 60 build/bench/bench_train --case $c > $OUT/${c}_${r}_$lib.log 2>&1
      echo "$c round $r $lib: exit $? $(grep -o '"step_ms": [0-9.]*\|"trained": [a-z]*' $OUT/${c}_${r}_$lib.log | paste -sd' ') at $SECONDS s"
    done
  done
done
cd $OUT && tar -czf bert_logs.tgz bert_*.log && rm bert_*.log; echo "total $SECONDS s"
