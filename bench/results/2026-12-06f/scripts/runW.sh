#!/usr/bin/env bash
# Branch attn-broadcast-bias at its second commit (gpu-carry/prebuilt.tar.xz: the bias row read through a zero
# stride, forward and backward). gpu-carry/varB.tar.xz: a libkiln whose backward expands the row to (L, S) in memory
# (the fallback if the zero stride is wrong too). gpu-carry/baseline.tar.xz: main 6ef0113's libkiln.
set -u
mkdir -p /tmp/focus_out
F="*CudaAttention*:*Parity*:*Bert*"
OUT=/tmp/focus_out KILN_FOCUS_TEST_TIMEOUT=200 KILN_FOCUS_TESTS="test_layers=$F" KILN_FOCUS_TARGETS="bench_train bench_attention" scripts/gpu_focus.sh > /tmp/focus.log 2>&1
grep -E "GPU:|prebuilt binaries from" /tmp/focus.log | cut -c1-120 | head -3; grep -E "^test_" /tmp/focus.log | cut -c1-160 | head -4
grep -h "FAILED  \]" /tmp/focus_out/*.log | sort -u | head; grep -h -A3 "Failure" /tmp/focus_out/*.log | grep "worst" | head -8
cp /tmp/focus.log $OUT/focus.log; cp /tmp/focus_out/test_layers.log $OUT/test_layers_A.log 2>/dev/null
export LD_LIBRARY_PATH=$PWD/build/prebuilt-libs/use:${LD_LIBRARY_PATH:-}
if grep -q "FAILED  \]" /tmp/focus_out/*.log; then
  mkdir -p /tmp/varB && tar -xJf gpu-carry/varB.tar.xz -C /tmp/varB
  LD_LIBRARY_PATH=/tmp/varB/baseline:$LD_LIBRARY_PATH timeout 200 build/tests/test_layers --gtest_filter="$F" > $OUT/test_layers_B.log 2>&1
  echo "variant B tests: exit $?"; grep "FAILED  \]\|PASSED" $OUT/test_layers_B.log | sort -u | head
  if ! grep -q "FAILED  \]" $OUT/test_layers_B.log; then cp -a /tmp/varB/baseline/libkiln.so* build/kiln/; echo "A/Bs below use variant B"; else echo "both variants fail"; exit 0; fi
fi
echo "at $SECONDS s"
timeout 120 gpu-carry/exp/sdpa_plans > $OUT/sdpa_plans.log 2>&1; echo "sdpa_plans exit $? at $SECONDS s"
grep "keybias" $OUT/sdpa_plans.log | cut -c1-64,100-125
mkdir -p /tmp/attn && OUT=/tmp/attn timeout 100 scripts/gpu_ab.sh 1 bench_attention --bert > /dev/null 2>&1
for f in /tmp/attn/ab_*.log; do echo "== $(basename $f)"; grep "kiln" $f | grep "mask\|dropout" | cut -c1-150; cp $f $OUT/attn_$(basename $f); done
echo "at $SECONDS s"
timeout 220 scripts/gpu_ab.sh 2 bench_train --case bert_base_128 --case bert_large_128 --case bert_base_128_fp8 > /dev/null 2>&1
cat $OUT/summary.txt 2>/dev/null | cut -c1-250
echo "total $SECONDS s"
