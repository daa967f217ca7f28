#!/usr/bin/env bash
# Goal 5 (the dynamic-shape case) in interleaved rounds: bench_train --case bert_base_dynamic (the development
# machine's build, carried in gpu-carry/) against pytorch_train.py's eager and torch.compile(dynamic=True) modes.
# Round 1's compile starts from an empty inductor cache; later rounds on the same instance find its cached kernels.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source scripts/gpu_env.sh >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "tree $(source_id)"
use_prebuilt bench_train || { echo "no prebuilt binaries"; exit 1; }
python3 -c "import torch; print('torch', torch.__version__)"
KILN_TORCH_MODES="eager compile" KILN_BENCH_TRAIN=build/bench/bench_train scripts/bench_vs_torch.sh ${ROUNDS:-3} bert_base_dynamic
echo "total $SECONDS s"
