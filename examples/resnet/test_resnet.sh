#!/usr/bin/env bash
# examples/resnet/test_resnet.sh MODE RESNET WORKDIR [LAUNCHER...] — what CTest runs for the ResNet example
# (examples/resnet/CMakeLists.txt). Tiny settings, so that each mode takes seconds on a 2-core CPU.
#
#   smoke      a few steps on synthetic data (--device auto: the GPU where there is one); checks the CSV files,
#              and that --export-onnx writes the model (ONNX Runtime runs exported models in tests/io/onnx_models.cpp)
#   resume     exact resume: an uninterrupted 6-step run (2 epochs of 3 steps) against one killed after step 2,
#              resumed and killed after step 5, and resumed again (mid-epoch, then across the epoch boundary, then
#              mid-epoch); the final weight checksum, loss and metrics.csv must be equal to the last digit (CPU);
#              once with one micro-batch per step, once with gradient accumulation. With --tensorboard: one event
#              file per process, and train_log.csv holds each step once (the rows of the steps after a
#              checkpoint, which the resumed run redoes, dropped)
#   grad_checkpoint  --grad-checkpoint gives the same weights as without (CPU: the same bits)
#   cifar      --make-fake-cifar10 files, then training on them through the CIFAR-10 reader
#   folder     an ImageNet-layout folder of generated PNGs (needs python3; exit 77, skipped, without it)
#   folder_gpu the same folder with --decode gpu --amp bf16 --channels-last (exit 77, skipped, without a GPU); in a
#              kiln without nvJPEG the run must stop before training, saying to use --decode cpu
#   graph      --cuda-graph on the GPU (exit 77, skipped, without one): 2 epochs of 6 steps (bf16, channels-last,
#              --deterministic, checkpoints and evaluation between replays) eagerly and with the step captured at
#              step 3 and replayed; the per-step losses and the weights must agree within 2e-3 relative (see the
#              case), the learning rates exactly. Then the graphed run killed after step 5 and resumed, which
#              captures again (at step 7), must end where the uninterrupted graphed run ends
#   bad_input  wrong options and missing data give a message naming the problem and a non-zero exit
#   damaged_checkpoints  --resume with the newest checkpoint damaged names it and continues from the older one
#              (keeping the damaged file aside); with every checkpoint damaged it exits non-zero and changes nothing
#   mpi        LAUNCHER (mpirun -np 2 ...) on the CPU, with SyncBatchNorm: a data-parallel run killed after step 2
#              and resumed ends with the weights of an uninterrupted one
set -euo pipefail
mode=$1
exe=$2
work=$3
shift 3
rm -rf "$work"
mkdir -p "$work"

tiny=(--model resnet18 --dataset synthetic --image-size 16 --batch-size 4 --synthetic-size 64
      --synthetic-eval-size 16 --workers 1 --log-every 1 --seed 3)

fail() {
  echo "FAILED: $*" >&2
  exit 1
}
# rows of a CSV file without its header
rows() { echo $(($(wc -l <"$1") - 1)); }

# png_folder DIR: an image folder in ImageNet's layout, 3 classes of small PNGs of varied sizes (8 train, 2 val
# each), written by Python's zlib; exits 77 (skipped) without python3
png_folder() {
  command -v python3 >/dev/null || { echo "python3 not found: skipped"; exit 77; }
  python3 - "$1" <<'PY'
import os, random, struct, sys, zlib
def png(path, w, h, pixels):
    rows = b"".join(b"\0" + bytes(pixels[y * w * 3:(y + 1) * w * 3]) for y in range(h))
    chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
                chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
random.seed(0)
for split, n in (("train", 8), ("val", 2)):
    for name, colour in (("cat", (200, 50, 50)), ("dog", (50, 50, 200)), ("fox", (50, 200, 50))):
        os.makedirs(f"{sys.argv[1]}/{split}/{name}", exist_ok=True)
        for i in range(n):
            w, h = random.randint(40, 80), random.randint(40, 80)
            pixels = [max(0, min(255, c + random.randint(-40, 40))) for _ in range(w * h) for c in colour]
            png(f"{sys.argv[1]}/{split}/{name}/{i}.png", w, h, pixels)
PY
}

