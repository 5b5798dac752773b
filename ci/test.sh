#!/usr/bin/env bash
# All tests: native workspace tests (the simulator suite is added by issue 2).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace
