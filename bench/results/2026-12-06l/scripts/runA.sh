#!/usr/bin/env bash
# The development machine's build (scripts/gpu_prebuilt.sh bench_train kernel_trace test_data, carried in gpu-carry/):
# kernel traces of the BERT cases in bf16 and FP8 (graph replay; where the FP8 step's time goes), then goal 6's path
# choice with 32 hardware queues (the library's default): in memory, JPEG-fed with nvJPEG's default backend, and
# JPEG-fed with the hardware engines (KILN_NVJPEG_HARDWARE=1), alternated in rounds until STOP_AT seconds.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source scripts/gpu_env.sh >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "tree $(source_id)"
(python3 bench/make_photos.py /tmp/photos --count 2400 > $OUT/photos.log 2>&1) &
use_prebuilt bench_train kernel_trace test_data || { echo "no prebuilt binaries"; cat $OUT/summary.txt; exit 1; }
cat $OUT/summary.txt 2>/dev/null
bt=build/bench/bench_train; kt=$PWD/build/bench/libkernel_trace.so
if [[ -z ${NO_TRACE:-} ]]; then
  for size in base large; do
    KILN_KERNEL_TRACE_API=1 KILN_KERNEL_TRACE_SLOW_MS=50 KILN_KERNEL_TRACE_TOP=90 CUDA_INJECTION64_PATH=$kt timeout 120 $bt --case bert_${size}_128 --case bert_${size}_128_fp8 > $OUT/trace_$size.log 2>&1
    echo "traced bert_$size: exit $? $(grep -o '"case": "[a-z0-9_]*"\|"step_ms": [0-9.]*\|"trained": [a-z]*' $OUT/trace_$size.log | paste -sd' ') at $SECONDS s"
    grep "^kernel_trace range\|busy" $OUT/trace_$size.log | cut -c1-200
  done
fi
wait
fields='"step_ms": [0-9.]*\|"batch_wait_ms": [0-9.]*\|"loader_wait_ms": [0-9.]*\|"worker_collate_ms": [0-9.]*\|"trained": [a-z]*'
for r in ${ROUNDS:-1 2 3 4 5}; do
  [[ $SECONDS -gt ${STOP_AT:-420} ]] && { echo "stopped at $SECONDS s"; break; }
  timeout 60 $bt --case resnet50_bf16 > $OUT/inmem_$r.log 2>&1; echo "round $r in memory: exit $? $(grep -o '"step_ms": [0-9.]*\|"trained": [a-z]*' $OUT/inmem_$r.log | paste -sd' ') at $SECONDS s"
  timeout 80 $bt --photos /tmp/photos --case resnet50_jpeg_gpu > $OUT/jpeg_$r.log 2>&1; echo "round $r jpeg default: exit $? $(grep -o "$fields" $OUT/jpeg_$r.log | paste -sd' ') at $SECONDS s"
  KILN_NVJPEG_HARDWARE=1 timeout 80 $bt --photos /tmp/photos --case resnet50_jpeg_gpu > $OUT/jpeghw_$r.log 2>&1; echo "round $r jpeg engines: exit $? $(grep -o "$fields" $OUT/jpeghw_$r.log | paste -sd' ') at $SECONDS s"
done
if [[ -n ${API_TRACE:-} && $SECONDS -lt ${API_STOP_AT:-500} ]]; then
  KILN_KERNEL_TRACE_API=1 KILN_KERNEL_TRACE_SLOW_MS=5 CUDA_INJECTION64_PATH=$kt timeout 80 $bt --photos /tmp/photos --case resnet50_jpeg_gpu > $OUT/api_jpeg.log 2>&1
  echo "API-traced jpeg: exit $? $(grep -o "$fields" $OUT/api_jpeg.log | paste -sd' ') at $SECONDS s"
  grep -i "busy\|idle\|thread" $OUT/api_jpeg.log | head -20 | cut -c1-220
fi
cd $OUT && tar -czf logs_${TAG:-a}.tgz *.log && rm -f *.log; echo "total $SECONDS s"
