"""Checks of stage 1 federated on Flower (ci/federated-test.sh runs them).

  users DIR          writes DIR/train.jsonl (9 users) and DIR/dev.jsonl (3 users)
  same REF FED       the hypernetwork in FED (a federation's last round) has
                     every tensor of REF (single-process hypertrain) bit for bit
  falls FED          the federation's held-out loss fell from round 0 to its last
  shards FED S N     S nodes trained disjoint shards covering the N users
  fedadam FED Y1 Y2 ETA B1 B2 TAU
                     rounds 1 and 2 of FED are the FedAdam steps (Reddi et al.
                     2020, Flower's bias correction), in f64, from the worker
                     outputs Y1, Y2 of those rounds; round 2 (after a restart)
                     continues round 1's moments, which round-0002 commits
  clipped FED Y1 C   round 1 of a one-worker DP federation without noise is
                     the worker's update Y1 - round 0 scaled to L2 norm C
  noise FED C N      round 1 of a DP federation of N workers moved the
                     parameters by Gaussian noise of stdev C/N (the update
                     itself, of norm <= C, is negligible beside it)
  evaluated FED BIN MODEL BENCH
                     every round of FED records dev_rouge1, and the last
                     equals `BIN eval --method hypernet` of that round
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

STYLES = ["ok.", "LOUD!", "please, thanks", "terse", "so so good", "no way", "yes yes", "hmm maybe", "done done", "lol", "sure thing", "nope"]


def users(directory: Path) -> None:
    """Users whose responses share a style (what the hypernetwork can learn
    from the context) over queries on varied topics."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = []
    for u, style in enumerate(STYLES):
        examples = [{"query": f"note {i} on topic {(7 * i + 3 * u) % 11}", "response": f"{style} {i}"} for i in range(4)]
        rows.append(json.dumps({"user": f"u{u:02d}", "examples": examples}))
    (directory / "train.jsonl").write_text("\n".join(rows[:9]) + "\n")
    (directory / "dev.jsonl").write_text("\n".join(rows[9:]) + "\n")


def same(ref: Path, fed: Path) -> None:
    a = load_file(str(ref / "hypernet.safetensors"))
    b = load_file(str(fed / "hypernet.safetensors"))
    assert sorted(a) == sorted(b), f"tensor names differ: {sorted(set(a) ^ set(b))}"
    for name in a:
        assert a[name].dtype == b[name].dtype == np.float32, name
        assert a[name].shape == b[name].shape, name
        diff = np.count_nonzero(a[name].view(np.uint32) != b[name].view(np.uint32))
        assert diff == 0, f"{name}: {diff} of {a[name].size} values differ; max |d| {np.abs(a[name] - b[name]).max()}"
    ca, cb = json.loads((ref / "hypernet.json").read_text()), json.loads((fed / "hypernet.json").read_text())
    assert ca == cb, f"hypernet.json differs: {ca} vs {cb}"
    print(f"same: {len(a)} tensors, {sum(t.size for t in a.values())} values bit-identical to single-process hypertrain")


def rounds(fed: Path) -> list[dict]:
    return [json.loads(l) for l in (fed / "metrics.jsonl").read_text().splitlines() if l.strip()]


def falls(fed: Path) -> None:
    rs = rounds(fed)
    first, last = rs[0], rs[-1]
    assert first["round"] == 0 and last["round"] > 0, rs
    assert last["dev_loss"] < first["dev_loss"] - 1e-3, f"held-out loss {first['dev_loss']} -> {last['dev_loss']}"
    print("falls: held-out loss by round " + ", ".join(f"{r['round']}: {r['dev_loss']:.4f}" for r in rs if "dev_loss" in r))


def shards(fed: Path, s: int, n: int) -> None:
    counts = [json.loads((fed / "nodes" / str(k) / "stage1" / "worker" / "worker.json").read_text())["users"] for k in range(s)]
    assert sum(counts) == n and all(c >= 2 for c in counts), counts
    last = rounds(fed)[-1]
    assert last["workers"] == s and last["failed"] == 0, last
    print(f"shards: {s} workers trained {counts} users (of {n}) in every round")


def params(directory: Path) -> dict[str, np.ndarray]:
    return {k: v.astype(np.float64) for k, v in load_file(str(directory / "hypernet.safetensors")).items()}


def round_params(fed: Path, r: int) -> dict[str, np.ndarray]:
    return params(fed / "rounds" / f"round-{r:04d}")


