#!/usr/bin/env bash
# Builds dsp/fastrpc-standin (a native, test-only libcdsprpc.so stand-in that
# serves the skel in-process, built with the device's HAP paths) and prints
# its path as the last line; ci/test.sh exports it as HEXLORA_FASTRPC_LIB
# for host/tests/suite/npu_fastrpc.rs. Its own workspace and target directory keep
# the firmware's `hap` feature out of the main build.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-$(pwd)/target}/fastrpc-standin"
cargo build -q --release --manifest-path dsp/fastrpc-standin/Cargo.toml --target-dir "$target" >&2
cargo test -q --release --manifest-path dsp/fastrpc-standin/Cargo.toml --target-dir "$target" >&2
echo "$target/release/libcdsprpc_standin.so"
