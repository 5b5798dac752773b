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

# The simulator transport and firmware-log tests of the native run need
# the Hexagon projection service and the self-test ELF beside it.
stage "build: Hexagon service and self-test ELF" bash ci/sim-test.sh --build-service
HEXLORA_SIM_SERVICE=$(stage_last_line)
HEXLORA_FIRMWARE_ELF=$(dirname "$HEXLORA_SIM_SERVICE")/selftest
export HEXLORA_SIM_SERVICE HEXLORA_FIRMWARE_ELF

# The FastRPC transport tests below need it.
stage "build+test: FastRPC stand-in" bash ci/fastrpc-standin.sh
HEXLORA_FASTRPC_LIB=$(stage_last_line)
export HEXLORA_FASTRPC_LIB

stage "native tests" cargo test --workspace
# The binary that run made for the integration tests: the checks below use
# it, since a `cargo build` resolves features without the dev-dependencies
# and would rebuild the crate.
export HEXLORA_BIN=$PWD/target/debug/hexlora

# The workspace run above used the widest this CPU has; the portable build
# is the aarch64 one, which ci/aarch64-test.sh runs the same test on.
stage "SmolLM2 vs transformers, AVX2 decoding" env HEXLORA_MATVEC=avx2 cargo test -q -p hexlora --test suite model_smollm2::

stage "GGUF LoRA adapters in llama.cpp" bash ci/llama-cpp-adapter.sh

stage "serve and its learning loop, official openai client" bash ci/openai-client.sh

stage "stage 1 federated on Flower, loopback" bash ci/federated-test.sh

# Fuzzing: the native tests replay every target's body over its kept
# regression inputs and a few thousand mutants of the fixture seeds
# (host/tests/suite/fuzz_replay.rs). Coverage-guided fuzzing under the
# address sanitizer is a tier of its own, `bash ci/fuzz.sh` (its build
# alone took 10 minutes here); its latest long pass is in fuzz/README.md.

# The same registry the simulator runs.
stage "firmware self-test, native" bash -c 'set -o pipefail; cargo run -q -p hexlora-dsp --bin selftest | tail -n 1'

stage "C header vs Rust ABI (bindgen)" bash ci/bindgen-check.sh

stage "build: skel shared object (v73)" bash ci/build-skel.sh v73

stage "HVX float tile engine for v73 (objdump)" bash ci/hvx-float-check.sh

# The host's simulator transport tests ran in the native stage.
stage "Hexagon simulator self-tests" bash ci/sim-test.sh --selftest-only

# The static musl build a phone's shell runs: one build, both CPUs.
stage "aarch64 (static) host tests, qemu -cpu max" bash ci/aarch64-test.sh max
stage "aarch64 (static) subset, qemu -cpu cortex-a53" bash ci/aarch64-test.sh cortex-a53

stage_summary