def fedadam(fed: Path, y1: Path, y2: Path, eta: float, b1: float, b2: float, tau: float) -> None:
    x = [round_params(fed, r) for r in range(3)]
    ys = [params(y1), params(y2)]
    m = {k: np.zeros_like(v) for k, v in x[0].items()}
    v = {k: np.zeros_like(a) for k, a in x[0].items()}
    worst = 0.0
    for r in (1, 2):
        eta_r = eta * np.sqrt(1 - b2 ** (r + 1)) / (1 - b1 ** (r + 1))
        for k in x[0]:
            delta = ys[r - 1][k] - x[r - 1][k]
            m[k] = b1 * m[k] + (1 - b1) * delta
            v[k] = b2 * v[k] + (1 - b2) * delta**2
            step = eta_r * m[k] / (np.sqrt(v[k]) + tau)
            got = x[r][k] - x[r - 1][k]
            err = np.abs(got - step) / (np.abs(step) + 1e-6 * (1 + np.abs(x[r - 1][k])))
            worst = max(worst, float(err.max()))
            assert err.max() < 1e-3, f"round {r} {k}: FedAdam step off by {err.max():.3g} (relative)"
    committed = load_file(str(fed / "rounds" / "round-0002" / "server-opt.safetensors"))
    for k in x[0]:
        for name, ref in (("m", m[k]), ("v", v[k])):
            c = committed[f"{name}/{k}"].astype(np.float64)
            assert np.allclose(c, ref, rtol=1e-4, atol=1e-12), f"round-0002 {name}/{k} is not the moment of rounds 1-2"
    print(f"fedadam: rounds 1 and 2 are the FedAdam steps from round 1's moments (worst relative error {worst:.2g})")


def clipped(fed: Path, y1: Path, c: float) -> None:
    x0, x1, y = round_params(fed, 0), round_params(fed, 1), params(y1)
    norm = np.sqrt(sum(((y[k] - x0[k]) ** 2).sum() for k in x0))
    assert norm > 2 * c, f"the worker's update (norm {norm:.3g}) is not larger than the clipping norm {c}: nothing to clip"
    for k in x0:
        want = (y[k] - x0[k]) * (c / norm)
        # the worker adds the clipped update to x0 in f32: a rounding of x0's size
        err = np.abs(x1[k] - x0[k] - want) - (1e-4 * np.abs(want) + 4 * np.finfo(np.float32).eps * np.abs(x0[k]))
        assert err.max() <= 0, f"{k}: round 1 is not the update clipped to {c} (off by {err.max():.3g} beyond rounding)"
    print(f"clipped: the worker's update of norm {norm:.4g} arrived scaled to the clipping norm {c}")


def noise(fed: Path, c: float, n: int) -> None:
    x0, x1 = round_params(fed, 0), round_params(fed, 1)
    d = np.concatenate([(x1[k] - x0[k]).ravel() for k in x0])
    want = c / n
    assert abs(d.std() / want - 1) < 0.1 and abs(d.mean()) < 0.1 * want, f"update stdev {d.std():.4g}, mean {d.mean():.3g}; DP noise stdev should be {want:.4g}"
    last = rounds(fed)[-1]
    assert last["dp_clipping_norm"] == c and last["workers"] == n, last
    print(f"noise: {d.size} parameters moved with stdev {d.std():.4g} (DP noise stdev C/N = {want:.4g})")


def evaluated(fed: Path, hexlora: str, model: str, bench: str) -> None:
    rs = rounds(fed)
    assert all("dev_rouge1" in r for r in rs), [sorted(r) for r in rs]
    last = fed / "rounds" / f"round-{rs[-1]['round']:04d}"
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [hexlora, "eval", "--bench", bench, "--split", "dev", "--train-split", "none", "--method", "hypernet", "--hypernet", str(last)]
        subprocess.run([*cmd, "--model", model, "--max-new-tokens", "4", "--out", tmp], check=True, capture_output=True)
        direct = json.loads(next(Path(tmp).glob("*-hypernet-dev-T0.json")).read_text())
    recorded = json.loads((last / "eval-dev-T0.json").read_text())
    assert direct["summary"]["rouge1"] == rs[-1]["dev_rouge1"], f"round {rs[-1]['round']}: recorded {rs[-1]['dev_rouge1']}, hexlora eval gives {direct['summary']['rouge1']}"
    # The fixture model is random and tiny: it generates empty text and
    # ROUGE is 0, so the figure alone cannot tell networks apart. The kept
    # result file names the network it evaluated: this round's (committed
    # from its .tmp directory) and the predictions are hexlora eval's.
    said = lambda result: [q["predictions"] for u in result["users"] for q in u["queries"]]
    assert said(direct) == said(recorded), f"round {rs[-1]['round']}: the recorded eval's predictions differ from hexlora eval's"
    evaluated_net = Path(recorded["config"]["hypernet"]).name
    assert evaluated_net == f".round-{rs[-1]['round']:04d}.tmp", f"round {rs[-1]['round']}: the server evaluated {evaluated_net}"
    print("evaluated: dev ROUGE-1 by round " + ", ".join(f"{r['round']}: {r['dev_rouge1']:.4f}" for r in rs))


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "users":
        users(Path(args[0]))
    elif cmd == "same":
        same(Path(args[0]), Path(args[1]))
    elif cmd == "falls":
        falls(Path(args[0]))
    elif cmd == "shards":
        shards(Path(args[0]), int(args[1]), int(args[2]))
    elif cmd == "fedadam":
        fedadam(Path(args[0]), Path(args[1]), Path(args[2]), *map(float, args[3:7]))
    elif cmd == "clipped":
        clipped(Path(args[0]), Path(args[1]), float(args[2]))
    elif cmd == "noise":
        noise(Path(args[0]), float(args[1]), int(args[2]))
    elif cmd == "evaluated":
        evaluated(Path(args[0]), *args[1:4])
    else:
        sys.exit(f"unknown check {cmd}")