case "$mode" in
smoke)
  "$exe" "${tiny[@]}" --batch-size 8 --epochs 2 --steps-per-epoch 3 --output "$work/run" \
    --export-onnx "$work/resnet.onnx" | tee "$work/out.txt"
  [[ $(rows "$work/run/metrics.csv") == 2 ]] || fail "metrics.csv should hold one row per epoch (2)"
  [[ $(rows "$work/run/train_log.csv") == 6 ]] || fail "train_log.csv should hold one row per step (6)"
  ls "$work/run"/ckpt-*.h5 >/dev/null || fail "no checkpoint written"
  grep -q "epoch 2 done" "$work/out.txt" || fail "no end-of-epoch line"
  [[ -s "$work/resnet.onnx" ]] || fail "--export-onnx wrote no $work/resnet.onnx (or an empty one)"
  grep -q "^exported $work/resnet.onnx: [0-9]* ONNX nodes, [0-9]* bytes" "$work/out.txt" || fail "no export line"
  ;;

resume)
  # resume_case NAME ARGS...: the uninterrupted run against the interrupted and twice resumed one
  resume_case() {
    local dir=$work/$1
    shift
    local run=(--device cpu "${tiny[@]}" --epochs 2 --steps-per-epoch 3 --checkpoint-every 2 --print-checksum "$@")
    "$exe" "${run[@]}" --output "$dir/straight" --tensorboard "$dir/straight/tb" | tee "$dir.straight.txt"
    "$exe" "${run[@]}" --output "$dir/resumed" --tensorboard "$dir/resumed/tb" --stop-at-step 2 | tee "$dir.part1.txt"
    "$exe" "${run[@]}" --output "$dir/resumed" --tensorboard "$dir/resumed/tb" --stop-at-step 5 --resume |
      tee "$dir.part2.txt"
    "$exe" "${run[@]}" --output "$dir/resumed" --tensorboard "$dir/resumed/tb" --resume | tee "$dir.part3.txt"
    grep -q "resumed from .*ckpt-00000002.h5: step 2, epoch 1" "$dir.part2.txt" || fail "part 2 did not resume at step 2"
    grep -q "resumed from .*ckpt-00000004.h5: step 4, epoch 2" "$dir.part3.txt" || fail "part 3 did not resume at step 4"
    local want got
    want=$(grep '^checksum' "$dir.straight.txt")
    got=$(grep '^checksum' "$dir.part3.txt")
    echo "uninterrupted: $want"
    echo "resumed:       $got"
    [[ -n "$want" && "$want" == "$got" ]] || fail "the resumed run ends with other weights than the uninterrupted one"
    # one row per epoch, equal to the uninterrupted run's but for the times (the last three columns)
    [[ $(rows "$dir/resumed/metrics.csv") == 2 ]] || fail "metrics.csv of the resumed run should hold 2 epoch rows"
    [[ $(cut -d, -f1-7 "$dir/straight/metrics.csv") == $(cut -d, -f1-7 "$dir/resumed/metrics.csv") ]] ||
      fail "metrics.csv rows differ: $(cat "$dir/straight/metrics.csv" "$dir/resumed/metrics.csv")"
    # part 2 logged step 5 after its checkpoint of step 4; part 3 redid it: its row replaced part 2's
    [[ $(cut -d, -f1-4 "$dir/straight/train_log.csv") == $(cut -d, -f1-4 "$dir/resumed/train_log.csv") ]] ||
      fail "train_log.csv rows (epoch, step, loss, lr) differ: $(cat "$dir/straight/train_log.csv" "$dir/resumed/train_log.csv")"
    local events
    events=$(find "$dir/straight/tb" -name 'events.out.tfevents.*' -size +0 | wc -l)
    [[ $events == 1 ]] || fail "--tensorboard: $events event files in $dir/straight/tb, expected 1"
    events=$(find "$dir/resumed/tb" -name 'events.out.tfevents.*' -size +0 | wc -l)
    [[ $events == 3 ]] || fail "--tensorboard: $events event files in $dir/resumed/tb, expected 3 (one per run)"
  }
  resume_case plain
  grep -q "epoch 1 batch 2" "$work/plain.part2.txt" || fail "plain: not resumed mid-epoch"
  # micro-batches of 2, two per step: the loader position counts micro-batches
  resume_case accumulate --batch-size 2 --accumulate 2
  grep -q "epoch 2 batch 2" "$work/accumulate.part3.txt" || fail "accumulate: not resumed at micro-batch 2"
  # a folder that holds checkpoints is not overwritten without --resume
  if "$exe" --device cpu "${tiny[@]}" --output "$work/plain/resumed" 2>"$work/refused.txt"; then
    fail "reused a checkpoint folder without --resume"
  fi
  grep -q "pass --resume" "$work/refused.txt" || fail "no hint to pass --resume"
  ;;

