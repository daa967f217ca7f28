#!/usr/bin/env bash
# The next GPU call: the branches bert-mlp (BERT's layers take the MLP node outside FP8 regions too) and stem-s2d
# (ResNet's bf16 stem as a stride-1 convolution over the input's 2 x 2 blocks) tested and measured against main, and
# the stem experiment with its space-to-depth variant. Run from a clean main checkout with main's build packed
# (scripts/gpu_prebuilt.sh bench_train kernel_trace test_data test_autograd test_tensor) and gpu-carry/ab6/ab.tar.xz
# (one xz stream, 256 MiB dictionary): libkiln_bertmlp (branch bert-mlp, built in /work/fp8q), libkiln_s2d16 (branch stem-s2d, built
# in /work/main) and libkiln_s2d12 (the same with the blocks' 12 channels unpadded), test_layers_bertmlp and
# test_layers_s2d. Carry gpu-carry/prebuilt.tar.xz, prebuilt.id, prebuilt.targets, gpu-carry/ab6 and gpu-carry/exp4.
# In order:
#  1. bert-mlp's test_layers on the GPU (BERT against PyTorch's golden values and the parity runs, the MLP node,
#     GELU, layer norms, determinism, CUDA graphs of BERT); stem-s2d's convolution, ResNet and determinism tests;
#  2. the stem experiment (gpu-carry/exp4/stem_channels, bench/experiments/stem_channels.cpp, main's libkiln);
#  3. bench_train bert_base_128, bert_large_128 and bert_base_128_fp32 on main and bertmlp, and resnet50_bf16 on
#     main, s2d16 and s2d12, alternated (AB_ROUNDS, AB_REVS, RN_REVS);
#  4. a kernel trace of bert_base_128 on bertmlp (TRACE_STOP_AT);
#  5. optionally (VS_TORCH_ROUNDS, VS_TORCH_LIB, VS_TORCH_CASES) BERT-base and BERT-large against PyTorch compile + graph
#     (ONLY_VS_TORCH=1: this step alone, as a follow-up call).
# Logs go to /tmp/lh and are packed into $OUT/logs_h.tgz after each step.
set -u
export OUT=${OUT:-/tmp/out}
source scripts/gpu_env.sh >/dev/null 2>&1  # call_logs, snap, gpu_banner, with_lib, gtest_counts
call_logs h; L=$logs
gpu_banner
use_prebuilt bench_train kernel_trace test_autograd || { echo "no prebuilt binaries"; exit 1; }
unpack_libs ${AB_PACK:-gpu-carry/ab6/ab.tar.xz} || { echo "the branches' pack does not unpack"; exit 1; }
# The branches' test_layers read PyTorch's golden files where they were built (bert-mlp in /work/fp8q, stem-s2d in
# /work/main).
golden_at /work/fp8q; golden_at /work/main
bt=build/bench/bench_train; kt=$PWD/build/bench/libkernel_trace.so
steps='"case": "[a-z0-9_]*"\|"step_ms": [0-9.]*\|"eager_step_ms": [0-9.]*\|"trained": [a-z]*'
if [[ -z ${ONLY_VS_TORCH:-} ]]; then
  with_lib bertmlp timeout 300 /tmp/lib_bertmlp/test_layers \
    --gtest_filter='*Bert*:*Mlp*:*Parity*:*Gelu*:*Determinis*:*ColumnSums*:*CudaAddLayerNorm*' > $L/test_layers_bertmlp.log 2>&1
  echo "bertmlp test_layers: exit $? $(gtest_counts $L/test_layers_bertmlp.log) at $SECONDS s"
  grep "FAILED\|Failure" $L/test_layers_bertmlp.log | head -20; snap
  with_lib s2d16 timeout 200 /tmp/lib_s2d/test_layers --gtest_filter='*Conv*:*ResNet*:*Deterministic*' > $L/test_layers_s2d.log 2>&1
  echo "s2d test_layers: exit $? $(gtest_counts $L/test_layers_s2d.log) at $SECONDS s"
  grep "FAILED\|Failure" $L/test_layers_s2d.log | head -20; snap
  if [[ -x gpu-carry/exp4/stem_channels ]]; then
    with_lib main timeout 150 gpu-carry/exp4/stem_channels > $L/stem_channels.log 2>&1
    echo "stem_channels: exit $? at $SECONDS s"; cat $L/stem_channels.log; snap
  fi
  for r in ${AB_ROUNDS:-1 2}; do
    for rev in ${AB_REVS:-main bertmlp}; do
      with_lib $rev timeout 150 $bt --case bert_base_128 --case bert_large_128 --case bert_base_128_fp32 > $L/ab_${rev}_$r.log 2>&1
      echo "round $r $rev: exit $? $(grep -o "$steps" $L/ab_${rev}_$r.log | paste -sd' ') at $SECONDS s"
    done
    for rev in ${RN_REVS:-main s2d16 s2d12}; do
      with_lib $rev timeout 150 $bt --case resnet50_bf16 > $L/rn_${rev}_$r.log 2>&1
      echo "round $r $rev: exit $? $(grep -o "$steps" $L/rn_${rev}_$r.log | paste -sd' ') at $SECONDS s"
    done
    snap
  done
  if [[ $SECONDS -lt ${TRACE_STOP_AT:-420} ]]; then
    for rev in bertmlp main; do
      with_lib $rev env KILN_KERNEL_TRACE_TOP=45 CUDA_INJECTION64_PATH=$kt timeout 100 $bt --case bert_base_128 > $L/trace_$rev.log 2>&1
      echo "traced bert_base_128 ($rev): exit $? $(grep -o '"step_ms": [0-9.]*' $L/trace_$rev.log) at $SECONDS s"
    done
    snap
  fi
fi
if [[ ${VS_TORCH_ROUNDS:-0} -gt 0 ]]; then
  with_lib ${VS_TORCH_LIB:-bertmlp} env OUT=$OUT/vs_torch KILN_TORCH_MODES=compile_graph KILN_BENCH_TRAIN=$bt \
    scripts/bench_vs_torch.sh $VS_TORCH_ROUNDS ${VS_TORCH_CASES:-bert_base_128 bert_large_128} > $L/vs_torch.log 2>&1
  echo "vs torch (${VS_TORCH_LIB:-bertmlp}): exit $? at $SECONDS s"; tail -12 $L/vs_torch.log
fi
snap; echo "total $SECONDS s"
