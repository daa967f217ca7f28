#!/usr/bin/env bash
# Branch attn-broadcast-bias at its third commit (zero_flagged_rows writes the dead rows' statistics too):
# attention, BERT and FP8 tests, an A/B of BERT steps against main 6ef0113's libkiln (gpu-carry/baseline.tar.xz),
# then rounds beside PyTorch (compile + whole-step graph) while time is left (VS_ROUNDS each call).
set -u
mkdir -p /tmp/focus_out
OUT=/tmp/focus_out KILN_FOCUS_TEST_TIMEOUT=200 KILN_FOCUS_TESTS="test_layers=*CudaAttention*:*Parity*:*Bert*:*Fp8*" KILN_FOCUS_TARGETS="bench_train bench_attention" scripts/gpu_focus.sh > /tmp/focus.log 2>&1
grep -E "GPU:|prebuilt binaries from" /tmp/focus.log | cut -c1-120 | head -3; grep -E "^test_" /tmp/focus.log | cut -c1-160 | head -4
grep -h "FAILED  \]" /tmp/focus_out/*.log | sort -u | head; grep -h -A3 "Failure" /tmp/focus_out/*.log | head -20
cp /tmp/focus.log $OUT/focus.log; cp /tmp/focus_out/test_layers.log $OUT/test_layers.log 2>/dev/null
export LD_LIBRARY_PATH=$PWD/build/prebuilt-libs/use:${LD_LIBRARY_PATH:-}
echo "at $SECONDS s"
timeout 150 scripts/gpu_ab.sh 2 bench_train --case bert_base_128 --case bert_large_128 --case bert_base_128_fp8 > /dev/null 2>&1
cut -c1-250 $OUT/summary.txt
left=$((560 - SECONDS)); echo "A/B done at $SECONDS s, $left s left"
if (( left > 150 )); then
  mkdir -p $OUT/vs_torch; OUT=$OUT/vs_torch KILN_BENCH_TRAIN=$PWD/build/bench/bench_train KILN_TORCH_MODES=compile_graph timeout $((left - 10)) bash scripts/bench_vs_torch.sh ${VS_ROUNDS:-2} bert_base_128 bert_large_128 > /tmp/vs.log 2>&1
  grep -E "round|\|" /tmp/vs.log | cut -c1-200 | tail -14
fi
cd $OUT && tar -czf vs.tgz vs_torch 2>/dev/null; rm -rf vs_torch; echo "total $SECONDS s"
