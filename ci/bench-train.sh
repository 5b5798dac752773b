#!/usr/bin/env bash
# Training throughput: LoRA r16 on all 7 projections of SmolLM2-135M, batch 1,
# seq 256, for hexlora (frozen weights f32 and bf16; bf16 counts) and for
# PyTorch + PEFT (float32 and bfloat16; the best counts) in the same run on
# the same number of threads. Prints tokens/s and peak RSS of each, hexlora's
# per-node time tables, a roofline line (the frozen products' GFLOP/s
# against the bf16 kernel's instruction ceiling), and finally
#   train tok/s ratio hexlora/pytorch: X
# Env: THREADS (2), STEPS (6), ROUNDS (3), MODEL, PYTHON (/work/venv/bin/python:
# an interpreter with torch, transformers, peft and gguf).
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${THREADS:-2}
STEPS=${STEPS:-6}
ROUNDS=${ROUNDS:-3}
PY=${PYTHON:-/work/venv/bin/python}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$MODEL" ] || { echo "missing $MODEL: run toolchain/fetch-models.sh" >&2; exit 1; }
cargo build --release -q -p hexlora --bin hexlora
BIN=${CARGO_TARGET_DIR:-target}/release/hexlora
tmp=$(mktemp -d)
source ci/steal.sh
trap 'rm -rf "$tmp"' EXIT

# STEPS sequences of 256 token ids: the content does not change the cost.
awk -v n="$STEPS" 'BEGIN { srand(7); for (i = 0; i < n; i++) { printf "{\"input_ids\": ["
  for (t = 0; t < 256; t++) printf "%s%d", (t ? "," : ""), int(rand() * 49000) + 100; print "]}" } }' > "$tmp/data.jsonl"

# The machine's speed drifts by up to ~1.5x over minutes (a shared VM: the
# same binary measured 298 and 433 tok/s ten minutes apart), so one
# hexlora run followed by one PyTorch run can compare a fast minute with a
# slow one. The compared runs are therefore interleaved: ROUNDS rounds of
# (hexlora bf16, PyTorch float32, PyTorch bfloat16); each round's ratio is
# hexlora over PyTorch's better dtype in that round, and the last line is
# the median of those ratios. hexlora's f32 run is printed once, first.
# PyTorch's dtype that lost round 1 by more than 3x is not run again: on a
# CPU without native bf16 (AMD EPYC Zen 1: 3 tok/s against 75 in float32)
# each of its runs took ~9 minutes and could never be the better one.
hex_run() { # dtype round
  RAYON_NUM_THREADS=$THREADS "$BIN" train --model "$MODEL" --data "$tmp/data.jsonl" --out "$tmp/run-$1-$2" \
    --steps "$STEPS" --rank 16 --alpha 32 --dropout 0 --max-len 256 --lr 2e-4 --quiet --profile \
    --frozen-dtype "$1" > "$tmp/hex-$1-$2.txt"
  rm -rf "$tmp/run-$1-$2"
}
echo "== hexlora frozen f32 ($THREADS threads)"
hex_run f32 0
cat "$tmp/hex-f32-0.txt"

have_pt=0
# gguf: transformers reads the GGUF checkpoint with it.
"$PY" -c 'import torch, peft, transformers, gguf' 2>/dev/null && have_pt=1
[ "$have_pt" = 1 ] || echo "PyTorch side skipped: $PY lacks one of torch, peft, transformers, gguf (no ratio is printed)"

