#!/usr/bin/env bash
# main + the jerror.h order fix, built natively (Ubuntu's libjpeg 8): the image, GPU decoding and loader tests; then
# bench_train with timers on the consumer's side of the loader (gpu-carry/exp/files, never merged) to find where the
# JPEG case's remaining host wait per step goes.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source scripts/gpu_env.sh >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "tree $(source_id)"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > $OUT/configure.log 2>&1 || { echo "configure FAILED"; tail -30 $OUT/configure.log; exit 1; }
grep "Found JPEG" $OUT/configure.log
cmake --build build-gpu -j 16 --target test_data bench_train > $OUT/build.log 2>&1 || { echo "build FAILED"; grep -E "error" $OUT/build.log | head -30; exit 1; }
echo "build done at $SECONDS s"
td=$(find build-gpu/tests -name test_data -type f -perm -u+x | head -1)
timeout 150 $td --gtest_filter='GpuDecode*:DataLoader*:Image*' > $OUT/test_default.log 2>&1; echo "test_data GpuDecode*:DataLoader*:Image* (default): exit $? ($(grep -c '^\[       OK ' $OUT/test_default.log) ok, $(grep -c '^\[  SKIPPED ' $OUT/test_default.log) skipped) at $SECONDS s"; grep -E '^\[  (FAILED|SKIPPED) ' $OUT/test_default.log | head -12; grep -A5 "Failure" $OUT/test_default.log | head -20
grep -E "^\[       OK" $OUT/test_default.log | grep -E "DamagedScanData|DamagedJpegs|DecodeWritesAfter|PixelsMatchLibjpegTurboInOneBatch"
(python3 bench/make_photos.py /tmp/photos --count 2400 > $OUT/photos.log 2>&1); echo "photos at $SECONDS s: $(tail -1 $OUT/photos.log)"
cp -r gpu-carry/exp/files/. . && cmake --build build-gpu -j 16 --target bench_train > $OUT/build_exp.log 2>&1 || { echo "exp build FAILED"; grep error $OUT/build_exp.log | head; exit 1; }
echo "exp build at $SECONDS s"
fields='"step_ms": [0-9.]*\|"batch_wait_ms": [0-9.]*\|"loader_wait_ms": [0-9.]*\|"feed_copy_ms": [0-9.]*\|"worker_collate_ms": [0-9.]*\|"trained": [a-z]*'
timeout 80 build-gpu/bench/bench_train --photos /tmp/photos --case resnet50_jpeg_gpu > $OUT/exp_1.log 2>&1; echo "exp run: exit $? $(grep -o "$fields" $OUT/exp_1.log | paste -sd' ') at $SECONDS s"
grep "^exp" $OUT/exp_1.log | tail -9 | cut -c1-330
export LD_LIBRARY_PATH=$PWD/gpu-carry/exp/trace:${LD_LIBRARY_PATH:-}
ldd gpu-carry/exp/trace/libtrace.so | grep cupti
CUDA_INJECTION64_PATH=$PWD/gpu-carry/exp/trace/libtrace.so timeout 100 build-gpu/bench/bench_train --photos /tmp/photos --case resnet50_jpeg_gpu > $OUT/trace_jpeg.log 2>&1; echo "traced jpeg run: exit $? $(grep -o "$fields" $OUT/trace_jpeg.log | paste -sd' ') at $SECONDS s"
grep "^trace" $OUT/trace_jpeg.log | cut -c1-200
[[ $SECONDS -gt 420 ]] && { echo "stopped before the batched variant at $SECONDS s"; cd $OUT && tar -czf logs.tgz *.log && rm -f *.log; exit 0; }
cp -r gpu-carry/exp/files2/. . && cmake --build build-gpu -j 16 --target bench_train test_data > $OUT/build_b.log 2>&1 || { echo "batched build FAILED"; grep error $OUT/build_b.log | head; exit 1; }
echo "batched build at $SECONDS s"
timeout 60 $td --gtest_filter='GpuDecodeCuda*' > $OUT/test_batched.log 2>&1; echo "batched: test_data GpuDecodeCuda*: exit $? ($(grep -c '^\[       OK ' $OUT/test_batched.log) ok) at $SECONDS s"; grep -E '^\[  FAILED ' $OUT/test_batched.log | head -8; grep -A5 "Failure" $OUT/test_batched.log | head -16
timeout 80 build-gpu/bench/bench_train --photos /tmp/photos --case resnet50_jpeg_gpu > $OUT/batched_1.log 2>&1; echo "batched run: exit $? $(grep -o "$fields" $OUT/batched_1.log | paste -sd' ') at $SECONDS s"
grep "^exp" $OUT/batched_1.log | tail -9 | cut -c1-200
[[ $SECONDS -gt 500 ]] && { echo "stopped at $SECONDS s"; cd $OUT && tar -czf logs.tgz *.log && rm -f *.log; exit 0; }
CUDA_INJECTION64_PATH=$PWD/gpu-carry/exp/trace/libtrace.so timeout 80 build-gpu/bench/bench_train --photos /tmp/photos --case resnet50_jpeg_gpu > $OUT/trace_batched.log 2>&1; echo "traced batched run: exit $? $(grep -o "$fields" $OUT/trace_batched.log | paste -sd' ') at $SECONDS s"
grep "^trace" $OUT/trace_batched.log | cut -c1-200
cd $OUT && tar -czf logs.tgz *.log && rm -f *.log; echo "total $SECONDS s"
