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
(c) Gemma 3 (models/gemma-3-270m-q4_k_m.gguf, if fetched; under CI it
    must be): a seeded random PEFT adapter on all seven projections of
    every layer, exported as F32, checked as (b) does. Gemma's q/k rows
    keep Hugging Face order in GGUF (llama.cpp rotates them NeoX-style), so
    this also checks that export leaves them unpermuted.
Exits non-zero on any failure; the last line is `N passed, M failed`.
"""
import json
import os
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


def zero_adapter(path, reader, arch="llama"):
    """A LoRA with B = 0 on blk.0.attn_q, written by gguf-py: the base model."""
    q = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight")
    n_in, n_out = int(q.shape[0]), int(q.shape[1])
    w = gguf.GGUFWriter(str(path), arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, 2.0)
    rng = np.random.default_rng(0)
    w.add_tensor("blk.0.attn_q.weight.lora_a", rng.standard_normal((2, n_in)).astype(np.float32))
    w.add_tensor("blk.0.attn_q.weight.lora_b", np.zeros((n_out, 2), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def hexlora_logprobs(binary, model, adapter, ids, work):
    batch = work / "batch.json"
    batch.write_text(json.dumps({"input_ids": [ids], "labels": [ids]}))
    out = work / "grad.safetensors"
    run(binary, "grad", "--model", model, "--adapter", adapter, "--batch", batch, "--out", out, "--force")
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


def agreement(name, binary, model, server, n_loras, lora_id, adapter_gguf, zero_gguf, work):
    """hexlora with `adapter_gguf` against llama.cpp's `server` with its
    lora `lora_id` at scale 1 (the others 0) on LOGPROB_PROMPTS; the
    tolerance from the base models' gap (see the module docs)."""
    base_gaps, adapter_gaps, effects, top1_llama, top1_ours = [], [], [], [], []
    scales = lambda on: [1.0 if (on and i == lora_id) else 0.0 for i in range(n_loras)]
    for prompt in LOGPROB_PROMPTS:
        ids = json.loads(run(binary, "tokenize", "--model", model, prompt))
        ours_base = hexlora_logprobs(binary, model, zero_gguf, ids, work)
        ours_with = hexlora_logprobs(binary, model, adapter_gguf, ids, work)
        theirs_base = llama_top(server, ids, scales(False))
        theirs_with = llama_top(server, ids, scales(True))
        base_gaps.append(gap(theirs_base, ours_base))
        adapter_gaps.append(gap(theirs_with, ours_with))
        effects.append(gap(theirs_with, ours_base))
        top1_llama.append(theirs_with[0][0])
        top1_ours.append(int(np.argmax(ours_with)))
        print(f"  {name} {prompt!r}: base gap {base_gaps[-1]:.4f}, adapter gap {adapter_gaps[-1]:.4f}, "
              f"llama.cpp+adapter vs hexlora base {effects[-1]:.4f}; top-1 llama.cpp {theirs_with[0][0]}, "
              f"hexlora {int(np.argmax(ours_with))}", flush=True)
    # llama.cpp's activation rounding moves log-probabilities by an amount
    # that jumps from input to input (a tiny change of the input flips many
    # roundings), so prompts are compared on average.
    base_mean, adapter_mean, effect_mean = (float(np.mean(g)) for g in (base_gaps, adapter_gaps, effects))
    tol = 2.0 * base_mean
    print(f"  {name} mean gap (nats): base {base_mean:.4f}, adapter {adapter_mean:.4f}; adapter effect {effect_mean:.4f}; "
          f"tolerance = 2 x the base gap = {tol:.4f}", flush=True)
    check(f"{name} adapter agreement", adapter_mean <= tol, f"mean gap with the adapter {adapter_mean:.4f} <= {tol:.4f}")
    check(f"{name} adapter effect exceeds the tolerance", effect_mean > 2.0 * tol,
          f"mean shift the adapter causes {effect_mean:.4f} > 2 x {tol:.4f}")
    same_top = sum(1 for a, b in zip(top1_llama, top1_ours) if a == b)
    check(f"{name} top-1 tokens with the adapter", same_top >= len(LOGPROB_PROMPTS) - 2, f"{same_top} of {len(LOGPROB_PROMPTS)} equal")


