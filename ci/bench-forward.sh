#!/usr/bin/env bash
# Forward throughput and peak RSS on SmolLM2-135M at seq 256, 2 threads:
# hexlora, then PyTorch (transformers on the same GGUF) when it is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
SEQ=${SEQ:-256}
THREADS=${THREADS:-2}
PYTHON=${PYTHON:-/work/venv/bin/python}
[ -f "$MODEL" ] || { echo "no $MODEL (run toolchain/fetch-models.sh)"; exit 1; }

cargo build --release -p hexlora --example bench_forward
OMP_NUM_THREADS=$THREADS cargo run -q --release -p hexlora --example bench_forward -- \
    --model "$MODEL" --seq "$SEQ" --threads "$THREADS"
if [ -x "$PYTHON" ] && "$PYTHON" -c "import torch, transformers" 2>/dev/null; then
    for dtype in float32 bfloat16; do
        OMP_NUM_THREADS=$THREADS "$PYTHON" host/examples/bench_forward_torch.py \
            --model "$MODEL" --seq "$SEQ" --threads "$THREADS" --dtype "$dtype" 2>/dev/null | grep '^pytorch'
    done
else
    echo "pytorch: not installed ($PYTHON), no comparison"
fi
