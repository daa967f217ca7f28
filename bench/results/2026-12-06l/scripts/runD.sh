#!/usr/bin/env bash
# For the next GPU session (written on 2026-12-06, not yet run). The tree is main with its build packed
# (scripts/gpu_prebuilt.sh bench_train kernel_trace test_data test_autograd test_tensor); gpu-carry/ab2/ab.tar.xz holds
# the libkiln of 5586c0e (before the embedding's gradient went into its table's other gradient, 82c9af3) and of the
# branch index-add-rows (1faf122), with that branch's test_tensor. Carry gpu-carry/prebuilt.tar.xz, prebuilt.id,
# prebuilt.targets, gpu-carry/ab2 and third_party/nvjpeg (the three binaries in one xz stream with a 192 MiB window:
# 15 MB, under the 64 MiB a call carries).
#  1. tests on the GPU: main's test_autograd (the embedding's sums), the branch's test_tensor (rows kernels);
#  2. bench_train bert_base_128 and bert_base_128_fp8 with 5586c0e's, main's and the branch's libkiln, alternated;
#  3. kernel traces of BERT-base and BERT-large, bf16 and FP8, on main (API mode: copies and memsets too);
#  4. issue 34 goal 6's path choice with 32 queues: in memory, JPEG-fed (default backend), JPEG-fed (engines).
# Logs go to /tmp/l and are packed into $OUT after each step, so that a run stopped at its limit brings them back.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
RES=$OUT; OUT=/tmp/l; mkdir -p $OUT
snap() { tar -czf $RES/logs_d.tgz -C $OUT .; }
source scripts/gpu_env.sh >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "tree $(source_id)"
(python3 bench/make_photos.py /tmp/photos --count 2400 > $OUT/photos.log 2>&1) &
use_prebuilt bench_train kernel_trace test_autograd || { echo "no prebuilt binaries"; cat $OUT/summary.txt; exit 1; }
mkdir -p /tmp/ab && tar -xJf gpu-carry/ab2/ab.tar.xz -C /tmp/ab
for rev in 5586c0e 1faf122; do
  mkdir -p /tmp/lib_$rev && mv /tmp/ab/libkiln_$rev.so.0.1 /tmp/lib_$rev/libkiln.so.0.1
done
mv /tmp/ab/test_tensor_1faf122 /tmp/lib_1faf122/test_tensor && chmod +x /tmp/lib_1faf122/test_tensor
with() { local rev=$1; shift; if [[ $rev == main ]]; then "$@"; else LD_LIBRARY_PATH=/tmp/lib_$rev:${LD_LIBRARY_PATH:-} "$@"; fi; }
count() { echo "($(grep -c '^\[       OK ' $1) ok, $(grep -c '^\[  SKIPPED ' $1) skipped)"; grep -E '^\[  (FAILED|SKIPPED) ' $1 | head -8; grep -A6 "Failure" $1 | head -16; }
timeout 60 build/tests/test_autograd --gtest_filter='*IndexGrad*:*Embedding*' > $OUT/test_main_autograd.log 2>&1; echo "main test_autograd *IndexGrad*:*Embedding*: exit $? $(count $OUT/test_main_autograd.log)"
with 1faf122 timeout 120 /tmp/lib_1faf122/test_tensor --gtest_filter='*Index*:*Embedding*:*Scatter*:*Gather*:*Determin*' > $OUT/test_branch_tensor.log 2>&1; echo "branch test_tensor index tests: exit $? $(count $OUT/test_branch_tensor.log)"
snap
bt=build/bench/bench_train; kt=$PWD/build/bench/libkernel_trace.so
steps='"case": "[a-z0-9_]*"\|"step_ms": [0-9.]*\|"eager_step_ms": [0-9.]*\|"trained": [a-z]*'
for r in ${AB_ROUNDS:-1 2}; do
  for rev in 5586c0e main 1faf122; do
    with $rev timeout 90 $bt --case bert_base_128 --case bert_base_128_fp8 > $OUT/ab_${rev}_$r.log 2>&1; echo "round $r $rev: exit $? $(grep -o "$steps" $OUT/ab_${rev}_$r.log | paste -sd' ') at $SECONDS s"
  done
  snap
done
for size in ${TRACE_SIZES:-base large}; do
  [[ $SECONDS -gt ${TRACE_STOP_AT:-400} ]] && break
  KILN_KERNEL_TRACE_API=1 KILN_KERNEL_TRACE_SLOW_MS=50 KILN_KERNEL_TRACE_TOP=90 CUDA_INJECTION64_PATH=$kt timeout 120 $bt --case bert_${size}_128 --case bert_${size}_128_fp8 > $OUT/trace_$size.log 2>&1
  echo "traced bert_$size (main): exit $? $(grep -o "$steps" $OUT/trace_$size.log | paste -sd' ') at $SECONDS s"
  snap
done
wait
fields='"step_ms": [0-9.]*\|"batch_wait_ms": [0-9.]*\|"loader_wait_ms": [0-9.]*\|"worker_collate_ms": [0-9.]*\|"trained": [a-z]*'
for r in 1 2 3 4 5; do
  [[ $SECONDS -gt ${STOP_AT:-450} ]] && { echo "stopped at $SECONDS s"; break; }
  timeout 60 $bt --case resnet50_bf16 > $OUT/inmem_$r.log 2>&1; echo "round $r in memory: exit $? $(grep -o '"step_ms": [0-9.]*\|"trained": [a-z]*' $OUT/inmem_$r.log | paste -sd' ') at $SECONDS s"
  timeout 80 $bt --photos /tmp/photos --case resnet50_jpeg_gpu > $OUT/jpeg_$r.log 2>&1; echo "round $r jpeg default: exit $? $(grep -o "$fields" $OUT/jpeg_$r.log | paste -sd' ') at $SECONDS s"
  KILN_NVJPEG_HARDWARE=1 timeout 80 $bt --photos /tmp/photos --case resnet50_jpeg_gpu > $OUT/jpeghw_$r.log 2>&1; echo "round $r jpeg engines: exit $? $(grep -o "$fields" $OUT/jpeghw_$r.log | paste -sd' ') at $SECONDS s"
  snap
done
snap; echo "total $SECONDS s"
