#!/usr/bin/env bash
# Installs what hexlora's builds and tests need on a fresh Debian 12 machine.
# Idempotent: installs only what is missing, so CI calls it every run.
#
#   rustc-web rust-web-src  Debian's rustc 1.96 and its library source, which
#                           -Zbuild-std compiles for hexagon-unknown-none-elf
#   cargo-web               cargo for that rustc (skipped if cargo exists)
#   qemu-user (>= 10)       qemu-hexagon with -cpu v73, the simulator (Linux
#                           user mode), from Debian bookworm-backports
#   lld-14                  ld.lld-14, the Hexagon linker
#   llvm-14                 llvm-readelf-14, to check the skel's symbols
#   llvm-22                 llvm-objdump-22, which decodes v73 HVX float
#                           (ci/hvx-float-check.sh)
#   libclang-dev bindgen    bindgen over dsp/include/hexlora.h
#   gcc-aarch64-linux-gnu   linker and C runtime of the phone-CPU build
#   libc6-dev-arm64-cross   (ci/build-aarch64.sh; qemu-user runs it)
#   musl-dev:arm64          musl's static C runtime for aarch64 and its gcc
#                           wrapper: the static phone binary (ci/build-
#                           aarch64.sh --static; adds dpkg's arm64 arch)
#   fonts-dejavu-core       DejaVuSans.ttf, the font `hexlora report` draws
#                           its plots' text with (host/tests/suite/eval_report.rs,
#                           eval_cli.rs)
#
# A rustup user can skip the Debian compilers instead: see toolchain/README.md.
set -euo pipefail

packages=(rustc-web rust-web-src lld-14 llvm-14 llvm-22 libclang-dev bindgen gcc-aarch64-linux-gnu libc6-dev-arm64-cross fonts-dejavu-core)
command -v cargo >/dev/null || packages+=(cargo-web)

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"

if [ ${#missing[@]} -gt 0 ]; then
    echo "toolchain/install.sh: installing ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
else
    echo "toolchain/install.sh: all packages present"
fi

# qemu-hexagon 10 (-cpu v73): Debian 12 itself has 7.2 (v67 at most).
# `|| true`: on a fresh machine qemu-hexagon is absent, and a failing
# command substitution would end the script under `set -e`.
qemu_major=$(qemu-hexagon --version 2>/dev/null | sed -n 's/^qemu-hexagon version \([0-9]*\).*/\1/p' || true)
if [ "${qemu_major:-0}" -lt 10 ]; then
    echo "toolchain/install.sh: installing qemu-user 10 from bookworm-backports (have ${qemu_major:-none})"
    list=/etc/apt/sources.list.d/bookworm-backports.list
    if ! grep -rqs bookworm-backports /etc/apt/sources.list /etc/apt/sources.list.d/; then
        echo "deb http://deb.debian.org/debian bookworm-backports main" | $sudo tee "$list" >/dev/null
    fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq -t bookworm-backports qemu-user
fi

# musl for aarch64 (the static phone binary): Debian ships it as the arm64
# build of musl-dev, installed beside the x86 system through multiarch.
if ! dpkg-query -W -f='${Status}' musl-dev:arm64 2>/dev/null | grep -q "ok installed"; then
    echo "toolchain/install.sh: installing musl-dev:arm64 (adds the arm64 architecture to dpkg)"
    dpkg --print-foreign-architectures | grep -qx arm64 || $sudo dpkg --add-architecture arm64
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq musl-dev:arm64
fi
