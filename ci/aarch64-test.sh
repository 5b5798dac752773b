#!/usr/bin/env bash
# The host test suite cross-built for the phone's CPU (aarch64-unknown-
# linux-gnu) and run under qemu-aarch64: every test below under `-cpu max`
# (NEON, bf16, i8mm: the BFMMLA kernels), the kernel, fixture and SmolLM2
# tests again under `-cpu cortex-a53` (NEON only: the widened f32 kernels),
# then the static musl binary (ci/build-aarch64.sh --static) through the
# fixture `grad` test under both. Ends with cargo's result lines.
#
# Release profile: the code that ships (the dev profile's opt-level 1 made
# the SmolLM2 tests crawl under emulation). Tests that run the binary run
# it through qemu too (HEXLORA_TEST_RUNNER).
#
# Left out, and why:
# - npu_grad, npu_transports, personalize_job, firmware_log: they drive the
#   Hexagon service ELF through qemu-hexagon (ci/sim-test.sh) from the
#   emulated host; the client code they test is the same on both CPUs and
#   its protocol is in the library tests, which run here.
# - npu_fastrpc: it loads the FastRPC stand-in, an x86 shared object.
# - train_torture: 70 kill/resume and damaged-commit runs of the binary test
#   commits and the file system, the same code on both CPUs; the kill -9
#   resume test (train_resume) runs here.
# - adapter_generate, eval_model_methods, serve_http, unless
#   HEXLORA_AARCH64_SLOW=1: SmolLM2 generation end to end, 513 s, 605 s and
#   over 600 s under qemu (qemu computes every float through softfloat, ~100x
#   slower than native; AMD EPYC Zen 4 host, 2026-12-01). The first two
#   passed under -cpu max, and serve_http's drain test (its other test was
#   stopped unfinished); model_smollm2 (greedy text against transformers,
#   236 s) stays in. model_gemma3 too is left out unless
#   HEXLORA_AARCH64_SLOW=1: Gemma 3 270M is twice SmolLM2's weights with a
#   262,144-row head read per token and a 600-token prompt; it has not
#   been timed under qemu.
# Usage: bash ci/aarch64-test.sh [max|cortex-a53|static|all]   (default all)
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1
target=aarch64-unknown-linux-gnu
left_out="npu_grad npu_transports personalize_job firmware_log npu_fastrpc train_torture"
[[ ${HEXLORA_AARCH64_SLOW:-} == 1 ]] || left_out+=" adapter_generate eval_model_methods serve_http model_gemma3 eval_trained_methods hyper_worker"
# The integration tests are one binary (host/tests/suite): a module is left
# out by skipping its path.
skips=()
for name in $left_out; do
    skips+=(--skip "$name::")
done

run_under() {
    local cpu=$1; shift
    local runner="qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu $cpu"
    local log rc=0
    # -cpu max has FEAT_BF16: the BFMMLA kernel test must run, not skip.
    local require=()
    [[ $cpu == max ]] && require=(HEXLORA_REQUIRE_BF16=1)
    log=$(mktemp)
    echo "== host tests under $runner"
    env "${require[@]}" CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$runner" HEXLORA_TEST_RUNNER="$runner" \
        cargo test --release -p hexlora -Zbuild-std=std,panic_unwind --target "$target" "$@" >"$log" 2>&1 || rc=$?
    if ((rc)); then
        grep -E -A40 '^failures:$' "$log" | head -120 || tail -40 "$log"
    fi
    grep -E '^test result|^ *Running ' "$log" || tail -20 "$log"
    rm -f "$log"
    return $rc
}

which=${1:-all}
status=0
if [[ $which == max || $which == all ]]; then
    run_under max --lib || status=1
    run_under max --test suite -- "${skips[@]}" || status=1
fi
# cortex-a53: NEON without bf16 or i8mm. The library tests hold every
# kernel test, so they take the fallback branches; the fixture and SmolLM2
# tests check the end-to-end numbers on them.
if [[ $which == cortex-a53 || $which == all ]]; then
    run_under cortex-a53 --lib || status=1
    run_under cortex-a53 --test suite -- grad_cli_fixtures:: train_grad_fixtures:: model_smollm2:: || status=1
fi
# The static musl binary a phone's shell runs: `grad` on the fixtures.
if [[ $which == static || $which == all ]]; then
    static=$(bash ci/build-aarch64.sh --static | tail -n 1)
    for cpu in max cortex-a53; do
        echo "(the static binary $static)"
        HEXLORA_TEST_BIN=$static run_under "$cpu" --test suite -- grad_cli_fixtures:: || status=1
    done
fi
exit $status
