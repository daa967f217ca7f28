#!/usr/bin/env bash
# A short first part of runH.sh for a call with little device time left: stem-s2d's tests, the stem experiment, and
# one round of resnet50_bf16 on main and s2d16, then (time allowing) one round of BERT on main and bertmlp. Same carry
# as runH.sh. Logs go to /tmp/lh1 and are packed into $OUT/logs_h1.tgz after each step.
set -u
export OUT=${OUT:-/tmp/out}
source scripts/gpu_env.sh >/dev/null 2>&1
call_logs h1; L=$logs
gpu_banner
use_prebuilt bench_train kernel_trace test_autograd || { echo "no prebuilt binaries"; exit 1; }
unpack_libs gpu-carry/ab6/ab.tar.xz || { echo "the branches' pack does not unpack"; exit 1; }
golden_at /work/main
bt=build/bench/bench_train
steps='"case": "[a-z0-9_]*"\|"step_ms": [0-9.]*\|"trained": [a-z]*'
with_lib s2d16 timeout 120 /tmp/lib_s2d/test_layers --gtest_filter='*Conv*' > $L/test_layers_s2d.log 2>&1
echo "s2d conv tests: exit $? $(gtest_counts $L/test_layers_s2d.log) at $SECONDS s"; grep "Failure" -A3 $L/test_layers_s2d.log | head; snap
with_lib main timeout 100 gpu-carry/exp4/stem_channels > $L/stem_channels.log 2>&1
echo "stem_channels: exit $? at $SECONDS s"; cat $L/stem_channels.log; snap
for rev in main s2d16 s2d12; do
  with_lib $rev timeout 60 $bt --case resnet50_bf16 > $L/rn_${rev}_1.log 2>&1
  echo "$rev: exit $? $(grep -o "$steps" $L/rn_${rev}_1.log | paste -sd' ') at $SECONDS s"; snap
done
for rev in main bertmlp; do
  with_lib $rev timeout 60 $bt --case bert_base_128 > $L/ab_${rev}_1.log 2>&1
  echo "$rev: exit $? $(grep -o "$steps" $L/ab_${rev}_1.log | paste -sd' ') at $SECONDS s"; snap
done
echo "total $SECONDS s"
