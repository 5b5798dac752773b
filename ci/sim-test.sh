#!/usr/bin/env bash
# Builds the firmware self-test suite for Hexagon (v67 CPU, HVX v66 integer)
# and runs it under qemu-hexagon. The suite is the same one `cargo test -p
# hexlora-dsp` runs natively (dsp/src/selftest). Its last line is
# `N passed, M failed`; this script fails when M > 0 or the run crashes.
# Extra arguments go to the suite (a test-name filter, --dump-log).
set -euo pipefail
cd "$(dirname "$0")/.."
source toolchain/hexagon-env.sh

if ! command -v qemu-hexagon >/dev/null; then
    echo "ci/sim-test.sh: qemu-hexagon not found (Debian package qemu-user; run toolchain/install.sh)" >&2
    exit 1
fi

RUSTFLAGS="$(hexagon_rustflags sim)" "${HEXAGON_CARGO[@]}" build "${HEXAGON_BUILD[@]}" \
    -p hexlora-dsp --features sim --bin selftest
elf="$HEXAGON_OUT/debug/selftest"

out=$(mktemp)
trap 'rm -f "$out"' EXIT
status=0
qemu-hexagon -cpu v67 "$elf" "$@" | tee "$out" || status=$?
if ! grep -Eq '^[0-9]+ passed, [0-9]+ failed$' "$out"; then
    echo "ci/sim-test.sh: the suite did not finish (qemu exit status $status)" >&2
    exit 1
fi
exit "$status"
