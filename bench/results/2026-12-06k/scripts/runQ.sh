#!/usr/bin/env bash
# main, built natively: the loader and GPU decoding tests owed since 53db881 and 4bfc43b (default backend, then the
# engines), then ResNet-50 fed by JPEGs under CUDA_DEVICE_MAX_CONNECTIONS=8 (CUDA's default) and 32, alternated, with
# the in-memory case for the ratio. ROUNDS_ONLY=1 skips the build and tests; TRACE=1 adds one CUPTI-traced run of each.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source scripts/gpu_env.sh >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "tree $(source_id)"
td() { find build-gpu/tests -name test_data -type f -perm -u+x | head -1; }
if [[ -z ${ROUNDS_ONLY:-} ]]; then
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > $OUT/configure.log 2>&1 || { echo "configure FAILED"; tail -30 $OUT/configure.log; exit 1; }
grep "Found JPEG" $OUT/configure.log
cmake --build build-gpu -j 16 --target test_data bench_train > $OUT/build.log 2>&1 || { echo "build FAILED"; grep -E "error" $OUT/build.log | head -30; exit 1; }
echo "build done at $SECONDS s"
timeout 150 $(td) --gtest_filter='GpuDecode*:DataLoader*:Image*' > $OUT/test_default.log 2>&1; echo "test_data GpuDecode*:DataLoader*:Image* (default): exit $? ($(grep -c '^\[       OK ' $OUT/test_default.log) ok, $(grep -c '^\[  SKIPPED ' $OUT/test_default.log) skipped) at $SECONDS s"; grep -E '^\[  (FAILED|SKIPPED) ' $OUT/test_default.log | head -12; grep -A5 "Failure" $OUT/test_default.log | head -20
grep -E "^\[       OK" $OUT/test_default.log | grep -E "WaitTimeCounts|LoaderBatches|PixelsMatch|DamagedJpegs|DecodeWritesAfter"
KILN_NVJPEG_HARDWARE=1 timeout 100 $(td) --gtest_filter='GpuDecodeCuda*' > $OUT/test_hw1.log 2>&1; echo "test_data GpuDecodeCuda* (KILN_NVJPEG_HARDWARE=1): exit $? ($(grep -c '^\[       OK ' $OUT/test_hw1.log) ok, $(grep -c '^\[  SKIPPED ' $OUT/test_hw1.log) skipped) at $SECONDS s"; grep -E '^\[  (FAILED|SKIPPED) ' $OUT/test_hw1.log | head -12; grep -A5 "Failure" $OUT/test_hw1.log | head -20
fi
[[ -d /tmp/photos ]] || (python3 bench/make_photos.py /tmp/photos --count 2400 > $OUT/photos.log 2>&1); echo "photos at $SECONDS s"
fields='"step_ms": [0-9.]*\|"batch_wait_ms": [0-9.]*\|"loader_wait_ms": [0-9.]*\|"worker_collate_ms": [0-9.]*\|"trained": [a-z]*'
[[ -n ${INMEM-1} ]] && { timeout 60 build-gpu/bench/bench_train --case resnet50_bf16 > $OUT/inmem.log 2>&1; echo "in memory: exit $? $(grep -o '"step_ms": [0-9.]*\|"trained": [a-z]*' $OUT/inmem.log | paste -sd' ') at $SECONDS s"; }
for r in ${ROUNDS:-1}; do
  for c in 8 32; do
    [[ $SECONDS -gt ${STOP_AT:-500} ]] && { echo "stopped at $SECONDS s"; break 2; }
    CUDA_DEVICE_MAX_CONNECTIONS=$c timeout 80 build-gpu/bench/bench_train --photos /tmp/photos --case resnet50_jpeg_gpu > $OUT/jpeg_c${c}_$r.log 2>&1; echo "round $r connections $c: exit $? $(grep -o "$fields" $OUT/jpeg_c${c}_$r.log | paste -sd' ') at $SECONDS s"
  done
done
if [[ -n ${TRACE:-} ]]; then
  export LD_LIBRARY_PATH=$PWD/gpu-carry/exp/trace:${LD_LIBRARY_PATH:-}
  for c in 8 32; do
    [[ $SECONDS -gt ${STOP_AT:-500} ]] && { echo "stopped at $SECONDS s"; break; }
    TRACE_SLOW_MS=3 CUDA_DEVICE_MAX_CONNECTIONS=$c CUDA_INJECTION64_PATH=$PWD/gpu-carry/exp/trace/libapi_trace.so timeout 100 build-gpu/bench/bench_train --photos /tmp/photos --case resnet50_jpeg_gpu > $OUT/trace_c$c.log 2>&1; echo "traced, connections $c: exit $? $(grep -o "$fields" $OUT/trace_c$c.log | paste -sd' ') at $SECONDS s"
    grep "^trace: GPU busy\|^trace: window\|calls of\|training thread" $OUT/trace_c$c.log | cut -c1-200
  done
fi
cd $OUT && tar -czf logs_${TAG:-q}.tgz *.log && rm -f *.log; echo "total $SECONDS s"
