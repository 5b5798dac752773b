#!/usr/bin/env bash
# Builds libhexlora_skel.so for one Hexagon generation (v73 by default; v68,
# v75 or v79 as the argument) and checks that it is a Hexagon shared object
# of that generation exporting the FastRPC entry points of hexlora.h.
#
# The Rust crate dsp/skel builds a static library; ld.lld-14 links the
# shared object with linker/hexagon-skel.x and an export list, because
# rustc's cdylib path for hexagon-unknown-none-elf with lld crashes
# (rustc 1.96: "assertion failed: l.is_cc()").
set -euo pipefail
cd "$(dirname "$0")/.."
source toolchain/hexagon-env.sh

gen="${1:-v73}"
case "$gen" in
    v68 | v73 | v75 | v79) ;;
    *) echo "usage: ci/build-skel.sh [v68|v73|v75|v79]" >&2; exit 2 ;;
esac

RUSTFLAGS="$(hexagon_rustflags "$gen")" "${HEXAGON_CARGO[@]}" build "${HEXAGON_BUILD[@]}" \
    --release -p hexlora-skel --features "$gen"

archive="$HEXAGON_OUT/release/libhexlora_skel.a"
# defmt's build script writes defmt.x into its OUT_DIR; the skel script
# INCLUDEs it from there.
defmt_x=$(ls -t "$HEXAGON_OUT"/release/build/defmt-*/out/defmt.x | head -n 1)
out_dir="$HEXAGON_OUT/skel-$gen"
so="$out_dir/libhexlora_skel.so"
mkdir -p "$out_dir"
ld.lld-14 -shared -soname libhexlora_skel.so --gc-sections --hash-style=sysv \
    -z max-page-size=4096 -z noexecstack -z norelro \
    --version-script dsp/skel/hexlora_skel.ver \
    -L "$(dirname "$defmt_x")" -L linker -T hexagon-skel.x \
    --whole-archive "$archive" --no-whole-archive -o "$so"

readelf=$(command -v llvm-readelf-14 || command -v llvm-readelf || command -v readelf)
header=$("$readelf" -h "$so")
dynsyms=$("$readelf" --dyn-syms "$so")
fail() { echo "ci/build-skel.sh: $so: $*" >&2; exit 1; }

grep -Eq 'Type:[[:space:]]+DYN' <<<"$header" || fail "not a shared object"
grep -Eq 'Machine:[[:space:]]+(Qualcomm Hexagon|QUALCOMM DSP6)' <<<"$header" || fail "not a Hexagon ELF"
# e_flags holds the architecture version: 0x73 for v73, and so on.
grep -Eq "Flags:[[:space:]]+0x${gen#v}\$" <<<"$header" || fail "e_flags is not 0x${gen#v}"
for sym in hexlora_skel_handle_invoke hexlora_open hexlora_close; do
    grep -Eq "FUNC[[:space:]]+GLOBAL[[:space:]]+DEFAULT[[:space:]]+[0-9]+[[:space:]]+$sym\$" <<<"$dynsyms" \
        || fail "does not export $sym"
done
# Everything else must be inside: only the C library's abort and the HAP
# runtime calls of the memory model (the weights mapping, VTCM) may come
# from the protection domain, and those must be there (the device paths are
# linked, not the native stand-ins).
hap=(HAP_mmap_get HAP_mmap_put HAP_compute_res_attr_init HAP_compute_res_attr_set_vtcm_param
     HAP_compute_res_acquire HAP_compute_res_attr_get_vtcm_ptr HAP_compute_res_release)
undefined=$(awk '$7 == "UND" && $8 != "" {print $8}' <<<"$dynsyms" | grep -vxF -e abort "${hap[@]/#/-e}" || true)
[ -z "$undefined" ] || fail "unexpected undefined symbols: $undefined"
for sym in "${hap[@]}"; do
    awk '$7 == "UND" {print $8}' <<<"$dynsyms" | grep -qx "$sym" || fail "does not import $sym (device memory model not linked)"
done

echo "ci/build-skel.sh: $so ($gen, $(stat -c %s "$so") bytes) exports hexlora_skel_handle_invoke, hexlora_open, hexlora_close"
