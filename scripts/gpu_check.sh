#!/usr/bin/env bash
# The whole GPU check, run on a machine with NVIDIA GPUs (see ../shared/GPU.md): configure and build
# natively, run every test (the conformance suite then also runs on cuda:0), run the GPU benchmarks
# beside PyTorch, and write full logs. Prints a short summary last.
#
#   scripts/gpu_check.sh                 logs go to $OUT when set (the GPU runner), else ./gpu-logs
#   KILN_GPU_CHECK_SKIP_BENCH=1 scripts/gpu_check.sh
#   KILN_GPU_CHECK_ONLY=dist scripts/gpu_check.sh    build, kiln-doctor, then only the multi-GPU part (below)
#   KILN_GPU_CHECK_ONLY=train scripts/gpu_check.sh   build, kiln-doctor, then only the performance harness
#                                                    (bench_train, pytorch_train.py, train_table.py)
#   KILN_GPU_CHECK_SKIP_EXAMPLES=1                   without scripts/gpu_examples.sh (the examples on one GPU)
#   KILN_GPU_CHECK_SKIP_MPI_TESTS=1 ...              the multi-GPU part without `ctest -L mpi`
#   (KILN_GPU_CHECK_SKIP_BENCH=1 also skips the multi-GPU benchmarks: the two switches split the part in two runs)
#
# With two or more GPUs (`nvidia-smi -L`) it also runs the multi-GPU part: the `mpi`-labelled tests (under
# mpirun, one at a time, after the others), bench_allreduce under `mpirun -np 2` (kiln's NCCL group beside
# plain NCCL), and the data-parallel scaling runs: bench_ddp and bench/pytorch_ddp.py each alone and under
# `mpirun -np 2`, then bench/ddp_scaling.py's table.
set -uo pipefail

only="${KILN_GPU_CHECK_ONLY:-}"
if [[ -n "$only" && "$only" != dist && "$only" != train ]]; then
  echo "gpu_check.sh: KILN_GPU_CHECK_ONLY takes 'dist' or 'train' (got '$only')" >&2; exit 2
fi
# shellcheck source=scripts/gpu_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"  # root, out, build, note; NVLink multicast off
jobs="$(nproc)"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/gpus.txt" 2>&1
note "GPUs: $(paste -sd';' "$out/gpus.txt")"
ngpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')

start=$SECONDS
if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  >"$out/configure.log" 2>&1; then
  note "configure FAILED"; tail -30 "$out/configure.log"; exit 1
fi
if ! cmake --build "$build" -j "$jobs" >"$out/build.log" 2>&1; then
  note "build FAILED"; grep -E "error|Error" "$out/build.log" | head -40; exit 1
fi
note "configure + build: $((SECONDS - start)) s"

status=0
# ---------------------------------------------------------------- the environment doctor
"$build/tools/doctor/kiln-doctor" >"$out/doctor.txt" 2>&1
doctor_rc=$?
"$build/tools/doctor/kiln-doctor" --json >"$out/doctor.json" 2>"$out/doctor_json.err"
note "kiln-doctor (exit $doctor_rc):"
tee -a "$summary" <"$out/doctor.txt"
[[ $doctor_rc -ne 0 ]] && status=1

# ---------------------------------------------------------------- the performance harness (KILN_GPU_CHECK_ONLY=train)
# The performance issue's cases through kiln, PyTorch eager and torch.compile in one run, then the table with
# the goals (bench/README.md). torch.compile's first steps take minutes: this part runs only when asked for.
if [[ "$only" == train ]]; then
  python3 bench/make_photos.py /tmp/kiln-photos --count 2400 >"$out/photos.log" 2>&1 && photos=(--photos /tmp/kiln-photos)
  timeout 1200 "$build/bench/bench_train" "${photos[@]}" >"$out/train_kiln.log" 2>&1 || note "bench_train: exit $?"
  PYTHONUNBUFFERED=1 timeout 2400 python3 bench/pytorch_train.py "${photos[@]}" >"$out/train_torch.log" 2>&1 ||
    note "pytorch_train.py: exit $?"
  python3 bench/train_table.py "$out/train_kiln.log" "$out/train_torch.log" | tee -a "$summary"
  exit $status
fi

# ---------------------------------------------------------------- single-GPU tests and benchmarks
if [[ -z "$only" ]]; then
  # Golden files that are too big to commit: torchvision/transformers weights and logits for io's pretrained tests.
  if python3 tests/golden/make_golden_pretrained.py "$build/pretrained" >"$out/pretrained.log" 2>&1; then
    export KILN_PRETRAINED_DIR="$root/$build/pretrained"
  else
    note "make_golden_pretrained.py failed (the PretrainedGolden tests skip): $(tail -1 "$out/pretrained.log")"
  fi

  # With two GPUs the mpirun tests run later, one at a time, in the multi-GPU part.
  ctest_filter=()
  [[ $ngpus -ge 2 ]] && ctest_filter=(-LE mpi)
  start=$SECONDS
  ctest --test-dir "$build" -j 8 --timeout 600 --output-on-failure "${ctest_filter[@]}" >"$out/ctest.log" 2>&1
  ctest_status=$?
  status=$ctest_status
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
    for b in "$build"/bench/bench_cuda_* "$build"/bench/bench_autograd "$build"/bench/bench_checkpoint_memory "$build"/bench/bench_attention "$build"/bench/bench_batch_norm "$build"/bench/bench_models "$build"/bench/bench_optim; do
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
      [[ -f "$p" && "$p" != bench/pytorch_ddp.py ]] || continue  # pytorch_ddp.py: in the multi-GPU part
      echo "== $p" >>"$out/bench.log"
      PYTHONUNBUFFERED=1 timeout 300 python3 "$p" >>"$out/bench.log" 2>&1 || echo "(exit $?)" >>"$out/bench.log"
    done
    note "benchmarks:"
    cat "$out/bench.log" | tee -a "$summary"
  fi
