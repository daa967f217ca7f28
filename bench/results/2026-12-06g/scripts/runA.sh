#!/usr/bin/env bash
# Next session's first call (main with the listed MLM head; gpu-carry/prebuilt.tar.xz is its build of test_layers and
# bench_train). The GPU tests of BERT and attention (BertCuda.MaskedPositionsMatchTheFullHeadEagerAndGraphed is new),
# one bench_train process with the full and the listed head for both sizes, and PyTorch's side of the _p20 cases in
# --quick mode (it has never run).
set -u
mkdir -p /tmp/focus_out
OUT=/tmp/focus_out KILN_FOCUS_TEST_TIMEOUT=200 KILN_FOCUS_TESTS="test_layers=Bert*:*CudaAttention*" KILN_FOCUS_TARGETS="bench_train" scripts/gpu_focus.sh > /tmp/focus.log 2>&1
grep -E "GPU:|prebuilt binaries from" /tmp/focus.log | cut -c1-120 | head -3; grep -E "^test_" /tmp/focus.log | cut -c1-160 | head -4
grep -h "FAILED  \]" /tmp/focus_out/*.log | sort -u | head; grep -h -A4 "Failure" /tmp/focus_out/*.log | head -20
cp /tmp/focus.log $OUT/focus.log; cp /tmp/focus_out/test_layers.log $OUT/test_layers.log 2>/dev/null
export LD_LIBRARY_PATH=$PWD/build/prebuilt-libs/use:${LD_LIBRARY_PATH:-}
echo "at $SECONDS s"
timeout 150 build/bench/bench_train --case bert_base_128 --case bert_base_128_p20 --case bert_large_128 --case bert_large_128_p20 --case bert_base_128_fp8_p20 --case bert_large_128_fp8_p20 > $OUT/p20.log 2>&1; echo "bench_train exit $? at $SECONDS s"
grep -o '"case": "[a-z0-9_]*"\|"step_ms": [0-9.]*\|"eager_step_ms": [0-9.]*\|"trained": [a-z]*' $OUT/p20.log | paste -sd' ' | sed 's/"case"/\n"case"/g'
(cd bench && timeout 150 python3 pytorch_train.py --quick --mode eager --mode compile_graph --case bert_base_128_p20) > $OUT/torch_p20_quick.log 2>&1; echo "pytorch quick exit $? at $SECONDS s"
grep -o '"framework": "[a-z_-]*"\|"step_ms": [0-9.]*\|"trained": [a-z]*\|"error": "[^"]*"' $OUT/torch_p20_quick.log | paste -sd' '; tail -3 $OUT/torch_p20_quick.log | cut -c1-300
echo "total $SECONDS s"
