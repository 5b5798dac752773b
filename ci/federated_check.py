"""Checks of stage 1 federated on Flower (ci/federated-test.sh runs them).

  users DIR          writes DIR/train.jsonl (9 users) and DIR/dev.jsonl (3 users)
  same REF FED       the hypernetwork in FED (a federation's last round) has
                     every tensor of REF (single-process hypertrain) bit for bit
  falls FED          the federation's held-out loss fell from round 0 to its last
  shards FED S N     S nodes trained disjoint shards covering the N users
"""

import json
import sys
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
    else:
        sys.exit(f"unknown check {cmd}")
