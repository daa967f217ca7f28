#!/usr/bin/env bash
# The examples on one GPU (called by scripts/gpu_check.sh, or alone): the quick start, ResNet-50 on synthetic
# 224x224 images (bf16 channels-last, also under kiln's profiler; fp16 with the GradScaler, gradient checkpointing and
# accumulation), and
# BERT-base masked-LM pretraining on the repository's sample text (bf16, with and without checkpointing; fp16 with checkpointing). Prints the
# last progress lines of each run; full logs go to $out/examples_*.log.
#
# With "graph" as the third argument it runs instead the examples as bench/bench_train's cases are set up, each step
# replayed as a CUDA graph (--cuda-graph): ResNet-18 on CIFAR-10-format files (batch 512, bf16), ResNet-50 on
# synthetic 224x224 images (batch 256, bf16, channels-last) and BERT-base pretraining at batch 128 x 128 (bf16,
# AdamW) with a vocabulary of 30,522 tokens (one built from the sample text, padded with [unusedN] entries), so that
# their throughput can be set beside bench_train's resnet18_cifar_bf16, resnet50_bf16 and bert_base_128.
#
#   scripts/gpu_examples.sh BUILD_DIR OUT_DIR [graph]
set -uo pipefail
build="${1:?build folder}"
out="${2:?log folder}"
mode="${3:-}"
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
if [[ "$mode" == graph ]]; then
  "$build/examples/resnet/resnet" --make-fake-cifar10 "$runs/cifar" --fake-images-per-file 10000 >/dev/null
  ex resnet18_cifar_graph 300 "$build/examples/resnet/resnet" --model resnet18 --dataset cifar10 --data "$runs/cifar" \
    --batch-size 512 --amp bf16 --channels-last --workers 12 --epochs 3 --cuda-graph --output "$runs/g1"
  ex resnet50_graph 300 "$build/examples/resnet/resnet" --model resnet50 --dataset synthetic --image-size 224 \
    --synthetic-size 20000 --synthetic-eval-size 512 --batch-size 256 --epochs 1 --steps-per-epoch 75 --log-every 25 \
    --workers 12 --amp bf16 --channels-last --cuda-graph --output "$runs/g2"
  for i in $(seq 20); do cat examples/bert/data/sample.txt; echo; done >"$runs/text.txt"
  "$build/examples/bert/bert" pretrain --text "$runs/text.txt" --build-vocab 2000 --size tiny --max-steps 1 \
    --ckpt-every 0 --out "$runs/v" >/dev/null
  { cat "$runs/v/vocab.txt"; seq 1 $((30522 - $(wc -l <"$runs/v/vocab.txt"))) | sed 's/.*/[unused&]/'; } >"$runs/vocab.txt"
  ex bert_base_graph 300 "$build/examples/bert/bert" pretrain --text "$runs/text.txt" --vocab "$runs/vocab.txt" \
    --size base --seq-len 128 --batch 128 --amp bf16 --max-steps 120 --log-every 20 --ckpt-every 0 --cuda-graph \
    --out "$runs/g3"
  exit 0
fi
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
