# Sourced by ci/*.sh: the compiler settings of a Hexagon build.
#
# Default: Debian's rustc 1.96 (rustc-web), which ships the Hexagon backend
# and, with rust-web-src, the library source -Zbuild-std needs;
# RUSTC_BOOTSTRAP=1 unlocks -Zbuild-std and the unstable Hexagon asm/HVX
# features on this stable compiler.
#
# HEXLORA_RUSTUP=1: use the rustup nightly toolchain instead (needs
# `rustup toolchain install nightly --component rust-src`); the linker
# stays ld.lld-14 from .cargo/config.toml unless
# CARGO_TARGET_HEXAGON_UNKNOWN_NONE_ELF_LINKER=rust-lld is set.
if [ "${HEXLORA_RUSTUP:-0}" = 1 ]; then
    HEXAGON_CARGO=(cargo +nightly)
    unset RUSTC
else
    HEXAGON_CARGO=(cargo)
    export RUSTC=/usr/bin/rustc
    export RUSTC_BOOTSTRAP=1
    if [ ! -x "$RUSTC" ] || [ ! -d /usr/lib/rustlib/src/rust/library/core ]; then
        echo "Hexagon build needs Debian's rustc-web and rust-web-src: run toolchain/install.sh" >&2
        return 1 2>/dev/null || exit 1
    fi
fi
HEXAGON_TARGET=hexagon-unknown-none-elf
HEXAGON_BUILD=(-Zbuild-std=core,alloc --target "$HEXAGON_TARGET")
HEXAGON_OUT="${CARGO_TARGET_DIR:-$(pwd)/target}/$HEXAGON_TARGET"

# RUSTFLAGS of one generation: sim = v73 CPU with HVX v73 integer ops (what
# qemu-hexagon 10 `-cpu v73` executes: no HVX float, no user DMA);
# v68..v79 are the device skels, compile-only here, and add HVX floating
# point (IEEE `hvx-ieee-fp` and `hvx-qfloat`, both introduced with v68),
# which selects the HVX float tile engine (dsp/src/tile/hvx_float.rs).
hexagon_rustflags() {
    local cpu hvx
    case "$1" in
        sim) cpu=hexagonv73 hvx=hvxv73 ;;
        v68 | v73 | v75 | v79) cpu="hexagon$1" hvx="hvx$1,+hvx-ieee-fp,+hvx-qfloat" ;;
        *) echo "unknown Hexagon generation '$1' (sim, v68, v73, v75, v79)" >&2; return 1 ;;
    esac
    echo "-C target-cpu=$cpu -C target-feature=+$hvx,+hvx-length128b"
}