ratios=""
for round in $(seq 1 "$ROUNDS"); do
  echo "== round $round: hexlora frozen bf16 ($THREADS threads)"
  hex_run bf16 "$round"
  if [ "$round" = 1 ]; then cat "$tmp/hex-bf16-1.txt"; else grep -E '^(train tok/s|peak RSS)' "$tmp/hex-bf16-$round.txt"; fi
  hex=$(awk '/^train tok\/s:/ { print $3 }' "$tmp/hex-bf16-$round.txt")
  [ "$have_pt" = 1 ] || continue
  : > "$tmp/pt-$round.txt"
  for dtype in ${pt_dtypes:-float32 bfloat16}; do
    echo "== round $round: pytorch+peft $dtype ($THREADS threads)"
    OMP_NUM_THREADS=$THREADS "$PY" ci/bench_train_pytorch.py "$MODEL" "$tmp/data.jsonl" "$STEPS" "$THREADS" "$dtype" 2>"$tmp/pt.err" | tee -a "$tmp/pt-$round.txt" \
      || { echo "bench-train: the PyTorch $dtype run failed:" >&2; tail -n 5 "$tmp/pt.err" >&2; exit 1; }
  done
  best=$(awk '/^pytorch/ { if ($4 > b) b = $4 } END { print b }' "$tmp/pt-$round.txt")
  if [ "$round" = 1 ]; then
    pt_dtypes=$(awk -v b="$best" '/^pytorch/ && $4 * 3 >= b { printf "%s ", $2 }' "$tmp/pt-1.txt")
    [ "$pt_dtypes" = "float32 bfloat16 " ] || echo "(later rounds run PyTorch in $pt_dtypes only: the other dtype was over 3x slower)"
  fi
  r=$(awk -v h="$hex" -v p="$best" 'BEGIN { printf "%.2f", h / p }')
  echo "round $round: hexlora bf16 $hex tok/s, pytorch best dtype $best tok/s, ratio $r"
  ratios="$ratios $r"
done

# Roofline: the frozen products' FLOP (forward and input gradient of every
# layer projection, STEPS x 256 tokens) over round 1's proj+lora time (which
# also holds the LoRA branch the products carry), against the bf16 kernel's
# instruction ceiling on THREADS threads.
cargo build --release -q -p hexlora --example bench_train_roofline
roof=$(RAYON_NUM_THREADS=$THREADS "${CARGO_TARGET_DIR:-target}/release/examples/bench_train_roofline" "$MODEL")
flop=$(sed -n 's/^frozen product FLOP per token, one direction: //p' <<< "$roof")
proj_s=$(awk '$1 == "proj+lora" { print $2 + $3 }' "$tmp/hex-bf16-1.txt")
ceiling=$(sed -n 's/^kernel ceiling: \([0-9]*\) GFLOP.*/\1/p' <<< "$roof")
gflops=$(awk -v f="$flop" -v n="$STEPS" -v s="$proj_s" 'BEGIN { printf "%.0f", 2 * f * 256 * n / s / 1e9 }')
echo "$roof" | grep '^kernel ceiling'
if [ -n "$ceiling" ]; then
  echo "roofline: frozen products $gflops GFLOP/s in round 1 (proj+lora $proj_s s for $STEPS x 256 tokens), $(awk -v g="$gflops" -v c="$ceiling" 'BEGIN { printf "%.1f", 100 * g / c }')% of the kernel ceiling $ceiling GFLOP/s"
else
  echo "roofline: frozen products $gflops GFLOP/s in round 1 (proj+lora $proj_s s for $STEPS x 256 tokens); no ceiling measured for this kernel"
fi

steal_line
echo "hexlora train tok/s: f32 $(awk '/^train tok\/s:/ { print $3 }' "$tmp/hex-f32-0.txt"), bf16 per round$(for f in "$tmp"/hex-bf16-*.txt; do awk '/^train tok\/s:/ { printf " %s", $3 }' "$f"; done)"
if [ -n "$ratios" ]; then
  echo "per-round ratios:$ratios"
  echo "train tok/s ratio hexlora/pytorch: $(echo $ratios | tr ' ' '\n' | sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : sprintf("%.2f", (v[NR / 2] + v[NR / 2 + 1]) / 2) }')"
else
  echo "train tok/s ratio hexlora/pytorch: n/a (PyTorch + PEFT not installed)"
fi
