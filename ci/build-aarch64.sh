#!/usr/bin/env bash
# Cross-builds the hexlora release binary for the phone's CPU and prints its
# path as the last line.
#
#   bash ci/build-aarch64.sh            aarch64-unknown-linux-gnu (glibc)
#   bash ci/build-aarch64.sh --static   aarch64-unknown-linux-musl, statically
#                                       linked: needs no libc on the device
#                                       (the form an Android shell runs)
#
# Debian's rustc 1.96 (rustc-web, the compiler of the Hexagon build) has no
# prebuilt aarch64 standard library, so std is compiled from rust-web-src
# (-Zbuild-std, unlocked by RUSTC_BOOTSTRAP=1). The glibc build links with
# gcc-aarch64-linux-gnu against libc6-dev-arm64-cross; the static one with
# musl-dev:arm64's gcc wrapper against its libc.a, and unwinds with gcc's
# libgcc_eh (Debian has no LLVM libunwind for musl; `_dl_find_object`, which
# libgcc_eh wants from glibc, is in host/src/main.rs). toolchain/install.sh
# installs all of it. Run the result with
#   qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu max BINARY ...   (glibc)
#   qemu-aarch64 -cpu max BINARY ...                             (static)
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1
target_dir=${CARGO_TARGET_DIR:-$(pwd)/target}

need() {
    command -v "$1" >/dev/null || { echo "ci/build-aarch64.sh: $1 not found ($2; run toolchain/install.sh)" >&2; exit 1; }
}

# The static musl link: the flags its builds (this one, and the aarch64
# test suite, which sources this script with --static-env) need.
static_env() {
    need aarch64-linux-musl-gcc musl-dev:arm64
    need aarch64-linux-gnu-gcc gcc-aarch64-linux-gnu
    # the unwinder under the name std's unwind crate links (-lunwind)
    unwind="$target_dir/aarch64-musl-unwind"
    mkdir -p "$unwind"
    ln -sf "$(aarch64-linux-gnu-gcc -print-file-name=libgcc_eh.a)" "$unwind/libunwind.a"
    # no self-contained crt objects (Debian's rustc has none): musl-dev's
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_RUSTFLAGS="-C link-self-contained=no -C target-feature=+crt-static -L $unwind"
}

if [[ ${1:-} == --static-env ]]; then
    static_env
    return 0
elif [[ ${1:-} == --static ]]; then
    target=aarch64-unknown-linux-musl
    static_env
elif [[ -z ${1:-} ]]; then
    target=aarch64-unknown-linux-gnu
    need aarch64-linux-gnu-gcc gcc-aarch64-linux-gnu
else
    echo "usage: bash ci/build-aarch64.sh [--static]" >&2
    exit 2
fi
cargo build --release -p hexlora -Zbuild-std=std,panic_unwind --target "$target" >&2
echo "$target_dir/$target/release/hexlora"
