#!/usr/bin/env bash
# Branch attn-broadcast-bias (gpu-carry/prebuilt.tar.xz is its build; gpu-carry/baseline.tar.xz is main 6ef0113's
# libkiln). Attention and BERT tests, cuDNN's plans with the key bias (gpu-carry/exp/sdpa_plans), then A/Bs of
# bench_attention --bert and of BERT steps.
set -u
mkdir -p /tmp/focus_out
OUT=/tmp/focus_out KILN_FOCUS_TEST_TIMEOUT=200 KILN_FOCUS_TESTS="test_layers=*Attention*:*Bert*:*Parity*:*Fp8*" KILN_FOCUS_TARGETS="bench_train bench_attention" scripts/gpu_focus.sh > /tmp/focus.log 2>&1
grep -E "GPU:|FAILED|prebuilt binaries from" /tmp/focus.log | cut -c1-120 | head -6; grep -E "^test_" /tmp/focus.log | cut -c1-160 | head -4
grep -h -B2 -A12 "Failure" /tmp/focus_out/*.log 2>/dev/null | head -40
cp /tmp/focus.log $OUT/focus.log; (cd /tmp/focus_out && tar -czf $OUT/tests.tgz . 2>/dev/null)
export LD_LIBRARY_PATH=$PWD/build/prebuilt-libs/use:${LD_LIBRARY_PATH:-}
echo "at $SECONDS s"
timeout 120 gpu-carry/exp/sdpa_plans > $OUT/sdpa_plans.log 2>&1; echo "sdpa_plans exit $? at $SECONDS s"
grep "keybias\|mask=bias    dropout=0.1 impl=auto\|mask=padding dropout=0.1 impl=auto" $OUT/sdpa_plans.log | cut -c1-64,100-125
mkdir -p /tmp/attn && OUT=/tmp/attn timeout 100 scripts/gpu_ab.sh 1 bench_attention --bert > /dev/null 2>&1
for f in /tmp/attn/ab_*.log; do echo "== $(basename $f)"; grep "kiln" $f | cut -c1-150; cp $f $OUT/attn_$(basename $f); done
echo "at $SECONDS s"
timeout 200 scripts/gpu_ab.sh 2 bench_train --case bert_base_128 --case bert_large_128 > /dev/null 2>&1
for f in $OUT/ab_*.log; do echo "$(basename $f): $(grep -o '"case": "[a-z0-9_]*"\|"step_ms": [0-9.]*\|"trained": [a-z]*' $f | paste -sd' ')"; done
(cd $OUT && tar -czf ab.tgz ab_*.log attn_ab_*.log && rm -f ab_*.log attn_ab_*.log)
echo "total $SECONDS s"
