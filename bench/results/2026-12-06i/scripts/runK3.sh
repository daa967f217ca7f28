#!/usr/bin/env bash
# Branch jpeg-priority-exp: per-batch wall/CPU time of the decode's parts after warm-up, nvJPEG's allocations,
# cores busy during the timed block; device schedule flags (blocking sync, yield) and 8 workers as variants.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source scripts/gpu_env.sh >/dev/null 2>&1; use_prebuilt bench_train || { echo "prebuilt binaries unusable"; exit 1; }
nvidia-smi --query-gpu=name --format=csv,noheader; nproc
(python3 bench/make_photos.py /tmp/photos --count 2400 > $OUT/photos.log 2>&1); echo "photos at $SECONDS s"
timeout 60 build/bench/bench_train --case resnet50_bf16 > $OUT/inmem.log 2>&1; echo "in memory: $(grep -o '"step_ms": [0-9.]*' $OUT/inmem.log) $(grep exp_timed $OUT/inmem.log | tail -1)"
fields='"step_ms": [0-9.]*\|"batch_wait_ms": [0-9.]*\|"worker_samples_ms": [0-9.]*\|"worker_collate_ms": [0-9.]*\|"trained": [a-z]*'
for r in 1 2; do
  for v in hw1 block w8 hw0 hw0block yield; do
    [[ $SECONDS -gt 430 ]] && { echo "stopped at $SECONDS s"; break 2; }
    env=(KILN_EXP_COLLATE_TIMES=1 KILN_EXP_COUNT_ALLOC=1 KILN_NVJPEG_HARDWARE=1)
    case $v in
      block) env+=(KILN_EXP_BLOCKING_SYNC=1) ;;
      yield) env+=(KILN_EXP_YIELD=1) ;;
      w8) env+=(KILN_EXP_WORKERS=8) ;;
      hw0) env=(KILN_EXP_COLLATE_TIMES=1 KILN_EXP_COUNT_ALLOC=1 KILN_NVJPEG_HARDWARE=0) ;;
      hw0block) env=(KILN_EXP_COLLATE_TIMES=1 KILN_EXP_COUNT_ALLOC=1 KILN_NVJPEG_HARDWARE=0 KILN_EXP_BLOCKING_SYNC=1) ;;
    esac
    env "${env[@]}" timeout 70 build/bench/bench_train --photos /tmp/photos --case resnet50_jpeg_gpu > $OUT/jpeg_${r}_$v.log 2>&1
    echo "== round $r $v: exit $? $(grep -o "$fields" $OUT/jpeg_${r}_$v.log | paste -sd' ') at $SECONDS s"
    grep "^exp" $OUT/jpeg_${r}_$v.log | cut -c1-400
  done
done
cd $OUT && tar -czf jpeg_logs.tgz jpeg_*.log && rm jpeg_*.log; echo "total $SECONDS s"
