"""The `hexlora hypertrain` invocations of a federation. The Rust trainer
knows nothing about Flower: a round is `--init-hypernet DIR --start-step S
--local-steps N`, its output `hypernet/` and `worker.json`."""

import json
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Trainer:
    """How to call hexlora on this machine, and the run's shared options."""

    hexlora: str
    model: str
    users: list[str]  # ["--data", PATH] or ["--bench", DIR, "--split", NAME]
    train_args: str  # the same on every worker and on the server

    def command(self, out: Path, extra: list[str]) -> list[str]:
        return [self.hexlora, "hypertrain", "--model", self.model, *self.users, *shlex.split(self.train_args), "--out", str(out), "--quiet", *extra]


def run(cmd: list[str], what: str) -> None:
    """Runs hexlora; a failure raises with its stderr (the trainer's errors
    name the option or file at fault)."""
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({shlex.join(cmd)}), exit {done.returncode}:\n{done.stderr.strip()}")


def worker_round(t: Trainer, shard: str, init: Path, start_step: int, local_steps: int, out: Path) -> dict:
    """One worker round from the parameters in `init` at `start_step`.
    `out` keeps this worker's commit between rounds: when it is at
    `start_step` the round resumes it (its Adam moments), otherwise it is
    replaced by a fresh run at `start_step` (a new worker, or one that
    missed rounds). Returns worker.json."""
    extra = ["--init-hypernet", str(init), "--start-step", str(start_step), "--local-steps", str(local_steps)]
    if shard:
        extra += ["--shard", shard]
    what = f"worker round at step {start_step}"
    if _committed_step(out) == start_step:
        try:
            run(t.command(out, [*extra, "--resume"]), what)
            return json.loads((out / "worker.json").read_text())
        except RuntimeError:
            # A worker killed mid-round leaves a commit past worker.json's
            # step; its moments are given up, the round runs fresh.
            pass
    _clear(out)
    run(t.command(out, extra), what)
    return json.loads((out / "worker.json").read_text())


def initial_network(t: Trainer, out: Path) -> Path:
    """The untrained network the train args define (seeded init), written
    by `--local-steps 0` into `out/hypernet`."""
    _clear(out)
    run(t.command(out, ["--local-steps", "0"]), "initial hypernetwork")
    return out / "hypernet"


def dev_users_args(dev_data: str, dev_split: str) -> tuple[list[str], list[str]]:
    """How hypertrain reads the held-out users in `dev_data`: a users JSONL
    file, or a LaMP directory's `dev_split`. Returns (the users option, the
    held-out option)."""
    if Path(dev_data).is_dir():
        return ["--bench", dev_data, "--split", dev_split], ["--dev-split", dev_split]
    return ["--data", dev_data], ["--dev-data", dev_data]


def held_out_loss(t: Trainer, net: Path, step: int, dev: list[str], dev_users: int) -> float:
    """Loss of the LoRAs `net` synthesizes on the held-out users `dev`
    (`dev_users_args`; `hexlora hypertrain`'s held-out log, taken before
    any step)."""
    with tempfile.TemporaryDirectory(prefix="hexlora-dev-") as tmp:
        extra = ["--init-hypernet", str(net), "--start-step", str(step), "--local-steps", "0", *dev, "--dev-users", str(dev_users)]
        run(t.command(Path(tmp) / "eval", extra), f"held-out loss at step {step}")
        lines = [json.loads(l) for l in (Path(tmp) / "eval" / "heldout.jsonl").read_text().splitlines() if l.strip()]
        return float(next(l["hypernet"] for l in lines if l.get("step") == step))


def eval_hypernet(t: Trainer, net: Path, bench: str, split: str, users: int, eval_args: str) -> dict:
    """`hexlora eval --method hypernet` of the network in `net` on the
    LaMP benchmark `bench`'s `split` (its first `users`, 0 = all), greedy:
    `{"dev_<metric>": value}` for the task's primary metric (ROUGE-1 or
    accuracy), plus the users and queries it covered. The result file
    (per-user predictions and scores) is kept in `net` as
    `eval-<split>-T0.json`."""
    with tempfile.TemporaryDirectory(prefix="hexlora-eval-") as tmp:
        cmd = [t.hexlora, "eval", "--bench", bench, "--split", split, "--train-split", "none", "--method", "hypernet", "--hypernet", str(net)]
        cmd += ["--model", t.model, "--users", str(users), *shlex.split(eval_args), "--out", tmp]
        run(cmd, f"eval of {net} on {bench} ({split})")
        results = sorted(Path(tmp).glob(f"*-hypernet-{split}-T0.json"))
        if len(results) != 1:
            raise RuntimeError(f"eval of {net} wrote {[p.name for p in Path(tmp).iterdir()]}, expected one *-hypernet-{split}-T0.json")
        shutil.copyfile(results[0], Path(net) / f"eval-{split}-T0.json")
        summary = json.loads(results[0].read_text())["summary"]
        metric = summary.get("primary_metric", "accuracy")
        return {f"dev_{metric}": float(summary[metric]), "dev_eval_users": int(summary["users"]), "dev_eval_queries": int(summary["queries"])}


def _committed_step(out: Path) -> int | None:
    try:
        return int(json.loads((out / "worker.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return None


def _clear(out: Path) -> None:
    shutil.rmtree(out, ignore_errors=True)
