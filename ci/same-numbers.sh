#!/usr/bin/env bash
# Same numbers, bit for bit, from two hexlora binaries: run before landing a
# refactor that must not change any result.
#
#   bash ci/same-numbers.sh OLD_BINARY NEW_BINARY
#
# Compares, byte for byte: `grad` (loss, logits, every LoRA gradient) on the
# llama, qwen3, qwen35 and gemma3 training fixtures; `train --steps 3` and
# `personalize --steps 2` (the main job, through the split runtime) on
# SmolLM2 (adapters and losses); `generate` greedy with that adapter, seeded
# at T = 1, and greedy on Gemma 3 270M (text). Needs the models of
# toolchain/fetch-models.sh. Exit 1 if anything differs.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: $0 OLD_BINARY NEW_BINARY" >&2; exit 2; }
declare -A BIN=([old]=$1 [new]=$2)
F=host/tests/fixtures/training
M=models/SmolLM2-135M-Instruct.Q4_1.gguf
G=models/gemma-3-270m-q4_k_m.gguf
for m in "$M" "$G"; do [ -f "$m" ] || { echo "missing $m: run toolchain/fetch-models.sh" >&2; exit 2; }; done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
bad=0
same() { # what file_old file_new
    if cmp -s "$2" "$3"; then echo "same: $1"; else echo "DIFFERENT: $1"; bad=1; fi
}
for arch in llama qwen3 qwen35 gemma3; do
    for b in old new; do
        "${BIN[$b]}" grad --model $F/$arch/model --adapter $F/$arch/adapter --batch $F/$arch/batch.json \
            --out "$out/grad-$arch-$b.safetensors" --force > /dev/null || { echo "grad $arch failed ($b)"; bad=1; }
    done
    same "grad $arch" "$out/grad-$arch-old.safetensors" "$out/grad-$arch-new.safetensors"
done
for b in old new; do
    "${BIN[$b]}" train --model $M --data $F/sotu_train.jsonl --steps 3 --out "$out/train-$b" > /dev/null 2>&1 || { echo "train failed ($b)"; bad=1; }
    "${BIN[$b]}" personalize --data $F/sotu_train.jsonl --steps 2 --no-plan-cache --out "$out/personalize-$b" > /dev/null 2>&1 || { echo "personalize failed ($b)"; bad=1; }
    grep -o '"loss":[^,]*' "$out/train-$b/metrics.jsonl" > "$out/train-loss-$b"
    grep -o '"loss":[^,]*' "$out/personalize-$b/metrics.jsonl" > "$out/personalize-loss-$b"
    "${BIN[$b]}" generate --model $M --adapter "$out/train-old/adapter" --max-tokens 48 --prompt "Write one sentence about the state of the union." > "$out/gen-$b" 2>/dev/null
    "${BIN[$b]}" generate --model $M --max-tokens 48 --temperature 1 --seed 3 --prompt "The best way to learn a language is" > "$out/gen-t1-$b" 2>/dev/null
    "${BIN[$b]}" generate --model $G --max-tokens 48 --prompt "Write one sentence about rivers." > "$out/gen-gemma3-$b" 2>/dev/null
done
same "train adapter" "$out/train-old/adapter/adapter_model.safetensors" "$out/train-new/adapter/adapter_model.safetensors"
same "train losses" "$out/train-loss-old" "$out/train-loss-new"
same "personalize adapter" "$out/personalize-old/adapter/adapter_model.safetensors" "$out/personalize-new/adapter/adapter_model.safetensors"
same "personalize losses" "$out/personalize-loss-old" "$out/personalize-loss-new"
same "generate greedy with the adapter" "$out/gen-old" "$out/gen-new"
same "generate T=1 seed 3" "$out/gen-t1-old" "$out/gen-t1-new"
same "generate Gemma 3 greedy" "$out/gen-gemma3-old" "$out/gen-gemma3-new"
for f in "$out"/gen-*-new "$out/gen-new"; do [ -s "$f" ] || { echo "empty output: $f"; bad=1; }; done
exit $bad
