#!/usr/bin/env bash
# Branch next-verify (main 01514d2 + hybrid-rows-helpers + shadow-stack-lazy + bench-attention-bert; check it out
# first: gpu-carry/prebuilt.tar.xz is its build). Tests of the two library branches, an A/B of BERT steps against
# main b0ddd07's library (gpu-carry/baseline.tar.xz; main's library has not changed since), then the attention
# measurements: cuDNN's plans (gpu-carry/exp/sdpa_plans), bench_attention --bert, pytorch_attention.py --bert.
set -u
mkdir -p /tmp/focus_out
OUT=/tmp/focus_out KILN_FOCUS_TEST_TIMEOUT=150 KILN_FOCUS_TESTS="test_layers=*Hybrid*:*Bert*:*Parity*:*Fp8* test_optim=*Shadow*:*Graph*:*Fused*" KILN_FOCUS_TARGETS="bench_train bench_attention" scripts/gpu_focus.sh > /tmp/focus.log 2>&1
grep -E "GPU:|FAILED|prebuilt binaries from" /tmp/focus.log | cut -c1-120 | head -6; grep -E "^test_" /tmp/focus.log | cut -c1-160 | head -4
grep -h -B2 -A12 "Failure" /tmp/focus_out/*.log 2>/dev/null | head -30
cp /tmp/focus.log $OUT/focus.log; (cd /tmp/focus_out && tar -czf $OUT/tests.tgz . 2>/dev/null)
export LD_LIBRARY_PATH=$PWD/build/prebuilt-libs/use:${LD_LIBRARY_PATH:-}
echo "at $SECONDS s"
timeout 150 scripts/gpu_ab.sh 2 bench_train --case bert_base_128 --case bert_large_128 --case bert_base_128_fp8 > /dev/null 2>&1
for f in $OUT/ab_*.log; do echo "$(basename $f): $(grep -o '"case": "[a-z0-9_]*"\|"step_ms": [0-9.]*\|"trained": [a-z]*' $f | paste -sd' ')"; done
(cd $OUT && tar -czf ab.tgz ab_*.log && rm -f ab_*.log)
echo "A/B done at $SECONDS s"
timeout 150 gpu-carry/exp/sdpa_plans > $OUT/sdpa_plans.log 2>&1; echo "sdpa_plans exit $? at $SECONDS s"
grep -v "not built" $OUT/sdpa_plans.log | sort -k8,8 | awk '{print}' | head -40 | cut -c1-160
timeout 120 build/bench/bench_attention --bert > $OUT/bench_attention_bert.log 2>&1; echo "bench_attention exit $? at $SECONDS s"
cut -c1-170 $OUT/bench_attention_bert.log
(cd bench && timeout 240 python3 pytorch_attention.py --bert) > $OUT/pytorch_attention_bert.log 2>&1; echo "pytorch exit $? at $SECONDS s"
cut -c1-170 $OUT/pytorch_attention_bert.log
echo "total $SECONDS s"
