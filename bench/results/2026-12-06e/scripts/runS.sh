#!/usr/bin/env bash
# Branch mlp-gelu-bias-sums at da27a4d (the rewritten gelu_backward_sums kernel) against main b0ddd07's library
# (gpu-carry/baseline.tar.xz): the kernel's tests, an A/B of BERT steps, a profile of BERT-large.
set -u
mkdir -p /tmp/focus_out
OUT=/tmp/focus_out KILN_FOCUS_TEST_TIMEOUT=90 KILN_FOCUS_TESTS="test_tensor=*ActivationBackward* test_layers=*AutocastLinear*:ParityCuda.*Bert*" KILN_FOCUS_TARGETS="bench_train" scripts/gpu_focus.sh > /tmp/focus.log 2>&1
grep -E "GPU:|FAILED|prebuilt binaries from" /tmp/focus.log | cut -c1-120 | head -6; grep -E "^test_" /tmp/focus.log | cut -c1-160 | head -4
grep -h -B2 -A12 "Failure" /tmp/focus_out/*.log 2>/dev/null | head -30
cp /tmp/focus.log $OUT/focus.log; (cd /tmp/focus_out && tar -czf $OUT/tests.tgz . 2>/dev/null)
export LD_LIBRARY_PATH=$PWD/build/prebuilt-libs/use:${LD_LIBRARY_PATH:-}
echo "at $SECONDS s"
timeout 100 scripts/gpu_ab.sh 2 bench_train --case bert_base_128 --case bert_large_128 > /dev/null 2>&1
for f in $OUT/ab_*.log; do echo "$(basename $f): $(grep -o '"case": "[a-z0-9_]*"\|"step_ms": [0-9.]*\|"trained": [a-z]*' $f | paste -sd' ')"; done
echo "A/B done at $SECONDS s"
timeout 30 build/bench/bench_train --case bert_large_128 --profile 2 > $OUT/prof_bert_large_128.txt 2>&1
grep -E "gelu|GPU self" $OUT/prof_bert_large_128.txt | head -8
cd $OUT && tar -czf ab.tgz ab_*.log && rm -f ab_*.log; echo "total $SECONDS s"
