#!/usr/bin/env bash
# The development machine's build (scripts/gpu_prebuilt.sh test_tensor test_data bench_train, carried in gpu-carry/)
# of kiln asking for 32 hardware queues plus nvjpeg_allocators.diff: the queue tests, the loader and GPU decoding
# tests, then in-memory and JPEG-fed ResNet-50 with nothing in the environment.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source scripts/gpu_env.sh >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "tree $(source_id); environment: CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS-unset}"
(python3 bench/make_photos.py /tmp/photos --count 2400 > $OUT/photos.log 2>&1) &
use_prebuilt test_tensor test_data bench_train || { echo "no prebuilt binaries"; cat $OUT/summary.txt; exit 1; }
cat $OUT/summary.txt 2>/dev/null
tt=build/tests/test_tensor; td=build/tests/test_data
timeout 40 $tt --gtest_filter='CudaQueues*:CudaMemory*' > $OUT/test_queues.log 2>&1; echo "test_tensor CudaQueues*:CudaMemory*: exit $? ($(grep -c '^\[       OK ' $OUT/test_queues.log) ok, $(grep -c '^\[  SKIPPED ' $OUT/test_queues.log) skipped) at $SECONDS s"; grep -E '^\[  (FAILED|SKIPPED) ' $OUT/test_queues.log | head; grep -A6 "Failure" $OUT/test_queues.log | head -16; grep -E "NoStreamWaits|CudaQueues" $OUT/test_queues.log | grep -E "OK|FAILED"
CUDA_DEVICE_MAX_CONNECTIONS=8 timeout 20 $tt --gtest_filter='CudaQueues*:CudaMemory.NoStream*' > $OUT/test_queues8.log 2>&1; echo "the same with CUDA_DEVICE_MAX_CONNECTIONS=8: exit $?"; grep -E "^\[       OK|^\[  FAILED" $OUT/test_queues8.log; grep -A6 "Failure" $OUT/test_queues8.log | head -12
timeout 60 $td --gtest_filter='GpuDecode*:DataLoader*:Image*' > $OUT/test_data.log 2>&1; echo "test_data GpuDecode*:DataLoader*:Image*: exit $? ($(grep -c '^\[       OK ' $OUT/test_data.log) ok, $(grep -c '^\[  SKIPPED ' $OUT/test_data.log) skipped) at $SECONDS s"; grep -E '^\[  (FAILED|SKIPPED) ' $OUT/test_data.log | head; grep -A6 "Failure" $OUT/test_data.log | head -20; grep -E "Growing" $OUT/test_data.log | grep -E "OK|FAILED"
wait
fields='"step_ms": [0-9.]*\|"batch_wait_ms": [0-9.]*\|"loader_wait_ms": [0-9.]*\|"worker_collate_ms": [0-9.]*\|"trained": [a-z]*'
timeout 50 build/bench/bench_train --case resnet50_bf16 > $OUT/inmem.log 2>&1; echo "in memory: exit $? $(grep -o '"step_ms": [0-9.]*\|"trained": [a-z]*' $OUT/inmem.log | paste -sd' ') at $SECONDS s"
for r in 1 2 3; do
  [[ $SECONDS -gt ${STOP_AT:-110} ]] && { echo "stopped at $SECONDS s"; break; }
  timeout 60 build/bench/bench_train --photos /tmp/photos --case resnet50_jpeg_gpu > $OUT/jpeg_$r.log 2>&1; echo "jpeg $r: exit $? $(grep -o "$fields" $OUT/jpeg_$r.log | paste -sd' ') at $SECONDS s"
done
cd $OUT && tar -czf logs_u.tgz *.log && rm -f *.log; echo "total $SECONDS s"
