#!/usr/bin/env bash
# The GPU calls of 2026-12-07g, from a clean main checkout with main's build packed
# (scripts/gpu_prebuilt.sh bench_train kernel_trace test_data test_autograd test_tensor test_layers test_optim) and
# the branch pack gpu-carry/ab11/ab.tar.xz (libkiln_fwd.so.0.1 and test_layers_fwd of branch fwd-persist, the
# forward kernel of kiln's short-sequence attention looping over heads with the next head's copies in flight, and
# short_attention_vs_cudnn built against main's libkiln). Carry gpu-carry/prebuilt.tar.xz, prebuilt.id,
# prebuilt.targets and gpu-carry/ab11.
# STEPS picks what runs, in this order:
#   tests   main's GPU tests: test_layers whole, then the CUDA tests of test_optim, test_autograd, test_tensor and
#           test_data (TESTS: other BINARY:FILTER pairs)
#   btests  the branch's attention tests (its test_layers with its libkiln)
#   kern    short_attention_vs_cudnn with main's libkiln, then the branch's
#   ab      bench_train's BERT cases with main's libkiln and the branch's, AB_ROUNDS alternated rounds (default 2)
#   trace   kernel traces of bert_large_128, resnet50_fp32 and resnet18_cifar_bf16 (main)
#   bert    bert_base_128, bert_large_128, bert_base_128_fp32 against PyTorch compile + graph (VS_LIB, ROUNDS)
#   eager   issue 34's goal 2: the bf16 cases against torch.compile without graphs (kiln's eager step beside it), 3 rounds
# Logs go to /tmp/lL and are packed into $OUT/logs_L.tgz after each step.
set -u
export OUT=${OUT:-/tmp/out}
source scripts/gpu_env.sh >/dev/null 2>&1  # begin_call, snap, ab_runs, vs_torch_runs, gtest_counts, with_lib, ...
begin_call L || { echo "no prebuilt binaries"; exit 1; }
L=$logs
golden_at /work/main  # the prebuilt tests read PyTorch's golden files where they were built
unpack_libs "gpu-carry/${AB_PACK:-ab11}/ab.tar.xz" || echo "no branch pack"
set -f  # the test filters below are patterns for gtest, not for the shell
for step in ${STEPS:-tests}; do
  t0=$SECONDS
  case $step in
    tests)
      for t in ${TESTS:-test_layers:'*' test_optim:'*Cuda*:*Graph*' test_autograd:'*cuda*:*Cuda*' test_tensor:'*Cuda*' \
                 test_data:'*Cuda*:*Gpu*'}; do
        bin=${t%%:*} filter=${t#*:}
        gtest_run $bin build/tests/$bin "$filter"
        grep "FAILED\|Failure" $L/$bin.log | head -12; snap
      done ;;
    btests)
      with_lib fwd timeout 200 /tmp/lib_fwd/test_layers \
        --gtest_filter='*Attention*:*Bert*:*Golden*:*Multihead*:*ColumnSums*:ParityCuda.*' > $L/test_layers_fwd.log 2>&1
      echo "test_layers (fwd, attention): exit $? $(gtest_counts $L/test_layers_fwd.log) at $SECONDS s"; snap ;;
    kern)
      for rev in main fwd; do
        with_lib $rev timeout 60 /tmp/ab/short_attention_vs_cudnn > $L/kern_$rev.log 2>&1
        echo "short_attention_vs_cudnn ($rev): exit $? at $SECONDS s"; grep -v "^ *differences" $L/kern_$rev.log
      done; snap ;;
    ab) ab_runs fwd bert $bt --case bert_base_128 --case bert_large_128 ;;
    trace)
      for tc in bert_large_128 resnet50_fp32 resnet18_cifar_bf16; do
        env KILN_KERNEL_TRACE_TOP=40 CUDA_INJECTION64_PATH=$PWD/build/bench/libkernel_trace.so \
          timeout 100 $bt --case $tc > $L/trace_$tc.log 2>&1
        echo "traced $tc: exit $? $(grep -o '"step_ms": [0-9.]*' $L/trace_$tc.log) at $SECONDS s"
        grep -m1 -A41 "kernel_trace range 0" $L/trace_$tc.log | cut -c1-150; snap
      done ;;
    bert) vs_torch_runs bert compile_graph $bt bert_base_128 bert_large_128 bert_base_128_fp32 ;;
    eager) ROUNDS=3 vs_torch_runs eager compile $bt resnet50_bf16 bert_base_128 bert_large_128 resnet18_cifar_bf16 ;;
  esac
  echo "step $step: $((SECONDS - t0)) s"
done
snap; echo "total $SECONDS s"
