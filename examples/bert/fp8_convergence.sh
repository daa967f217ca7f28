#!/usr/bin/env bash
# examples/bert/fp8_convergence.sh — the FP8 convergence check (issue 35): masked-LM pretraining of BERT-base on a
# generated corpus, twice from the same seed with the same options but the precision, --amp bf16 and --amp fp8.
#
#   examples/bert/fp8_convergence.sh BERT_BINARY OUT_DIR [STEPS]      # STEPS: 2000 by default
#   python3 examples/bert/plot_convergence.py OUT_DIR/bf16/metrics.csv OUT_DIR/fp8/metrics.csv \
#       --out examples/bert/fp8_convergence.png --vocab-size 4096      # the plot, and the 2% criterion judged
#
# It writes OUT_DIR/corpus (make_corpus.py's default corpus, 30.7 M tokens, and its vocab.txt; kept and reused when
# it exists), OUT_DIR/bf16 and OUT_DIR/fp8 (each run's --out: metrics.csv, config.json, vocab.txt, the final
# checkpoint and weights) and OUT_DIR/bf16.log, OUT_DIR/fp8.log. Both runs read the corpus's vocab.txt (--vocab), so
# they tokenize the text alike. Each run: BERT-base, 128 tokens, batch 128, AdamW at lr 1e-4, warmup of 200 steps (a
# tenth of STEPS when that is less) then linear decay to 0 at STEPS, a metrics.csv row every 10 steps, the training
# step replayed as a CUDA graph (--cuda-graph), on one GPU. About 30 ms a step on an H200 with bf16.
#
# The runs need a GPU (--amp fp8 one of compute capability 8.9 or newer); the script stops, saying so, where none is
# visible. For a smoke test on the CPU (bf16 becomes float32 there, fp8 kiln's FP8 reference; slow), the environment
# may change the setup:
#   KILN_CONVERGENCE_DEVICE=cpu      run on the CPU (no --cuda-graph there)
#   KILN_CONVERGENCE_SIZE=tiny       the model size (base by default)
#   KILN_CONVERGENCE_BATCH=8         sequences per batch (128 by default)
#   KILN_CONVERGENCE_SENTENCES=N     a smaller corpus (make_corpus.py --sentences; used when OUT_DIR/corpus is made)
#   KILN_CONVERGENCE_SEED=N          the seed of both runs (1234 by default)
# e.g. KILN_CONVERGENCE_DEVICE=cpu KILN_CONVERGENCE_SIZE=tiny KILN_CONVERGENCE_BATCH=8 \
#        KILN_CONVERGENCE_SENTENCES=20000 examples/bert/fp8_convergence.sh build/examples/bert/bert /tmp/conv 40
set -euo pipefail

usage() {
  echo "usage: $0 BERT_BINARY OUT_DIR [STEPS]   (the bert binary, e.g. build/examples/bert/bert; STEPS: 2000)" >&2
  exit 2
}
[[ $# -ge 2 && $# -le 3 ]] || usage
bert=$1 out=$2 steps=${3:-2000}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

device=${KILN_CONVERGENCE_DEVICE:-cuda}
size=${KILN_CONVERGENCE_SIZE:-base}
batch=${KILN_CONVERGENCE_BATCH:-128}
seed=${KILN_CONVERGENCE_SEED:-1234}
sentences=${KILN_CONVERGENCE_SENTENCES:-}

fail() { echo "fp8_convergence.sh: $*" >&2; exit 1; }
[[ -x "$bert" ]] || fail "$bert is not an executable; give the bert binary (build/examples/bert/bert)"
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || fail "STEPS must be a positive integer, got '$steps'"
[[ "$device" == cuda || "$device" == cpu ]] || fail "KILN_CONVERGENCE_DEVICE takes cuda or cpu, not '$device'"
[[ "$batch" =~ ^[1-9][0-9]*$ ]] || fail "KILN_CONVERGENCE_BATCH must be a positive integer, got '$batch'"
[[ "$seed" =~ ^[0-9]+$ ]] || fail "KILN_CONVERGENCE_SEED must be a non-negative integer, got '$seed'"
for run in bf16 fp8; do
  # bert pretrain refuses a folder with checkpoints; a half-finished pair of runs would not compare either.
  [[ ! -e "$out/$run" ]] || fail "$out/$run exists (an earlier check?); remove $out/bf16 and $out/fp8 to run again"
done
mkdir -p "$out"

# The corpus, made once (it is a pure function of its options; the runs only read it).
corpus=$out/corpus
if [[ -d "$corpus" ]]; then
  # make_corpus.py writes vocab.txt last: without it the folder is what an interrupted run left.
  [[ -d "$corpus/text" && -s "$corpus/vocab.txt" ]] ||
    fail "$corpus exists but lacks text/ or vocab.txt (an interrupted make_corpus.py?); remove it"
  echo "the corpus: $corpus (already there)"
else
  echo "making the corpus in $corpus (make_corpus.py)..."
  python3 "$here/make_corpus.py" --out "$corpus" ${sentences:+--sentences "$sentences"}
fi

warmup=$((steps / 10 < 200 ? steps / 10 : 200))
common=(--text "$corpus/text" --vocab "$corpus/vocab.txt" --size "$size" --seq-len 128 --batch "$batch"
        --max-steps "$steps" --warmup-steps "$warmup" --optimizer adamw --lr 1e-4 --log-every 10 --ckpt-every 0
        --keep 1 --seed "$seed" --device "$device")
if [[ "$device" == cuda ]]; then
  common+=(--cuda-graph)
else
  common+=(--workers 1)
fi

# run_one PRECISION: bert pretrain --amp PRECISION into $out/PRECISION, its output also in $out/PRECISION.log
declare -A took
run_one() {
  local amp=$1 start status=0
  start=$(date +%s)
  echo "+ $bert pretrain ${common[*]} --amp $amp --out $out/$amp"
  "$bert" pretrain "${common[@]}" --amp "$amp" --out "$out/$amp" 2>&1 | tee "$out/$amp.log" || status=$?
  if grep -q "no GPU is visible" "$out/$amp.log"; then
    fail "no GPU is visible, and the check runs on one (--device cuda). Run it on a GPU machine, or set" \
      "KILN_CONVERGENCE_DEVICE=cpu (with KILN_CONVERGENCE_SIZE=tiny and a few STEPS) for a smoke test on the CPU."
  fi
  [[ $status -eq 0 ]] || fail "the --amp $amp run failed (exit $status); its output is in $out/$amp.log"
  [[ -s "$out/$amp/metrics.csv" ]] || fail "the --amp $amp run wrote no $out/$amp/metrics.csv"
  took[$amp]=$(($(date +%s) - start))
}
run_one bf16
run_one fp8

vocab_size=$(wc -l <"$corpus/vocab.txt")
echo
echo "fp8_convergence.sh: $steps steps of BERT $size, batch $batch x 128, on $device, seed $seed"
echo "  --amp bf16: ${took[bf16]} s  ($out/bf16/metrics.csv)"
echo "  --amp fp8:  ${took[fp8]} s  ($out/fp8/metrics.csv)"
echo "the plot and the criterion (FP8 within 2% of bf16 at every logged step after the first $warmup):"
echo "  python3 $here/plot_convergence.py $out/bf16/metrics.csv $out/fp8/metrics.csv \\"
echo "      --out $here/fp8_convergence.png --vocab-size $vocab_size --skip $warmup"
