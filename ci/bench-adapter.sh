#!/usr/bin/env bash
# What answering with a personal adapter costs: `hexlora generate` on
# SmolLM2-135M Q4_1, 2 threads, a ~512-token prompt and 128 greedy tokens,
# without an adapter, with the r4 fixture adapter (all 7 projections) and
# with an r16 adapter on all 7 (the default of `train`/`personalize`; made
# here by one training step so B is not zero). Rounds interleave the three
# so a drift of the machine's speed hits them alike. Prints each run, the
# medians, and `adapter r16 decode slowdown: X%` (the target is <= 15%).
# Run it alone on the machine.
#
# Env: ROUNDS (5), THREADS (2), TOKENS (128), MODEL.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
ROUNDS=${ROUNDS:-5}
THREADS=${THREADS:-2}
TOKENS=${TOKENS:-128}
[ -f "$MODEL" ] || { echo "no $MODEL (run toolchain/fetch-models.sh)"; exit 1; }
cargo build --release -q -p hexlora
BIN=target/release/hexlora
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; threads $THREADS"
RAYON_NUM_THREADS=$THREADS $BIN train --model "$MODEL" --data host/tests/fixtures/training/sotu_train.jsonl \
    --out "$WORK/r16" --rank 16 --alpha 32 --steps 1 --quiet > /dev/null
# ~512 tokens of State of the Union text as a raw prompt.
PROMPT=$(python3 -c "
import json, sys
text = ' '.join(json.loads(l)['prompt'] + json.loads(l)['completion'] for l in open('host/tests/fixtures/training/sotu_train.jsonl'))
print(text[:2450])")

declare -A PROMPT_TPS DECODE_TPS
run() { # name, adapter args...
    local name=$1; shift
    local line
    line=$(RAYON_NUM_THREADS=$THREADS $BIN generate --model "$MODEL" --raw --prompt "$PROMPT" \
        --max-tokens "$TOKENS" "$@" 2>&1 >/dev/null | tail -n 1)
    # [P prompt tokens in S s (X tok/s), N generated in T s (Y tok/s), finish: F]
    local p d
    p=$(sed -E 's/.*\(([0-9.]+) tok\/s\), [0-9]+ generated.*/\1/' <<<"$line")
    d=$(sed -E 's/.*generated in [0-9.]+ s \(([0-9.]+) tok\/s\).*/\1/' <<<"$line")
    echo "round $r $name: $line"
    PROMPT_TPS[$name]+="$p "
    DECODE_TPS[$name]+="$d "
}
for r in $(seq 1 "$ROUNDS"); do
    run base
    run r4 --adapter host/tests/fixtures/adapters/sotu/adapter
    run r16 --adapter "$WORK/r16/adapter"
done
median() { tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
for name in base r4 r16; do
    echo "median $name: prompt $(median "${PROMPT_TPS[$name]}") tok/s, decode $(median "${DECODE_TPS[$name]}") tok/s"
done
for name in r4 r16; do
    awk -v b="$(median "${DECODE_TPS[base]}")" -v a="$(median "${DECODE_TPS[$name]}")" -v n="$name" \
        'BEGIN {printf "adapter %s decode slowdown: %.1f%%\n", n, 100 * (b / a - 1)}'
    awk -v b="$(median "${PROMPT_TPS[base]}")" -v a="$(median "${PROMPT_TPS[$name]}")" -v n="$name" \
        'BEGIN {printf "adapter %s prompt slowdown: %.1f%%\n", n, 100 * (b / a - 1)}'
done
