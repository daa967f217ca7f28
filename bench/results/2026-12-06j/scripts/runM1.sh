#!/usr/bin/env bash
# main as is: native build of test_data and bench_train, the GPU decoding and loader tests under the default
# (engines off), GpuDecodeCuda* again with the engines on, then photos and round 1 of in-memory vs JPEG-fed ResNet-50.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source scripts/gpu_env.sh >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "tree $(source_id)"
if [[ -z ${ROUNDS_ONLY:-} ]]; then
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > $OUT/configure.log 2>&1 || { echo "configure FAILED"; tail -30 $OUT/configure.log; exit 1; }
grep -i "nvjpeg\|KILN_TEST" $OUT/configure.log | head -5
cmake --build build-gpu -j 16 --target test_data bench_train > $OUT/build.log 2>&1 || { echo "build FAILED"; grep -E "error" $OUT/build.log | head -30; exit 1; }
echo "build done at $SECONDS s"
timeout 150 build-gpu/tests/data/test_data --gtest_filter='GpuDecode*:DataLoader*' > $OUT/test_default.log 2>&1; echo "test_data GpuDecode*:DataLoader* (default): exit $? ($(grep -c '^\[       OK ' $OUT/test_default.log) ok, $(grep -c '^\[  SKIPPED ' $OUT/test_default.log) skipped) at $SECONDS s"; grep -E '^\[  (FAILED|SKIPPED) ' $OUT/test_default.log | head -12; grep -A5 "Failure" $OUT/test_default.log | head -20
KILN_NVJPEG_HARDWARE=1 timeout 100 build-gpu/tests/data/test_data --gtest_filter='GpuDecodeCuda*' > $OUT/test_hw1.log 2>&1; echo "test_data GpuDecodeCuda* (KILN_NVJPEG_HARDWARE=1): exit $? ($(grep -c '^\[       OK ' $OUT/test_hw1.log) ok, $(grep -c '^\[  SKIPPED ' $OUT/test_hw1.log) skipped) at $SECONDS s"; grep -E '^\[  (FAILED|SKIPPED) ' $OUT/test_hw1.log | head -12; grep -A5 "Failure" $OUT/test_hw1.log | head -20
grep -E "^\[ RUN|^\[       OK" $OUT/test_default.log | grep -E "DecodeWritesAfter|PixelsMatchLibjpegTurboInOneBatch|CountsSay" | head
fi
[[ -d /tmp/photos ]] || (python3 bench/make_photos.py /tmp/photos --count 2400 > $OUT/photos.log 2>&1); echo "photos at $SECONDS s: $(tail -1 $OUT/photos.log)"
fields='"step_ms": [0-9.]*\|"batch_wait_ms": [0-9.]*\|"loader_wait_ms": [0-9.]*\|"worker_collate_ms": [0-9.]*\|"decoded_by": {[^}]*}\|"trained": [a-z]*'
for r in ${ROUNDS:-1}; do
  [[ $SECONDS -gt ${STOP_AT:-480} ]] && { echo "stopped at $SECONDS s"; break; }
  timeout 60 build-gpu/bench/bench_train --case resnet50_bf16 > $OUT/inmem_$r.log 2>&1; echo "round $r in memory: exit $? $(grep -o '"step_ms": [0-9.]*\|"trained": [a-z]*' $OUT/inmem_$r.log | paste -sd' ') at $SECONDS s"
  timeout 80 build-gpu/bench/bench_train --photos /tmp/photos --case resnet50_jpeg_gpu > $OUT/jpeg_$r.log 2>&1; echo "round $r jpeg: exit $? $(grep -o "$fields" $OUT/jpeg_$r.log | paste -sd' ') at $SECONDS s"
done
mkdir -p build-gpu/base_lib && cp -L build-gpu/kiln/libkiln.so.0.1 build-gpu/base_lib/ 2>/dev/null; ls build-gpu/kiln/ | grep libkiln
cd $OUT && tar -czf logs.tgz *.log && rm -f *.log; echo "total $SECONDS s"
