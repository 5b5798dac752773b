"""A bounded loopback load test of `hexlora serve` (run by
ci/bench-serve-load.sh, alone on the machine):

    python3 ci/bench_serve_load.py HEXLORA_BINARY MODEL DURATION CLIENTS QUEUE

One server with two adapters (the `sotu` and `marker` fixtures) and the
base model, `--queue QUEUE`. CLIENTS threads (more than the QUEUE waiting
requests plus the one being answered, so the queue overflows) send, back to
back, chat and completion requests of 8-24 new tokens, half of them
streamed, each to the base or one of the adapters in turn, for a 10 s
warm-up and then DURATION seconds. The server's RSS is sampled every
second.

Prints latency p50/p99 of the answered requests (whole answer, streamed or
not), answers and refusals per second, and RSS after the warm-up and at the
end. Fails on any 5xx, any refusal that is not a 429 in the OpenAI error
shape, any answer without a finish reason (an empty answer is the model's
when it says `stop`: the base model given a raw completion prompt may end
at once), or RSS growing by more than 16 MiB after the warm-up.
"""
import json
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ADAPTERS = {"sotu": ROOT / "host/tests/fixtures/adapters/sotu/adapter", "marker": ROOT / "host/tests/fixtures/adapters/marker/adapter"}
PROMPTS = ["Write one line about the sea.", "What is a commit message?", "Name three colours.", "Say hello to Alice.", "Describe a cat."]
WARMUP = 10.0


def rss_mib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def request(url, model, i):
    """One request; returns (status, seconds, text or error body, finish
    reason)."""
    stream = i % 2 == 1
    n = 8 + 8 * (i % 3)
    if i % 4 < 2:
        path, body = "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]}
    else:
        path, body = "/v1/completions", {"model": model, "prompt": PROMPTS[i % len(PROMPTS)]}
    body.update({"max_tokens": n, "temperature": 0, "stream": stream})
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    t = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            raw = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        return e.code, time.perf_counter() - t, e.read().decode(), None
    secs = time.perf_counter() - t
    if stream:
        events = [json.loads(l[6:]) for l in raw.splitlines() if l.startswith("data: ") and l != "data: [DONE]"]
        text = "".join((c.get("delta", {}).get("content") or c.get("text") or "") for e in events for c in e["choices"])
        finish = next((c.get("finish_reason") for e in events for c in e["choices"] if c.get("finish_reason")), None)
        assert raw.rstrip().endswith("data: [DONE]"), raw[-200:]
    else:
        v = json.loads(raw)
        c = v["choices"][0]
        text = c["message"]["content"] if "message" in c else c["text"]
        finish = c.get("finish_reason")
    return status, secs, text, finish


def main():
    binary, model, duration, clients, queue = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    args = [binary, "serve", "--model", model, "--port", "0", "--queue", str(queue), "--max-tokens", "32"]
    for name, path in ADAPTERS.items():
        args += ["--adapter", f"{name}={path}"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    url = proc.stdout.readline().strip().rsplit(" ", 1)[-1]
    assert url.startswith("http://127.0.0.1:"), url
    models = [m["id"] for m in json.loads(urllib.request.urlopen(url + "/v1/models").read())["data"]]
    assert set(ADAPTERS) <= set(models), models
    start = time.perf_counter()
    end = start + WARMUP + duration
    results, lock, failures, empty = [], threading.Lock(), [], [0]

    def client(k):
        i = k
        while time.perf_counter() < end:
            status, secs, text, finish = request(url, models[i % len(models)], i)
            at = time.perf_counter() - start
            with lock:
                results.append((at, status, secs))
                if status >= 500 or (status != 200 and status != 429):
                    failures.append(f"{status}: {text[:200]}")
                elif status == 429 and json.loads(text).get("error", {}).get("type") != "rate_limit_error":
                    failures.append(f"429 not in the OpenAI error shape: {text[:200]}")
                elif status == 200 and finish not in ("stop", "length"):
                    failures.append(f"an answer without a finish reason ({models[i % len(models)]}, request {i}): {finish!r}")
                elif status == 200 and not text and finish != "stop":
                    failures.append(f"an empty answer cut by length ({models[i % len(models)]}, request {i})")
                if status == 200 and not text:
                    empty[0] += 1
            if status == 429:
                time.sleep(0.05)
            i += clients

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    samples = []
    while time.perf_counter() < end:
        samples.append((time.perf_counter() - start, rss_mib(proc.pid)))
        time.sleep(1.0)
    for t in threads:
        t.join()
    final_rss = rss_mib(proc.pid)
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=60)

    timed = [r for r in results if r[0] >= WARMUP]
    ok = sorted(s for _, st, s in timed if st == 200)
    refused = sum(1 for _, st, _ in timed if st == 429)
    after_warmup = [r for t, r in samples if t >= WARMUP]
    rss0 = after_warmup[0] if after_warmup else samples[-1][1]
    q = lambda p: ok[min(len(ok) - 1, int(p * len(ok)))] * 1e3
    print(f"{clients} clients, --queue {queue}, {len(models)} models ({', '.join(models)}), {duration:.0f} s after a {WARMUP:.0f} s warm-up")
    print(f"answered {len(ok)} ({len(ok) / duration:.2f}/s), refused 429 {refused} ({refused / duration:.2f}/s), other {len(timed) - len(ok) - refused}")
    print(f"latency of answers: p50 {q(0.5):.0f} ms, p99 {q(0.99):.0f} ms, worst {ok[-1] * 1e3:.0f} ms" if ok else "no answers")
    print(f"RSS after the warm-up {rss0:.1f} MiB, highest after it {max(after_warmup or [rss0]):.1f} MiB, at the end {final_rss:.1f} MiB")
    print(f"answers that were empty (the model ended at once, finish_reason stop): {empty[0]}")
    print(f"server exit after SIGTERM: {code}")
    grew = max(after_warmup or [rss0]) - rss0
    if grew > 16:
        failures.append(f"RSS grew {grew:.1f} MiB after the warm-up")
    if code != 0:
        failures.append(f"server exited {code} after SIGTERM")
    if not ok:
        failures.append("no request answered")
    if failures:
        print("FAILED:\n" + "\n".join(sorted(set(failures))[:20]))
        sys.exit(1)
    print("no 5xx, every refusal a 429, RSS flat after the warm-up")


main()
