"""What learning inside the server costs (issue: the personal loop in one
process). Run by ci/bench-learn.sh, alone on the machine:

    python3 ci/bench_learn.py HEXLORA_BINARY MODEL DEVICE WORK_DIR

In one run, on the same device, adapter and examples (the first 20 lines
of the main job's data, host/tests/fixtures/training/sotu_train.jsonl, and
the r4 `sotu` fixture adapter as the user's starting version):

1. `serve` alone answering with the adapter: 20 greedy chat requests
   (12 tokens), then its peak RSS (VmHWM).
2. a separate `personalize --init-adapter` of the same examples, 8 steps:
   its peak RSS (`/usr/bin/time`).
3. `serve --learn` with the same user: 20 requests idle (latency median
   and worst), then a round started (16 examples x 6 epochs = 96 steps)
   and, while it runs, 20 requests back to back (the learner pauses after
   the first and stays paused while they keep coming: `GRACE`) and 20
   spaced beyond the grace (each meets a running step), median and worst
   of each; the learner's yield time (how long a request shared the
   machine with a step before the learner paused: worst), and the
   server's peak RSS after the round.

Prints one line per figure and `base weights held once: serve --learn X
MiB < serve Y + personalize Z - resident W` (the issue's bar).
"""
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "host/tests/fixtures/training/sotu_train.jsonl"
ADAPTER = ROOT / "host/tests/fixtures/adapters/sotu/adapter"
N = 20


def http(url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as r:
        return json.loads(r.read())


def start(args):
    proc = subprocess.Popen([str(a) for a in args], stdout=subprocess.PIPE, text=True)
    url = proc.stdout.readline().strip().rsplit(" ", 1)[-1]
    assert url.startswith("http://127.0.0.1:"), url
    return proc, url


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=600)


def hwm_mib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def timed_requests(url, model, prompts, gap=0.0):
    out = []
    for p in prompts:
        time.sleep(gap)
        t = time.perf_counter()
        http(url + "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": p}], "max_tokens": 12, "temperature": 0})
        out.append((time.perf_counter() - t) * 1e3)
    return out


def summary(name, ms):
    print(f"{name}: median {statistics.median(ms):.0f} ms, worst {max(ms):.0f} ms over {len(ms)} requests", flush=True)


def main():
    binary, model, device, work = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
    work.mkdir(parents=True, exist_ok=True)
    lines = [json.loads(l) for l in DATA.read_text().splitlines()[:N]]
    prompts = [l["prompt"][:200] for l in lines]
    (work / "examples.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))
    print(f"cpu: {os.popen('lscpu').read().split('Model name:')[1].splitlines()[0].strip()}, {os.cpu_count()} cores; device {device}", flush=True)

    # 1. serve alone
    proc, url = start([binary, "serve", "--model", model, "--port", "0", "--adapter", f"me={ADAPTER}"])
    summary("serve alone, idle", timed_requests(url, "me", prompts))
    serve_alone = hwm_mib(proc.pid)
    stop(proc)
    print(f"peak RSS serve alone: {serve_alone:.0f} MiB", flush=True)

    # 2. personalize separately
    out = work / "personalize"
    r = subprocess.run(["/usr/bin/time", "-f", "%M", binary, "personalize", "--model", model, "--data", work / "examples.jsonl",
                        "--init-adapter", ADAPTER, "--device", device, "--steps", "8", "--out", out, "--force", "--quiet"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(r.stderr)
    personalize = int(r.stderr.strip().splitlines()[-1]) / 1024
    resident = [l for l in r.stdout.splitlines() if l.startswith("resident on the")]
    print(f"peak RSS personalize (8 steps): {personalize:.0f} MiB; {resident[0] if resident else 'no DSP residency (cpu)'}", flush=True)

    # 3. serve --learn
    users = work / "users"
    subprocess.run(["rm", "-rf", users], check=True)
    proc, url = start([binary, "serve", "--model", model, "--port", "0", "--adapter", f"me={ADAPTER}", "--learn", users,
                       "--learn-idle", "3600", "--device", device, "--learn-epochs", "6", "--learn-max-len", "512"])
    for l in lines:
        http(url + "/v1/feedback", {"model": "me", **l})
    idle = timed_requests(url, "me", prompts)
    summary("serve --learn, idle", idle)
    http(url + "/v1/adapters/me/learn", {})
    t = time.time()
    while (http(url + "/v1/learner").get("step") or 0) < 1:
        if time.time() - t > 1800:
            sys.exit("the round never started")
        time.sleep(0.05)
    busy = timed_requests(url, "me", prompts)
    summary("serve --learn, during a round, back to back", busy)
    spaced = timed_requests(url, "me", prompts, gap=2.5)
    status = http(url + "/v1/learner")
    summary("serve --learn, during a round, 2.5 s apart", spaced)
    if status.get("step") is None:
        print("WARNING: the round ended before the last request; the figures above mix in idle requests", flush=True)
    print(f"learner: step {status['step']} after the 40th answer; {status['yields']} steps met a request, "
          f"yield time last {status['yield_ms_last']:.0f} ms, worst {status['yield_ms_max']:.0f} ms", flush=True)
    round_ = http(url + "/v1/adapters/me/learn", {"wait": True})["round"]
    learning = hwm_mib(proc.pid)
    stop(proc)
    print(f"round: {json.dumps(round_)}", flush=True)
    print(f"peak RSS serve --learn (through the round): {learning:.0f} MiB", flush=True)
    for name, ms in (("back to back", busy), ("2.5 s apart", spaced)):
        print(f"ratio during a round ({name}) / idle: median {statistics.median(ms) / statistics.median(idle):.2f}x, worst {max(ms) / max(idle):.2f}x", flush=True)
    print(f"serve --learn {learning:.0f} MiB against serve {serve_alone:.0f} + personalize {personalize:.0f} = {serve_alone + personalize:.0f} MiB: "
          f"{serve_alone + personalize - learning:.0f} MiB less", flush=True)


if __name__ == "__main__":
    main()
