#!/usr/bin/env bash
# The examples on one GPU (called by scripts/gpu_check.sh, or alone): the quick start, ResNet-50 on synthetic
# 224x224 images (bf16 channels-last, also under kiln's profiler; fp16 with the GradScaler, gradient checkpointing and
# accumulation), and
# BERT-base masked-LM pretraining on the repository's sample text (bf16, with and without checkpointing; fp16 with checkpointing). Prints the
# last progress lines of each run; full logs go to $out/examples_*.log.
#
#   scripts/gpu_examples.sh BUILD_DIR OUT_DIR
set -uo pipefail
build="${1:?build folder}"
out="${2:?log folder}"
runs="$(mktemp -d)"
trap 'rm -rf "$runs"' EXIT
ex() {  # ex NAME SECONDS COMMAND...
  local name="$1" limit="$2"; shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$out/examples_$name.log" 2>&1
  local rc=$?
  echo "== $name (exit $rc, $((SECONDS - start)) s): $*"
  grep -E "^epoch|accuracy|samples/s|error" "$out/examples_$name.log" | tail -3
}
ex quickstart 120 "$build/examples/quickstart/quickstart"
r50=("$build/examples/resnet/resnet" --model resnet50 --dataset synthetic --image-size 224 --synthetic-size 20000
     --synthetic-eval-size 512 --batch-size 256 --epochs 1 --steps-per-epoch 60 --log-every 20 --workers 8)
ex resnet50_bf16 240 "${r50[@]}" --amp bf16 --channels-last --output "$runs/r1"
# The same ResNet-50 step under kiln's profiler: 10 steps wait, 3 warm up, 5 are kept; the top ops and the trace.
ex resnet50_bf16_profile 240 "${r50[@]}" --amp bf16 --channels-last --steps-per-epoch 30 --profile 10,3,5 \
  --trace "$out/resnet50_trace.json" --output "$runs/r0"
sed -n '/^profile of/,/ops in .* steps/p' "$out/examples_resnet50_bf16_profile.log"
ex resnet50_fp16_ckpt_accum 240 "${r50[@]}" --amp fp16 --channels-last --grad-checkpoint --accumulate 2 \
  --batch-size 128 --output "$runs/r2"
# The sample text holds 55 sequences of 128 tokens: twenty copies give batches of 64 for a timing.
for i in $(seq 20); do cat examples/bert/data/sample.txt; echo; done >"$runs/text.txt"
bert=("$build/examples/bert/bert" pretrain --text "$runs/text.txt" --build-vocab 2000 --size base
      --seq-len 128 --batch 64 --max-steps 60 --log-every 20 --ckpt-every 0)
ex bert_base_bf16 240 "${bert[@]}" --amp bf16 --out "$runs/b1"
ex bert_base_fp16_ckpt 240 "${bert[@]}" --amp fp16 --checkpointing --out "$runs/b2"
ex bert_base_bf16_ckpt 240 "${bert[@]}" --amp bf16 --checkpointing --out "$runs/b3"
