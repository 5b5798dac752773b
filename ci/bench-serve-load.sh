#!/usr/bin/env bash
# A bounded loopback load test of `serve`: several adapters, streaming and
# not, more concurrent clients than --queue admits, for DURATION seconds
# after a warm-up (ci/bench_serve_load.py says what it checks and prints).
# Run it alone on the machine; it exits non-zero on any 5xx, any refusal
# other than 429, or RSS growing after the warm-up.
#
# Env: MODEL, DURATION (60), CLIENTS (12), QUEUE (4).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$MODEL" ] || { echo "no $MODEL (run toolchain/fetch-models.sh)"; exit 1; }
cargo build --release -q -p hexlora
python3 ci/bench_serve_load.py target/release/hexlora "$MODEL" "${DURATION:-60}" "${CLIENTS:-12}" "${QUEUE:-4}"
