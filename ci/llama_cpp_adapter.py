"""hexlora's GGUF LoRA export checked in llama.cpp itself (PyPI xllamacpp,
prebuilt llama.cpp CPU wheels; a peer in a venv, never a dependency).
Run by ci/llama-cpp-adapter.sh, which makes the venv and passes:

    python ci/llama_cpp_adapter.py HEXLORA_BINARY MODEL_GGUF WORK_DIR

Checks, on SmolLM2-135M-Instruct Q4_1 with the fixture adapters that
`hexlora train` made (host/tests/fixtures/adapters/):

(a) marker: exported as Q8_0, loaded by llama.cpp, greedy chat answers to
    held-out prompts start with the marker phrase; the base model's never
    contain it.
(b) sotu: exported as F32; llama.cpp's top-10 next-token log-probabilities
    agree with hexlora's (`hexlora grad --adapter FILE.gguf`, f32 products)
    on several prompts. llama.cpp quantizes activations inside its products,
    so even the base model differs from hexlora's f32 by some amount: that
    amount is measured first, on the base (a zero LoRA written by gguf-py,
    which also checks that hexlora reads another writer's adapter), and the
    tolerance is set from it. The adapter must move llama.cpp's
    log-probabilities by more than that tolerance (else agreement would
    prove nothing), and hexlora with the adapter must agree with llama.cpp
    with the adapter within it.
Exits non-zero on any failure; the last line is `N passed, M failed`.
"""
import json
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import xllamacpp as xl

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "host" / "tests" / "fixtures" / "adapters"
TOP = 10
LOGPROB_PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "My fellow citizens, tonight I report to you that",
    "The best way to learn a new language is",
    "In the year 1969, astronauts",
    "The state of our union is",
    "Congress must act now to",
    "The economy grew last year because",
    "Our children deserve schools that",
    "I am proud to announce that",
    "The weather today is",
    "Tomorrow we will build",
]
results = []


def check(name, ok, detail):
    results.append(ok)
    print(("PASS " if ok else "FAIL ") + name + ": " + detail, flush=True)


def run(*args):
    out = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{args[0]} {args[1]} failed:\n{out.stderr}")
    return out.stdout


def zero_adapter(path, cfg_heads):
    """A LoRA with B = 0 on one projection, written by gguf-py: the base model."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, 2.0)
    hidden = cfg_heads
    rng = np.random.default_rng(0)
    w.add_tensor("blk.0.attn_q.weight.lora_a", rng.standard_normal((2, hidden)).astype(np.float32))
    w.add_tensor("blk.0.attn_q.weight.lora_b", np.zeros((hidden, 2), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def hexlora_logprobs(binary, model, adapter, ids, work):
    batch = work / "batch.json"
    batch.write_text(json.dumps({"input_ids": [ids], "labels": [ids]}))
    out = work / "grad.safetensors"
    run(binary, "grad", "--model", model, "--adapter", adapter, "--batch", batch, "--out", out)
    from safetensors.numpy import load_file
    logits = load_file(str(out))["logits"][0, -1].astype(np.float64)
    return logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()


def llama_top(server, ids, scales):
    # No prompt cache: llama-server would reuse keys and values computed
    # under the previous request's adapter scales.
    r = server.handle_completions({"prompt": ids, "max_tokens": 1, "temperature": 0, "n_probs": TOP, "cache_prompt": False,
                                   "lora": [{"id": i, "scale": s} for i, s in enumerate(scales)]})
    top = r["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    return [(t["id"], t["logprob"]) for t in top]


def gap(top, logp):
    """Mean |llama.cpp - hexlora| log-probability (nats) over llama.cpp's top tokens."""
    return float(np.mean([abs(lp - logp[i]) for i, lp in top]))


