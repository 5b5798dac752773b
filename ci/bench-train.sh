#!/usr/bin/env bash
# Training throughput: LoRA r16 on all 7 projections of SmolLM2-135M, batch 1,
# seq 256, for hexlora (frozen weights f32 and bf16; bf16 counts) and for
# PyTorch + PEFT (float32 and bfloat16; the best counts) in the same run on
# the same number of threads. Prints tokens/s and peak RSS of each, hexlora's
# per-node time tables, and finally
#   train tok/s ratio hexlora/pytorch: X
# Env: THREADS (2), STEPS (6), PYTHON (/work/venv/bin/python), MODEL.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${THREADS:-2}
STEPS=${STEPS:-6}
PY=${PYTHON:-/work/venv/bin/python}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$MODEL" ] || { echo "missing $MODEL: run toolchain/fetch-models.sh" >&2; exit 1; }
cargo build --release -q -p hexlora --bin hexlora
BIN=${CARGO_TARGET_DIR:-target}/release/hexlora
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# STEPS sequences of 256 token ids: the content does not change the cost.
awk -v n="$STEPS" 'BEGIN { srand(7); for (i = 0; i < n; i++) { printf "{\"input_ids\": ["
  for (t = 0; t < 256; t++) printf "%s%d", (t ? "," : ""), int(rand() * 49000) + 100; print "]}" } }' > "$tmp/data.jsonl"

# hexlora with bf16 frozen weights (AMX tiles where the CPU has them) is the
# figure compared; the f32 run is printed next to it.
for dtype in f32 bf16; do
  echo "== hexlora frozen $dtype ($THREADS threads)"
  RAYON_NUM_THREADS=$THREADS "$BIN" train --model "$MODEL" --data "$tmp/data.jsonl" --out "$tmp/run-$dtype" \
    --steps "$STEPS" --rank 16 --alpha 32 --dropout 0 --max-len 256 --lr 2e-4 --quiet --profile \
    --frozen-dtype "$dtype" | tee "$tmp/hex-$dtype.txt"
done
hex=$(awk '/^train tok\/s:/ { print $3 }' "$tmp/hex-bf16.txt")
echo "hexlora train tok/s: f32 $(awk '/^train tok\/s:/ { print $3 }' "$tmp/hex-f32.txt"), bf16 $hex"

best=""
if "$PY" -c 'import torch, peft, transformers' 2>/dev/null; then
  for dtype in float32 bfloat16; do
    echo "== pytorch+peft $dtype ($THREADS threads)"
    OMP_NUM_THREADS=$THREADS "$PY" ci/bench_train_pytorch.py "$MODEL" "$tmp/data.jsonl" "$STEPS" "$THREADS" "$dtype" 2>/dev/null | tee -a "$tmp/pt.txt"
  done
  best=$(awk '/^pytorch/ { if ($4 > b) b = $4 } END { print b }' "$tmp/pt.txt")
fi
if [ -n "$best" ]; then
  echo "train tok/s ratio hexlora/pytorch: $(awk -v h="$hex" -v p="$best" 'BEGIN { printf "%.2f", h / p }')"
else
  echo "train tok/s ratio hexlora/pytorch: n/a (PyTorch + PEFT not installed)"
fi
