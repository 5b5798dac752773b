#!/usr/bin/env bash
# Generation speed against llama.cpp: SmolLM2-135M Q4_1 GGUF, THREADS
# threads, a 512-token prompt (the same token ids on both sides) and 128
# greedy tokens. hexlora `generate` against llama.cpp built for this CPU
# (PyPI llama-cpp-python compiles its vendored llama.cpp with native flags,
# in a venv of its own: a peer, never a dependency), in interleaved rounds
# as ci/bench-train.sh does. Prints prompt tok/s, generated tok/s and peak
# RSS of both per round, and ends with
#   generate tok/s ratio hexlora/llama.cpp: X
#   prompt tok/s ratio hexlora/llama.cpp: Y
# (medians of the per-round ratios), after a roofline line: decoding reads
# every weight once a token, so its bound is the machine's memory read
# speed (host/examples/bench_decode_roofline.rs measures it, and the
# decoding kernel alone on a weight larger than the caches).
# Env: THREADS (2), ROUNDS (3), PROMPT_TOKENS (512), GEN (128), MODEL,
#      HEXLORA_BENCH_VENV (target/bench-venv), PYTHON (python3).
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-3}
PROMPT_TOKENS=${PROMPT_TOKENS:-512}
GEN=${GEN:-128}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
VENV=${HEXLORA_BENCH_VENV:-target/bench-venv}
LLAMA_CPP_PYTHON=0.3.36
[ -f "$MODEL" ] || { echo "missing $MODEL: run toolchain/fetch-models.sh" >&2; exit 1; }
if ! "$VENV/bin/python" -c "import llama_cpp; assert llama_cpp.__version__ == '$LLAMA_CPP_PYTHON'" 2>/dev/null; then
    echo "bench-generate: making $VENV (llama-cpp-python $LLAMA_CPP_PYTHON, compiled for this CPU: several minutes)"
    "${PYTHON:-python3}" -m venv "$VENV"
    CMAKE_ARGS="-DGGML_NATIVE=ON" "$VENV/bin/pip" install --quiet --no-cache-dir "llama-cpp-python==$LLAMA_CPP_PYTHON"
fi
cargo build --release -q -p hexlora --bin hexlora --example bench_decode_roofline
BIN=${CARGO_TARGET_DIR:-target}/release/hexlora
ROOFLINE=${CARGO_TARGET_DIR:-target}/release/examples/bench_decode_roofline
PY="$VENV/bin/python"
tmp=$(mktemp -d)
source ci/steal.sh
trap 'rm -rf "$tmp"' EXIT

echo "cpu: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores), threads $THREADS"
echo "hexlora: $("$BIN" info | grep -E "^decoding")"
echo "llama.cpp: $("$PY" -c 'import llama_cpp; print(llama_cpp.llama_print_system_info().decode().strip())')"

# The prompt: the first PROMPT_TOKENS tokens of the sotu training fixture's
# text, as text that both tokenizers turn into exactly those ids (checked).
"$PY" - "$MODEL" "$PROMPT_TOKENS" "$tmp" <<'EOF'
import json, sys
from llama_cpp import Llama
model, n, tmp = sys.argv[1], int(sys.argv[2]), sys.argv[3]
lines = open("host/tests/fixtures/training/sotu_train.jsonl")
text = " ".join(json.loads(l)["prompt"] + json.loads(l)["completion"] for l in lines)
vocab = Llama(model_path=model, vocab_only=True, verbose=False)
ids = vocab.tokenize(text.encode(), add_bos=False, special=False)[:n]
assert len(ids) == n, f"the fixture text has only {len(ids)} tokens"
prompt = vocab.detokenize(ids)
assert vocab.tokenize(prompt, add_bos=False, special=False) == ids
open(f"{tmp}/prompt.txt", "wb").write(prompt)
json.dump(ids, open(f"{tmp}/ids.json", "w"))
EOF
"$BIN" tokenize --model "$MODEL" "$(cat "$tmp/prompt.txt")" > "$tmp/hex-ids.json"
cmp -s <(tr -d ' \n' < "$tmp/hex-ids.json") <(tr -d ' \n' < "$tmp/ids.json") \
    || { echo "hexlora and llama.cpp tokenize the prompt differently" >&2; exit 1; }

