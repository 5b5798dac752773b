#!/usr/bin/env bash
# A SuperNode killed mid-round (stage 1 federated on Flower, loopback):
# 3 SuperNodes on shards of 3 users, a round needs 2 of them (min-nodes 2).
# Node 2's worker is held at the start of round 1 (a wrapper around hexlora
# that waits 30 s for shard 2/3 only), its SuperNode's process group is
# killed with SIGKILL; the SuperLink reports the node unavailable after its
# missed heartbeats, round 1 commits the average of the other two, round 2
# runs with them, and the held-out loss still falls. ~80 s; not part of
# ci/federated-test.sh to keep that one short. Ends with `N passed, M failed`.
#
# Env as ci/federated-test.sh (FLOWER_VENV, HEXLORA_BIN, PORT).
set -euo pipefail
cd "$(dirname "$0")/.."
export FLOWER_VENV="${FLOWER_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/hexlora/flower-venv}"
[ -x "$FLOWER_VENV/bin/flwr" ] || { echo "no Flower in $FLOWER_VENV: run ci/federated-test.sh first" >&2; exit 2; }
if [ -z "${HEXLORA_BIN:-}" ]; then
    cargo build -q -p hexlora --bin hexlora
    HEXLORA_BIN=target/debug/hexlora
fi
work=$PWD/target/federated-kill-test
rm -rf "$work"
mkdir -p "$work"
py="$FLOWER_VENV/bin/python"
"$py" ci/federated_check.py users "$work"
cat >"$work/held-hexlora.sh" <<WRAP
#!/usr/bin/env bash
for a in "\$@"; do
    if [ "\$a" = "2/3" ]; then touch "$work/node2-in-round"; sleep 30; fi
done
exec "$(cd "$(dirname "$HEXLORA_BIN")" && pwd)/$(basename "$HEXLORA_BIN")" "\$@"
WRAP
chmod +x "$work/held-hexlora.sh"
train_args="--simcse-steps 1 --steps 3 --users-per-step 2 --target-examples 1 --embed-rank 2 --bottleneck 3 --context-tokens 60 --max-len 48 --lr 2e-2 --warmup 1 --kl-weight 0 --seed 3"
bash federated/run.sh --supernodes 3 --min-nodes 2 --rounds 2 --local-steps 2 --port "${PORT:-19300}" \
    --model "$PWD/host/tests/fixtures/hyper/eval-model" --data "$work/train.jsonl" --dev-data "$work/dev.jsonl" \
    --out "$work/fed" --hexlora "$work/held-hexlora.sh" --train-args "$train_args" --run-config "round-timeout=120.0" \
    >"$work/run.log" 2>&1 &
launcher=$!
for _ in $(seq 1 120); do
    [ -f "$work/node2-in-round" ] && break
    sleep 1
done
passed=0 failed=0
check() {
    if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: $*"; fi
}
check test -f "$work/node2-in-round"
node2=$(cat "$work/fed/flower/supernode-2.pid")
echo "killing SuperNode 2 (process group $node2) mid-round"
kill -KILL -- "-$node2"
check wait "$launcher"
check grep -q "Node Unavailable" "$work/fed/flower/run.log"
check "$py" - "$work/fed/metrics.jsonl" <<'PY'
import json, sys
rounds = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert [r["round"] for r in rounds] == [0, 1, 2], rounds
assert (rounds[1]["workers"], rounds[1]["failed"], rounds[1]["examples"]) == (2, 1, 24), rounds[1]
assert (rounds[2]["workers"], rounds[2]["failed"]) == (2, 0), rounds[2]
assert rounds[2]["dev_loss"] < rounds[0]["dev_loss"] - 1e-3, rounds
print("killed node: round 1 from 2 workers (1 failed), round 2 from 2; held-out loss", [round(r["dev_loss"], 4) for r in rounds])
PY
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
