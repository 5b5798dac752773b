#!/usr/bin/env bash
# Runs every cargo-fuzz target of fuzz/ for SECONDS each (default 60): over
# its kept regression inputs first (fuzz/regressions/TARGET: past findings,
# fixed), then fuzzing from a corpus seeded from the test fixtures
# (fuzz/corpus/TARGET, kept between runs, not committed). Prints each
# target's executions, coverage, crashes and hangs, and exits non-zero if
# any target found one (the input is in fuzz/artifacts/TARGET).
#
#   bash ci/fuzz.sh [SECONDS] [TARGET...]
#   FUZZ_RUNS=1000000 bash ci/fuzz.sh 36000    # the long pass: 10^6 executions
#                                              # per target (or SECONDS, if sooner)
#   FUZZ_FORK=2 ...                            # libFuzzer's fork mode: that many
#                                              # worker processes share the runs
#
# Installs cargo-fuzz when missing. cargo-fuzz passes nightly flags
# (-Zsanitizer=address); RUSTC_BOOTSTRAP=1 lets the stable toolchain take
# them. Not part of ci/test.sh: building the host crate under the address
# sanitizer alone takes minutes (docs/STATUS.md).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(decode_message skel_invoke gguf_read hf_dir peft_adapter training_jsonl http_request)
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
export RUSTC_BOOTSTRAP=1
fx=host/tests/fixtures

# pair CONFIG WEIGHTS OUT: the u16 LE length of CONFIG, CONFIG, WEIGHTS
# (the input form of hf_dir and peft_adapter).
pair() {
    local n
    n=$(stat -c %s "$1")
    { printf "\\x$(printf %02x $((n & 255)))\\x$(printf %02x $((n >> 8)))"; cat "$1" "$2"; } >"$3"
}

seed() {
    local c=fuzz/corpus
    mkdir -p "$c"/{decode_message,skel_invoke,gguf_read,hf_dir,peft_adapter,training_jsonl,http_request}
    cp $fx/gguf/quant.gguf $fx/models/llama3-rope-freqs/rope.gguf "$c/gguf_read/"
    for m in training/llama/model training/qwen3/model training/qwen35/model hyper/model; do
        pair $fx/$m/config.json $fx/$m/model.safetensors "$c/hf_dir/${m//\//_}"
    done
    for a in training/llama/adapter training/qwen3/adapter hyper/common; do
        pair $fx/$a/adapter_config.json $fx/$a/adapter_model.safetensors "$c/peft_adapter/${a//\//_}"
    done
    { printf '\x40'; head -n 4 $fx/training/sotu_train.jsonl; } >"$c/training_jsonl/pairs"
    printf '\x10{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n' >"$c/training_jsonl/chat"
    printf '\x08{"input_ids": [1, 5, 9, 17], "labels": [-100, 5, 9, 17]}\n{"input_ids": [3, 4]}\n' >"$c/training_jsonl/ids"
    # http_request: the flag byte (bit 0: the server has an API key), then a request.
    http() { { printf "$1"; printf 'POST %s HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nContent-Type: application/json\r\nAuthorization: Bearer sk-fuzz\r\nContent-Length: %d\r\n\r\n%s' "$2" "${#3}" "$3"; } >"$c/http_request/$4"; }
    http '\x01' /v1/chat/completions '{"model": "alice", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 8, "stream": true}' chat
    http '\x00' /v1/completions '{"model": "base", "prompt": ["hello"], "temperature": 0.7, "top_p": 0.9, "stop": ["\\n"]}' completion
    http '\x00' /v1/feedback '{"model": "alice", "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}' feedback
    http '\x01' /v1/adapters/alice '{"path": "alice", "scale": 2.0}' adapter
    http '\x00' /v1/adapters/bob '{"path": "../hexlora-fuzz-outside", "scale": 1e30}' outside
}
seed

echo "== building the fuzz targets (address sanitizer)"
(cd fuzz && cargo fuzz build)

failed=()
for t in "${targets[@]}"; do
    echo "== $t: ${secs} s"
    mkdir -p "fuzz/regressions/$t"
    log="fuzz/artifacts/$t.log"
    mkdir -p fuzz/artifacts
    rc=0 start=$SECONDS
    runs=()
    [ -z "${FUZZ_RUNS:-}" ] || runs=(-runs="$FUZZ_RUNS")
    [ -z "${FUZZ_FORK:-}" ] || runs+=(-fork="$FUZZ_FORK")
    # -timeout: an input running 10 s is a hang; the regression inputs run first.
    (cd fuzz && cargo fuzz run "$t" "corpus/$t" "regressions/$t" -- \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 "${runs[@]}") >"$log" 2>&1 || rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    # Fork mode prints no final stats; its progress lines start "#RUNS: cov:".
    [ -n "$execs" ] || execs=$(sed -n 's/^#\([0-9]*\): cov:.*/\1/p' "$log" | tail -n 1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2)
    crashes=$(grep -c '^==[0-9]*==ERROR\|panicked at\|deadly signal' "$log" || true)
    hangs=$(grep -c 'ERROR: libFuzzer: timeout' "$log" || true)
    echo "$t: executions ${execs:-?}, coverage ${cov:-?}, crashes $crashes, hangs $hangs, exit $rc, $((SECONDS - start)) s (log: $log)"
    if [ "$rc" -ne 0 ]; then
        failed+=("$t")
        grep -m 5 'panicked at\|ERROR\|Test unit written' "$log" || true
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz findings in: ${failed[*]}"
    exit 1
fi
echo "fuzz: ${#targets[@]} targets, no findings"
