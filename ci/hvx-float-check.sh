#!/usr/bin/env bash
# Checks that the HVX float tile engine compiles to HVX floating-point
# instructions for Hexagon v73: builds the firmware self-test binary with
# ci/build-skel.sh's v73 flags (HVX v73 + hvx-ieee-fp + hvx-qfloat), which
# links the engine on the real instructions (the tile self-tests run
# `DeviceTiles`), disassembles the engine's hot function
#   hexlora_dsp::tile::hvx_float::mac_tile::<hexlora_dsp::tile::hvx_intrinsics::Intrinsics>
# and fails unless its hardware loop holds the widening multiply-accumulate
# `Vxx.sf += vmpy(Vu.hf,Vv.hf)` (16 per row) with the `vsplat`s feeding it,
# and the function ends each row with `Vd.sf = vadd(Vu.sf,Vv.sf)`.
#
# The binary is built with the `sim` feature only for its Linux entry point
# (the v73 firmware has no other executable); it is never run: no simulator
# here executes HVX float. When the skel shared object of ci/build-skel.sh
# exists and links the engine too (once the service runs `DeviceTiles`), it
# is checked the same way; until then this prints that it does not.
#
# Prints the loop's packet count (static, from the disassembly; not a timing).
set -euo pipefail
cd "$(dirname "$0")/.."
source toolchain/hexagon-env.sh

RUSTFLAGS="$(hexagon_rustflags v73)" "${HEXAGON_CARGO[@]}" build -q "${HEXAGON_BUILD[@]}" \
    --release -p hexlora-dsp --features sim --bin selftest

# llvm-objdump-14 does not decode the v73 HVX float instructions; 22 does.
objdump=""
for c in llvm-objdump-22 llvm-objdump; do
    if command -v "$c" >/dev/null && "$c" --version | grep -Eq 'LLVM version (1[7-9]|[2-9][0-9])'; then
        objdump=$c
        break
    fi
done
[ -n "$objdump" ] || { echo "ci/hvx-float-check.sh: needs llvm-objdump >= 17 (Debian llvm-22)" >&2; exit 1; }
disasm=("$objdump" -d --no-show-raw-insn --mcpu=hexagonv73 --mattr=+hvxv73,+hvx-length128b,+hvx-ieee-fp,+hvx-qfloat)

fail() { echo "ci/hvx-float-check.sh: $*" >&2; exit 1; }

# The mangled (v0) name of mac_tile::<Intrinsics>, or nothing.
engine_symbol() {
    "$objdump" -t "$1" | awk '{print $NF}' | grep -E 'hvx_float8mac_tile.*14hvx_intrinsics10Intrinsics' | head -n 1 || true
}

check_elf() {
    local elf=$1 sym asm loop n_mpy n_splat n_add packets
    sym=$(engine_symbol "$elf")
    [ -n "$sym" ] || fail "$elf: no symbol hexlora_dsp::tile::hvx_float::mac_tile::<..Intrinsics>"
    asm=$("${disasm[@]}" --disassemble-symbols="$sym" "$elf")
    # The hardware loop: from the packet at loop0's target to :endloop0.
    local start
    start=$(grep -Eo 'loop0\(0x[0-9a-f]+' <<<"$asm" | head -n 1 | sed 's/loop0(0x//' || true)
    [ -n "$start" ] || fail "$elf: mac_tile has no hardware loop (loop0)"
    loop=$(awk -v s="$start:" '$1 == s {f = 1} f {print} f && /:endloop0/ {exit}' <<<"$asm")
    grep -q '<unknown>' <<<"$loop" && fail "$elf: $objdump cannot decode part of mac_tile's loop"
    n_mpy=$(grep -Ec 'v[0-9]+:[0-9]+\.sf \+= vmpy\(v[0-9]+\.hf,v[0-9]+\.hf\)' <<<"$loop" || true)
    n_splat=$(grep -Ec 'v[0-9]+ = vsplat\(r[0-9]+\)' <<<"$loop" || true)
    n_add=$(grep -Ec 'v[0-9]+\.sf = vadd\(v[0-9]+\.sf,v[0-9]+\.sf\)' <<<"$asm" || true)
    packets=$(grep -c '{' <<<"$loop" || true)
    [ "$n_mpy" -ge 16 ] || fail "$elf: the mac_tile loop holds $n_mpy 'Vxx.sf += vmpy(Vu.hf,Vv.hf)', expected >= 16"
    [ "$n_splat" -ge 16 ] || fail "$elf: the mac_tile loop holds $n_splat vsplat, expected >= 16"
    [ "$n_add" -ge 1 ] || fail "$elf: mac_tile holds no 'Vd.sf = vadd(Vu.sf,Vv.sf)'"
    echo "ci/hvx-float-check.sh: $elf: mac_tile's loop: $n_mpy x 'sf += vmpy(hf,hf)', $n_splat x vsplat in $packets packets (one activation row per iteration); sf vadd present"
}

check_elf "$HEXAGON_OUT/release/selftest"

so="$HEXAGON_OUT/skel-v73/libhexlora_skel.so"
if [ -f "$so" ] && [ -n "$(engine_symbol "$so")" ]; then
    check_elf "$so"
elif [ -f "$so" ]; then
    echo "ci/hvx-float-check.sh: note: $so does not link the HVX float engine (the service does not run DeviceTiles yet)"
fi
