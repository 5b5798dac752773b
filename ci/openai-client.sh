#!/usr/bin/env bash
# `hexlora serve` (and its --learn loop) driven by the official `openai`
# Python client (ci/openai_client.py says what is checked), in a venv of
# its own: a peer for this check, never a dependency of hexlora. Ends with
# `N passed, M failed`.
#
# Env: HEXLORA_OPENAI_VENV (default ~/.cache/hexlora/openai-venv: outside
# the clone, so a clean clone reuses it; remade when the import fails),
# PYTHON (python3), HEXLORA_BIN (default: the dev build; ci/test.sh passes
# the one its `cargo test` made).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${HEXLORA_OPENAI_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/hexlora/openai-venv}"
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$MODEL" ] || bash toolchain/fetch-models.sh
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import openai, httpx2" 2>/dev/null; then
    echo "openai-client: making $VENV (openai)"
    "${PYTHON:-python3}" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet openai==3.63.0
fi
if [ -z "${HEXLORA_BIN:-}" ]; then
    cargo build -q -p hexlora --bin hexlora
    HEXLORA_BIN=target/debug/hexlora
fi
"$VENV/bin/python" ci/openai_client.py "$HEXLORA_BIN" "$MODEL" target/openai-client
