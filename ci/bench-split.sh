#!/usr/bin/env bash
# Split-runtime step time, the mission's table: LoRA r16 on all 7 projections
# of SmolLM2-135M, batch 1, SEQ tokens, `hexlora personalize` in four modes:
#   unfused CPU            --device cpu --no-fuse
#   fused CPU              --device cpu
#   DSP offload, sync      --device dsp --no-overlap
#   DSP offload, overlap   --device dsp
# (the in-process transport runs the firmware crate natively: its software
# tile engine stands in for HMX, so DSP times here are this machine's, not a
# phone's), then the simulator transport (firmware under qemu-hexagon) next
# to the in-process one on the tiny Llama fixture.
# Prints a markdown table: mean step seconds after the first step, speed-up
# over unfused CPU, DSP in-flight share, row retries, and whether the step
# losses match where they must (fused = unfused, overlap = sync, sim =
# in-process).
# Env: STEPS (3), SEQ (256), THREADS (2), MODEL, TINY_STEPS (4),
# HEXLORA_SIM_SERVICE (the Hexagon service ELF; the simulator row is skipped
# without it).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-3}
SEQ=${SEQ:-256}
THREADS=${THREADS:-2}
TINY_STEPS=${TINY_STEPS:-4}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
TINY=host/tests/fixtures/training/llama/model
[ -f "$MODEL" ] || { echo "missing $MODEL: run toolchain/fetch-models.sh" >&2; exit 1; }
cargo build --release -q -p hexlora --bin hexlora
BIN=${CARGO_TARGET_DIR:-target}/release/hexlora
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Random token ids: the content does not change the cost.
ids() { awk -v n="$1" -v len="$2" -v vocab="$3" 'BEGIN { srand(7); for (i = 0; i < n; i++) { printf "{\"input_ids\": ["
  for (t = 0; t < len; t++) printf "%s%d", (t ? "," : ""), int(rand() * vocab) + 1; print "]}" } }'; }
ids "$STEPS" "$SEQ" 49000 > "$tmp/smol.jsonl"
ids "$TINY_STEPS" 32 126 > "$tmp/tiny.jsonl"

# run NAME MODEL DATA STEPS ARGS...: one personalize run, its log in $tmp/NAME.txt.
run() {
  local name=$1 model=$2 data=$3 steps=$4; shift 4
  RAYON_NUM_THREADS=$THREADS "$BIN" personalize --model "$model" --data "$data" --out "$tmp/$name" \
    --steps "$steps" --dropout 0 --max-len "$SEQ" --quiet --powercap-root /sys/class/powercap "$@" > "$tmp/$name.txt" 2>&1 \
    || { cat "$tmp/$name.txt" >&2; exit 1; }
}
step_s() { awk '/^step time: mean/ { print $4 }' "$tmp/$1.txt"; }
dsp_pct() { awk '/^  DSP in flight/ { print $(NF) }' "$tmp/$1.txt"; }
retries() { awk -F'[][]' '/^row retries per step/ { print $2 }' "$tmp/$1.txt"; }
losses() { grep -o '"loss":[^,]*' "$tmp/$1/metrics.jsonl" | cut -d: -f2 | paste -sd' '; }
same() { [ "$(losses "$1")" = "$(losses "$2")" ] && echo yes || echo NO; }

echo "== SmolLM2-135M, seq $SEQ, $STEPS steps, $THREADS threads, DSP rows on --device ${DSP_DEVICE:-dsp-shm}"
run unfused "$MODEL" "$tmp/smol.jsonl" "$STEPS" --device cpu --no-fuse
run fused "$MODEL" "$tmp/smol.jsonl" "$STEPS" --device cpu
# The DSP rows use the shared-memory transport: its service runs on its own
# thread, so the LoRA branch can really overlap the request. The in-process
# transport dispatches on the calling thread, so "overlapped" would equal
# "synchronous" there by construction.
DSP_DEVICE=${DSP_DEVICE:-dsp-shm}
run sync "$MODEL" "$tmp/smol.jsonl" "$STEPS" --device "$DSP_DEVICE" --buckets "$SEQ" --no-overlap
run overlap "$MODEL" "$tmp/smol.jsonl" "$STEPS" --device "$DSP_DEVICE" --buckets "$SEQ"
grep -E '^(resident|policy|all FP16|planner)' "$tmp/overlap.txt"
base=$(step_s unfused)
printf '\n| mode | step s | vs unfused CPU | DSP in flight | row retries per step | step losses |\n|---|---|---|---|---|---|\n'
for m in unfused fused sync overlap; do
  case $m in unfused) label="unfused CPU";; fused) label="fused CPU";; sync) label="DSP offload, synchronous";; overlap) label="DSP offload, overlapped";; esac
  s=$(step_s $m)
  printf '| %s | %s | %.2fx | %s | %s | %s |\n' "$label" "$s" "$(awk -v b="$base" -v s="$s" 'BEGIN { print b / s }')" \
    "$(dsp_pct $m)" "$(retries $m)" "$(losses $m)"
done
echo
echo "losses identical: fused = unfused: $(same fused unfused); overlapped = synchronous: $(same overlap sync)"

echo
echo "== tiny Llama fixture (hidden 48), seq 32, $TINY_STEPS steps, FP16 resident"
run tiny-native "$TINY" "$tmp/tiny.jsonl" "$TINY_STEPS" --device dsp --precision f16 --buckets 32 --rank 4 --targets q_proj,v_proj,down_proj
printf '| transport | step s | step losses |\n|---|---|---|\n'
printf '| in-process | %s | %s |\n' "$(step_s tiny-native)" "$(losses tiny-native)"
if [ -n "${HEXLORA_SIM_SERVICE:-}" ] && [ -f "$HEXLORA_SIM_SERVICE" ]; then
  run tiny-sim "$TINY" "$tmp/tiny.jsonl" "$TINY_STEPS" --device dsp-sim --precision f16 --buckets 32 --rank 4 --targets q_proj,v_proj,down_proj
  printf '| simulator (qemu-hexagon) | %s | %s |\n' "$(step_s tiny-sim)" "$(losses tiny-sim)"
  echo
  echo "losses identical: simulator = in-process: $(same tiny-sim tiny-native)"
else
  echo "(simulator row skipped: set HEXLORA_SIM_SERVICE to the service ELF built for qemu-hexagon)"
fi
