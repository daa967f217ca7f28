#!/usr/bin/env bash
# The next GPU call: the branches bf16-mlp and stem-pad, tested and measured against main. Run from a clean main
# checkout with main's build packed (scripts/gpu_prebuilt.sh bench_train kernel_trace test_data test_autograd
# test_tensor) and gpu-carry/ab5/ab.tar.xz (one xz stream, a 256 MiB dictionary, so that the near-identical libraries
# cost little): the libkiln of
#   mlp    0c43d7b  nn::linear_gelu_linear as one node: fc1's bias gradient summed in the GELU's backward pass,
#   mlpln  b470e96  and the layer norm's backward summing its x gradient for the Linear before (attention output, fc2),
#   pad    f5c632a  16-bit channels-last convolutions on fewer than 8 input channels run zero-padded to 8,
# with mlpln's and pad's test_layers, and gpu-carry/exp4/stem_channels (bench/experiments/stem_channels.cpp built
# against main's libkiln). Carry gpu-carry/prebuilt.tar.xz, prebuilt.id, prebuilt.targets, gpu-carry/ab5 and
# gpu-carry/exp4. In order:
#  1. mlpln's test_layers on the GPU (the new kernels, the offers through the graph, BERT against PyTorch's golden
#     values, every Linear and layer norm test); the stem experiment; pad's convolution and ResNet tests;
#  2. bench_train bert_base_128, bert_large_128 and bert_base_128_fp8 on main, mlp and mlpln, and resnet50_bf16 and
#     resnet18_cifar_bf16 on main and pad, alternated (AB_ROUNDS);
#  3. a kernel trace of bert_base_128 on mlpln (the new kernels' time against the bias-gradient passes they replace);
#  4. optionally (VS_TORCH_ROUNDS, VS_TORCH_LIB) BERT-base and BERT-large against PyTorch compile + graph
#     (ONLY_VS_TORCH=1: this step alone, as a follow-up call).
# Logs go to /tmp/lg and are packed into $OUT/logs_g.tgz after each step. (Commit hashes: the branches as rebased
# onto c250947.)
set -u
export OUT=${OUT:-/tmp/out}
source scripts/gpu_env.sh >/dev/null 2>&1  # call_logs, snap, gpu_banner, with_lib, gtest_counts
call_logs g; L=$logs
gpu_banner
use_prebuilt bench_train kernel_trace test_autograd || { echo "no prebuilt binaries"; exit 1; }
mkdir -p /tmp/ab && tar -xJf ${AB_PACK:-gpu-carry/ab5/ab.tar.xz} -C /tmp/ab
for rev in mlp mlpln; do mkdir -p /tmp/lib_$rev && mv /tmp/ab/libkiln_$rev.so.0.1 /tmp/lib_$rev/libkiln.so.0.1; done
mv /tmp/ab/test_layers_mlpln /tmp/lib_mlpln/test_layers && chmod +x /tmp/lib_mlpln/test_layers
# The branch's test_layers reads PyTorch's golden files where it was built.
mkdir -p /work/fp8q/tests/golden && ln -sfn "$PWD/tests/golden/data" /work/fp8q/tests/golden/data
# Branch stem-pad (libkiln_pad and test_layers_pad in the same pack, on main's sources): 16-bit channels-last convolutions on fewer than 8 input
# channels run zero-padded to 8; its libkiln and test_layers (built in /work/main, where its golden files lie).
if [[ -f /tmp/ab/libkiln_pad.so.0.1 ]]; then
  mkdir -p /tmp/lib_pad && mv /tmp/ab/libkiln_pad.so.0.1 /tmp/lib_pad/libkiln.so.0.1
  mv /tmp/ab/test_layers_pad /tmp/lib_pad/test_layers && chmod +x /tmp/lib_pad/test_layers
  [[ $PWD != /work/main ]] && mkdir -p /work/main/tests/golden && ln -sfn "$PWD/tests/golden/data" /work/main/tests/golden/data
