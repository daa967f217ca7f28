#!/usr/bin/env bash
# Issue 34 goal 5 (the dynamic-shape case) in interleaved rounds on one GPU instance: each round runs
# bench_train --case bert_base_dynamic (main's build, carried as gpu-carry/prebuilt.tar.xz), then
# pytorch_train.py --case bert_base_dynamic in eager mode, then with torch.compile(dynamic=True). Round 1's compile
# starts from an empty inductor cache; later rounds find the kernels it cached. No round starts after STOP_AT
# seconds (default 440). FIRST (default 1) numbers the first round, so that a second call on the same instance adds
# rounds beside the first call's logs (in /tmp/lf). Logs are packed into $OUT/logs_f.tgz after each run, so a run
# stopped at its limit still brings back what it measured; the table is made from all of them with
# bench/train_table.py. First, main's index tests on the GPU (the embedding's lookup and gradient by whole rows).
set -u
export OUT=${OUT:-/tmp/out}
source scripts/gpu_env.sh >/dev/null 2>&1  # call_logs, snap, gpu_banner, gtest_counts
call_logs f; L=$logs
gpu_banner
use_prebuilt bench_train test_tensor || { echo "no prebuilt binaries"; exit 1; }
timeout 120 build/tests/test_tensor --gtest_filter='*Index*:*Embedding*:*Scatter*:*Gather*' > $L/test_tensor_index.log 2>&1
echo "main test_tensor index tests: exit $? $(gtest_counts $L/test_tensor_index.log)"
python3 -c "import torch; print('torch', torch.__version__)"
bt=build/bench/bench_train
f='"framework": "[a-z-]*"\|"step_ms": [0-9.]*\|"first_epoch_s": [0-9.]*\|"trained": [a-z]*'
for r in $(seq ${FIRST:-1} ${ROUNDS:-5}); do
  [[ $SECONDS -gt ${STOP_AT:-440} ]] && { echo "stopped at $SECONDS s"; break; }
  timeout 60 $bt --case bert_base_dynamic > $L/kiln_bert_base_dynamic_$r.log 2>&1
  echo "round $r kiln: exit $? $(grep -o "$f" $L/kiln_bert_base_dynamic_$r.log | paste -sd' ') at $SECONDS s"; snap
  for mode in eager compile; do
    PYTHONUNBUFFERED=1 timeout 260 python3 bench/pytorch_train.py --case bert_base_dynamic --mode $mode > $L/torch_bert_base_dynamic_${mode}_$r.log 2>&1
    echo "round $r torch $mode: exit $? $(grep -o "$f" $L/torch_bert_base_dynamic_${mode}_$r.log | paste -sd' ') at $SECONDS s"; snap
  done
done
python3 bench/train_table.py $L/kiln_*.log $L/torch_*.log > $L/table.md 2>&1; cat $L/table.md; snap
echo "total $SECONDS s"
