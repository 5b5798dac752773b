"""Stage 1 on Flower under faults, with TLS (run by ci/federated-faults.sh):

    python ci/federated_faults.py VENV HEXLORA WORK PORT

A SuperLink serving TLS (a CA and a server certificate for 127.0.0.1 made
here with openssl) and three SuperNodes, each on an address of its own
(127.0.0.2-4 for their runtime API) verifying the SuperLink against the CA,
train the fixture hypernetwork on shards 0/3, 1/3, 2/3 for 4 rounds of 2
steps, min-nodes 2. Faults, in this order:

1. SuperNode 2 is killed (SIGKILL, its process group) while its worker is
   inside round 2 (a wrapper around hexlora holds shard 2/3's round-2
   worker for 20 s so the kill lands mid-round);
2. after round 2 is committed, SuperNode 2 is started again (same shard,
   same work directory);
3. once round 3 is committed, the SuperLink is killed (SIGKILL, with its
   ServerApp) during round 4, and started again; the federation is
   submitted again with the same run config.

Checks: an insecure client is refused by the TLS SuperLink; the run
completes; rounds 0-4 are committed once each and rounds 0-3 are
byte-identical before and after the SuperLink's restart (nothing committed
is lost or redone); each round's round.json says which shards and nodes
answered and which failed (round 2 without shard 2/3 and one failed node;
shard 2/3 back, as a new node, in a later round); the held-out loss fell.
Every wait is bounded. Prints `N passed, M failed`.
"""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

VENV, HEXLORA, WORK, PORT = Path(sys.argv[1]), Path(sys.argv[2]).resolve(), Path(sys.argv[3]).resolve(), int(sys.argv[4])
ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "host/tests/fixtures/hyper/eval-model"
TRAIN_ARGS = "--simcse-steps 1 --steps 7 --users-per-step 2 --target-examples 1 --embed-rank 2 --bottleneck 3 --context-tokens 60 --max-len 48 --lr 2e-2 --warmup 1 --kl-weight 0 --seed 3"
FLOWER = WORK / "fed" / "flower"
passed, failed = 0, 0


def check(ok: bool, what: str) -> None:
    global passed, failed
    if ok:
        passed += 1
        print(f"ok: {what}", flush=True)
    else:
        failed += 1
        print(f"FAILED: {what}", flush=True)


def wait_for(what: str, cond, timeout: float) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.5)
    print(f"timed out after {timeout:.0f} s waiting for {what}", flush=True)
    return False


def env(home: Path) -> dict:
    home.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "PATH": f"{VENV / 'bin'}:{os.environ['PATH']}", "FLWR_HOME": str(home)}


def daemon(args: list, log: Path, home: Path) -> subprocess.Popen:
    """A process in a group of its own, so a kill takes its children."""
    return subprocess.Popen([str(a) for a in args], stdout=open(log, "ab"), stderr=subprocess.STDOUT, env=env(home), start_new_session=True)


