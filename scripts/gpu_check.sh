#!/usr/bin/env bash
# The whole GPU check, run on a machine with NVIDIA GPUs (see ../shared/GPU.md): configure and build
# natively, run every test (the conformance suite then also runs on cuda:0), run the GPU benchmarks
# beside PyTorch, and write full logs. Prints a short summary last.
#
#   scripts/gpu_check.sh                 logs go to $OUT when set (the GPU runner), else ./gpu-logs
#   KILN_GPU_CHECK_SKIP_BENCH=1 scripts/gpu_check.sh
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${OUT:-$root/gpu-logs}"
mkdir -p "$out"
build="${KILN_GPU_BUILD_DIR:-build-gpu}"
jobs="$(nproc)"

# NVLink multicast stays off in every process (shared hosts: see GPU.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/gpus.txt" 2>&1
note "GPUs: $(paste -sd';' "$out/gpus.txt")"

start=$SECONDS
if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  >"$out/configure.log" 2>&1; then
  note "configure FAILED"; tail -30 "$out/configure.log"; exit 1
fi
if ! cmake --build "$build" -j "$jobs" >"$out/build.log" 2>&1; then
  note "build FAILED"; grep -E "error|Error" "$out/build.log" | head -40; exit 1
fi
note "configure + build: $((SECONDS - start)) s"

# Golden files that are too big to commit: torchvision/transformers weights and logits for io's pretrained tests.
if python3 tests/golden/make_golden_pretrained.py "$build/pretrained" >"$out/pretrained.log" 2>&1; then
  export KILN_PRETRAINED_DIR="$root/$build/pretrained"
else
  note "make_golden_pretrained.py failed (the PretrainedGolden tests skip): $(tail -1 "$out/pretrained.log")"
fi

start=$SECONDS
ctest --test-dir "$build" -j 8 --timeout 600 --output-on-failure >"$out/ctest.log" 2>&1
ctest_status=$?
note "ctest ($((SECONDS - start)) s): $(grep -E 'tests passed|tests failed' "$out/ctest.log" | tail -1)"
cuda_cases=$(grep -cE '/cuda0 \.+ +Passed' "$out/ctest.log")
cuda_skips=$(grep -cE '/cuda0 .*Skipped' "$out/ctest.log")
note "conformance cases on cuda:0 passed: $cuda_cases (skipped: $cuda_skips)"
if [[ $ctest_status -ne 0 ]]; then
  note "failed tests:"
  grep -E '^\s+[0-9]+ - ' "$out/ctest.log" | grep -v Skipped | head -60 | tee -a "$summary"
  # The first failure messages, for a quick look; the whole output is in ctest.log.
  grep -E 'Failure|error:|what\(\)|got .* expected' "$out/ctest.log" | head -40 >"$out/first_failures.txt"
fi

if [[ -z "${KILN_GPU_CHECK_SKIP_BENCH:-}" ]]; then
  : >"$out/bench.log"
  for b in "$build"/bench/bench_cuda_* "$build"/bench/bench_autograd "$build"/bench/bench_checkpoint_memory "$build"/bench/bench_attention "$build"/bench/bench_models "$build"/bench/bench_optim; do
    [[ -x "$b" ]] || continue
    echo "== $b" >>"$out/bench.log"
    timeout 300 "$b" >>"$out/bench.log" 2>&1 || echo "(exit $?)" >>"$out/bench.log"
  done
  # The input-pipeline benchmarks read a folder of JPEG photos cut from the sample photos of Python packages.
  if python3 bench/make_photos.py /tmp/kiln-photos --count 2400 >"$out/photos.log" 2>&1; then
    export KILN_BENCH_IMAGES=/tmp/kiln-photos
  fi
  for b in "$build"/bench/bench_images "$build"/bench/bench_data_loader; do
    [[ -x "$b" && -n "${KILN_BENCH_IMAGES:-}" ]] || continue
    echo "== $b" >>"$out/bench.log"
    timeout 300 "$b" --seconds 2 >>"$out/bench.log" 2>&1 || echo "(exit $?)" >>"$out/bench.log"
  done
  for p in bench/pytorch_*.py; do
    [[ -f "$p" ]] || continue
    echo "== $p" >>"$out/bench.log"
    PYTHONUNBUFFERED=1 timeout 300 python3 "$p" >>"$out/bench.log" 2>&1 || echo "(exit $?)" >>"$out/bench.log"
  done
  note "benchmarks:"
  cat "$out/bench.log" | tee -a "$summary"
fi
exit $ctest_status
