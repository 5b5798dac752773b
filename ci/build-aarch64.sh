#!/usr/bin/env bash
# Cross-builds the hexlora release binary for the phone's CPU
# (aarch64-unknown-linux-gnu) and prints its path as the last line.
#
# Debian's rustc 1.96 (rustc-web, the compiler of the Hexagon build) has no
# prebuilt aarch64 standard library, so std is compiled from rust-web-src
# (-Zbuild-std, unlocked by RUSTC_BOOTSTRAP=1); gcc-aarch64-linux-gnu links
# against libc6-dev-arm64-cross (.cargo/config.toml). Run the result with
#   qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu max BINARY ...
# (toolchain/install.sh installs all of it). A glibc binary: it runs on
# aarch64 Linux, not as is on Android (see toolchain/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1
target=aarch64-unknown-linux-gnu
if ! command -v aarch64-linux-gnu-gcc >/dev/null; then
    echo "ci/build-aarch64.sh: aarch64-linux-gnu-gcc not found (gcc-aarch64-linux-gnu; run toolchain/install.sh)" >&2
    exit 1
fi
cargo build --release -p hexlora -Zbuild-std=std,panic_unwind --target "$target" >&2
echo "${CARGO_TARGET_DIR:-$(pwd)/target}/$target/release/hexlora"