def random_peft_adapter(directory, reader, r=8, alpha=16.0, scale=0.02, seed=0):
    """A PEFT adapter with seeded N(0, scale) factors on all seven
    projections of every layer, shapes read from the GGUF `reader`."""
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    gguf_names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                  "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    tensors = {}
    for t in reader.tensors:
        layer, _, rest = t.name.removeprefix("blk.").partition(".")
        kind = rest.removesuffix(".weight")
        if not t.name.startswith("blk.") or kind not in gguf_names:
            continue
        n_in, n_out = int(t.shape[0]), int(t.shape[1])  # ggml dims: [in, out]
        key = f"base_model.model.model.layers.{layer}.{gguf_names[kind]}"
        tensors[f"{key}.lora_A.weight"] = rng.normal(0, scale, (r, n_in)).astype(np.float32)
        tensors[f"{key}.lora_B.weight"] = rng.normal(0, scale, (n_out, r)).astype(np.float32)
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": r, "lora_alpha": alpha, "lora_dropout": 0.0, "bias": "none", "use_rslora": False,
              "target_modules": sorted({v.split(".")[1] for v in gguf_names.values()}), "task_type": "CAUSAL_LM",
              "base_model_name_or_path": "gemma-3-270m"}
    (directory / "adapter_config.json").write_text(json.dumps(config))


def gemma_check(binary, model, work):
    reader = gguf.GGUFReader(str(model))
    random_peft_adapter(work / "gemma-random", reader)
    adapter_gguf, zero_gguf = work / "gemma-random.f32.gguf", work / "gemma-zero.gguf"
    run(binary, "export-gguf", "--model", model, "--adapter", work / "gemma-random", "--out", adapter_gguf, "--force")
    zero_adapter(zero_gguf, reader, arch="gemma3")
    agreement("gemma3", binary, model, llama_server(model, [adapter_gguf]), 1, 0, adapter_gguf, zero_gguf, work)


def llama_server(model, adapters):
    """llama.cpp's server on `model`, 2 threads, with `adapters` loaded at
    scale 0 (each request sets the scales it wants)."""
    p = xl.CommonParams()
    p.model.path = str(model)
    p.n_ctx = 512
    p.n_parallel = 1
    p.cpuparams.n_threads = 2
    p.cpuparams_batch.n_threads = 2
    loras = []
    for path in adapters:
        a = xl.CommonAdapterLoraInfo()
        a.path, a.scale = str(path), 0.0
        loras.append(a)
    p.lora_adapters = loras
    return xl.Server(p)


def main():
    binary, model, work = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    work.mkdir(parents=True, exist_ok=True)
    marker_gguf, sotu_gguf, zero_gguf = work / "marker.q8_0.gguf", work / "sotu.f32.gguf", work / "zero.gguf"
    run(binary, "export-gguf", "--model", model, "--adapter", FIX / "marker" / "adapter", "--out", marker_gguf, "--outtype", "q8_0", "--force")
    run(binary, "export-gguf", "--model", model, "--adapter", FIX / "sotu" / "adapter", "--out", sotu_gguf, "--force")
    zero_adapter(zero_gguf, gguf.GGUFReader(str(model)))

    server = llama_server(model, [marker_gguf, sotu_gguf])

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
    agreement("sotu", binary, model, server, 2, 1, sotu_gguf, zero_gguf, work)

    # (c) Gemma 3, a random adapter.
    gemma = ROOT / "models" / "gemma-3-270m-q4_k_m.gguf"
    if gemma.exists():
        gemma_check(binary, gemma, work)
    elif os.environ.get("CI"):
        check("gemma3", False, f"{gemma} is missing (toolchain/fetch-models.sh places it)")
    else:
        print(f"SKIPPED gemma3: {gemma} is missing (toolchain/fetch-models.sh places it)")

    passed = sum(results)
    print(f"{passed} passed, {len(results) - passed} failed")
    sys.exit(0 if passed == len(results) else 1)


if __name__ == "__main__":
    main()
