#!/usr/bin/env bash
# Branch fp8-owned-grads (on qkv-stack) against main c26bdf2 (gpu-carry/baseline.tar.xz): tests, an A/B of BERT steps,
# (gpu-carry/baseline.tar.xz): tests, an A/B of BERT steps, a profile of BERT-large, then PyTorch compile + graph.
set -u
mkdir -p /tmp/focus_out
OUT=/tmp/focus_out KILN_FOCUS_TEST_TIMEOUT=200 KILN_FOCUS_TESTS="test_tensor=*SplitOwned* test_optim=*Shadow* test_layers=*Fp8*:*Bert*:*Parity*" KILN_FOCUS_TARGETS="bench_train" scripts/gpu_focus.sh > /tmp/focus.log 2>&1
grep -E "GPU:|FAILED|prebuilt binaries from" /tmp/focus.log | cut -c1-120 | head -8; grep -E "^test_" /tmp/focus.log | cut -c1-160 | head -5
grep -h -B2 -A12 "Failure" /tmp/focus_out/*.log 2>/dev/null | head -40
cp /tmp/focus.log $OUT/focus.log; (cd /tmp/focus_out && tar -czf $OUT/tests.tgz . 2>/dev/null)
export LD_LIBRARY_PATH=$PWD/build/prebuilt-libs/use:${LD_LIBRARY_PATH:-}
echo "at $SECONDS s"
timeout 240 scripts/gpu_ab.sh ${AB_ROUNDS:-2} bench_train --case bert_base_128 --case bert_base_128_fp8 --case bert_large_128 --case bert_large_128_fp8 > /dev/null 2>&1
for f in $OUT/ab_*.log; do echo "$(basename $f): $(grep -o '"case": "[a-z0-9_]*"\|"step_ms": [0-9.]*\|"eager_step_ms": [0-9.]*\|"trained": [a-z]*' $f | paste -sd' ')"; done
echo "A/B done at $SECONDS s"
timeout 60 build/bench/bench_train --case bert_base_128_fp8 --profile 2 > $OUT/prof_bert_base_128_fp8.txt 2>&1
grep -E "^copy|^matmul|GPU self" $OUT/prof_bert_base_128_fp8.txt | head -8
left=$(( ${TOTAL:-560} - SECONDS ))
if (( left > 200 )); then
  mkdir -p $OUT/vs_torch; OUT=$OUT/vs_torch KILN_BENCH_TRAIN=$PWD/build/bench/bench_train KILN_TORCH_MODES=compile_graph timeout $((left - 10)) bash scripts/bench_vs_torch.sh ${VS_ROUNDS:-1} bert_base_128 bert_large_128 > /tmp/vs.log 2>&1
  grep -E "round|\|" /tmp/vs.log | cut -c1-200 | tail -14
fi
cd $OUT && tar -czf ab.tgz ab_* vs_torch 2>/dev/null; rm -rf ab_*.log vs_torch; echo "total $SECONDS s"