grad_checkpoint)
  # recomputing each stage in backward changes neither the gradients nor the BatchNorm statistics (CPU: bits)
  run=(--device cpu "${tiny[@]}" --epochs 1 --steps-per-epoch 3 --print-checksum)
  "$exe" "${run[@]}" --output "$work/plain" | tee "$work/plain.txt"
  "$exe" "${run[@]}" --output "$work/checkpointed" --grad-checkpoint | tee "$work/checkpointed.txt"
  want=$(grep '^checksum' "$work/plain.txt")
  got=$(grep '^checksum' "$work/checkpointed.txt")
  [[ -n "$want" && "$want" == "$got" ]] || fail "--grad-checkpoint changed the result: $want vs $got"
  ;;

cifar)
  "$exe" --make-fake-cifar10 "$work/fake" --fake-images-per-file 20
  for f in data_batch_1 data_batch_2 data_batch_3 data_batch_4 data_batch_5 test_batch; do
    [[ $(stat -c %s "$work/fake/$f.bin") == $((20 * 3073)) ]] || fail "$f.bin has the wrong size"
  done
  "$exe" --device cpu --dataset cifar10 --data "$work/fake" --batch-size 4 --epochs 1 --steps-per-epoch 2 \
    --eval-steps 2 --workers 1 --log-every 1 --output "$work/run" | tee "$work/out.txt"
  grep -q "cifar10: 100 train, 20 eval samples, 10 classes" "$work/out.txt" || fail "the fake files were not read"
  [[ $(rows "$work/run/metrics.csv") == 1 ]] || fail "metrics.csv should hold one row"
  ;;

folder)
  png_folder "$work/data"
  "$exe" --device cpu --dataset folder --data "$work/data" --image-size 64 --batch-size 4 --epochs 1 \
    --steps-per-epoch 2 --workers 2 --log-every 1 --output "$work/run" | tee "$work/out.txt"
  grep -q "folder: 24 train, 6 eval samples, 3 classes" "$work/out.txt" || fail "the image folder was not read"
  grep -q "(6 samples)" "$work/out.txt" || fail "not the whole val/ folder evaluated"
  rm -r "$work/data/val/fox"
  if "$exe" --device cpu --dataset folder --data "$work/data" --output "$work/bad" 2>"$work/err.txt"; then
    fail "train/ and val/ with different classes were accepted"
  fi
  grep -q "both need the same class folders" "$work/err.txt" || fail "no message on different class folders"
  ;;