fi  # single-GPU part

# ---------------------------------------------------------------- the examples on one GPU
if [[ -z "$only" && -z "${KILN_GPU_CHECK_SKIP_EXAMPLES:-}" ]]; then
  note "examples:"
  scripts/gpu_examples.sh "$build" "$out" 2>&1 | tee -a "$summary"
fi

# ---------------------------------------------------------------- multi-GPU part (two GPUs, mpirun)
if [[ $ngpus -lt 2 ]]; then
  [[ -n "$only" ]] && note "multi-GPU part skipped: $ngpus GPU(s) visible"
elif ! command -v mpirun >/dev/null; then
  note "multi-GPU part skipped: no mpirun"; status=1
else
  note "multi-GPU part: $ngpus GPUs"
  nvidia-smi topo -m >"$out/topology.txt" 2>&1
  # mpirun as root (the GPU machine), also where CTest starts it with its own command line.
  if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
  export MASTER_PORT="${MASTER_PORT:-29517}" PYTHONUNBUFFERED=1
  # One process per GPU, not pinned to one core each (Open MPI binds to cores by default for -np <= 2); the
  # multicast switches reach every rank.
  mpi2=(mpirun --allow-run-as-root --bind-to none -np 2 -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST
        -x NVSHMEM_DISABLE_NVLS -x PYTHONUNBUFFERED -x MASTER_PORT)

  # (a) the distributed tests (each starts its own mpirun)
  if [[ -z "${KILN_GPU_CHECK_SKIP_MPI_TESTS:-}" ]]; then
    start=$SECONDS
    timeout -k 30 1800 ctest --test-dir "$build" -L mpi --timeout 600 --output-on-failure >"$out/ctest_mpi.log" 2>&1
    mpi_status=$?
    note "ctest -L mpi ($((SECONDS - start)) s): $(grep -E 'tests passed|tests failed|No tests were found' "$out/ctest_mpi.log" | tail -1)"
    if [[ $mpi_status -ne 0 ]]; then
      status=1
      [[ $mpi_status -eq 124 ]] && note "ctest -L mpi: timed out"
      grep -E '^\s+[0-9]+ - ' "$out/ctest_mpi.log" | grep -v Skipped | head -30 | tee -a "$summary"
    fi
  fi
  if [[ -n "${KILN_GPU_CHECK_SKIP_BENCH:-}" ]]; then
    exit $status
  fi

  # (b) all-reduce bandwidth: kiln's NCCL group beside plain NCCL
  timeout -k 20 300 "${mpi2[@]}" "$build/bench/bench_allreduce" >"$out/allreduce.log" 2>&1
  rc=$?
  note "all-reduce (mpirun -np 2 bench_allreduce$([[ $rc -ne 0 ]] && echo ", exit $rc")):"
  grep -E '^(bench_allreduce|in-place|allreduce )' "$out/allreduce.log" | tee -a "$summary"
  [[ $rc -ne 0 ]] && { tail -8 "$out/allreduce.log" | tee -a "$summary"; status=1; }

  # (c) data-parallel scaling: kiln and PyTorch DDP, each on 1 GPU alone and on 2 under mpirun
  ddp_run() {  # name command...
    local name=$1; shift
    echo "== $*" >"$out/$name.log"
    timeout -k 20 600 "$@" >>"$out/$name.log" 2>&1
    local rc=$?
    if [[ $rc -ne 0 ]]; then
      note "$name: exit $rc$([[ $rc -eq 124 ]] && echo " (timed out)"); the last lines of $name.log:"
      tail -6 "$out/$name.log" | tee -a "$summary"
      status=1
    fi
  }
  ddp_run ddp_kiln_1 "$build/bench/bench_ddp"
  ddp_run ddp_kiln_2 "${mpi2[@]}" "$build/bench/bench_ddp"
  ddp_run ddp_pytorch_1 python3 bench/pytorch_ddp.py
  ddp_run ddp_pytorch_2 "${mpi2[@]}" python3 bench/pytorch_ddp.py
  note "data-parallel steps:"
  cat "$out"/ddp_kiln_1.log "$out"/ddp_kiln_2.log "$out"/ddp_pytorch_1.log "$out"/ddp_pytorch_2.log |
    grep -E '^(kiln|torch) +(resnet50|bert-base) ' | tee -a "$summary"
  python3 bench/ddp_scaling.py "$out"/ddp_kiln_1.log "$out"/ddp_kiln_2.log "$out"/ddp_pytorch_1.log \
    "$out"/ddp_pytorch_2.log >"$out/ddp_scaling.txt" 2>&1
  note "$(cat "$out/ddp_scaling.txt")"
fi
pack_logs
exit $status
