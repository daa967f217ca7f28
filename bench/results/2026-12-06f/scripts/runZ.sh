#!/usr/bin/env bash
# main after the key-bias change: FP8 against bf16 for both BERT sizes in one bench_train process, then PyTorch's
# torch.compile without a CUDA graph on BERT-base while the call's time lasts.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
source scripts/gpu_env.sh
use_prebuilt bench_train || { echo "no prebuilt bench_train"; exit 1; }
export LD_LIBRARY_PATH=$PWD/build/prebuilt-libs/use:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 build/bench/bench_train --case bert_base_128 --case bert_base_128_fp8 --case bert_large_128 --case bert_large_128_fp8 > $OUT/fp8_vs_bf16.log 2>&1; echo "bench_train exit $? at $SECONDS s"
grep -o '"case": "[a-z0-9_]*"\|"step_ms": [0-9.]*\|"eager_step_ms": [0-9.]*\|"trained": [a-z]*' $OUT/fp8_vs_bf16.log | paste -sd' ' | sed 's/"case"/\n"case"/g'
(cd bench && timeout $((115 - SECONDS)) python3 pytorch_train.py --mode compile --case bert_base_128) > $OUT/torch_compile_bert_base.log 2>&1; echo "torch exit $? at $SECONDS s"
grep -o '"framework": "[a-z_-]*"\|"step_ms": [0-9.]*\|"trained": [a-z]*' $OUT/torch_compile_bert_base.log | paste -sd' '
