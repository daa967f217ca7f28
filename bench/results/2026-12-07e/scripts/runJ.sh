#!/usr/bin/env bash
# The next GPU calls, from a clean main checkout with main's build packed
# (scripts/gpu_prebuilt.sh bench_train kernel_trace test_data test_autograd test_tensor test_layers),
# gpu-carry/exp6 (bench/experiments/bn_conv_fusion.cu built against main's libkiln; short_attention_vs_cudnn built
# against branch short-attn's) and gpu-carry/ab9/ab.tar.xz (one xz stream: libkiln_sattn.so.0.1 and test_layers_sattn
# from branch short-attn, kiln's attention kernels for sequences of at most 128; libkiln_sattn2.so.0.1 and
# test_layers_sattn2 from branch short-attn2, the same with the backward over two halves of the keys, two blocks an SM;
# libkiln_sattn3.so.0.1 and test_layers_sattn3 from branch short-attn-tf32, which adds float32 in TF32).
# Carry gpu-carry/prebuilt.tar.xz, prebuilt.id, prebuilt.targets, gpu-carry/exp6 and gpu-carry/ab9, or instead of
# ab9 gpu-carry/ab10 (the default, AB_PACK): libkiln_sattn and test_layers_sattn as in ab9, and libkiln_sattn3 and
# test_layers_sattn3 from short-attn-tf32 at 13e72fd (an empty batch declined, TF32's backward after TF32 is turned
# off). TEST_REVS and AB_REVS default to "sattn sattn3" (sattn2's bf16 kernels are sattn3's).
# STEPS picks what runs, in this order:
#   sattn  the attention, BERT, golden and column-sum tests and BERT's parity test of short-attn, short-attn2 and
#          short-attn-tf32 on the GPU; their kernels against cuDNN's (short_attention_vs_cudnn); bert_base_128,
#          bert_large_128 and bert_base_128_fp32 on main, sattn, sattn2 and sattn3, AB_ROUNDS alternated rounds
#          (default 2); TEST_REVS and AB_REVS name fewer branches for the tests and the A/B;
#   bn     the experiment: ResNet's batch norm inside cuDNN's fused convolutions (bn_conv_fusion fp16, then bf16),
#          every shape;
#   trace  kernel traces of bert_large_128 and resnet18_cifar_bf16 with VS_LIB's library (what the next changes for
#          the two cases below 1.15x should aim at);
#   bert   bert_base_128 and bert_large_128 against PyTorch compile + graph, ROUNDS interleaved rounds (default 5),
#          with VS_LIB's libkiln (main, or sattn or sattn2 where it won);
#   eager  issue 34's goal 2: every bf16 case against torch.compile without graphs (kiln's eager step beside it),
#          3 rounds;
#   fp32   bert_base_128_fp32 and resnet50_fp32 (TF32, goal 4) against PyTorch compile + graph, ROUNDS rounds.
# First call: STEPS=sattn under timeout 590 (about 350 s), then STEPS=bn (up to 300 s); then STEPS=bert VS_LIB=...
# (about 400 s); then STEPS="trace eager" or fp32.
# Logs go to /tmp/lj and are packed into $OUT/logs_j.tgz after each step; each comparison's logs into
# $OUT/vs_torch_STEP.tgz.
set -u
VS_LIB=${VS_LIB:-main}
export OUT=${OUT:-/tmp/out}
source scripts/gpu_env.sh >/dev/null 2>&1  # begin_call, snap, with_lib, unpack_libs, ab_runs, vs_torch_runs, ...
begin_call j || { echo "no prebuilt binaries"; exit 1; }
L=$logs
vs_torch() { local name=$1 modes=$2; shift 2; vs_torch_runs "$name" "$modes" "$bt" "$@"; }  # NAME MODES CASE...
ab() { local revs=$1 name=$2; shift 2; ab_runs "$revs" "$name" "$bt" "$@"; }                 # "REV..." NAME ARGS...
for step in ${STEPS:-sattn bn}; do
  if [[ $step == sattn || $VS_LIB != main ]] && [[ ! -f /tmp/lib_sattn3/libkiln.so.0.1 ]]; then
    unpack_libs "${AB_PACK:-gpu-carry/ab10/ab.tar.xz}" || { echo "the branch's pack does not unpack"; exit 1; }
  fi
  golden_at /work/main  # the branch's test_layers reads PyTorch's golden files where it was built
  case $step in
    sattn)
      for rev in ${TEST_REVS:-sattn sattn3}; do
        with_lib $rev timeout 150 /tmp/lib_$rev/test_layers \
          --gtest_filter='*Attention*:*Bert*:*Golden*:*Multihead*:*ColumnSums*:ParityCuda.Bert*' > $L/test_layers_$rev.log 2>&1
        echo "$rev test_layers: exit $? $(gtest_counts $L/test_layers_$rev.log) at $SECONDS s"
        grep "FAILED\|Failure" $L/test_layers_$rev.log | head -12; snap
        with_lib $rev timeout 60 gpu-carry/exp6/short_attention_vs_cudnn > $L/short_attention_vs_cudnn_$rev.log 2>&1
        echo "short_attention_vs_cudnn ($rev): exit $? at $SECONDS s"; cat $L/short_attention_vs_cudnn_$rev.log; snap
      done
      ab "${AB_REVS:-sattn sattn3}" bert --case bert_base_128 --case bert_large_128 --case bert_base_128_fp32 ;;
    bn)
      # fp16 first: cuDNN documents these fused engines for float16 only (see the experiment's header)
      for dt in fp16 bf16; do
        LD_LIBRARY_PATH=$PWD/build/kiln:${LD_LIBRARY_PATH:-} timeout 150 gpu-carry/exp6/bn_conv_fusion $dt \
          >> $L/bn_conv_fusion.log 2>&1
      done
      echo "bn_conv_fusion: exit $? at $SECONDS s"; cat $L/bn_conv_fusion.log; snap ;;
    trace)
      for tc in bert_large_128 resnet18_cifar_bf16; do
        with_lib ${VS_LIB:-main} env KILN_KERNEL_TRACE_TOP=45 CUDA_INJECTION64_PATH=$PWD/build/bench/libkernel_trace.so \
          timeout 100 $bt --case $tc > $L/trace_$tc.log 2>&1
        echo "traced $tc: exit $? $(grep -o '"step_ms": [0-9.]*' $L/trace_$tc.log) at $SECONDS s"
        grep -m1 -A46 "kernel_trace range 0" $L/trace_$tc.log | cut -c1-150; snap
      done ;;
    bert) vs_torch bert compile_graph bert_base_128 bert_large_128 ;;
    eager) ROUNDS=3 vs_torch eager compile resnet50_bf16 bert_base_128 bert_large_128 resnet18_cifar_bf16 ;;
    fp32) vs_torch fp32 compile_graph bert_base_128_fp32 resnet50_fp32 ;;
  esac
done
snap; echo "total $SECONDS s"
