#!/usr/bin/env bash
# The README's test command (and CI's, through .ci/run): installs what is
# missing, runs every native test, the Hexagon simulator tests, then the
# host tests built for aarch64 under qemu-aarch64.
set -euo pipefail
cd "$(dirname "$0")/.."
# A run from a clean clone never reuses incremental state; it only costs disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

bash toolchain/install.sh
# Real model and benchmark text: a test that needs them and finds them
# absent prints SKIPPED, and under CI (CI set) fails.
bash toolchain/fetch-models.sh || echo "WARNING: model fetch failed; SmolLM2 and Gemma 3 tests will skip (fail under CI)"
bash toolchain/fetch-bench-data.sh || echo "WARNING: benchmark data fetch failed; data tests will skip (fail under CI)"

echo "== Hexagon projection service (the simulator transport tests below need it)"
HEXLORA_SIM_SERVICE=$(bash ci/sim-test.sh --build-service | tail -n 1)
export HEXLORA_SIM_SERVICE

echo "== FastRPC stand-in (the FastRPC transport tests below need it)"
HEXLORA_FASTRPC_LIB=$(bash ci/fastrpc-standin.sh | tail -n 1)
export HEXLORA_FASTRPC_LIB

echo "== native tests"
cargo test --workspace

echo "== SmolLM2 logits and greedy text against transformers on the AVX2 decoding build"
# The workspace run above used the widest this CPU has; the portable build
# is the aarch64 one, which ci/aarch64-test.sh runs the same test on.
HEXLORA_MATVEC=avx2 cargo test -q -p hexlora --test model_smollm2

echo "== GGUF LoRA adapters in llama.cpp (xllamacpp in a venv of its own)"
bash ci/llama-cpp-adapter.sh

echo "== stage 1 federated on Flower, on loopback (Flower in a venv of its own)"
bash ci/federated-test.sh

echo "== fuzz targets, a short pass (ci/fuzz.sh; the long pass is run by hand, docs/STATUS.md)"
bash ci/fuzz.sh "${FUZZ_SECONDS:-15}"

echo "== firmware self-test binary, native (the same registry the simulator runs)"
cargo run -q -p hexlora-dsp --bin selftest | tail -n 1

echo "== C header vs Rust ABI (bindgen)"
bash ci/bindgen-check.sh

echo "== skel shared object (v73)"
bash ci/build-skel.sh v73

echo "== HVX float tile engine compiled for v73 (objdump of its hot loop)"
bash ci/hvx-float-check.sh

echo "== firmware log decoded on the host"
# ci/sim-test.sh below builds the same ELF; build it first for this test.
source toolchain/hexagon-env.sh
RUSTFLAGS="$(hexagon_rustflags sim)" "${HEXAGON_CARGO[@]}" build "${HEXAGON_BUILD[@]}" \
    -p hexlora-dsp --features sim --bin selftest
( unset RUSTC RUSTC_BOOTSTRAP
  HEXLORA_FIRMWARE_ELF="$HEXAGON_OUT/debug/selftest" \
      cargo test -p hexlora --test firmware_log -- --nocapture )

echo "== Hexagon simulator self-tests"
bash ci/sim-test.sh

echo "== host tests for the phone's CPU under qemu-aarch64 (and the static binary)"
bash ci/aarch64-test.sh
