#!/usr/bin/env bash
# Builds the firmware for Hexagon (v73 CPU, HVX v73 integer) and runs it
# under qemu-hexagon 10 (-cpu v73):
# 1. the self-test suite, the same one `cargo test -p hexlora-dsp` runs
#    natively (dsp/src/selftest). Its last line is `N passed, M failed`;
#    this script fails when M > 0 or the run crashes. Extra arguments go to
#    the suite (a test-name filter, --dump-log);
# 2. the projection service (dsp/src/bin/sim_service.rs) behind the host's
#    simulator transport: the host tests that kill, hang and compare it
#    (host/tests/suite/npu_transports.rs), with HEXLORA_SIM_SERVICE naming it.
#
# `ci/sim-test.sh --build-service` only builds the service and the
# self-test ELF (one build: the same crate and flags) and prints the
# service's path as the last line; the ELF is `selftest` beside it.
# ci/test.sh exports both before the native tests, whose simulator and
# firmware-log parts fail in CI without them, and then runs
# `ci/sim-test.sh --selftest-only`: part 1 alone, since the native tests
# have run part 2.
set -euo pipefail
cd "$(dirname "$0")/.."
source toolchain/hexagon-env.sh

if ! grep -x '  v73' >/dev/null <<<"$(qemu-hexagon -cpu help 2>/dev/null || true)"; then
    echo "ci/sim-test.sh: qemu-hexagon with -cpu v73 not found (qemu-user 10 from bookworm-backports; run toolchain/install.sh)" >&2
    exit 1
fi

build() {
    RUSTFLAGS="$(hexagon_rustflags sim)" "${HEXAGON_CARGO[@]}" build "${HEXAGON_BUILD[@]}" \
        -p hexlora-dsp --features sim --bin "$1" >&2
}

service="$HEXAGON_OUT/debug/sim_service"
host_tests=1
case "${1:-}" in
    --build-service)
        build sim_service
        build selftest
        echo "$service"
        exit 0 ;;
    --selftest-only) host_tests=0; shift ;;
esac

build sim_service
build selftest
elf="$HEXAGON_OUT/debug/selftest"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
status=0
qemu-hexagon -cpu v73 "$elf" "$@" | tee "$out" || status=$?
if ! grep -Eq '^[0-9]+ passed, [0-9]+ failed$' "$out"; then
    if [ "$status" = 134 ]; then
        # Our firmware's panics exit 101 (rt/linux.rs); qemu itself aborts
        # (SIGABRT) on an instruction it does not implement.
        echo "ci/sim-test.sh: qemu-hexagon aborted (exit 134): an instruction qemu does not implement (HVX float, user DMA), not a crash of the firmware" >&2
    else
        echo "ci/sim-test.sh: the suite did not finish (qemu exit status $status)" >&2
    fi
    exit 1
fi
[ "$status" = 0 ] || exit "$status"

((host_tests)) || exit 0
echo "== host simulator transport against the Hexagon service"
( unset RUSTC RUSTC_BOOTSTRAP
  HEXLORA_SIM_SERVICE="$service" cargo test -p hexlora --test suite npu_transports::simulator )
