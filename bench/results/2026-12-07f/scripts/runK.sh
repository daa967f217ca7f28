#!/usr/bin/env bash
# The next GPU calls, from a clean main checkout with main's build packed
# (scripts/gpu_prebuilt.sh bench_train kernel_trace test_data test_autograd test_tensor test_layers test_optim);
# carry gpu-carry/prebuilt.tar.xz, prebuilt.id, prebuilt.targets and gpu-carry/exp6 (bn_conv_fusion).
# STEPS picks what runs, in this order:
#   tests  main's GPU tests now that kiln's short-sequence attention kernels are merged: test_layers whole, then the
#          CUDA tests of test_optim, test_autograd and test_tensor (about 250 s);
#   bn     the experiment: ResNet's batch norm inside cuDNN's fused convolutions, fp16 then bf16 (up to 300 s);
#   bert   bert_base_128, bert_large_128 and bert_base_128_fp32 against PyTorch compile + graph, ROUNDS interleaved
#          rounds (default 5);
#   eager  issue 34's goal 2: every bf16 case against torch.compile without graphs (kiln's eager step beside it),
#          3 rounds;
#   trace  kernel traces of resnet50_fp32 and resnet18_cifar_bf16 (where float32 ResNet-50, level with PyTorch, and
#          CIFAR, 1.09x, spend their steps).
# First call: STEPS="tests bn" under timeout 590; then STEPS=bert; then STEPS="trace eager".
# Logs go to /tmp/lk and are packed into $OUT/logs_k.tgz after each step; each comparison's logs into
# $OUT/vs_torch_STEP.tgz.
set -u
export OUT=${OUT:-/tmp/out}
source scripts/gpu_env.sh >/dev/null 2>&1  # begin_call, snap, ab_runs, vs_torch_runs, gtest_counts, ...
begin_call k || { echo "no prebuilt binaries"; exit 1; }
L=$logs
golden_at /work/main  # the prebuilt tests read PyTorch's golden files where they were built
vs_torch() { local name=$1 modes=$2; shift 2; vs_torch_runs "$name" "$modes" "$bt" "$@"; }  # NAME MODES CASE...
for step in ${STEPS:-tests bn}; do
  case $step in
    tests)
      for t in test_layers:'*' test_optim:'*Cuda*:*Graph*' test_autograd:'*Cuda*' test_tensor:'*Cuda*'; do
        bin=${t%%:*} filter=${t#*:}
        timeout 200 build/tests/$bin --gtest_filter="$filter" > $L/$bin.log 2>&1
        echo "$bin ($filter): exit $? $(gtest_counts $L/$bin.log) at $SECONDS s"
        grep "FAILED\|Failure" $L/$bin.log | head -12; snap
      done ;;
    bn)
      for dt in fp16 bf16; do  # cuDNN documents these fused engines for float16 only (see the experiment's header)
        LD_LIBRARY_PATH=$PWD/build/kiln:${LD_LIBRARY_PATH:-} timeout 150 gpu-carry/exp6/bn_conv_fusion $dt \
          >> $L/bn_conv_fusion.log 2>&1
        echo "bn_conv_fusion $dt: exit $? at $SECONDS s"
      done
      cat $L/bn_conv_fusion.log; snap ;;
    bert) vs_torch bert compile_graph bert_base_128 bert_large_128 bert_base_128_fp32 ;;
    eager) ROUNDS=3 vs_torch eager compile resnet50_bf16 bert_base_128 bert_large_128 resnet18_cifar_bf16 ;;
    trace)
      for tc in resnet50_fp32 resnet18_cifar_bf16; do
        env KILN_KERNEL_TRACE_TOP=45 CUDA_INJECTION64_PATH=$PWD/build/bench/libkernel_trace.so \
          timeout 100 $bt --case $tc > $L/trace_$tc.log 2>&1
        echo "traced $tc: exit $? $(grep -o '"step_ms": [0-9.]*' $L/trace_$tc.log) at $SECONDS s"
        grep -m1 -A46 "kernel_trace range 0" $L/trace_$tc.log | cut -c1-150; snap
      done ;;
  esac
done
snap; echo "total $SECONDS s"
