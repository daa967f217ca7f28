#!/usr/bin/env bash
# One GPU call for 2026-12-07, run from main's tree with its build packed (scripts/gpu_prebuilt.sh bench_train
# kernel_trace test_data test_autograd test_tensor). gpu-carry/ab2/ab.tar.xz (one xz stream with a 192 MiB window, so
# that the near-identical libraries cost little) holds the libkiln of
#   5586c0e  before the embedding's gradient went into its table's other gradients (82c9af3),
#   1faf122  the branch index-add-rows (an embedding's lookup and gradient by whole rows),
#   fp8q     the branch fp8-pair-pipeline (the pair quantisations with a GELU or column sums: a wave of blocks, each
#            prefetching its next tile; the code tiles swizzled; a stack of weights quantised in one launch),
# with each branch's test_tensor, and bench_fp8 (same source on both sides). Carry gpu-carry/prebuilt.tar.xz,
# prebuilt.id, prebuilt.targets, gpu-carry/ab2 and third_party/nvjpeg. In order:
#  1. tests on the GPU: main's embedding-sum tests, index-add-rows' index tests, fp8-pair-pipeline's FP8 tests;
#  2. bench_fp8 with main's and fp8-pair-pipeline's libkiln, alternated;
#  3. bench_train bert_base_128 and bert_base_128_fp8 on the four libraries, alternated (AB_ROUNDS);
#  4. a kernel trace of BERT-base bf16 and FP8 on main (TRACE_SIZES; API mode: copies and memsets too);
#  5. issue 34 goal 6's path choice with 32 queues: in memory, JPEG-fed (default backend), JPEG-fed (engines), until
#     STOP_AT seconds.
# Env: FP8_ROUNDS, AB_ROUNDS, AB_REVS, TRACE_SIZES, TRACE_STOP_AT, STOP_AT (shorter runs for a short budget).
# Logs go to /tmp/le and are packed into $OUT/logs_e.tgz after each step, so that a run stopped at its limit brings
# back what it measured.
set -u
export OUT=${OUT:-/tmp/out}
source scripts/gpu_env.sh >/dev/null 2>&1  # call_logs, snap, gpu_banner, with_lib, gtest_counts
call_logs e; L=$logs
gpu_banner
(python3 bench/make_photos.py /tmp/photos --count 2400 > $L/photos.log 2>&1) &
use_prebuilt bench_train kernel_trace test_autograd || { echo "no prebuilt binaries"; exit 1; }
mkdir -p /tmp/ab && tar -xJf gpu-carry/ab2/ab.tar.xz -C /tmp/ab
for rev in 5586c0e 1faf122 fp8q; do mkdir -p /tmp/lib_$rev && mv /tmp/ab/libkiln_$rev.so.0.1 /tmp/lib_$rev/libkiln.so.0.1; done
for rev in 1faf122 fp8q; do mv /tmp/ab/test_tensor_$rev /tmp/lib_$rev/test_tensor && chmod +x /tmp/lib_$rev/test_tensor; done
chmod +x /tmp/ab/bench_fp8
timeout 60 build/tests/test_autograd --gtest_filter='*IndexGrad*:*Embedding*' > $L/test_main_autograd.log 2>&1; echo "main test_autograd *IndexGrad*:*Embedding*: exit $? $(gtest_counts $L/test_main_autograd.log)"
with_lib 1faf122 timeout 120 /tmp/lib_1faf122/test_tensor --gtest_filter='*Index*:*Embedding*:*Scatter*:*Gather*:*Determin*' > $L/test_iar_tensor.log 2>&1; echo "index-add-rows test_tensor index tests: exit $? $(gtest_counts $L/test_iar_tensor.log)"
with_lib fp8q timeout 120 /tmp/lib_fp8q/test_tensor --gtest_filter='*Fp8*:*Float8*' > $L/test_fp8q_tensor.log 2>&1; echo "fp8-pair-pipeline test_tensor FP8 tests: exit $? $(gtest_counts $L/test_fp8q_tensor.log)"
snap
for r in ${FP8_ROUNDS:-1 2}; do
  for rev in main fp8q; do
    with_lib $rev timeout 60 /tmp/ab/bench_fp8 > $L/fp8_${rev}_$r.log 2>&1; echo "bench_fp8 round $r $rev: exit $? at $SECONDS s"
    grep -E "gelu|e5m2 \+ sums  " $L/fp8_${rev}_$r.log | sed 's/^/    /'
  done
  snap
done
bt=build/bench/bench_train; kt=$PWD/build/bench/libkernel_trace.so
steps='"case": "[a-z0-9_]*"\|"step_ms": [0-9.]*\|"eager_step_ms": [0-9.]*\|"trained": [a-z]*'
for r in ${AB_ROUNDS:-1 2}; do
  for rev in ${AB_REVS:-5586c0e main 1faf122 fp8q}; do
    with_lib $rev timeout 90 $bt --case bert_base_128 --case bert_base_128_fp8 > $L/ab_${rev}_$r.log 2>&1; echo "round $r $rev: exit $? $(grep -o "$steps" $L/ab_${rev}_$r.log | paste -sd' ') at $SECONDS s"
  done
  snap
done
for size in ${TRACE_SIZES:-base}; do
  [[ $SECONDS -gt ${TRACE_STOP_AT:-360} ]] && break
  KILN_KERNEL_TRACE_API=1 KILN_KERNEL_TRACE_SLOW_MS=50 KILN_KERNEL_TRACE_TOP=90 CUDA_INJECTION64_PATH=$kt timeout 120 $bt --case bert_${size}_128 --case bert_${size}_128_fp8 > $L/trace_$size.log 2>&1
  echo "traced bert_$size (main): exit $? $(grep -o "$steps" $L/trace_$size.log | paste -sd' ') at $SECONDS s"
  snap
done
wait
fields='"step_ms": [0-9.]*\|"batch_wait_ms": [0-9.]*\|"loader_wait_ms": [0-9.]*\|"worker_collate_ms": [0-9.]*\|"trained": [a-z]*'
for r in 1 2 3 4 5; do
  [[ $SECONDS -gt ${STOP_AT:-450} ]] && { echo "stopped at $SECONDS s"; break; }
  timeout 60 $bt --case resnet50_bf16 > $L/inmem_$r.log 2>&1; echo "round $r in memory: exit $? $(grep -o '"step_ms": [0-9.]*\|"trained": [a-z]*' $L/inmem_$r.log | paste -sd' ') at $SECONDS s"
  timeout 80 $bt --photos /tmp/photos --case resnet50_jpeg_gpu > $L/jpeg_$r.log 2>&1; echo "round $r jpeg default: exit $? $(grep -o "$fields" $L/jpeg_$r.log | paste -sd' ') at $SECONDS s"
  KILN_NVJPEG_HARDWARE=1 timeout 80 $bt --photos /tmp/photos --case resnet50_jpeg_gpu > $L/jpeghw_$r.log 2>&1; echo "round $r jpeg engines: exit $? $(grep -o "$fields" $L/jpeghw_$r.log | paste -sd' ') at $SECONDS s"
  snap
done
snap; echo "total $SECONDS s"
