#!/usr/bin/env bash
# The GPU calls of 2026-12-07h, from a clean main checkout with main's build packed
# (scripts/gpu_prebuilt.sh bench_train kernel_trace test_data test_autograd test_tensor test_layers test_optim) and
# a branch pack (AB_PACK, default gpu-carry/ab14/ab.tar.xz: short_attention_vs_cudnn built against main's libkiln, g++
# line in its header; libkiln_bn.so.0.1 and test_layers_bn of branch bn-relu-mask, which holds softmax-dedup; ab13
# held softmax-dedup alone as _sm; ab15 holds branch attn-stage as _stage; ab16 holds _stage and branch attn-keep-bits,
# stacked on it, as _keep with its own short_attention_vs_cudnn_keep; all built in /work/wt).
# ab17 holds ab16's _keep (not _stage: the carry limit) and the libkiln and test_layers of branch ln-occupancy (57304b9, built in /work/main) as _ln.
# Carry gpu-carry/prebuilt.* and the pack's folder. STEPS picks what runs:
#   ncu     Nsight Compute on short_attention_vs_cudnn with NCU_LIB's libkiln (default main): kiln's 16-bit forward
#           on BERT-large without and with dropout (the full section set, stall reasons in detail). (On 2026-12-07h it
#           also listed the first 40 kernels of any name, meant to name cuDNN's; they were the experiment's fills.)
#   eager   issue 34's goal 2: kiln's eager step (bench_train's eager_step_ms) against torch.compile without graphs,
#           ROUNDS interleaved rounds (default 3) of the cases in EAGER_CASES
#   tests   BINARY:FILTER pairs in TESTS (main's binaries, or /tmp/lib_REV/test_layers as lib:REV:FILTER, another
#           test binary of the pack as lib:REV/BIN:FILTER)
#   kern    short_attention_vs_cudnn (kernel times per layer) with main's libkiln, then each of KERN_REV's (default AB_REV's, default bn;
#           short_attention_vs_cudnn_REV where the pack has one)
#   ab      bench_train's AB_CASES (default resnet50_fp32 resnet18_cifar_bf16) with main's libkiln and AB_REV's
#           (default bn), AB_ROUNDS alternated rounds (default 2)
#   vs      VS_CASES against PyTorch's VS_MODES (default compile_graph) with VS_LIB's libkiln (default bn), ROUNDS rounds
#           (default 3); logs in $OUT/vs_torch_VS_NAME.tgz (default vs)
#   trace   kernel traces (kernel_trace, KILN_KERNEL_TRACE_TOP=40) of TRACE_CASES (default bert_large_128_fp8
#           bert_base_128_fp8: where FP8's step goes, for the FP8 issue) with TRACE_LIB's libkiln (default main)
#   bert    bert_base_128 and bert_large_128 against PyTorch compile + graph, ROUNDS rounds (default 5)
#   ncubn   Nsight Compute's speed of light on the batch-norm kernels of resnet18_cifar_bf16's first eager step (one
#           line per launch: kernel, grid, duration, DRAM throughput), to see which layers' passes fall short of the
#           memory bandwidth
#   ncubnfull  Nsight Compute's full section set on the first 256-channel statistics and elementwise passes of
#           resnet18_cifar_bf16's forward (stall reasons: why the small layers run far below the bandwidth)
#   bnfuse  bench/experiments/bn_conv_fusion.cu (gpu-carry/exp7/bn_conv_fusion, built against main's libkiln with the
#           command in its header): cuDNN's fused convolution + batch-norm graphs against kiln's path, fp16 then bf16,
#           on the shapes whose name holds BNFUSE_FILTER (default resnet18_cifar; each graph takes 2 to 7 s to build)
#   ncubert Nsight Compute's full section set on one launch each of the memory-bound kernels of bert_large_128's
#           second eager step (NCU_BERT: NAME:SKIP pairs, default the LayerNorm backward with dropout and column sums,
#           the LayerNorm forward, GELU's backward with column sums and the AdamW update): why they run at 2.1 to
#           2.7 TB/s where a copy reaches more (2026-12-08a), with NCU_LIB's libkiln (default main)
#   exp     EXP (a command line, e.g. gpu-carry/exp8/adam_bandwidth: an experiment built against main's libkiln) with
#           main's libkiln, its output in exp.log (2026-12-07j)
# Logs go to /tmp/lM and are packed into $OUT/logs_M.tgz after each step.
set -u
export OUT=${OUT:-/tmp/out}
source scripts/gpu_env.sh >/dev/null 2>&1  # begin_call, snap, vs_torch_runs, gtest_counts, with_lib, ...
begin_call M || { echo "no prebuilt binaries"; exit 1; }
L=$logs
golden_at /work/main
golden_at /work/wt  # the branch test binaries of gpu-carry/ab13 were built in /work/wt
unpack_libs "gpu-carry/${AB_PACK:-ab14}/ab.tar.xz" || echo "no branch pack"
# The lines of an Nsight Compute report the ncu steps print (each adds its own).
ncu_keys='Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|DRAM Throughput|Block Limit|Warp Cycles Per Issued|Issue Slots Busy|Stall|stall'
exp=${KERN_EXP:-/tmp/ab/short_attention_vs_cudnn}  # KERN_EXP: e.g. gpu-carry/exp8/short_attention_vs_cudnn (2026-12-07j)
set -f
for step in ${STEPS:-ncu}; do
  t0=$SECONDS
  case $step in
    ncu)
      ncu --version | tail -1
      # kiln's forward, BERT-large: launches 502 (no dropout) and 753 (dropout 0.1) of short_attention_forward_kernel
      for skip in 502 753; do
        with_lib ${NCU_LIB:-main} timeout 150 ncu --clock-control none -k regex:short_attention_forward_kernel --launch-skip $skip \
          --launch-count 1 --set full --print-details all $exp > $L/ncu_fwd_$skip.log 2>&1
        echo "ncu forward (skip $skip): exit $? at $SECONDS s"
        grep -E "short_attention_forward|Memory Throughput|Compute \(SM\) Throughput|$ncu_keys" $L/ncu_fwd_$skip.log | cut -c1-160 | head -60
        snap
      done ;;
    eager) ROUNDS=${ROUNDS:-3} vs_torch_runs eager compile $bt ${EAGER_CASES:-bert_large_128 resnet18_cifar_bf16} ;;
    tests)
      for t in ${TESTS:-}; do
        if [[ $t == lib:* ]]; then
          t=${t#lib:}; rev=${t%%:*}; bin=test_layers  # lib:REV:FILTER, or lib:REV/BIN:FILTER for another test binary
          [[ $rev == */* ]] && bin=${rev#*/} && rev=${rev%/*}
          with_lib $rev gtest_run ${bin}_$rev /tmp/lib_$rev/$bin "${t#*:}"
        else
          gtest_run ${t%%:*} build/tests/${t%%:*} "${t#*:}"
        fi
        snap
      done ;;
    kern)
      for rev in main ${KERN_REV:-${AB_REV:-bn}}; do
        bin=/tmp/ab/short_attention_vs_cudnn_$rev  # a library whose API changed comes with its own build
        [[ -x $bin ]] || bin=$exp
        with_lib $rev timeout 60 $bin > $L/kern_$rev.log 2>&1
        echo "short_attention_vs_cudnn ($rev): exit $? at $SECONDS s"; grep -v "^ *differences" $L/kern_$rev.log
      done; snap ;;
    ab)
      cases=()
      for c in ${AB_CASES:-resnet50_fp32 resnet18_cifar_bf16}; do cases+=(--case $c); done
      ab_runs "${AB_REV:-bn}" ab $bt "${cases[@]}" ;;
    vs) VS_LIB=${VS_LIB:-bn} ROUNDS=${ROUNDS:-3} vs_torch_runs "${VS_NAME:-vs}" "${VS_MODES:-compile_graph}" $bt $VS_CASES ;;
    trace)
      for tc in ${TRACE_CASES:-bert_large_128_fp8 bert_base_128_fp8}; do
        with_lib ${TRACE_LIB:-main} env KILN_KERNEL_TRACE_TOP=40 CUDA_INJECTION64_PATH=$PWD/build/bench/libkernel_trace.so \
          timeout 100 $bt --case $tc > $L/trace_$tc.log 2>&1
        echo "traced $tc: exit $? $(grep -o '"step_ms": [0-9.]*' $L/trace_$tc.log) at $SECONDS s"
        grep -m1 -A41 "kernel_trace range 0" $L/trace_$tc.log | cut -c1-150; snap
      done ;;
    bert) vs_torch_runs bert compile_graph $bt bert_base_128 bert_large_128 ;;
    ncubn)
      timeout 240 ncu --clock-control none -k 'regex:reduce_rows_kernel|forward_rows_kernel|backward_rows_kernel|finalize_' \
        --launch-count 120 --section SpeedOfLight --section LaunchStats \
        $bt --case resnet18_cifar_bf16 --steps 1 --warmup 1 --no-graphs > $L/ncu_bn.log 2>&1
      echo "ncu batch norm: exit $? at $SECONDS s"
      awk '/Context [0-9]+, Stream/ {k=$0; sub(/^ *(void )?/, "", k); k=substr(k, 1, 48); g=$0; sub(/.*\) \(/, "(", g); sub(/, Context.*/, "", g)}
        /DRAM Throughput/ {dr=$NF} /^ +Duration/ {print k, g, $NF, $(NF-1), "DRAM " dr "%"}' \
        $L/ncu_bn.log | head -130; snap ;;
    ncubnfull)
      # The full section set on the first 256-channel (8 x 8) statistics pass and elementwise pass of the forward
      # (launch 10 of each kernel: 5 batch norms at 64 channels and 5 at 128 come first): why a 17 MB pass that the
      # bandwidth allows in 5 us takes 17 (2026-12-07i).
      for kern in reduce_rows_kernel forward_rows_kernel; do
        timeout 150 ncu --clock-control none -k regex:$kern --launch-skip 10 --launch-count 1 --set full \
          --print-details all $bt --case resnet18_cifar_bf16 --steps 1 --warmup 1 --no-graphs > $L/ncu_bn_full_$kern.log 2>&1
        echo "ncu $kern (full): exit $? at $SECONDS s"
        grep -E "Waves|$ncu_keys" \
          $L/ncu_bn_full_$kern.log | cut -c1-160 | head -40
      done; snap ;;
    bnfuse)
      for dt in fp16 bf16; do  # cuDNN documents these fused engines for float16 only (the experiment's header)
        with_lib main timeout 200 gpu-carry/exp7/bn_conv_fusion $dt "${BNFUSE_FILTER:-resnet18_cifar}" > $L/bn_conv_fusion_$dt.log 2>&1
        echo "bn_conv_fusion $dt: exit $? at $SECONDS s"; cut -c1-200 $L/bn_conv_fusion_$dt.log | head -60; snap
      done ;;
    ncubert)
      for ks in ${NCU_BERT:-layer_norm_backward_warp:55 layer_norm_forward_packed:55 gelu_backward_sums_kernel:30 multi_tensor_kernel:22}; do
        kern=${ks%%:*}
        with_lib ${NCU_LIB:-main} timeout 150 ncu --clock-control none -k regex:$kern --launch-skip ${ks##*:} --launch-count 1 \
          --set full --print-details all $bt --case bert_large_128 --steps 1 --warmup 1 --no-graphs > $L/ncu_bert_$kern.log 2>&1
        echo "ncu $kern (skip ${ks##*:}): exit $? at $SECONDS s"
        grep -E "Context [0-9]+, Stream|Memory Throughput|L2 Hit|Waves|Grid Size|Executed Ipc|$ncu_keys" \
          $L/ncu_bert_$kern.log | cut -c1-160 | head -50
        snap
      done ;;
    exp)
      with_lib main timeout 200 $EXP > $L/exp.log 2>&1
      echo "$EXP: exit $? at $SECONDS s"; cut -c1-200 $L/exp.log | head -60; snap ;;
  esac
  echo "step $step: $((SECONDS - t0)) s"
done
snap; echo "total $SECONDS s"
