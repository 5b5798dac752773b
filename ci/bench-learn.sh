#!/usr/bin/env bash
# What learning inside the server costs: request latency idle and during
# a round, the learner's yield time, and peak RSS of `serve --learn`
# against `serve` plus a separate `personalize` (ci/bench_learn.py says
# how). Run it alone on the machine.
#
# Env: DEVICE (dsp: the mission's path, the firmware in process; cpu),
# MODEL.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$MODEL" ] || { echo "no $MODEL (run toolchain/fetch-models.sh)"; exit 1; }
cargo build --release -q -p hexlora
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
python3 ci/bench_learn.py target/release/hexlora "$MODEL" "${DEVICE:-dsp}" "$WORK"
