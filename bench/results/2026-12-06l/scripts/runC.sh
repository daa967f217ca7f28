#!/usr/bin/env bash
# One call for everything this session could get a GPU for. Written for the tree of main 5586c0e and its build
# (scripts/gpu_prebuilt.sh bench_train kernel_trace test_data, in gpu-carry/prebuilt.tar.xz), with gpu-carry/branch
# holding the other side of the A/B, loaded first through LD_LIBRARY_PATH: then the branch embedding-into-sums's
# libkiln and test_autograd (xz). Since that branch is merged (82c9af3), the next A/B packs main and puts 5586c0e's
# libkiln in gpu-carry/branch instead (the test binary's filter still names the new test).
#  1. the branch's tests on the GPU (IndexGrad*: the embedding's rows added into the table's other gradients);
#  2. main against the branch, alternated: bench_train --case bert_base_128 --case bert_base_128_fp8;
#  3. kernel traces of BERT-base and BERT-large in bf16 and FP8 on main (API mode: copies and memsets too);
#  4. goal 6's path choice with 32 queues: in memory, JPEG-fed (default backend), JPEG-fed (hardware engines).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# The logs are written to /tmp/l and packed into $OUT after each step, so that a run stopped at its time limit
# still brings back what it measured.
RES=$OUT; OUT=/tmp/l; mkdir -p $OUT
snap() { tar -czf $RES/logs_c.tgz -C $OUT .; }
source scripts/gpu_env.sh >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "tree $(source_id)"
(python3 bench/make_photos.py /tmp/photos --count 2400 > $OUT/photos.log 2>&1) &
use_prebuilt bench_train kernel_trace || { echo "no prebuilt binaries"; cat $OUT/summary.txt; exit 1; }
mkdir -p /tmp/branch && xz -dc gpu-carry/branch/libkiln.so.0.1.xz > /tmp/branch/libkiln.so.0.1 && xz -dc gpu-carry/branch/test_autograd.xz > /tmp/branch/test_autograd && chmod +x /tmp/branch/test_autograd
br() { LD_LIBRARY_PATH=/tmp/branch:${LD_LIBRARY_PATH:-} "$@"; }
br timeout 60 /tmp/branch/test_autograd --gtest_filter='*IndexGrad*:*Embedding*:*Tied*' > $OUT/test_branch.log 2>&1; echo "branch test_autograd IndexGrad*:*Embedding*: exit $? ($(grep -c '^\[       OK ' $OUT/test_branch.log) ok, $(grep -c '^\[  SKIPPED ' $OUT/test_branch.log) skipped) at $SECONDS s"; grep -E '^\[  (FAILED|SKIPPED) ' $OUT/test_branch.log | head; grep -A6 "Failure" $OUT/test_branch.log | head -16; grep -E "AddsInto.*(OK|FAILED)" $OUT/test_branch.log; snap
br ldd build/bench/bench_train | grep libkiln
bt=build/bench/bench_train; kt=$PWD/build/bench/libkernel_trace.so
steps='"case": "[a-z0-9_]*"\|"step_ms": [0-9.]*\|"eager_step_ms": [0-9.]*\|"trained": [a-z]*'
for r in ${AB_ROUNDS:-1 2}; do
  timeout 90 $bt --case bert_base_128 --case bert_base_128_fp8 > $OUT/ab_main_$r.log 2>&1; echo "round $r main:   exit $? $(grep -o "$steps" $OUT/ab_main_$r.log | paste -sd' ') at $SECONDS s"
  br timeout 90 $bt --case bert_base_128 --case bert_base_128_fp8 > $OUT/ab_branch_$r.log 2>&1; echo "round $r branch: exit $? $(grep -o "$steps" $OUT/ab_branch_$r.log | paste -sd' ') at $SECONDS s"
  snap
done
for size in ${TRACE_SIZES:-base large}; do
  [[ $SECONDS -gt ${TRACE_STOP_AT:-400} ]] && break
  KILN_KERNEL_TRACE_API=1 KILN_KERNEL_TRACE_SLOW_MS=50 KILN_KERNEL_TRACE_TOP=90 CUDA_INJECTION64_PATH=$kt timeout 120 $bt --case bert_${size}_128 --case bert_${size}_128_fp8 > $OUT/trace_$size.log 2>&1
  echo "traced bert_$size (main): exit $? $(grep -o "$steps" $OUT/trace_$size.log | paste -sd' ') at $SECONDS s"
done
wait
fields='"step_ms": [0-9.]*\|"batch_wait_ms": [0-9.]*\|"loader_wait_ms": [0-9.]*\|"worker_collate_ms": [0-9.]*\|"trained": [a-z]*'
for r in 1 2 3; do
  [[ $SECONDS -gt ${STOP_AT:-300} ]] && { echo "stopped at $SECONDS s"; break; }
  timeout 60 $bt --case resnet50_bf16 > $OUT/inmem_$r.log 2>&1; echo "round $r in memory: exit $? $(grep -o '"step_ms": [0-9.]*\|"trained": [a-z]*' $OUT/inmem_$r.log | paste -sd' ') at $SECONDS s"
  timeout 80 $bt --photos /tmp/photos --case resnet50_jpeg_gpu > $OUT/jpeg_$r.log 2>&1; echo "round $r jpeg default: exit $? $(grep -o "$fields" $OUT/jpeg_$r.log | paste -sd' ') at $SECONDS s"
  KILN_NVJPEG_HARDWARE=1 timeout 80 $bt --photos /tmp/photos --case resnet50_jpeg_gpu > $OUT/jpeghw_$r.log 2>&1; echo "round $r jpeg engines: exit $? $(grep -o "$fields" $OUT/jpeghw_$r.log | paste -sd' ') at $SECONDS s"
  snap
done
snap; echo "total $SECONDS s"
