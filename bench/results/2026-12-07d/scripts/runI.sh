#!/usr/bin/env bash
# The next GPU calls, from a clean main checkout with main's build packed
# (scripts/gpu_prebuilt.sh bench_train kernel_trace test_data test_autograd test_tensor test_layers),
# gpu-carry/exp5/matmul_gelu_cudnn (bench/experiments/matmul_gelu_cudnn.cpp built against main's libkiln) and
# gpu-carry/ab8/ab.tar.xz (one xz stream: libkiln_s2dk.so.0.1 and test_layers_s2dk from branch s2d-kernel, the
# space-to-depth blocks in one kernel; libkiln_mlpc.so.0.1 and test_layers_mlpc from branch mlp-cudnn, the MLP's GELU
# in the first product's epilogue through cuDNN). Carry gpu-carry/prebuilt.tar.xz, prebuilt.id, prebuilt.targets,
# gpu-carry/exp5 and gpu-carry/ab8.
# STEPS picks what runs, in this order:
#   s2dk  s2d-kernel's convolution, ResNet and parity tests on the GPU, then resnet50_bf16 on main and s2dk,
#         AB_ROUNDS alternated rounds (default 2);
#   mlpc  mlp-cudnn's MLP, BERT, parity, golden and convolution tests on the GPU (its cuDNN graph cache is shared with
#         the convolutions'), then bert_base_128 and bert_large_128 on main and mlpc, AB_ROUNDS alternated rounds;
#   exp   the experiment: BERT's MLP product with its erf GELU fused through cuDNN against kiln's path;
#   rn    resnet50_bf16 against PyTorch compile + graph, ROUNDS interleaved rounds (default 5), with VS_LIB's libkiln
#         (main, or s2dk where it won);
#   bert  bert_base_128 and bert_large_128 the same way;
#   more  resnet18_cifar_bf16 and bert_base_512 the same way;
#   fp32  bert_base_128_fp32 and resnet50_fp32 (TF32, issue 34's goal 4) the same way.
# First call: STEPS="s2dk mlpc exp" under timeout 590 (s2dk and mlpc about 160 s each, exp up to 240 s); then
# STEPS=rn VS_LIB=... (about 400 s); then STEPS=bert VS_LIB=... (about 520 s).
# Logs go to /tmp/li and are packed into $OUT/logs_i.tgz after each step; each comparison's logs into
# $OUT/vs_torch_STEP.tgz.
set -u
VS_LIB=${VS_LIB:-main}
export OUT=${OUT:-/tmp/out}
source scripts/gpu_env.sh >/dev/null 2>&1  # begin_call, snap, with_lib, unpack_libs, ab_runs, vs_torch_runs, ...
begin_call i || { echo "no prebuilt binaries"; exit 1; }
L=$logs
vs_torch() { local name=$1; shift; vs_torch_runs "$name" compile_graph "$bt" "$@"; }  # NAME CASE...
ab() { local rev=$1 name=$2; shift 2; ab_runs "$rev" "$name" "$bt" "$@"; }              # REV NAME ARGS...
for step in ${STEPS:-s2dk mlpc exp}; do
  if [[ $step == s2dk || $step == mlpc || $VS_LIB != main ]] && [[ ! -d /tmp/lib_s2dk ]]; then
    unpack_libs gpu-carry/ab8/ab.tar.xz || { echo "the branches' pack does not unpack"; exit 1; }
  fi
  golden_at /work/main  # the branches' test_layers read PyTorch's golden files where they were built
  case $step in
    s2dk)
      with_lib s2dk timeout 150 /tmp/lib_s2dk/test_layers --gtest_filter='*Conv*:*ResNet*:*SpaceToDepth*' > $L/test_layers_s2dk.log 2>&1
      echo "s2dk test_layers: exit $? $(gtest_counts $L/test_layers_s2dk.log) at $SECONDS s"
      grep "FAILED\|Failure" $L/test_layers_s2dk.log | head -20; snap
      ab s2dk rn --case resnet50_bf16 ;;
    mlpc)
      with_lib mlpc timeout 260 /tmp/lib_mlpc/test_layers --gtest_filter='*Mlp*:*Bert*:*Parity*:*Golden*:*Conv*' > $L/test_layers_mlpc.log 2>&1
      echo "mlpc test_layers: exit $? $(gtest_counts $L/test_layers_mlpc.log) at $SECONDS s"
      grep "FAILED\|Failure" $L/test_layers_mlpc.log | head -20; snap
      ab mlpc bert --case bert_base_128 --case bert_large_128 ;;
    exp)
      LD_LIBRARY_PATH=$PWD/build/kiln:${LD_LIBRARY_PATH:-} timeout 240 gpu-carry/exp5/matmul_gelu_cudnn > $L/matmul_gelu_cudnn.log 2>&1
      echo "matmul_gelu_cudnn: exit $? at $SECONDS s"; cat $L/matmul_gelu_cudnn.log; snap ;;
    rn) vs_torch rn resnet50_bf16 ;;
    bert) vs_torch bert bert_base_128 bert_large_128 ;;
    more) vs_torch more resnet18_cifar_bf16 bert_base_512 ;;
    fp32) vs_torch fp32 bert_base_128_fp32 resnet50_fp32 ;;
  esac
done
snap; echo "total $SECONDS s"
