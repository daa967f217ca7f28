#!/usr/bin/env bash
# The next GPU call: the branch bf16-mlp, tested and measured against main. Run from a clean main checkout with
# main's build packed (scripts/gpu_prebuilt.sh bench_train kernel_trace test_data test_autograd test_tensor) and
# gpu-carry/ab3/ab.tar.xz (one xz stream): the libkiln of
#   mlp    7f1c09d  nn::linear_gelu_linear as one node: fc1's bias gradient summed in the GELU's backward pass,
#   mlpln  5b071c1  and the layer norm's backward summing its x gradient for the Linear before (attention output, fc2),
# and mlpln's test_layers. Carry gpu-carry/prebuilt.tar.xz, prebuilt.id, prebuilt.targets and gpu-carry/ab3. In order:
#  1. mlpln's test_layers on the GPU (the new kernels, the offers through the graph, BERT against PyTorch's golden
#     values, every Linear and layer norm test);
#  2. bench_train bert_base_128, bert_large_128 and bert_base_128_fp8 on main, mlp and mlpln, alternated (AB_ROUNDS);
#  3. a kernel trace of bert_base_128 on mlpln (the new kernels' time against the bias-gradient passes they replace);
#  4. optionally (VS_TORCH_ROUNDS, VS_TORCH_LIB) BERT-base and BERT-large against PyTorch compile + graph.
# Logs go to /tmp/lg and are packed into $OUT/logs_g.tgz after each step.
set -u
export OUT=${OUT:-/tmp/out}
source scripts/gpu_env.sh >/dev/null 2>&1  # call_logs, snap, gpu_banner, with_lib, gtest_counts
call_logs g; L=$logs
gpu_banner
use_prebuilt bench_train kernel_trace test_autograd || { echo "no prebuilt binaries"; exit 1; }
mkdir -p /tmp/ab && tar -xJf gpu-carry/ab3/ab.tar.xz -C /tmp/ab
for rev in mlp mlpln; do mkdir -p /tmp/lib_$rev && mv /tmp/ab/libkiln_$rev.so.0.1 /tmp/lib_$rev/libkiln.so.0.1; done
mv /tmp/ab/test_layers_mlpln /tmp/lib_mlpln/test_layers && chmod +x /tmp/lib_mlpln/test_layers
# The branch's test_layers reads PyTorch's golden files where it was built.
mkdir -p /work/fp8q/tests/golden && ln -sfn "$PWD/tests/golden/data" /work/fp8q/tests/golden/data
with_lib mlpln timeout 300 /tmp/lib_mlpln/test_layers \
  --gtest_filter='*Mlp*:*ColumnSums*:*CudaAddLayerNorm*:*CudaLayerNorm*:*Bert*:*Parity*:*Linear*:*Fp8*:*Gelu*' \
  > $L/test_layers_mlpln.log 2>&1
echo "mlpln test_layers: exit $? $(gtest_counts $L/test_layers_mlpln.log) at $SECONDS s"; snap
bt=build/bench/bench_train; kt=$PWD/build/bench/libkernel_trace.so
steps='"case": "[a-z0-9_]*"\|"step_ms": [0-9.]*\|"eager_step_ms": [0-9.]*\|"trained": [a-z]*'
for r in ${AB_ROUNDS:-1 2}; do
  for rev in ${AB_REVS:-main mlp mlpln}; do
    with_lib $rev timeout 150 $bt --case bert_base_128 --case bert_large_128 --case bert_base_128_fp8 > $L/ab_${rev}_$r.log 2>&1
    echo "round $r $rev: exit $? $(grep -o "$steps" $L/ab_${rev}_$r.log | paste -sd' ') at $SECONDS s"
  done
  snap
done
if [[ $SECONDS -lt ${TRACE_STOP_AT:-420} ]]; then
  with_lib mlpln env KILN_KERNEL_TRACE_TOP=60 CUDA_INJECTION64_PATH=$kt timeout 120 $bt --case bert_base_128 > $L/trace_mlpln.log 2>&1
  echo "traced bert_base_128 (mlpln): exit $? $(grep -o "$steps" $L/trace_mlpln.log | paste -sd' ') at $SECONDS s"
fi
# 4. (VS_TORCH_ROUNDS > 0) BERT-base and BERT-large against PyTorch compile + graph with the library VS_TORCH_LIB
#    (default mlpln), interleaved, into $OUT/vs_torch/ (packed by bench_vs_torch.sh at its end).
if [[ ${VS_TORCH_ROUNDS:-0} -gt 0 ]]; then
  with_lib ${VS_TORCH_LIB:-mlpln} env OUT=$OUT/vs_torch KILN_TORCH_MODES=compile_graph KILN_BENCH_TRAIN=$bt \
    scripts/bench_vs_torch.sh $VS_TORCH_ROUNDS bert_base_128 bert_large_128 > $L/vs_torch.log 2>&1
  echo "vs torch (${VS_TORCH_LIB:-mlpln}): exit $? at $SECONDS s"; tail -12 $L/vs_torch.log
fi
snap; echo "total $SECONDS s"
