#!/usr/bin/env bash
# hexlora's GGUF LoRA adapters in llama.cpp (ci/llama_cpp_adapter.py says
# what is checked). llama.cpp comes from PyPI's xllamacpp (prebuilt, generic
# AVX2 CPU build) in a venv of its own: a peer for this check, never a
# dependency of hexlora. Ends with `N passed, M failed`.
#
# Env: HEXLORA_PEER_VENV (default ~/.cache/hexlora/peer-venv: outside the
# clone, so a clean clone reuses it; remade when an import fails), PYTHON (python3),
# HEXLORA_BIN (default: the dev build; ci/test.sh passes the one its
# `cargo test` made, since `cargo build` resolves features without the
# dev-dependencies and would rebuild the crate and part of its tree).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${HEXLORA_PEER_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/hexlora/peer-venv}"
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$MODEL" ] || bash toolchain/fetch-models.sh
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import xllamacpp, gguf, safetensors" 2>/dev/null; then
    echo "llama-cpp-adapter: making $VENV (xllamacpp, gguf, safetensors, numpy)"
    "${PYTHON:-python3}" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet xllamacpp==2026.10.11549 gguf==0.19.0 safetensors numpy
fi
if [ -z "${HEXLORA_BIN:-}" ]; then
    cargo build -q -p hexlora --bin hexlora
    HEXLORA_BIN=target/debug/hexlora
fi
# llama.cpp's own log (loading, slots) goes to a file; the checks to stdout.
"$VENV/bin/python" ci/llama_cpp_adapter.py "$HEXLORA_BIN" "$MODEL" target/llama-cpp-adapter 2>target/llama-cpp-adapter.log \
    || { tail -n 20 target/llama-cpp-adapter.log >&2; exit 1; }
