#!/usr/bin/env bash
# x86 against aarch64: the same `hexlora train` job (SmolLM2-135M, three
# steps of the sotu fixture, 32 tokens) run natively and under qemu-aarch64,
# with f32 and with bf16 frozen weights; prints each run's losses and the
# largest difference from the native run of the same precision.
#
# What to expect (see docs/AARCH64.md): f32 frozen weights run the same
# fused multiply-add chains on both CPUs, so the losses are bit-identical;
# bf16 frozen weights differ by kernel (x86 AVX512-BF16 sums pairs, Arm
# BFMMLA rounds its adds to odd), except x86's portable kernel against
# `-cpu cortex-a53`, which widen to f32 and run the same chains.
# Usage: bash ci/aarch64-losses.sh [OUT_DIR]   (default target/aarch64-losses)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/aarch64-losses}
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
data=host/tests/fixtures/training/sotu_train.jsonl
[ -f "$model" ] || { echo "ci/aarch64-losses.sh: $model is absent (toolchain/fetch-models.sh)" >&2; exit 1; }

a64=$(bash ci/build-aarch64.sh | tail -n 1)
cargo build -q --release -p hexlora
x86=target/release/hexlora
rm -rf "$out"
mkdir -p "$out"

# run NAME DTYPE COMMAND...: trains into $out/NAME, prints its losses
run() {
    local name=$1 dtype=$2; shift 2
    local start=$SECONDS
    "$@" train --quiet --model "$model" --data "$data" --out "$out/$name" \
        --steps 3 --max-len 32 --rank 8 --seed 5 --frozen-dtype "$dtype" >/dev/null
    printf '%-28s %4ds  losses %s\n' "$name" $((SECONDS - start)) \
        "$(python3 -c 'import json,sys; print(" ".join(repr(json.loads(l)["loss"]) for l in open(sys.argv[1]) if "loss" in json.loads(l)))' "$out/$name/metrics.jsonl")"
}

qemu() { echo qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu "$1" "$a64"; }
for dtype in f32 bf16; do
    run "x86-$dtype" "$dtype" "$x86"
    run "a64-max-$dtype" "$dtype" $(qemu max)
    run "a64-cortex-a53-$dtype" "$dtype" $(qemu cortex-a53)
done
HEXLORA_BF16_KERNEL=portable run x86-portable-bf16 bf16 "$x86"

python3 - "$out" <<'EOF'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
def losses(name):
    return [json.loads(l)["loss"] for l in open(out / name / "metrics.jsonl") if "loss" in json.loads(l)]
for ref, other in [("x86-f32", "a64-max-f32"), ("x86-f32", "a64-cortex-a53-f32"),
                   ("x86-bf16", "a64-max-bf16"), ("x86-bf16", "a64-cortex-a53-bf16"),
                   ("x86-portable-bf16", "a64-cortex-a53-bf16"), ("a64-max-f32", "a64-cortex-a53-f32")]:
    a, b = losses(ref), losses(other)
    diff = max(abs(x - y) for x, y in zip(a, b))
    print(f"{other:>22} vs {ref:<18} max |loss difference| {diff:.3g}{'  (bit-identical)' if a == b else ''}")
EOF