folder_gpu)
  png_folder "$work/data"
  set +e
  "$exe" --dataset folder --data "$work/data" --decode gpu --amp bf16 --channels-last --image-size 64 \
    --batch-size 4 --epochs 1 --steps-per-epoch 2 --workers 2 --log-every 1 --output "$work/run" \
    >"$work/out.txt" 2>"$work/err.txt"
  code=$?
  set -e
  cat "$work/out.txt" "$work/err.txt"
  if grep -q "needs a GPU, and none is visible" "$work/err.txt"; then
    echo "no GPU visible: skipped"
    exit 77
  fi
  if grep -q "^resnet: --decode gpu: decoding the first training image on the GPU failed" "$work/err.txt"; then
    # a kiln without nvJPEG (or libnvjpeg not found): stopped before training, with the way out
    [[ $code == 2 ]] || fail "exit code $code, not 2, without nvJPEG"
    grep -q "decode cpu" "$work/err.txt" || fail "no hint to use --decode cpu"
    ! grep -q "^epoch 1 step" "$work/out.txt" || fail "training started although the GPU cannot decode"
  else
    [[ $code == 0 ]] || fail "--decode gpu run exited with $code"
    grep -q "images decoded on the GPU (nvJPEG) into bfloat16 channels-last batches" "$work/out.txt" ||
      fail "no line saying the images are decoded on the GPU"
    grep -q "(6 samples)" "$work/out.txt" || fail "not the whole val/ folder evaluated"
  fi
  ;;

bad_input)
  # expect EXIT_CODE TEXT -- ARGS: the program fails with that code and says TEXT on stderr
  expect() {
    local code=$1 text=$2
    shift 3
    set +e
    "$exe" "$@" >/dev/null 2>"$work/err.txt"
    local got=$?
    set -e
    [[ $got == "$code" ]] || fail "resnet $* exited with $got, not $code"
    grep -q -- "$text" "$work/err.txt" || fail "resnet $*: stderr lacks '$text': $(cat "$work/err.txt")"
  }
  expect 2 "resnet19 is not known; use one of resnet18" -- --model resnet19
  expect 2 "unknown option --bogus" -- --bogus 1
  expect 2 "takes an integer, got 'many'" -- --epochs many
  expect 2 "needs --data DIR" -- --dataset cifar10
  expect 2 "no such folder" -- --dataset cifar10 --data "$work/missing"
  mkdir -p "$work/empty"
  expect 2 "cannot read --dataset cifar10 from" -- --dataset cifar10 --data "$work/empty"
  expect 2 "has no train/ folder" -- --dataset folder --data "$work/empty"
  expect 2 "--amp fp32 is not known" -- --amp fp32
  expect 2 "--decode jpeg is not known; use one of cpu, gpu" -- --decode jpeg
  expect 2 "--decode gpu decodes the JPEGs of --dataset folder; --dataset synthetic has no images" -- --decode gpu
  expect 2 "--dataset cifar10 is read from binary files: leave out --decode" -- \
    --dataset cifar10 --data "$work/empty" --decode gpu
  expect 2 "--decode gpu needs a GPU, and this run is on the CPU (--device cpu); use --decode cpu" -- \
    --device cpu --dataset folder --data "$work/empty" --decode gpu
  expect 2 "--lr-steps takes positive epochs" -- --schedule step --lr-steps 3,x
  expect 2 "fewer than one optimizer step" -- --device cpu "${tiny[@]}" --synthetic-size 3
  expect 2 "--profile takes WAIT,WARMUP,ACTIVE" -- --device cpu "${tiny[@]}" --profile 1,2
  # --cuda-graph: what a captured step cannot do, refused before anything is loaded
  expect 2 "--cuda-graph needs a GPU, and this run is on the CPU (--device cpu)" -- --device cpu --cuda-graph
  CUDA_VISIBLE_DEVICES="" expect 2 "--cuda-graph needs a GPU, and none is visible" -- "${tiny[@]}" --cuda-graph \
    --output "$work/graph_no_gpu"
  expect 2 "it does not take --accumulate 2" -- --cuda-graph --accumulate 2
  expect 2 "--cuda-graph does not take --grad-checkpoint" -- --cuda-graph --grad-checkpoint
  expect 2 "--cuda-graph does not take --profile" -- --cuda-graph --profile 1,1,2
  KILN_CUDA_SYNC_INDEX_CHECKS=1 expect 2 "--cuda-graph does not work with KILN_CUDA_SYNC_INDEX_CHECKS=1" -- \
    --cuda-graph
  expect 2 "--lr: takes a finite number, got 'nan'" -- --lr nan
  expect 2 "--lr: takes a finite number, got 'inf'" -- --lr inf
  expect 2 "--lr: takes a finite number, got '1e-4x'" -- --lr 1e-4x
  expect 2 "--lr must be positive" -- --lr -0.1
  expect 2 "--momentum must be >= 0" -- --momentum -0.9
  expect 2 "--weight-decay must be >= 0" -- --weight-decay -1e-4
  # What the option parser (CLI11) refuses, each naming the option
  expect 2 "--epochs: takes an integer, got '1.5'" -- --epochs 1.5
  expect 2 "--epochs: takes an integer, got '99999999999999999999', which is too large" -- --epochs 99999999999999999999
  expect 2 "--epochs: 1 required INT missing" -- --epochs
  expect 2 "unexpected argument 'extra'" -- extra
  expect 2 "unknown option -x" -- -x
  echo "bad input: every case gave its message"
  ;;
