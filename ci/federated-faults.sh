#!/usr/bin/env bash
# Stage 1 on Flower under faults, over TLS, on loopback (ci/federated_faults.py
# says what it does and checks): a SuperNode killed mid-round and started
# again, the SuperLink killed and started again; the run finishes, no
# committed round is lost, and each round says which nodes it had. Bounded
# (every wait times out; the whole run is cut at 15 minutes). Not part of
# ci/test.sh. Ends with `N passed, M failed`.
#
# Env as ci/federated-test.sh (FLOWER_VENV, HEXLORA_BIN, PORT).
set -euo pipefail
cd "$(dirname "$0")/.."
export FLOWER_VENV="${FLOWER_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/hexlora/flower-venv}"
[ -x "$FLOWER_VENV/bin/flwr" ] || { echo "no Flower in $FLOWER_VENV: run ci/federated-test.sh first" >&2; exit 2; }
command -v openssl >/dev/null || { echo "needs openssl (apt-get install openssl)" >&2; exit 2; }
if [ -z "${HEXLORA_BIN:-}" ]; then
    cargo build -q -p hexlora --bin hexlora
    HEXLORA_BIN=target/debug/hexlora
fi
work=$PWD/target/federated-faults
rm -rf "$work"
mkdir -p "$work"
"$FLOWER_VENV/bin/python" ci/federated_check.py users "$work"
timeout 900 "$FLOWER_VENV/bin/python" ci/federated_faults.py "$FLOWER_VENV" "$HEXLORA_BIN" "$work" "${PORT:-19400}"
