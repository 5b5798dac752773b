"""The ClientApp: one per SuperNode, holding one shard of the users.

A train message carries the current hypernetwork (`arrays`) and the round's
config; the worker writes it as a hypernetwork directory, runs `hexlora
hypertrain` for `local-steps` steps on its shard, and replies with the new
parameters, its shard's example count (FedAvg's weight) and its mean loss.

Node config (`flower-supernode --node-config '...'`), paths on that machine:
  shard    "K/S": hypertrain's --shard (omit or "" for all users)
  data     users JSONL (or `bench` = a LaMP directory and `split`)
  model    the frozen LLM (GGUF or Hugging Face directory)
  hexlora  the hexlora binary (default "hexlora" on PATH)
  workdir  where this node keeps its worker state between rounds
"""

from pathlib import Path

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import fixedclipping_mod
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM

from .hexlora_cli import Trainer, worker_round
from .hypernet_io import read_hypernet, write_hypernet


def optional_clipping_mod(msg: Message, context: Context, call_next) -> Message:
    """Flower's fixedclipping_mod when the server runs DP (its wrapper puts
    the clipping norm into the round's config): the update is clipped
    here, before it leaves the node. Without DP the reply is untouched."""
    config = msg.content.config_records
    if not any(KEY_CLIPPING_NORM in c for c in config.values()):
        return call_next(msg, context)
    replies = []

    def run(m: Message, c: Context) -> Message:
        replies.append(call_next(m, c))
        return replies[-1]

    try:
        return fixedclipping_mod(msg, context, run)
    except ZeroDivisionError:
        # Flower divides the clipping norm by the update's norm; an update
        # of zero (a round run at learning rate 0, e.g. in warmup) is
        # within any clip, and the reply is untouched when it raises.
        if not replies:
            raise
        return replies[-1]


app = ClientApp(mods=[optional_clipping_mod])


def _node_value(context: Context, key: str, default: str | None = None) -> str:
    value = context.node_config.get(key, default)
    if value is None or value == "":
        raise ValueError(f"node config has no {key!r}: start the SuperNode with --node-config '{key}=...'")
    return str(value)


def _trainer(context: Context, train_args: str) -> Trainer:
    if context.node_config.get("bench"):
        users = ["--bench", _node_value(context, "bench"), "--split", str(context.node_config.get("split", "train"))]
    else:
        users = ["--data", _node_value(context, "data")]
    return Trainer(hexlora=_node_value(context, "hexlora", "hexlora"), model=_node_value(context, "model"), users=users, train_args=train_args)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One round of local steps on this node's shard."""
    config = msg.content["config"]
    arrays: ArrayRecord = msg.content["arrays"]
    # The server numbers the rounds of this `flwr run` from 1; first-round
    # places them in the whole (possibly resumed) federation.
    global_round = int(config["first-round"]) + int(config["server-round"]) - 1
    local_steps = int(config["local-steps"])
    start_step = (global_round - 1) * local_steps
    work = Path(_node_value(context, "workdir")) / str(config["federation-name"])
    write_hypernet(work / "received", arrays, str(config["hypernet-json"]))
    trainer = _trainer(context, str(config["train-args"]))
    shard = str(context.node_config.get("shard", ""))
    summary = worker_round(trainer, shard, work / "received", start_step, local_steps, work / "worker")
    reply_arrays, _ = read_hypernet(work / "worker" / "hypernet")
    # Which shard answered, as numbers (a MetricRecord holds no strings):
    # K and S of "K/S", or 0 and 1 for a node holding every user.
    k, of = (int(x) for x in shard.split("/")) if shard else (0, 1)
    metrics = MetricRecord(
        {
            "num-examples": int(summary["examples"]),
            # FedAvg's weight under DP: every worker counts the same.
            "unit-weight": 1,
            "train-loss": float(summary["loss"] if summary["loss"] is not None else 0.0),
            "steps": int(summary["step"]) - start_step,
            "shard-k": k,
            "shard-of": of,
        }
    )
    return Message(RecordDict({"arrays": reply_arrays, "metrics": metrics}), reply_to=msg)
