#!/usr/bin/env bash
# Stage 1 federated on Flower (federated/), on loopback, on the tiny fixture
# model (host/tests/fixtures/hyper/eval-model) and 9 + 3 generated users:
#  1. one SuperNode holding every user, FedAvg of that one client, 2 rounds
#     of 2 steps (the federation stopped after round 1 and started again
#     with a new SuperLink), ends bit-identical to single-process `hexlora
#     hypertrain` for the same 4 steps (the reference is that run);
#  2. three SuperNodes on disjoint shards (3 users each) train, every round
#     has all three workers, the held-out loss falls from round 0, and every
#     round's `hexlora eval --method hypernet` figure is recorded (the last
#     equal to running eval on that round by hand);
#  3. FedAdam, stopped after round 1 and resumed: both rounds are the
#     FedAdam steps computed in f64 from the workers' outputs, round 2 with
#     round 1's committed moments;
#  4. DP: one worker without noise arrives clipped to the clipping norm;
#     three workers with noise multiplier 1 move the parameters by noise of
#     the stdev Flower's Gaussian mechanism promises.
# Flower comes from PyPI into a venv of its own (never a dependency of
# hexlora). Ends with `N passed, M failed`.
#
# Env: FLOWER_VENV (default ~/.cache/hexlora/flower-venv: outside the clone,
# so a clean clone reuses it; remade when an import fails), HEXLORA_BIN (default: the
# dev build, which cargo test has made in CI), PYTHON (python3), PORT (19300).
set -euo pipefail
cd "$(dirname "$0")/.."
export FLOWER_VENV="${FLOWER_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/hexlora/flower-venv}"
if [ ! -x "$FLOWER_VENV/bin/flwr" ] || ! "$FLOWER_VENV/bin/python" -c "import flwr, safetensors, numpy" 2>/dev/null; then
    echo "federated-test: making $FLOWER_VENV (federated/pyproject.toml's dependencies)"
    "${PYTHON:-python3}" -m venv "$FLOWER_VENV"
    "$FLOWER_VENV/bin/pip" install --quiet 'flwr==1.42.*' 'numpy>=1.26' 'safetensors>=0.4'
fi
if [ -z "${HEXLORA_BIN:-}" ]; then
    cargo build -q -p hexlora --bin hexlora
    HEXLORA_BIN=target/debug/hexlora
fi
port=${PORT:-19300}
work=target/federated-test
rm -rf "$work"
mkdir -p "$work"
py="$FLOWER_VENV/bin/python"
model=$PWD/host/tests/fixtures/hyper/eval-model
"$py" ci/federated_check.py users "$work"
# 4 steps: 1 SimCSE + 3 end to end; no teacher (KL 0), so the loss is the
# synthesized LoRA's cross-entropy.
train_args="--simcse-steps 1 --steps 3 --users-per-step 2 --target-examples 1 --embed-rank 2 --bottleneck 3 --context-tokens 60 --max-len 48 --lr 2e-2 --warmup 1 --kl-weight 0 --seed 3"
passed=0 failed=0
check() {
    if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: $*"; fi
}
# A federation on loopback into $work/NAME, its output in $work/NAME.log.
federation() {
    local name=$1 start=$SECONDS
    shift
    if bash federated/run.sh "$@" --model "$model" --data "$work/train.jsonl" --dev-data "$work/dev.jsonl" \
        --out "$work/$name" --hexlora "$HEXLORA_BIN" --train-args "$train_args" >"$work/$name.log" 2>&1; then
        echo "   $name: $((SECONDS - start)) s"
    else
        tail -n 30 "$work/$name.log"
        return 1
    fi
}

echo "== single-process reference: hypertrain, 4 steps"
# shellcheck disable=SC2086
"$HEXLORA_BIN" hypertrain --model "$model" --data "$work/train.jsonl" $train_args --out "$work/single" --quiet

echo "== 1 SuperNode, all users, 2 rounds x 2 steps"
# Round 1, then a new SuperLink and SuperNode resume the same directory
# for round 2 (the worker resumes its own commit, Adam moments included).
check federation fed1 --supernodes 1 --rounds 1 --local-steps 2 --port "$port"
check federation fed1 --supernodes 1 --rounds 2 --local-steps 2 --port "$port"
check grep -q "resuming after committed round 1" "$work/fed1/flower/run.log"
check "$py" ci/federated_check.py same "$work/single/hypernet" "$work/fed1/hypernet"
check "$py" ci/federated_check.py shards "$work/fed1" 1 9

echo "== 3 SuperNodes, shards 0/3 1/3 2/3, 2 rounds x 2 steps, hexlora eval every round"
bench=$PWD/host/tests/fixtures/hyper/lamp/mail-subject
check federation fed3 --supernodes 3 --rounds 2 --local-steps 2 --port "$((port + 10))" \
    --run-config "eval-bench=\"$bench\" eval-args=\"--max-new-tokens 4\""
check "$py" ci/federated_check.py shards "$work/fed3" 3 9
check "$py" ci/federated_check.py falls "$work/fed3"
check "$py" ci/federated_check.py evaluated "$work/fed3" "$HEXLORA_BIN" "$model" "$bench"

# From here round 1 must move the parameters (under --warmup 1 its two
# steps run at learning rate 0), so the server's step and the clipping see
# a real update.
train_args=${train_args/--warmup 1/--warmup 0}

echo "== FedAdam, 1 SuperNode, round 1, restart, round 2"
adam="strategy=\"fedadam\" server-lr=0.01 server-beta1=0.9 server-beta2=0.99 server-tau=0.001"
worker_net=$work/fedadam/nodes/0/stage1/worker/hypernet
check federation fedadam --supernodes 1 --rounds 1 --local-steps 2 --port "$((port + 20))" --run-config "$adam"
cp -r "$worker_net" "$work/fedadam-y1"
check federation fedadam --supernodes 1 --rounds 2 --local-steps 2 --port "$((port + 20))" --run-config "$adam"
check "$py" ci/federated_check.py fedadam "$work/fedadam" "$work/fedadam-y1" "$worker_net" 0.01 0.9 0.99 0.001

echo "== DP: clipping alone (1 SuperNode), clipping and noise (3 SuperNodes)"
check federation dpclip --supernodes 1 --rounds 1 --local-steps 2 --port "$((port + 30))" --run-config "dp-clipping-norm=0.001"
check "$py" ci/federated_check.py clipped "$work/dpclip" "$work/dpclip/nodes/0/stage1/worker/hypernet" 0.001
check federation dpnoise --supernodes 3 --rounds 1 --local-steps 2 --port "$((port + 40))" --run-config "dp-clipping-norm=0.001 dp-noise-multiplier=1.0"
check "$py" ci/federated_check.py noise "$work/dpnoise" 0.001 3

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
