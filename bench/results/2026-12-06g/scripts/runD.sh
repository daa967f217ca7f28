#!/usr/bin/env bash
# Issue 34, goal 6: which JPEG path wins. Branch gpu-decode-counts (data::gpu_decode_counts). The GPU decode tests
# (with and without the engines), decode throughput alone (bench_images --gpu), then ResNet-50 in memory and fed by
# GPU decoding, with the JPEG engines and with the CUDA decoder only.
set -u
mkdir -p /tmp/focus_out
OUT=/tmp/focus_out KILN_FOCUS_TEST_TIMEOUT=120 KILN_FOCUS_TESTS="test_data=GpuDecode*" KILN_FOCUS_TARGETS="bench_train bench_images" scripts/gpu_focus.sh > /tmp/focus.log 2>&1
grep -E "GPU:|prebuilt binaries from" /tmp/focus.log | cut -c1-120 | head -3; grep -E "^test_" /tmp/focus.log | cut -c1-160 | head -4
grep -h "FAILED  \]" /tmp/focus_out/*.log | sort -u | head; grep -h -A4 "Failure" /tmp/focus_out/*.log | head -20
cp /tmp/focus_out/test_data.log $OUT/test_data.log 2>/dev/null
export LD_LIBRARY_PATH=$PWD/build/prebuilt-libs/use:${LD_LIBRARY_PATH:-}
KILN_NVJPEG_HARDWARE=0 timeout 60 build/tests/test_data --gtest_filter='GpuDecodeCuda.Counts*' > $OUT/test_counts_hw0.log 2>&1; echo "counts test, engines off: exit $? ($(grep -c OK $OUT/test_counts_hw0.log) ok)"
echo "at $SECONDS s"
(python3 bench/make_photos.py /tmp/photos --count 2400 > $OUT/photos.log 2>&1); echo "photos exit $? at $SECONDS s: $(find /tmp/photos -name '*.jpg' | wc -l) files, $(du -sh /tmp/photos | cut -f1)"
for hw in 1 0; do
  KILN_NVJPEG_HARDWARE=$hw timeout 60 build/bench/bench_images /tmp/photos --gpu --threads 1,4,16 --seconds 3 > $OUT/images_hw$hw.log 2>&1
  echo "bench_images hw=$hw exit $?"; grep -o '"threads": [0-9]*\|"images_per_s": [0-9.]*\|"decoded_by": {[^}]*}' $OUT/images_hw$hw.log | paste -sd' ' | sed 's/"threads"/\n"threads"/g'
done
echo "at $SECONDS s"
timeout 120 build/bench/bench_train --photos /tmp/photos --case resnet50_bf16 --case resnet50_jpeg_gpu > $OUT/train_hw1.log 2>&1; echo "bench_train hw=1 exit $? at $SECONDS s"
KILN_NVJPEG_HARDWARE=0 timeout 90 build/bench/bench_train --photos /tmp/photos --case resnet50_jpeg_gpu > $OUT/train_hw0.log 2>&1; echo "bench_train hw=0 exit $? at $SECONDS s"
grep -h -o '"case": "[a-z0-9_]*"\|"step_ms": [0-9.]*\|"eager_step_ms": [0-9.]*\|"throughput": [0-9.]*\|"trained": [a-z]*\|"decoded_by": {[^}]*}\|"error": "[^"]*"' $OUT/train_hw1.log $OUT/train_hw0.log | paste -sd' ' | sed 's/"case"/\n"case"/g'
echo "total $SECONDS s"