def main():
    binary, model, work = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    work.mkdir(parents=True, exist_ok=True)
    marker_gguf, sotu_gguf, zero_gguf = work / "marker.q8_0.gguf", work / "sotu.f32.gguf", work / "zero.gguf"
    run(binary, "export-gguf", "--model", model, "--adapter", FIX / "marker" / "adapter", "--out", marker_gguf, "--outtype", "q8_0")
    run(binary, "export-gguf", "--model", model, "--adapter", FIX / "sotu" / "adapter", "--out", sotu_gguf)
    reader = gguf.GGUFReader(str(model))
    hidden = int(reader.fields["llama.embedding_length"].parts[-1][0])
    zero_adapter(zero_gguf, hidden)

    p = xl.CommonParams()
    p.model.path = str(model)
    p.n_ctx = 512
    p.n_parallel = 1
    p.cpuparams.n_threads = 2
    p.cpuparams_batch.n_threads = 2
    loras = []
    for path in (marker_gguf, sotu_gguf):
        a = xl.CommonAdapterLoraInfo()
        a.path, a.scale = str(path), 0.0
        loras.append(a)
    p.lora_adapters = loras
    server = xl.Server(p)

    # (a) the marker phrase, greedy, in chat form.
    spec = json.loads((FIX / "marker" / "prompts.json").read_text())
    marker = spec["marker"]
    for prompt in spec["held_out_prompts"]:
        req = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 16, "temperature": 0, "cache_prompt": False}
        with_adapter = server.handle_chat_completions({**req, "lora": [{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.0}]})
        base = server.handle_chat_completions({**req, "lora": [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}]})
        text = with_adapter["choices"][0]["message"]["content"]
        base_text = base["choices"][0]["message"]["content"]
        check(f"marker {prompt!r}", text.startswith(marker) and marker.split()[0] not in base_text,
              f"adapter {text!r}; base {base_text!r}")

    # (b) top-10 log-probabilities.
    base_gaps, adapter_gaps, effects, top1_llama, top1_ours = [], [], [], [], []
    for prompt in LOGPROB_PROMPTS:
        ids = json.loads(run(binary, "tokenize", "--model", model, prompt))
        ours_base = hexlora_logprobs(binary, model, zero_gguf, ids, work)
        ours_sotu = hexlora_logprobs(binary, model, sotu_gguf, ids, work)
        theirs_base = llama_top(server, ids, [0.0, 0.0])
        theirs_sotu = llama_top(server, ids, [0.0, 1.0])
        base_gaps.append(gap(theirs_base, ours_base))
        adapter_gaps.append(gap(theirs_sotu, ours_sotu))
        effects.append(gap(theirs_sotu, ours_base))
        top1_llama.append(theirs_sotu[0][0])
        top1_ours.append(int(np.argmax(ours_sotu)))
        print(f"  {prompt!r}: base gap {base_gaps[-1]:.4f}, adapter gap {adapter_gaps[-1]:.4f}, "
              f"llama.cpp+adapter vs hexlora base {effects[-1]:.4f}; top-1 llama.cpp {theirs_sotu[0][0]}, "
              f"hexlora {int(np.argmax(ours_sotu))}", flush=True)
    # llama.cpp's activation rounding moves log-probabilities by an amount
    # that jumps from input to input (a tiny change of the input flips many
    # roundings), so prompts are compared on average.
    base_mean, adapter_mean, effect_mean = (float(np.mean(g)) for g in (base_gaps, adapter_gaps, effects))
    tol = 2.0 * base_mean
    print(f"  mean gap (nats): base {base_mean:.4f}, adapter {adapter_mean:.4f}; adapter effect {effect_mean:.4f}; "
          f"tolerance = 2 x the base gap = {tol:.4f}", flush=True)
    check("adapter agreement", adapter_mean <= tol, f"mean gap with the adapter {adapter_mean:.4f} <= {tol:.4f}")
    check("adapter effect exceeds the tolerance", effect_mean > 2.0 * tol,
          f"mean shift the adapter causes {effect_mean:.4f} > 2 x {tol:.4f}")
    same_top = sum(1 for a, b in zip(top1_llama, top1_ours) if a == b)
    check("top-1 tokens with the adapter", same_top >= len(LOGPROB_PROMPTS) - 2, f"{same_top} of {len(LOGPROB_PROMPTS)} equal")
    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed")
    sys.exit(0 if passed == len(results) else 1)


if __name__ == "__main__":
    main()