def kill_group(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait(timeout=30)


def certificates(d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=hexlora test CA", "-keyout", d / "ca.key", "-out", d / "ca.pem")
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", d / "server.key", "-out", d / "server.csr")
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", d / "server.csr", "-CA", d / "ca.pem", "-CAkey", d / "ca.key", "-CAcreateserial", "-days", "2", "-extfile", d / "san.ext", "-out", d / "server.pem")


def superlink() -> subprocess.Popen:
    """The SuperLink over TLS. Its state is kept in a database file: a
    SuperNode that outlives a SuperLink restart reconnects with the node id
    the database still knows (with the state in memory, Flower 1.42's
    SuperNodes retry forever and are never let back in)."""
    tls = WORK / "tls"
    return daemon(
        [VENV / "bin/flower-superlink", "--ssl-ca-certfile", tls / "ca.pem", "--ssl-certfile", tls / "server.pem", "--ssl-keyfile", tls / "server.key",
         "--host", "127.0.0.1", "--port", PORT, "--disable-runtime-dependency-installation", "--database", FLOWER / "superlink.db"],
        FLOWER / "superlink.log", FLOWER / "home")


def supernode(k: int) -> subprocess.Popen:
    work = WORK / "fed" / "nodes" / str(k)
    config = f'shard="{k}/3" data="{WORK / "train.jsonl"}" model="{MODEL}" hexlora="{WORK / "held-hexlora.sh"}" workdir="{work}"'
    return daemon(
        [VENV / "bin/flower-supernode", "--root-certificates", WORK / "tls/ca.pem", "--superlink", f"127.0.0.1:{PORT}",
         "--host", f"127.0.0.{2 + k}", "--port", PORT + 1 + k, "--node-config", config],
        FLOWER / f"supernode-{k}.log", work / "home")


def flwr(*args: str, home: Path = FLOWER / "home") -> subprocess.CompletedProcess:
    return subprocess.run([str(VENV / "bin/flwr"), *args], capture_output=True, text=True, env=env(home), timeout=120)


def submit() -> str:
    config = (f'num-server-rounds=4 local-steps=2 min-nodes=2 round-timeout=90.0 out-dir="{WORK / "fed"}" hexlora="{HEXLORA}" '
              f'model="{MODEL}" dev-data="{WORK / "dev.jsonl"}" train-args="{TRAIN_ARGS}"')
    for _ in range(60):
        r = flwr("run", str(ROOT / "federated"), "tls", "--run-config", config, "--format", "json")
        try:
            run_id = json.loads(r.stdout).get("run-id")
        except json.JSONDecodeError:
            run_id = None
        if run_id:
            return str(run_id)
        time.sleep(1)
    raise RuntimeError(f"flwr run did not start a run: {r.stdout} {r.stderr}")


def committed(r: int) -> bool:
    return (WORK / "fed" / "rounds" / f"round-{r:04d}" / "round.json").exists()


def digest(r: int) -> str:
    h = hashlib.sha256()
    d = WORK / "fed" / "rounds" / f"round-{r:04d}"
    for p in sorted(d.rglob("*")):
        if p.is_file():
            h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def status(run_id: str) -> str:
    r = flwr("ls", "tls", "--run-id", run_id, "--format", "json")
    try:
        return json.loads(r.stdout)["runs"][0]["status"]
    except (json.JSONDecodeError, KeyError, IndexError):
        return f"unknown ({r.stdout.strip()[:200]} {r.stderr.strip()[:200]})"


def main() -> None:
    FLOWER.mkdir(parents=True, exist_ok=True)
    certificates(WORK / "tls")
    home = FLOWER / "home"
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "tls"\n\n[superlink.tls]\naddress = "127.0.0.1:{PORT}"\nroot-certificates = "{WORK / "tls/ca.pem"}"\n\n'
        f'[superlink.insecure]\naddress = "127.0.0.1:{PORT}"\ninsecure = true\n')
    # Shard 2/3's round-2 worker (hypertrain --start-step 2) is held so the
    # kill lands inside the round; every worker leaves a mark per round.
    (WORK / "held-hexlora.sh").write_text(f"""#!/usr/bin/env bash
shard="" start=""
prev=""
for a in "$@"; do
    [ "$prev" = "--shard" ] && shard=$a
    [ "$prev" = "--start-step" ] && start=$a
    prev=$a
done
if [ -n "$shard" ] && [ -n "$start" ]; then
    touch "{WORK}/in-round-${{shard%/*}}-$start"
    [ "$shard" = "2/3" ] && [ "$start" = "2" ] && sleep 20
fi
exec "{HEXLORA}" "$@"
""")
    os.chmod(WORK / "held-hexlora.sh", 0o755)
    procs = {"link": superlink()}
    for k in range(3):
        procs[k] = supernode(k)
    try:
        run_fault_schedule(procs)
    finally:
        for p in procs.values():
            kill_group(p)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


def run_fault_schedule(procs: dict) -> None:
    time.sleep(3)
    insecure = flwr("ls", "insecure", "--format", "json")
    try:
        refused = json.loads(insecure.stdout).get("success") is False
    except json.JSONDecodeError:
        refused = False
    check(insecure.returncode != 0 or refused, "an insecure client is refused by the TLS SuperLink")
    run_id = submit()
    print(f"run {run_id} submitted over TLS", flush=True)
    log1 = subprocess.Popen([str(VENV / "bin/flwr"), "log", run_id, "tls", "--stream"], stdout=open(FLOWER / "run-1.log", "wb"),
                            stderr=subprocess.STDOUT, env=env(FLOWER / "home"))
    # 1. SuperNode 2 killed inside round 2.
    if wait_for("shard 2/3 inside round 2", lambda: (WORK / "in-round-2-2").exists(), 240):
        kill_group(procs[2])
        print("SuperNode 2 killed inside round 2", flush=True)
    # 2. Started again once round 2 is committed.
    check(wait_for("round 2 committed", lambda: committed(2), 240), "round 2 committed without SuperNode 2")
    procs[2] = supernode(2)
    print("SuperNode 2 started again", flush=True)
    # 3. The SuperLink killed during round 4, then started again.
    check(wait_for("round 3 committed", lambda: committed(3), 240), "round 3 committed")
    before = {r: digest(r) for r in range(4)}
    kill_group(procs["link"])
    print("SuperLink killed (with its ServerApp) after round 3", flush=True)
    log1.wait(timeout=60)
    procs["link"] = superlink()
    time.sleep(3)
    run_id = submit()
    print(f"run {run_id} submitted again", flush=True)
    log2 = subprocess.run([str(VENV / "bin/flwr"), "log", run_id, "tls", "--stream"], capture_output=True, text=True, env=env(FLOWER / "home"), timeout=600)
    (FLOWER / "run-2.log").write_text(log2.stdout + log2.stderr)
    check("completed" in status(run_id), f"the resubmitted run completes (status {status(run_id)})")
    check("resuming after committed round 3" in log2.stdout + log2.stderr, "the restarted federation resumes after committed round 3")
    check(all(digest(r) == before[r] for r in range(4)), "rounds 0-3 byte-identical across the SuperLink's restart")
    metrics = [json.loads(l) for l in (WORK / "fed" / "metrics.jsonl").read_text().splitlines() if l.strip()]
    check([m["round"] for m in metrics] == [0, 1, 2, 3, 4], f"rounds 0-4 committed once each: {[m['round'] for m in metrics]}")
    by = {m["round"]: m for m in metrics}
    for r in range(1, 5):
        m = by.get(r, {})
        print(f"round {r}: shards {m.get('shards')} nodes {m.get('nodes')} failed {m.get('failed_nodes')} dev_loss {m.get('dev_loss')}", flush=True)
    check(by.get(1, {}).get("shards") == ["0/3", "1/3", "2/3"], "round 1 had all three shards")
    r2 = by.get(2, {})
    r1 = by.get(1, {})
    node2 = [n for n in r1.get("nodes", []) if n not in r2.get("nodes", [])]
    check(r2.get("shards") == ["0/3", "1/3"] and r2.get("failed_nodes") == node2 and len(node2) == 1,
          "round 2: shards 0/3 and 1/3; the failed node is round 1's third node (SuperNode 2)")
    check(all(n not in r1.get("nodes", []) for n in by.get(4, {}).get("nodes", []) if n not in r2.get("nodes", [])),
          "the restarted SuperNode 2 answers under a new node id")
    later = [by.get(r, {}) for r in (3, 4)]
    check(any("2/3" in m.get("shards", []) for m in later), "shard 2/3 answers again in a later round (the restarted SuperNode)")
    check(by.get(4, {}).get("dev_loss", 1e9) < by.get(0, {}).get("dev_loss", 0) - 1e-3, "the held-out loss fell from round 0 to round 4")


main()