fi
bt=build/bench/bench_train; kt=$PWD/build/bench/libkernel_trace.so
steps='"case": "[a-z0-9_]*"\|"step_ms": [0-9.]*\|"eager_step_ms": [0-9.]*\|"trained": [a-z]*'
if [[ -z ${ONLY_VS_TORCH:-} ]]; then  # ONLY_VS_TORCH=1: step 4 alone (a follow-up call)
with_lib mlpln timeout 300 /tmp/lib_mlpln/test_layers \
  --gtest_filter='*Mlp*:*ColumnSums*:*CudaAddLayerNorm*:*CudaLayerNorm*:*Bert*:*Parity*:*Linear*:*Fp8*:*Gelu*' \
  > $L/test_layers_mlpln.log 2>&1
echo "mlpln test_layers: exit $? $(gtest_counts $L/test_layers_mlpln.log) at $SECONDS s"; snap
# The stem's convolution on 3 channels and padded to 4 and 8 (bench/experiments/stem_channels.cpp, main's libkiln).
if [[ -x gpu-carry/exp4/stem_channels ]]; then
  with_lib main timeout 120 gpu-carry/exp4/stem_channels > $L/stem_channels.log 2>&1
  echo "stem_channels: exit $? at $SECONDS s"; cat $L/stem_channels.log
fi
if [[ -x /tmp/lib_pad/test_layers ]]; then
  with_lib pad timeout 200 /tmp/lib_pad/test_layers --gtest_filter='*Conv*:*ResNet*:*Deterministic*' > $L/test_layers_pad.log 2>&1
  echo "pad test_layers: exit $? $(gtest_counts $L/test_layers_pad.log) at $SECONDS s"; grep "FAILED\|Failure" $L/test_layers_pad.log | head -20
fi
snap
for r in ${AB_ROUNDS:-1 2}; do
  for rev in ${AB_REVS:-main mlp mlpln}; do
    with_lib $rev timeout 150 $bt --case bert_base_128 --case bert_large_128 --case bert_base_128_fp8 > $L/ab_${rev}_$r.log 2>&1
    echo "round $r $rev: exit $? $(grep -o "$steps" $L/ab_${rev}_$r.log | paste -sd' ') at $SECONDS s"
  done
  if [[ -x /tmp/lib_pad/test_layers ]]; then
    for rev in main pad; do
      with_lib $rev timeout 150 $bt --case resnet50_bf16 --case resnet18_cifar_bf16 > $L/rn_${rev}_$r.log 2>&1
      echo "round $r $rev: exit $? $(grep -o "$steps" $L/rn_${rev}_$r.log | paste -sd' ') at $SECONDS s"
    done
  fi
  snap
done
if [[ $SECONDS -lt ${TRACE_STOP_AT:-480} ]]; then
  with_lib mlpln env KILN_KERNEL_TRACE_TOP=60 CUDA_INJECTION64_PATH=$kt timeout 120 $bt --case bert_base_128 > $L/trace_mlpln.log 2>&1
  echo "traced bert_base_128 (mlpln): exit $? $(grep -o "$steps" $L/trace_mlpln.log | paste -sd' ') at $SECONDS s"
fi
fi
# 4. (VS_TORCH_ROUNDS > 0) BERT-base and BERT-large against PyTorch compile + graph with the library VS_TORCH_LIB
#    (default mlpln), interleaved, into $OUT/vs_torch/ (packed by bench_vs_torch.sh at its end).
if [[ ${VS_TORCH_ROUNDS:-0} -gt 0 ]]; then
  with_lib ${VS_TORCH_LIB:-mlpln} env OUT=$OUT/vs_torch KILN_TORCH_MODES=compile_graph KILN_BENCH_TRAIN=$bt \
    scripts/bench_vs_torch.sh $VS_TORCH_ROUNDS bert_base_128 bert_large_128 > $L/vs_torch.log 2>&1
  echo "vs torch (${VS_TORCH_LIB:-mlpln}): exit $? at $SECONDS s"; tail -12 $L/vs_torch.log
fi
snap; echo "total $SECONDS s"
