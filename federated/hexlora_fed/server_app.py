"""The ServerApp: federated averaging of the hypernetwork, weighted by each
worker's example count (Flower's FedAvg over the ArrayRecords), with every
round committed as a hypernetwork directory `hexlora synth` reads.

`out-dir` holds `rounds/round-NNNN/` (hypernet.json, hypernet.safetensors,
round.json), renamed into place whole, so a round is either committed or
absent; `hypernet` (a symlink to the last round), `metrics.jsonl` (every
round.json). A stopped federation started again with the same run config
resumes after its last committed round.
"""

import json
import os
import shutil
import time
from dataclasses import dataclass
from logging import INFO
from pathlib import Path

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from .hexlora_cli import Trainer, held_out_loss, initial_network
from .hypernet_io import read_hypernet, write_hypernet

app = ServerApp()


@dataclass
class ServerConfig:
    rounds: int
    local_steps: int
    train_args: str
    out_dir: Path
    hexlora: str
    model: str
    dev_data: str
    dev_users: int
    eval_every: int
    min_nodes: int
    timeout: float
    federation_name: str

    @staticmethod
    def from_run_config(rc: dict) -> "ServerConfig":
        def text(key: str) -> str:
            value = str(rc.get(key, ""))
            if not value:
                raise ValueError(f"run config {key!r} is empty: pass it with flwr run --run-config '{key}=\"...\"'")
            return value

        def at_least(key: str, low: int) -> int:
            value = int(rc[key])
            if value < low:
                raise ValueError(f"run config {key!r} is {value}, must be >= {low}")
            return value

        return ServerConfig(
            rounds=at_least("num-server-rounds", 1),
            local_steps=at_least("local-steps", 1),
            train_args=str(rc.get("train-args", "")),
            out_dir=Path(text("out-dir")),
            hexlora=text("hexlora"),
            model=text("model"),
            dev_data=text("dev-data"),
            dev_users=at_least("dev-users", 1),
            eval_every=at_least("eval-every", 0),
            min_nodes=at_least("min-nodes", 1),
            timeout=float(rc["round-timeout"]),
            federation_name=text("federation-name"),
        )


class Rounds:
    """The committed rounds in `out-dir`."""

    def __init__(self, out: Path):
        self.out = out
        self.dir = out / "rounds"

    def path(self, r: int) -> Path:
        return self.dir / f"round-{r:04d}"

    def last(self) -> int | None:
        """The last committed round (its directory is renamed into place
        only once complete, so any present one is whole)."""
        done = [int(p.name.split("-")[1]) for p in self.dir.glob("round-*") if (p / "round.json").exists()] if self.dir.exists() else []
        return max(done) if done else None

    def commit(self, r: int, arrays: ArrayRecord, net_json: str, record: dict, measure) -> dict:
        """Writes round `r`: the network, then `measure(directory)`'s figures
        into round.json, then the rename that makes it the last round."""
        tmp = self.dir / f".round-{r:04d}.tmp"
        write_hypernet(tmp, arrays, net_json)
        record = {**record, **measure(tmp)}
        (tmp / "round.json").write_text(json.dumps(record) + "\n")
        shutil.rmtree(self.path(r), ignore_errors=True)
        os.rename(tmp, self.path(r))
        self._point_latest(r)
        self._write_metrics()
        return record

    def _point_latest(self, r: int) -> None:
        link, tmp = self.out / "hypernet", self.out / ".hypernet.tmp"
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        tmp.symlink_to(self.path(r).relative_to(self.out))
        os.replace(tmp, link)

    def _write_metrics(self) -> None:
        rounds = sorted(self.dir.glob("round-*/round.json"))
        lines = "".join(p.read_text() for p in rounds)
        tmp = self.out / ".metrics.jsonl.tmp"
        tmp.write_text(lines)
        os.replace(tmp, self.out / "metrics.jsonl")


class RoundFedAvg(FedAvg):
    """FedAvg that keeps what the round's replies said (for round.json) and
    refuses to commit a round no worker answered: the federation stops, and
    started again it retries that round."""

    def aggregate_train(self, server_round: int, replies):
        replies = list(replies)
        arrays, metrics = super().aggregate_train(server_round, replies)
        ok = [m for m in replies if not m.has_error()]
        if arrays is None or not ok:
            raise RuntimeError(f"round {server_round}: no worker returned parameters ({len(replies) - len(ok)} failed)")
        self.last = {
            "workers": len(ok),
            "failed": len(replies) - len(ok),
            "examples": sum(int(m.content["metrics"]["num-examples"]) for m in ok),
            "train_loss": float(metrics["train-loss"]) if metrics is not None else None,
        }
        return arrays, metrics


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = ServerConfig.from_run_config(context.run_config)
    rounds = Rounds(cfg.out_dir)
    trainer = Trainer(hexlora=cfg.hexlora, model=cfg.model, users=["--data", cfg.dev_data], train_args=cfg.train_args)

    def measure(r: int):
        def figures(net: Path) -> dict:
            if cfg.eval_every == 0 or (r % cfg.eval_every != 0 and r != cfg.rounds):
                return {}
            return {"dev_loss": held_out_loss(trainer, net, r * cfg.local_steps, cfg.dev_data, cfg.dev_users)}

        return figures

    done = rounds.last()
    if done is None:
        arrays, net_json = read_hypernet(initial_network(trainer, cfg.out_dir / "init"))
        rec = rounds.commit(0, arrays, net_json, {"round": 0, "step": 0}, measure(0))
        log(INFO, "round 0 (untrained network) committed: %s", rec)
        done = 0
    else:
        log(INFO, "resuming after committed round %d in %s", done, cfg.out_dir)
    if done >= cfg.rounds:
        log(INFO, "all %d rounds are committed in %s", cfg.rounds, cfg.out_dir)
        return
    arrays, net_json = read_hypernet(rounds.path(done))

    strategy = RoundFedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=cfg.min_nodes, min_available_nodes=cfg.min_nodes)
    train_config = ConfigRecord(
        {
            "first-round": done + 1,
            "local-steps": cfg.local_steps,
            "hypernet-json": net_json,
            "train-args": cfg.train_args,
            "federation-name": cfg.federation_name,
        }
    )
    started = time.time()

    def commit_round(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if server_round == 0:
            return None  # the starting network is the last committed round
        r = done + server_round
        record = {"round": r, "step": r * cfg.local_steps, **strategy.last, "seconds": round(time.time() - started, 3)}
        rec = rounds.commit(r, arrays, net_json, record, measure(r))
        log(INFO, "round %d committed: %s", r, rec)
        return MetricRecord({k: v for k, v in rec.items() if isinstance(v, (int, float)) and v is not None})

    strategy.start(grid, arrays, num_rounds=cfg.rounds - done, timeout=cfg.timeout, train_config=train_config, evaluate_fn=commit_round)
