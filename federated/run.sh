#!/usr/bin/env bash
# Stage 1 federated on loopback: a SuperLink, S SuperNodes (node k holds
# shard k/S of the users), the app run with `flwr run`, everything torn
# down by PID at the end (or on error / Ctrl-C).
#
#   federated/run.sh --supernodes 3 --model M --data users.jsonl \
#       --dev-data dev.jsonl --out runs/fed [--rounds 3] [--local-steps 2] \
#       [--train-args "--simcse-steps 1 --steps 5 --seed 0"] [--hexlora BIN] \
#       [--port 19300] [--min-nodes N] [--run-config 'key=value ...']
#
# --data and --dev-data are users JSONL files, or both a LaMP benchmark
# directory (the nodes train on its train split, the server holds out its
# dev split). Each node keeps its worker state in OUT/nodes/K; Flower's own state and
# logs go to OUT/flower. The same commands across machines (real addresses,
# TLS): docs/FEDERATED.md.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${FLOWER_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/hexlora/flower-venv}
supernodes=1 min_nodes="" rounds=3 local_steps=2 port=19300 train_args="" extra_config=""
hexlora=$(command -v hexlora || echo "$here/../target/release/hexlora")
model="" data="" dev_data="" out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --supernodes) supernodes=$2 ;;
        --min-nodes) min_nodes=$2 ;;
        --model) model=$2 ;;
        --data) data=$2 ;;
        --dev-data) dev_data=$2 ;;
        --out) out=$2 ;;
        --rounds) rounds=$2 ;;
        --local-steps) local_steps=$2 ;;
        --train-args) train_args=$2 ;;
        --hexlora) hexlora=$2 ;;
        --port) port=$2 ;;
        --run-config) extra_config=$2 ;;
        *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift 2
done
for v in model data dev_data out; do
    [ -n "${!v}" ] || { echo "run.sh: --${v//_/-} is required" >&2; exit 2; }
done
[ -x "$venv/bin/flwr" ] || { echo "run.sh: no Flower in $venv (python3 -m venv $venv && $venv/bin/pip install -e $here)" >&2; exit 2; }
abs() { (cd "$(dirname "$1")" && echo "$(pwd)/$(basename "$1")"); }
mkdir -p "$out"
out=$(abs "$out") model=$(abs "$model") data=$(abs "$data") dev_data=$(abs "$dev_data") hexlora=$(abs "$hexlora")
flower="$out/flower"
mkdir -p "$flower"

# Every daemon starts in a process group of its own (setsid), so its
# ServerApp/ClientApp processes and their hexlora children go with it: the
# teardown signals each group by its leader's PID, nothing by name.
pids=()
teardown() {
    for pid in "${pids[@]}"; do
        kill -TERM -- "-$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
}
trap teardown EXIT

# The SuperLink and SuperNodes start flower-superexec and the app processes from PATH.
export PATH="$venv/bin:$PATH"
export FLWR_HOME="$flower/home"
mkdir -p "$FLWR_HOME"
cat > "$FLWR_HOME/config.toml" <<TOML
[superlink]
default = "loopback"

[superlink.loopback]
address = "127.0.0.1:$port"
insecure = true
TOML

# The ServerApp runs in this venv (no per-run environment fetched from PyPI).
# The SuperLink's state stays in memory: the federation's is in --out, and a
# database kept across launches would list the last launch's SuperNodes, on
# which a resumed round would wait until their heartbeats time out.
setsid "$venv/bin/flower-superlink" --insecure --host 127.0.0.1 --port "$port" \
    --disable-runtime-dependency-installation >"$flower/superlink.log" 2>&1 &
pids+=($!)
echo "${pids[0]}" >"$flower/superlink.pid"
echo "superlink pid ${pids[0]} on 127.0.0.1:$port" >&2
users="data=\"$data\""
[ -d "$data" ] && users="bench=\"$data\" split=\"train\""
for k in $(seq 0 $((supernodes - 1))); do
    shard=""
    [ "$supernodes" -gt 1 ] && shard="$k/$supernodes"
    mkdir -p "$out/nodes/$k/home"
    FLWR_HOME="$out/nodes/$k/home" setsid "$venv/bin/flower-supernode" --insecure --superlink "127.0.0.1:$port" --port $((port + 1 + k)) \
        --node-config "shard=\"$shard\" $users model=\"$model\" hexlora=\"$hexlora\" workdir=\"$out/nodes/$k\"" \
        >"$flower/supernode-$k.log" 2>&1 &
    pids+=($!)
    echo "$!" >"$flower/supernode-$k.pid"
done

# A round waits for min-nodes connected workers (default: all S) and
# aggregates whichever of them answer.
config="num-server-rounds=$rounds local-steps=$local_steps min-nodes=${min_nodes:-$supernodes} out-dir=\"$out\" hexlora=\"$hexlora\" model=\"$model\" dev-data=\"$dev_data\" train-args=\"$train_args\" $extra_config"
# The SuperLink may take a moment to listen: retry the submission briefly.
run_id=""
for attempt in $(seq 1 60); do
    started=$(flwr run "$here" loopback --run-config "$config" --format json 2>"$flower/run-submit.err" || true)
    run_id=$(echo "$started" | "$venv/bin/python" -c 'import json, sys; print(json.load(sys.stdin).get("run-id") or "")' 2>/dev/null || true)
    [ -z "$run_id" ] || break
    sleep 1
done
[ -n "$run_id" ] || { echo "run.sh: flwr run did not start a run: $started" >&2; cat "$flower/run-submit.err" >&2; exit 1; }
echo "run $run_id submitted; logs: $flower/run.log" >&2
flwr log "$run_id" loopback --stream >"$flower/run.log" 2>&1 || true
status=$(flwr ls loopback --run-id "$run_id" --format json | "$venv/bin/python" -c 'import json, sys; print(json.load(sys.stdin)["runs"][0]["status"])')
echo "run $run_id: $status" >&2
case "$status" in
    *completed*) ;;
    *) tail -n 40 "$flower/run.log" >&2; exit 1 ;;
esac
