#!/usr/bin/env bash
# Branch gpu-decode-counts with the marker walk: the GPU decode tests, then resnet50_jpeg_gpu under kernel_trace
# with the JPEG engines and with the CUDA decoder (which kernels run in the timed steps, and how busy the GPU is).
set -u
mkdir -p /tmp/focus_out
OUT=/tmp/focus_out KILN_FOCUS_TEST_TIMEOUT=120 KILN_FOCUS_TESTS="test_data=GpuDecode*" KILN_FOCUS_TARGETS="bench_train" scripts/gpu_focus.sh > /tmp/focus.log 2>&1
grep -E "GPU:|prebuilt binaries from" /tmp/focus.log | cut -c1-120 | head -3; grep -E "^test_" /tmp/focus.log | cut -c1-160 | head -4
grep -h "FAILED  \]" /tmp/focus_out/*.log | sort -u | head; grep -h -A4 "Failure" /tmp/focus_out/*.log | head -20
cp /tmp/focus_out/test_data.log $OUT/test_data.log 2>/dev/null
export LD_LIBRARY_PATH=$PWD/build/prebuilt-libs/use:${LD_LIBRARY_PATH:-}
KILN_NVJPEG_HARDWARE=0 timeout 60 build/tests/test_data --gtest_filter='GpuDecodeCuda.*' > $OUT/test_hw0.log 2>&1; echo "GpuDecodeCuda, engines off: exit $? ($(grep -c '  OK ' $OUT/test_hw0.log) ok)"
(python3 bench/make_photos.py /tmp/photos --count 2400 > /dev/null 2>&1); echo "photos at $SECONDS s"
for hw in 1 0; do
  KILN_NVJPEG_HARDWARE=$hw CUDA_INJECTION64_PATH=$PWD/gpu-carry/exp/libkernel_trace.so KILN_KERNEL_TRACE_TOP=40 timeout 75 build/bench/bench_train --photos /tmp/photos --case resnet50_jpeg_gpu > $OUT/trace_hw$hw.log 2>&1
  echo "hw=$hw exit $? at $SECONDS s"; grep -o '"step_ms": [0-9.]*\|"eager_step_ms": [0-9.]*\|"decoded_by": {[^}]*}' $OUT/trace_hw$hw.log | paste -sd' '; grep "kernel_trace range" $OUT/trace_hw$hw.log | cut -c1-200
done
echo "total $SECONDS s"
