#!/usr/bin/env bash
# Next session, branch jpeg-priority-exp (check it out first; gpu-carry/prebuilt.tar.xz is its build of test_data,
# bench_train, bench_images: main + two experiments chosen by environment variables). Where the loader's time goes
# when ResNet-50 trains from JPEGs (worker_samples_ms, worker_collate_ms, new in main), and whether the decoder's
# stream at high priority (pri) or the engines without pipelining (nopipe) change it; "main" is the same library
# with both off, which is main's code. Two rounds while time lasts.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source scripts/gpu_env.sh >/dev/null 2>&1; use_prebuilt test_data bench_train bench_images || { echo "prebuilt binaries unusable"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 90 build/tests/test_data --gtest_filter='GpuDecode*:DataLoader.Stats*' > $OUT/test_data.log 2>&1; echo "test_data GpuDecode*, DataLoader.Stats*: exit $? ($(grep -c '  OK ' $OUT/test_data.log) ok)"; grep -A3 "Failure" $OUT/test_data.log | head -8
(python3 bench/make_photos.py /tmp/photos --count 2400 > $OUT/photos.log 2>&1); echo "photos at $SECONDS s: $(tail -1 $OUT/photos.log)"
timeout 60 build/bench/bench_train --case resnet50_bf16 > $OUT/inmem.log 2>&1; echo "in memory: $(grep -o '"step_ms": [0-9.]*' $OUT/inmem.log)"
fields='"step_ms": [0-9.]*\|"batch_wait_ms": [0-9.]*\|"batch_gpu_pending": [0-9.]*\|"feed_copy_ms": [0-9.]*\|"worker_samples_ms": [0-9.]*\|"worker_collate_ms": [0-9.]*\|"decoded_by": {[^}]*}\|"trained": [a-z]*'
for r in 1 2; do
  for v in main pri nopipe hw0 hw0pri; do
    [[ $SECONDS -gt 480 ]] && { echo "stopped at $SECONDS s"; break 2; }
    env=(KILN_EXP_COLLATE_TIMES=1 KILN_NVJPEG_HARDWARE=1)
    case $v in
      pri) env+=(KILN_EXP_DECODER_HIGH_PRIORITY=1) ;;
      nopipe) env+=(KILN_EXP_NVJPEG_NO_PIPELINE=1) ;;
      hw0) env=(KILN_EXP_COLLATE_TIMES=1 KILN_NVJPEG_HARDWARE=0) ;;
      hw0pri) env=(KILN_EXP_COLLATE_TIMES=1 KILN_NVJPEG_HARDWARE=0 KILN_EXP_DECODER_HIGH_PRIORITY=1) ;;
    esac
    env "${env[@]}" timeout 70 build/bench/bench_train --photos /tmp/photos --case resnet50_jpeg_gpu > $OUT/jpeg_${r}_$v.log 2>&1
    echo "round $r $v: exit $? $(grep -o "$fields" $OUT/jpeg_${r}_$v.log | paste -sd' ') at $SECONDS s"
    grep "exp_collate_ms_per_batch" $OUT/jpeg_${r}_$v.log | cut -c1-220
  done
done
cd $OUT && tar -czf jpeg_logs.tgz jpeg_*.log && rm jpeg_*.log; echo "total $SECONDS s"