damaged_checkpoints)
  # A damaged checkpoint is never passed over in silence nor overwritten. Checkpoints of steps 2, 3 (the end of
  # epoch 1) and 4; then:
  run=(--device cpu "${tiny[@]}" --epochs 2 --steps-per-epoch 3 --checkpoint-every 2)
  "$exe" "${run[@]}" --output "$work/run" --stop-at-step 4 >/dev/null
  [[ -f "$work/run/ckpt-00000002.h5" && -f "$work/run/ckpt-00000004.h5" ]] || fail "no checkpoints of steps 2 and 4"
  # (1) the newest damaged (one byte flipped mid-file): --resume names it and why, and continues from step 3; its
  # save of step 4 moves the damaged file aside (byte for byte) instead of overwriting it
  python3 - "$work/run/ckpt-00000004.h5" <<'PY' || { echo "python3 is needed: skipped"; exit 77; }
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[len(b) // 2] ^= 0x10
open(p, "wb").write(bytes(b))
PY
  cp "$work/run/ckpt-00000004.h5" "$work/damaged4.h5"
  "$exe" "${run[@]}" --output "$work/run" --resume --stop-at-step 5 >"$work/out1.txt" 2>"$work/err1.txt" ||
    fail "--resume with the newest checkpoint damaged failed: $(cat "$work/err1.txt")"
  grep -q "skipped the checkpoint .*ckpt-00000004.h5 (.*crc32" "$work/err1.txt" ||
    fail "--resume did not name the damaged checkpoint and why: $(cat "$work/err1.txt")"
  grep -q "resumed from .*ckpt-00000003.h5: step 3" "$work/out1.txt" || fail "did not resume from step 3"
  cmp -s "$work/damaged4.h5" "$work/run/ckpt-00000004.h5.damaged" ||
    fail "the damaged checkpoint of step 4 was not kept aside as ckpt-00000004.h5.damaged"
  # (2) every checkpoint damaged (one truncated, one garbage): --resume, and a fresh run, exit non-zero, naming
  # each file, and leave every file as it was
  rm -rf "$work/all" && mkdir -p "$work/all"
  head -c 1000 "$work/run/ckpt-00000002.h5" >"$work/all/ckpt-00000002.h5"
  head -c 5000 /dev/urandom >"$work/all/ckpt-00000004.h5"
  before=$(cd "$work/all" && stat -c "%n %s %y" . ./* ./.[!.]* 2>/dev/null; sha256sum ./*)
  for args in "--resume" ""; do
    set +e
    "$exe" "${run[@]}" --output "$work/all" $args >"$work/out2.txt" 2>"$work/err2.txt"
    code=$?
    set -e
    [[ $code != 0 ]] || fail "resnet ${args:-without --resume} with every checkpoint damaged exited 0: $(cat "$work/out2.txt")"
    for want in "none of its 2 checkpoint(s) can be loaded" "ckpt-00000002.h5: truncated" "ckpt-00000004.h5" \
      "move them out of"; do
      grep -qF -- "$want" "$work/err2.txt" || fail "stderr lacks '$want': $(cat "$work/err2.txt")"
    done
    ! grep -q "starting from the beginning" "$work/out2.txt" || fail "it started from the beginning"
    after=$(cd "$work/all" && stat -c "%n %s %y" . ./* ./.[!.]* 2>/dev/null; sha256sum ./*)
    [[ "$before" == "$after" ]] || fail "the damaged checkpoints were changed: $before vs $after"
  done
  echo "damaged checkpoints: named, never overwritten, and a folder of only damaged ones refused"
  ;;

profile)
  # --profile 1,1,2: step 1 waits, step 2 warms up, steps 3-4 are kept; the table is printed and the trace
  # written. --nvtx along with it must change nothing (where kiln has NVTX: KILN_TEST_NO_NVTX=1 in a build without
  # CUDA, which refuses --nvtx).
  nvtx=(--nvtx)
  [[ "${KILN_TEST_NO_NVTX:-0}" == 1 ]] && nvtx=()
  "$exe" --device cpu "${tiny[@]}" --epochs 1 --steps-per-epoch 5 --profile 1,1,2 "${nvtx[@]}" --output "$work/run" |
    tee "$work/out.txt"
  grep -q "^profile of 2 steps (trace: $work/run/trace.json)" "$work/out.txt" || fail "no profile table"
  grep -qE "^matmul +[0-9]+ " "$work/out.txt" || fail "the table lacks matmul"
  python3 - "$work/run/trace.json" <<'PY' || fail "the trace file is not what it should be"
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
steps = sorted(e["name"] for e in events if e.get("cat") == "step")
assert steps == ["step 2", "step 3"], steps
modules = {e["name"] for e in events if e.get("cat") == "module"}
assert {"ResNet", "Conv2d", "BatchNorm2d", "Linear"} <= modules, modules
assert any(e.get("cat") == "backward" for e in events)
PY
  echo "profile: table and trace as expected"
  ;;

graph)
  # run NAME ARGS...: one run on the GPU, its output in $work/NAME.txt
  common=(--model resnet18 --dataset synthetic --image-size 32 --batch-size 32 --synthetic-size 256
          --synthetic-eval-size 64 --workers 2 --log-every 1 --seed 3 --lr 0.02 --epochs 2 --steps-per-epoch 6
          --checkpoint-every 4 --amp bf16 --channels-last --deterministic --print-checksum --device cuda)
  run() {
    local name=$1
    shift
    set +e
    "$exe" "${common[@]}" --output "$work/$name" "$@" >"$work/$name.txt" 2>"$work/$name.err"
    local code=$?
    set -e
    cat "$work/$name.txt" "$work/$name.err"
    if grep -q "no GPU is visible" "$work/$name.err"; then
      echo "no GPU visible: skipped"
      exit 77
    fi
    [[ $code == 0 ]] || fail "$name: resnet exited with $code"
  }
  # close A B: the two numbers agree within 2e-3 of the larger magnitude (of SCALE when given)
  close() { awk -v a="$1" -v b="$2" -v s="${3:-0}" 'BEGIN { d = a - b; if (d < 0) d = -d; m = (a < 0 ? -a : a);
    if ((b < 0 ? -b : b) > m) m = (b < 0 ? -b : b); if (s > m) m = s; exit !(d <= 2e-3 * m) }'; }
  # compare A B: the train_log.csv rows (epoch, step, lr exactly; the loss within tolerance) and the checksums
  compare() {
    local a=$1 b=$2
    [[ $(cut -d, -f1,2,4 "$work/$a/train_log.csv") == $(cut -d, -f1,2,4 "$work/$b/train_log.csv") ]] ||
      fail "$a and $b: other steps or learning rates in train_log.csv"
    paste -d, <(cut -d, -f2,3 "$work/$a/train_log.csv" | tail -n +2) <(cut -d, -f3 "$work/$b/train_log.csv" |
      tail -n +2) | while IFS=, read -r step la lb; do
      close "$la" "$lb" || fail "$a and $b: the loss of step $step is $la and $lb"
    done
    local ca cb
    ca=$(grep '^checksum' "$work/$a.txt")
    cb=$(grep '^checksum' "$work/$b.txt")
    # "checksum SUM MAGNITUDE final loss LOSS": the sum of the weights within 2e-3 of their magnitude
    read -r _ sa ma _ _ la <<<"$ca"
    read -r _ sb mb _ _ lb <<<"$cb"
    close "$ma" "$mb" && close "$sa" "$sb" "$ma" && close "$la" "$lb" || fail "$a and $b end apart: $ca vs $cb"
    if [[ "$ca" == "$cb" ]]; then echo "$a and $b: the same bits ($ca)"; else echo "$a and $b: within 2e-3 ($ca vs $cb)"; fi
  }
  run graph --cuda-graph
  run eager
  grep -q "cuda graph: the training step was captured at step 3; the later steps replay it" "$work/graph.txt" ||
    fail "the graphed run did not capture its step at step 3"
  ! grep -q "cuda graph" "$work/eager.txt" || fail "the eager run captured a graph"
  [[ $(rows "$work/graph/train_log.csv") == 12 && $(rows "$work/graph/metrics.csv") == 2 ]] ||
    fail "the graphed run should log 12 steps and 2 epochs"
  compare eager graph
  # killed after step 5 (the checkpoint of step 4 was saved between replays), resumed: captures anew at step 7
  run resumed --cuda-graph --stop-at-step 5
  run resumed --cuda-graph --resume
  grep -q "resumed from .*ckpt-00000004.h5: step 4" "$work/resumed.txt" || fail "did not resume at step 4"
  grep -q "captured at step 7" "$work/resumed.txt" || fail "the resumed run did not capture its step at step 7"
  compare graph resumed
  ;;

mpi)
  [[ $# -gt 0 ]] || fail "mode mpi needs the launcher, e.g. mpirun -np 2"
  # --cuda-graph is for one process: every rank stops before training, rank 0 says why
  if "$@" "$exe" "${tiny[@]}" --cuda-graph --output "$work/graph" >"$work/graph.txt" 2>&1; then
    fail "--cuda-graph was accepted with 2 processes"
  fi
  grep -q "cuda-graph runs on one GPU for now" "$work/graph.txt" || fail "no message on --cuda-graph with 2 processes"
  run=(--device cpu "${tiny[@]}" --epochs 1 --steps-per-epoch 3 --checkpoint-every 2 --sync-bn --print-checksum)
  "$@" "$exe" "${run[@]}" --output "$work/straight" | tee "$work/straight.txt"
  "$@" "$exe" "${run[@]}" --output "$work/run" --stop-at-step 2 | tee "$work/part1.txt"
  ls "$work/run/ckpt-00000002.h5.rank1.h5" >/dev/null || fail "rank 1 wrote no checkpoint part"
  "$@" "$exe" "${run[@]}" --output "$work/run" --resume | tee "$work/part2.txt"
  grep -q "^2 process(es)" "$work/part1.txt" || fail "not a 2-process job"
  [[ $(grep -c "^epoch 1 step 2/3" "$work/part1.txt") == 1 ]] || fail "a progress line was printed by more than rank 0"
  grep -q "resumed from .*ckpt-00000002.h5: step 2" "$work/part2.txt" || fail "did not resume at step 2"
  [[ $(rows "$work/run/metrics.csv") == 1 ]] || fail "metrics.csv should hold one row"
  want=$(grep '^checksum' "$work/straight.txt")
  got=$(grep '^checksum' "$work/part2.txt")
  [[ -n "$want" && "$want" == "$got" ]] || fail "the resumed 2-process run ends with other weights: $want vs $got"
  ;;

*)
  fail "unknown mode $mode"
  ;;
esac
find "$work" -name '*.h5' -delete  # checkpoints are ~90 MB each; the logs and CSV files stay for a look
echo "test_resnet.sh $mode: passed"
