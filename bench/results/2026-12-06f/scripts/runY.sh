#!/usr/bin/env bash
# More rounds beside PyTorch after runX.sh on the same machine (VS_ROUNDS, default 3); the prebuilt binaries are
# unpacked again where the machine is a fresh one.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
source scripts/gpu_env.sh
use_prebuilt bench_train || { echo "no prebuilt bench_train"; exit 1; }
export LD_LIBRARY_PATH=$PWD/build/prebuilt-libs/use:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/vs_torch; OUT=$OUT/vs_torch KILN_BENCH_TRAIN=$PWD/build/bench/bench_train KILN_TORCH_MODES=compile_graph timeout 560 bash scripts/bench_vs_torch.sh ${VS_ROUNDS:-3} bert_base_128 bert_large_128 > /tmp/vs.log 2>&1
grep -E "round|\|" /tmp/vs.log | cut -c1-200 | tail -14
cd $OUT && tar -czf vs.tgz vs_torch 2>/dev/null; rm -rf vs_torch; echo "total $SECONDS s"
