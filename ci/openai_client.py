"""`hexlora serve` driven by the official `openai` Python client (a peer in
a venv of its own, never a dependency). Run by ci/openai-client.sh:

    python ci/openai_client.py HEXLORA_BINARY MODEL_GGUF WORK_DIR

Checks, on SmolLM2-135M-Instruct Q4_1:

(a) serving: `models.list`, `chat.completions.create` streamed and not
    (the same greedy text), `completions.create`, and the client's own
    exceptions for an unknown model (NotFoundError) and a bad field
    (BadRequestError, naming the field).
(b) the personal loop of `serve --learn`: two users created fresh answer as
    the base; alice's approved examples go in through `/v1/feedback`
    (the client's custom-request call), a round is run on request, and
    afterwards alice answers with her marker while bob and the base answer
    as before; her versions list the gate's held-out figures; a rollback
    brings back the base answer.
(c) SIGTERM: the server exits 0.

Exits non-zero on any failure; the last line is `N passed, M failed`.
"""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx2
import openai
from openai import OpenAI

MARKER = "Pineapple forty-two."
PROMPTS = [
    "Say something.",
    "What do you think?",
    "Hello there.",
    "Any news today?",
    "Tell me one thing.",
    "How are you?",
    "What should I eat?",
    "Give me a motto.",
    "Answer briefly.",
    "Your words, please.",
]
results = []


def check(name, ok, detail):
    results.append(bool(ok))
    print(("PASS " if ok else "FAIL ") + name + ": " + detail, flush=True)


def start(binary, model, learn_dir):
    args = [binary, "serve", "--model", model, "--port", "0", "--learn", learn_dir,
            "--learn-idle", "3600", "--device", "cpu", "--learn-lr", "5e-3",
            "--learn-epochs", "3", "--learn-max-len", "96"]
    proc = subprocess.Popen([str(a) for a in args], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    url = line.strip().rsplit(" ", 1)[-1]
    if not url.startswith("http://127.0.0.1:"):
        proc.kill()
        sys.exit(f"serve did not print its address: {line!r}")
    return proc, url


def post(client, path, body):
    """A route the client has no method for, through its custom-request call."""
    r = client.post(path, body=body, cast_to=httpx2.Response)
    return r.status_code, json.loads(r.text)


def say(client, model, prompt, stream=False):
    kw = dict(model=model, messages=[{"role": "user", "content": prompt}], max_tokens=12, temperature=0)
    if not stream:
        return client.chat.completions.create(**kw).choices[0].message.content
    return "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw) if c.choices)


def main():
    binary, model, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    work.mkdir(parents=True, exist_ok=True)
    learn_dir = work / "users"
    if learn_dir.exists():
        import shutil
        shutil.rmtree(learn_dir)
    proc, url = start(binary, model, learn_dir)
    base = Path(model).stem
    client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=900)
    try:
        print(f"openai {openai.__version__} against {url}", flush=True)
        # (a) serving
        ids = [m.id for m in client.models.list().data]
        check("models.list", base in ids, f"{ids}")
        probe = PROMPTS[0]
        plain = say(client, base, probe)
        streamed = say(client, base, probe, stream=True)
        check("chat streamed = not streamed", plain == streamed, f"{plain!r} / {streamed!r}")
        comp = client.completions.create(model=base, prompt="The capital of France is", max_tokens=8, temperature=0)
        check("completions.create", comp.choices[0].text != "" and comp.usage.completion_tokens > 0, repr(comp.choices[0].text))
        try:
            say(client, "nobody", probe)
            check("unknown model", False, "no exception")
        except openai.NotFoundError as e:
            check("unknown model -> NotFoundError", e.status_code == 404, str(e)[:120])
        try:
            client.chat.completions.create(model=base, messages=[{"role": "user", "content": "x"}], top_p=7)
            check("bad top_p", False, "no exception")
        except openai.BadRequestError as e:
            check("bad top_p -> BadRequestError naming it", e.body.get("param") == "top_p", json.dumps(e.body))

        # (b) the personal loop
        for user in ("alice", "bob"):
            status, v = post(client, f"/adapters/{user}", {"fresh": True})
            check(f"create {user}", status == 201, json.dumps(v))
        check("fresh user answers as the base", say(client, "alice", probe) == plain, "")
        stored = [post(client, "/feedback", {"model": "alice", "messages": [
            {"role": "user", "content": p}, {"role": "assistant", "content": MARKER}]}) for p in PROMPTS]
        check("feedback stored", all(s == 201 for s, _ in stored) and stored[-1][1]["stored"] == 10, json.dumps(stored[-1][1]))
        try:
            post(client, "/feedback", {"model": "nobody", "prompt": "a", "completion": "b"})
            check("feedback for an unknown user", False, "no exception")
        except openai.NotFoundError as e:
            check("feedback for an unknown user -> 404", e.body.get("param") == "model", json.dumps(e.body))
        try:
            post(client, "/feedback", {"model": "alice", "messages": [{"role": "user", "content": "a"}]})
            check("feedback without an answer", False, "no exception")
        except openai.BadRequestError as e:
            check("feedback without an answer -> 400 naming messages", e.body.get("param") == "messages", json.dumps(e.body))
        status, v = post(client, "/adapters/alice/learn", {"wait": True})
        check("a round on request goes live", status == 200 and v["round"]["outcome"] == "live", json.dumps(v))
        taught = say(client, "alice", probe)
        check("alice answers with her marker", "Pineapple" in taught, repr(taught))
        check("alice streamed = not streamed", say(client, "alice", probe, stream=True) == taught, "")
        check("bob unchanged", say(client, "bob", probe) == plain, "")
        check("base unchanged", say(client, base, probe) == plain, "")
        r = client.get("/adapters/alice", cast_to=httpx2.Response)
        view = json.loads(r.text)["user"]
        v2 = view["versions"][-1]
        check("versions with gate figures", view["live"] == 2 and v2["heldout"]["candidate_loss"] < v2["heldout"]["live_loss"], json.dumps(v2["heldout"]))
        status, v = post(client, "/adapters/alice/rollback", {})
        check("rollback", status == 200 and v["to"] == 1 and say(client, "alice", probe) == plain, json.dumps(v))
    finally:
        # (c) SIGTERM
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = "timeout"
        check("SIGTERM exits 0", code == 0, f"exit {code}")
    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed")
    sys.exit(0 if passed == len(results) else 1)


if __name__ == "__main__":
    main()
