#!/usr/bin/env bash
# Rounds beside PyTorch (compile + whole-step graph): VS_ROUNDS rounds (default 3) of VS_CASES (default the _p20 BERT
# cases), prebuilt bench_train; a later call on the same machine finds torch's compile cache warm.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
source scripts/gpu_env.sh
use_prebuilt bench_train || { echo "no prebuilt bench_train"; exit 1; }
export LD_LIBRARY_PATH=$PWD/build/prebuilt-libs/use:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/vs_torch; OUT=$OUT/vs_torch KILN_BENCH_TRAIN=$PWD/build/bench/bench_train KILN_TORCH_MODES=compile_graph timeout ${VS_LIMIT:-570} bash scripts/bench_vs_torch.sh ${VS_ROUNDS:-3} ${VS_CASES:-bert_base_128_p20 bert_large_128_p20} > /tmp/vs.log 2>&1
grep -E "round|\|" /tmp/vs.log | cut -c1-220 | tail -16
cd $OUT && tar -czf vs.tgz vs_torch 2>/dev/null; rm -rf vs_torch; echo "total $SECONDS s"
