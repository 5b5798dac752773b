"""The ServerApp: federated averaging of the hypernetwork, weighted by each
worker's example count (Flower's FedAvg over the ArrayRecords; FedAdam and
client-side DP as options, see strategies.py), with every round committed
as a hypernetwork directory `hexlora synth` reads.

`out-dir` holds `rounds/round-NNNN/` (hypernet.json, hypernet.safetensors,
round.json; server-opt.safetensors under FedAdam), renamed into place
whole, so a round is either committed or absent; `hypernet` (a symlink to the last round), `metrics.jsonl` (every
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

from .hexlora_cli import Trainer, dev_users_args, eval_hypernet, held_out_loss, initial_network
from .hypernet_io import read_hypernet, write_hypernet
from .strategies import check, load_moments, make_strategy, save_moments

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
    dev_split: str
    dev_users: int
    eval_every: int
    min_nodes: int
    timeout: float
    federation_name: str
    strategy: str
    server_lr: float
    server_beta1: float
    server_beta2: float
    server_tau: float
    dp_noise_multiplier: float
    dp_clipping_norm: float
    eval_bench: str
    eval_split: str
    eval_users: int
    eval_args: str

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

        def number(key: str, low: float, high: float = float("inf")) -> float:
            value = float(rc[key])
            if not low <= value <= high:
                raise ValueError(f"run config {key!r} is {value}, must be in [{low}, {high}]")
            return value

        cfg = ServerConfig(
            rounds=at_least("num-server-rounds", 1),
            local_steps=at_least("local-steps", 1),
            train_args=str(rc.get("train-args", "")),
            out_dir=Path(text("out-dir")),
            hexlora=text("hexlora"),
            model=text("model"),
            dev_data=text("dev-data"),
            dev_split=str(rc["dev-split"]),
            dev_users=at_least("dev-users", 1),
            eval_every=at_least("eval-every", 0),
            min_nodes=at_least("min-nodes", 1),
            timeout=float(rc["round-timeout"]),
            federation_name=text("federation-name"),
            strategy=str(rc["strategy"]),
            server_lr=number("server-lr", 1e-12),
            server_beta1=number("server-beta1", 0.0, 0.999999),
            server_beta2=number("server-beta2", 0.0, 0.999999),
            server_tau=number("server-tau", 1e-12),
            dp_noise_multiplier=number("dp-noise-multiplier", 0.0),
            dp_clipping_norm=number("dp-clipping-norm", 0.0),
            eval_bench=str(rc["eval-bench"]),
            eval_split=str(rc["eval-split"]),
            eval_users=at_least("eval-users", 0),
            eval_args=str(rc["eval-args"]),
        )
        check(cfg.strategy, cfg.dp_noise_multiplier, cfg.dp_clipping_norm)
        return cfg


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

    def commit(self, r: int, arrays: ArrayRecord, net_json: str, moments: dict, record: dict, measure) -> dict:
        """Writes round `r`: the network and the server optimizer's
        `moments`, then `measure(directory)`'s figures into round.json,
        then the rename that makes it the last round."""
        tmp = self.dir / f".round-{r:04d}.tmp"
        write_hypernet(tmp, arrays, net_json)
        save_moments(tmp, moments)
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


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = ServerConfig.from_run_config(context.run_config)
    rounds = Rounds(cfg.out_dir)
    users, dev = dev_users_args(cfg.dev_data, cfg.dev_split)
    trainer = Trainer(hexlora=cfg.hexlora, model=cfg.model, users=users, train_args=cfg.train_args)

    def measure(r: int):
        def figures(net: Path) -> dict:
            if cfg.eval_every == 0 or (r % cfg.eval_every != 0 and r != cfg.rounds):
                return {}
            out = {"dev_loss": held_out_loss(trainer, net, r * cfg.local_steps, dev, cfg.dev_users)}
            if cfg.eval_bench:
                out.update(eval_hypernet(trainer, net, cfg.eval_bench, cfg.eval_split, cfg.eval_users, cfg.eval_args))
            return out

        return figures

    done = rounds.last()
    if done is None:
        arrays, net_json = read_hypernet(initial_network(trainer, cfg.out_dir / "init"))
        rec = rounds.commit(0, arrays, net_json, {}, {"round": 0, "step": 0}, measure(0))
        log(INFO, "round 0 (untrained network) committed: %s", rec)
        done = 0
    else:
        log(INFO, "resuming after committed round %d in %s", done, cfg.out_dir)
    if done >= cfg.rounds:
        log(INFO, "all %d rounds are committed in %s", cfg.rounds, cfg.out_dir)
        return
    arrays, net_json = read_hypernet(rounds.path(done))
    strategy = make_strategy(cfg, done, load_moments(rounds.path(done), cfg.strategy, done))
    dp = {"dp_noise_multiplier": cfg.dp_noise_multiplier, "dp_clipping_norm": cfg.dp_clipping_norm} if cfg.dp_clipping_norm > 0 else {}
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
        record = {"round": r, "step": r * cfg.local_steps, "strategy": cfg.strategy, **dp, **strategy.last, "seconds": round(time.time() - started, 3)}
        rec = rounds.commit(r, arrays, net_json, strategy.moments(), record, measure(r))
        log(INFO, "round %d committed: %s", r, rec)
        return MetricRecord({k: v for k, v in rec.items() if isinstance(v, (int, float)) and v is not None})

    strategy.start(grid, arrays, num_rounds=cfg.rounds - done, timeout=cfg.timeout, train_config=train_config, evaluate_fn=commit_round)
