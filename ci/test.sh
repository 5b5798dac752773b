#!/usr/bin/env bash
# The README's test command (and CI's, through .ci/run): installs what is
# missing, runs every native test, the Hexagon simulator tests, then the
# host tests built for aarch64 under qemu-aarch64. Ends with a table of its
# stages (wall seconds, tests passed) and the ten slowest test binaries
# (ci/stage-table.sh), and one `N passed, M failed` line over all stages.
set -euo pipefail
cd "$(dirname "$0")/.."
# A run from a clean clone never reuses incremental state; it only costs disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
source ci/stages.sh

stage "install" bash toolchain/install.sh
# Real model and benchmark text: a test that needs them and finds them
# absent prints SKIPPED, and under CI (CI set) fails.
stage "fetch models" bash -c 'bash toolchain/fetch-models.sh || echo "WARNING: model fetch failed; SmolLM2 and Gemma 3 tests will skip (fail under CI)"'
stage "fetch bench data" bash -c 'bash toolchain/fetch-bench-data.sh || echo "WARNING: benchmark data fetch failed; data tests will skip (fail under CI)"'

# The simulator transport tests below need it.
stage "build: Hexagon projection service" bash ci/sim-test.sh --build-service
HEXLORA_SIM_SERVICE=$(stage_last_line)
export HEXLORA_SIM_SERVICE

# The FastRPC transport tests below need it.
stage "build+test: FastRPC stand-in" bash ci/fastrpc-standin.sh
HEXLORA_FASTRPC_LIB=$(stage_last_line)
export HEXLORA_FASTRPC_LIB

stage "native tests" cargo test --workspace

# The workspace run above used the widest this CPU has; the portable build
# is the aarch64 one, which ci/aarch64-test.sh runs the same test on.
stage "SmolLM2 vs transformers, AVX2 decoding" env HEXLORA_MATVEC=avx2 cargo test -q -p hexlora --test model_smollm2

stage "GGUF LoRA adapters in llama.cpp" bash ci/llama-cpp-adapter.sh

stage "stage 1 federated on Flower, loopback" bash ci/federated-test.sh

# ci/fuzz.sh; the long pass is run by hand (docs/STATUS.md).
stage "fuzz targets, short pass" bash ci/fuzz.sh "${FUZZ_SECONDS:-15}"

# The same registry the simulator runs.
stage "firmware self-test, native" bash -c 'set -o pipefail; cargo run -q -p hexlora-dsp --bin selftest | tail -n 1'

stage "C header vs Rust ABI (bindgen)" bash ci/bindgen-check.sh

stage "build: skel shared object (v73)" bash ci/build-skel.sh v73

stage "HVX float tile engine for v73 (objdump)" bash ci/hvx-float-check.sh

firmware_log() {
    set -e
    # ci/sim-test.sh below builds the same ELF; build it first for this test.
    source toolchain/hexagon-env.sh
    RUSTFLAGS="$(hexagon_rustflags sim)" "${HEXAGON_CARGO[@]}" build "${HEXAGON_BUILD[@]}" \
        -p hexlora-dsp --features sim --bin selftest
    ( unset RUSTC RUSTC_BOOTSTRAP
      HEXLORA_FIRMWARE_ELF="$HEXAGON_OUT/debug/selftest" \
          cargo test -p hexlora --test firmware_log -- --nocapture )
}
stage "firmware log decoded on the host" firmware_log

stage "Hexagon simulator self-tests" bash ci/sim-test.sh

stage "aarch64 host tests, qemu -cpu max" bash ci/aarch64-test.sh max
stage "aarch64 subset, qemu -cpu cortex-a53" bash ci/aarch64-test.sh cortex-a53
stage "aarch64 static binary, qemu" bash ci/aarch64-test.sh static

stage_summary