# llama.cpp's AMX product (an extra buffer type) segfaults on some AMX
# machines; a short probe finds out, and llama.cpp then runs without extra
# buffer types (its AVX-512 kernels), which this line says.
head -c 40 "$tmp/ids.json" | sed 's/,[^,]*$/]/' > "$tmp/probe.json"
export LLAMA_EXTRA_BUFTS=1
if ! OMP_NUM_THREADS=$THREADS "$PY" ci/bench_generate_llama.py "$MODEL" "$tmp/probe.json" 2 "$THREADS" > /dev/null 2>&1; then
    LLAMA_EXTRA_BUFTS=0
    OMP_NUM_THREADS=$THREADS "$PY" ci/bench_generate_llama.py "$MODEL" "$tmp/probe.json" 2 "$THREADS" > /dev/null
    echo "llama.cpp: crashed with its extra buffer types (AMX, repacked weights) on this CPU; runs without them (LLAMA_EXTRA_BUFTS=0)"
fi

RAYON_NUM_THREADS=$THREADS "$ROOFLINE" | tee "$tmp/roofline.txt" | grep -v '^cpu:'

gen_ratios=""
prompt_ratios=""
hex_gen=""
llama_gen=""
for round in $(seq 1 "$ROUNDS"); do
    # hexlora prints "[N prompt tokens in S s (P tok/s), M generated in S s (G tok/s), finish: ...]"
    RAYON_NUM_THREADS=$THREADS /usr/bin/time -f "%M" -o "$tmp/rss" "$BIN" generate --model "$MODEL" --raw \
        --prompt "$(cat "$tmp/prompt.txt")" --max-tokens "$GEN" > /dev/null 2> "$tmp/hex.txt"
    line=$(grep -E '^\[[0-9]+ prompt tokens' "$tmp/hex.txt")
    hp=$(sed -E 's/.*prompt tokens in [0-9.]+ s \(([0-9.]+) tok\/s\).*/\1/' <<< "$line")
    hg=$(sed -E 's/.*generated in [0-9.]+ s \(([0-9.]+) tok\/s\).*/\1/' <<< "$line")
    echo "round $round: hexlora $line, peak RSS $(( $(cat "$tmp/rss") / 1024 )) MiB"
    OMP_NUM_THREADS=$THREADS "$PY" ci/bench_generate_llama.py "$MODEL" "$tmp/ids.json" "$GEN" "$THREADS" 2>/dev/null > "$tmp/llama.txt"
    echo "round $round: $(cat "$tmp/llama.txt")"
    lp=$(sed -E 's/.*tokens ([0-9.]+) tok\/s, generated.*/\1/' "$tmp/llama.txt")
    lg=$(sed -E 's/.*generated [0-9]+ tokens ([0-9.]+) tok\/s.*/\1/' "$tmp/llama.txt")
    hex_gen="$hex_gen $hg"
    llama_gen="$llama_gen $lg"
    gen_ratios="$gen_ratios $(awk -v h="$hg" -v l="$lg" 'BEGIN { printf "%.2f", h / l }')"
    prompt_ratios="$prompt_ratios $(awk -v h="$hp" -v l="$lp" 'BEGIN { printf "%.2f", h / l }')"
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : sprintf("%.2f", (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
echo "per-round generate ratios:$gen_ratios; prompt ratios:$prompt_ratios"
# Bytes a decoding step reads: every weight once, i.e. about the GGUF
# file (the tied embedding is the head; its lookup reads one row).
mb=$(( $(stat -c %s "$MODEL") / 1000000 ))
read_gbs=$(sed -nE 's/^memory read: ([0-9.]+) GB\/s.*/\1/p' "$tmp/roofline.txt")
steal_line
echo "roofline: decoding reads ~$mb MB of weights a token; at the median rates hexlora $(median <<< "$hex_gen") tok/s = $(awk -v m="$mb" -v t="$(median <<< "$hex_gen")" 'BEGIN { printf "%.1f", m * t / 1000 }') GB/s, llama.cpp $(median <<< "$llama_gen") tok/s = $(awk -v m="$mb" -v t="$(median <<< "$llama_gen")" 'BEGIN { printf "%.1f", m * t / 1000 }') GB/s, of the $read_gbs GB/s this machine reads"
echo "generate tok/s ratio hexlora/llama.cpp: $(median <<< "$gen_ratios")"
echo "prompt tok/s ratio hexlora/llama.cpp: $(median <<< "$prompt_ratios")"
