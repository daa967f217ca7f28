#!/usr/bin/env bash
# Branch mlp-gelu-bias-sums (e394c9c: nn::linear_gelu, the MLP's bias gradient from the GELU's gradient pass) against
# main c26bdf2 (gpu-carry/baseline.tar.xz). Check out the branch first: gpu-carry/prebuilt.tar.xz is its build.
# Tests, an A/B of BERT steps (A against main), then B (gpu-carry/libB.tar.xz: branch row-sums-ones-product dd95ac7,
# stacked on A) against A, then PyTorch compile + graph beside kiln where time is left.
set -u
mkdir -p /tmp/focus_out
OUT=/tmp/focus_out KILN_FOCUS_TEST_TIMEOUT=200 KILN_FOCUS_TESTS="test_tensor=*ActivationBackward*:*Matmul*:*Linalg* test_autograd=*Linear*:*Addmm*:*Cuda* test_layers=*AutocastLinear*:*Linear*:*Bert*:*Parity*:*Checkpoint*" KILN_FOCUS_TARGETS="bench_train bench_cuda_matmul" scripts/gpu_focus.sh > /tmp/focus.log 2>&1
grep -E "GPU:|FAILED|prebuilt binaries from" /tmp/focus.log | cut -c1-120 | head -6; grep -E "^test_" /tmp/focus.log | cut -c1-160 | head -4
grep -h -B2 -A12 "Failure" /tmp/focus_out/*.log 2>/dev/null | head -40
cp /tmp/focus.log $OUT/focus.log; (cd /tmp/focus_out && tar -czf $OUT/tests.tgz . 2>/dev/null)
export LD_LIBRARY_PATH=$PWD/build/prebuilt-libs/use:${LD_LIBRARY_PATH:-}
echo "at $SECONDS s"
timeout 200 scripts/gpu_ab.sh ${AB_ROUNDS:-2} bench_train --case bert_base_128 --case bert_large_128 > /dev/null 2>&1
for f in $OUT/ab_*.log; do echo "$(basename $f): $(grep -o '"case": "[a-z0-9_]*"\|"step_ms": [0-9.]*\|"trained": [a-z]*' $f | paste -sd' ')"; done
echo "A/B done at $SECONDS s"
# B (branch row-sums-ones-product, dd95ac7: 16-bit bias gradients as a product with ones everywhere, no epilogue)
# against A (this build), alternating, the same bench_train binary.
libb=$(mktemp -d); tar -xJf gpu-carry/libB.tar.xz -C $libb
LD_LIBRARY_PATH=$libb/libB:$LD_LIBRARY_PATH timeout 60 build/tests/test_tensor --gtest_filter='*Matmul*:*Linalg*' > $OUT/libB_tests.log 2>&1; echo "libB test_tensor Matmul/Linalg: exit $? $(grep -E '^\[  (PASSED|FAILED) ' $OUT/libB_tests.log | head -3 | paste -sd' ')"
for r in 1 2; do for side in A B; do
  if [[ $side == B ]]; then LD_LIBRARY_PATH=$libb/libB:$LD_LIBRARY_PATH timeout 60 build/bench/bench_train --case bert_base_128 --case bert_large_128 --case bert_base_128_fp8 > $OUT/ab_lib${side}_$r.log 2>&1
  else timeout 60 build/bench/bench_train --case bert_base_128 --case bert_large_128 --case bert_base_128_fp8 > $OUT/ab_lib${side}_$r.log 2>&1; fi
  echo "lib$side round $r: $(grep -o '"case": "[a-z0-9_]*"\|"step_ms": [0-9.]*\|"trained": [a-z]*' $OUT/ab_lib${side}_$r.log | paste -sd' ')"
done; done
echo "B/A done at $SECONDS s"
left=$(( ${TOTAL:-560} - SECONDS ))
if (( left > 200 )); then
  mkdir -p $OUT/vs_torch; OUT=$OUT/vs_torch KILN_BENCH_TRAIN=$PWD/build/bench/bench_train KILN_TORCH_MODES=compile_graph timeout $((left - 10)) bash scripts/bench_vs_torch.sh ${VS_ROUNDS:-1} bert_base_128 bert_large_128 > /tmp/vs.log 2>&1
  grep -E "round|\|" /tmp/vs.log | cut -c1-200 | tail -14
fi
cd $OUT && tar -czf ab.tgz ab_* vs_torch 2>/dev/null; rm -rf ab_*.log; echo "total $SECONDS s"
