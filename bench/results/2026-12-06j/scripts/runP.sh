#!/usr/bin/env bash
# nvJPEG buffer padding (4 MiB): GpuDecodeCuda tests, then resnet50_jpeg_gpu alternating main's library
# (gpu-carry/base_lib, LD_LIBRARY_PATH) and the change's, with one in-memory run for the ratio.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source scripts/gpu_env.sh >/dev/null 2>&1; use_prebuilt bench_train test_data || { echo "prebuilt binaries unusable"; exit 1; }
mkdir -p /tmp/base && xz -dc gpu-carry/base_lib/libkiln.so.0.1.xz > /tmp/base/libkiln.so.0.1 && echo "base library: $(cat gpu-carry/base_lib/rev)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(python3 bench/make_photos.py /tmp/photos --count 2400 > $OUT/photos.log 2>&1) & 
timeout 40 build/tests/test_data --gtest_filter='GpuDecodeCuda*' > $OUT/test_data.log 2>&1; echo "test_data GpuDecodeCuda*: exit $? ($(grep -c '^\[       OK ' $OUT/test_data.log) ok) at $SECONDS s"; grep -E '^\[  FAILED ' $OUT/test_data.log | head -5
wait
timeout 50 build/bench/bench_train --case resnet50_bf16 > $OUT/inmem.log 2>&1; echo "in memory: $(grep -o '"step_ms": [0-9.]*\|"trained": [a-z]*' $OUT/inmem.log | paste -sd' ') at $SECONDS s"
fields='"step_ms": [0-9.]*\|"batch_wait_ms": [0-9.]*\|"feed_copy_ms": [0-9.]*\|"worker_collate_ms": [0-9.]*\|"trained": [a-z]*'
for v in new base new base new base; do
  [[ $SECONDS -gt 225 ]] && { echo "stopped at $SECONDS s"; break; }
  lib=""; [[ $v == base ]] && lib=/tmp/base:
  log=$OUT/jpeg_${SECONDS}_$v.log
  LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:-}" timeout 60 build/bench/bench_train --photos /tmp/photos --case resnet50_jpeg_gpu > $log 2>&1
  echo "$v: exit $? $(grep -o "$fields" $log | paste -sd' ') at $SECONDS s"
done
cd $OUT && tar -czf logs.tgz *.log && rm -f *.log; echo "total $SECONDS s"
