#!/usr/bin/env bash
# Branch jpeg-yuv-planes (next-verify + JPEG planes): the GPU decode tests (KernelConvertsJpegPlanes new), then
# test_data, bench_train, bench_images; gpu-carry/baseline.tar.xz is main's libkiln, gpu-carry/baseline.rev). The GPU decode tests
# (among them DamagedJpegsDecodeAsOnTheCpuOrAreNamed, rewritten, not yet run), then resnet50_jpeg_gpu with the
# engines and without, main's library against the branch's (nvJPEG's buffers from kiln's caching allocators),
# each line with batch_wait_ms and batch_gpu_pending (the branch's bench_train).
set -u
mkdir -p /tmp/focus_out
OUT=/tmp/focus_out KILN_FOCUS_TEST_TIMEOUT=120 KILN_FOCUS_TESTS="test_data=GpuDecode*" KILN_FOCUS_TARGETS="bench_train bench_images" scripts/gpu_focus.sh > /tmp/focus.log 2>&1
grep -E "GPU:|prebuilt binaries from" /tmp/focus.log | cut -c1-120 | head -3; grep -E "^test_" /tmp/focus.log | cut -c1-160 | head -4
grep -h "FAILED  \]" /tmp/focus_out/*.log | sort -u | head; grep -h -A4 "Failure" /tmp/focus_out/*.log | head -20
cp /tmp/focus_out/test_data.log $OUT/test_data.log 2>/dev/null
export LD_LIBRARY_PATH=$PWD/build/prebuilt-libs/use:${LD_LIBRARY_PATH:-}
KILN_NVJPEG_HARDWARE=0 timeout 60 build/tests/test_data --gtest_filter='GpuDecodeCuda.*' > $OUT/test_hw0.log 2>&1; echo "GpuDecodeCuda, engines off: exit $? ($(grep -c '  OK ' $OUT/test_hw0.log) ok)"
(python3 bench/make_photos.py /tmp/photos --count 2400 > /dev/null 2>&1); echo "photos at $SECONDS s"
base=$(mktemp -d); tar -xJf gpu-carry/baseline.tar.xz -C $base
LD_LIBRARY_PATH=$base/baseline:$LD_LIBRARY_PATH timeout 60 build/tests/test_data --gtest_filter='GpuDecodeCuda.NvjpegBuffers*' > $OUT/test_alloc_main.log 2>&1; echo "the allocator test on main's library (should fail there): exit $?"; grep -A2 "Failure" $OUT/test_alloc_main.log | head -4
timeout 60 build/bench/bench_train --case resnet50_bf16 > $OUT/inmem.log 2>&1; echo "in memory: $(grep -o '"step_ms": [0-9.]*' $OUT/inmem.log)"
for r in 1 2; do
  [[ $r == 2 && $SECONDS -gt 380 ]] && { echo "round 2 skipped at $SECONDS s"; break; }
  for hw in 1 0; do
    for lib in base new; do
      [[ $lib == base ]] && L=$base/baseline:$LD_LIBRARY_PATH || L=$LD_LIBRARY_PATH
      LD_LIBRARY_PATH=$L KILN_NVJPEG_HARDWARE=$hw timeout 70 build/bench/bench_train --photos /tmp/photos --case resnet50_jpeg_gpu > $OUT/jpeg_${r}_hw${hw}_$lib.log 2>&1
      echo "round $r hw=$hw $lib: exit $? $(grep -o '"step_ms": [0-9.]*\|"eager_step_ms": [0-9.]*\|"batch_wait_ms": [0-9.]*\|"batch_gpu_pending": [0-9.]*\|"feed_copy_ms": [0-9.]*\|"decoded_by": {[^}]*}\|"trained": [a-z]*' $OUT/jpeg_${r}_hw${hw}_$lib.log | paste -sd' ') at $SECONDS s"
    done
  done
done
cd $OUT && tar -czf jpeg_logs.tgz jpeg_*.log && rm jpeg_*.log; echo "total $SECONDS s"
