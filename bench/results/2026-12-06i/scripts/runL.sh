#!/usr/bin/env bash
# Branch loader-lookahead (main + the DataLoader's look-ahead through several short epochs): the tests, then
# resnet50_jpeg_gpu with main's library (gpu-carry/base_lib, through LD_LIBRARY_PATH) and the branch's, alternated.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source scripts/gpu_env.sh >/dev/null 2>&1; use_prebuilt bench_train test_data || { echo "prebuilt binaries unusable"; exit 1; }
mkdir -p /tmp/base && xz -dc gpu-carry/base_lib/libkiln.so.0.1.xz > /tmp/base/libkiln.so.0.1 && echo "base library: main $(cat gpu-carry/base_lib/rev)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "libkiln: branch $(ldd build/bench/bench_train | grep -o "libkiln[^ ]* => [^ ]*"); base $(LD_LIBRARY_PATH=/tmp/base:$LD_LIBRARY_PATH ldd build/bench/bench_train | grep -o "libkiln[^ ]* => [^ ]*")"
timeout 100 build/tests/test_data --gtest_filter='DataLoader*:GpuDecodeCuda.LoaderBatches*' > $OUT/test_data.log 2>&1; echo "test_data DataLoader*, LoaderBatches*: exit $? ($(grep -c '  OK ' $OUT/test_data.log) ok) at $SECONDS s"; grep -A3 "Failure" $OUT/test_data.log | head -8
(python3 bench/make_photos.py /tmp/photos --count 2400 > $OUT/photos.log 2>&1); echo "photos at $SECONDS s: $(tail -1 $OUT/photos.log)"
timeout 60 build/bench/bench_train --case resnet50_bf16 > $OUT/inmem.log 2>&1; echo "in memory: $(grep -o '"step_ms": [0-9.]*\|"trained": [a-z]*' $OUT/inmem.log | paste -sd' ')"
fields='"step_ms": [0-9.]*\|"batch_wait_ms": [0-9.]*\|"worker_collate_ms": [0-9.]*\|"decoded_by": {[^}]*}\|"trained": [a-z]*'
for r in 1 2; do
  for v in base_hw1 new_hw1 new_hw0; do
    [[ $SECONDS -gt 230 ]] && { echo "stopped at $SECONDS s"; break 2; }
    hw=${v#*_hw}
    lib=""; [[ $v == base* ]] && lib=/tmp/base:
    LD_LIBRARY_PATH="$lib$LD_LIBRARY_PATH" KILN_NVJPEG_HARDWARE=$hw timeout 80 build/bench/bench_train --photos /tmp/photos --case resnet50_jpeg_gpu > $OUT/jpeg_${r}_$v.log 2>&1
    echo "round $r $v: exit $? $(grep -o "$fields" $OUT/jpeg_${r}_$v.log | paste -sd' ') at $SECONDS s"
  done
done
timeout 60 build/bench/bench_train --case resnet50_bf16 > $OUT/inmem2.log 2>&1; echo "in memory again: $(grep -o '"step_ms": [0-9.]*\|"trained": [a-z]*' $OUT/inmem2.log | paste -sd' ')"
cd $OUT && tar -czf jpeg_logs.tgz jpeg_*.log && rm jpeg_*.log; echo "total $SECONDS s"
