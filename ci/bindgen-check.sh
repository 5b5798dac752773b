#!/usr/bin/env bash
# Generates Rust bindings for dsp/include/hexlora.h with bindgen and checks
# them against the Rust side of the ABI (dsp/src/skel/abi.rs): the
# `hexlora-dsp` test `c_header_bindings` includes the generated file when
# HEXLORA_H_BINDINGS names it.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v bindgen >/dev/null; then
    echo "ci/bindgen-check.sh: bindgen not found (Debian package bindgen; run toolchain/install.sh)" >&2
    exit 1
fi
out="${CARGO_TARGET_DIR:-$(pwd)/target}/bindgen"
mkdir -p "$out"
bindgen dsp/include/hexlora.h -o "$out/hexlora_h.rs" \
    --allowlist-function 'hexlora_.*' --allowlist-type 'remote_.*' --allowlist-var 'HEXLORA_.*' \
    --no-layout-tests
echo "ci/bindgen-check.sh: generated $out/hexlora_h.rs"
HEXLORA_H_BINDINGS="$out/hexlora_h.rs" cargo test -p hexlora-dsp --lib c_header
