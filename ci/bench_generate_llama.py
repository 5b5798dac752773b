"""llama.cpp's side of ci/bench-generate.sh: the same prompt token ids and
greedy decoding on the same GGUF and thread count, through PyPI
llama-cpp-python (its vendored llama.cpp compiled natively for this CPU).

Usage: bench_generate_llama.py MODEL IDS_JSON N_GEN THREADS
Env: LLAMA_EXTRA_BUFTS=0 loads the weights without llama.cpp's extra buffer
types (AMX and repacked layouts): its AMX matrix product segfaults on some
AMX machines (ggml_backend_amx_mul_mat, llama-cpp-python 0.3.36, an Intel
Xeon with AMX under KVM, 2026-12-02), and ci/bench-generate.sh then says so.
Prints one line:
  llama.cpp prompt N tokens P tok/s, generated G tokens D tok/s, peak RSS R MiB
Prompt tok/s: the prompt's tokens over the time of its one evaluation
(which yields the first generated token's logits). Generated tok/s: the
decoding steps after it (one token each, argmax of the logits) over their
time, as hexlora generate counts them.
"""
import json
import resource
import sys
import time

import os

import llama_cpp
import llama_cpp.llama_cpp as llama_lib
import numpy as np
from llama_cpp import Llama


def next_token(llm):
    """Argmax of the last evaluated position's logits (read from the
    context: this llama-cpp-python keeps scores only with logits_all)."""
    logits = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return int(np.argmax(np.ctypeslib.as_array(logits, shape=(llm.n_vocab(),))))


def without_extra_buffer_types():
    """Makes every model load with use_extra_bufts off (Llama() takes no
    such argument: it starts from llama_model_default_params())."""
    default = llama_lib.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    llama_lib.llama_model_default_params = params


def main():
    model, ids_path, n_gen, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    ids = json.load(open(ids_path))
    if os.environ.get("LLAMA_EXTRA_BUFTS") == "0":
        without_extra_buffer_types()
    llm = Llama(
        model_path=model,
        n_ctx=len(ids) + n_gen + 8,
        n_batch=len(ids),
        n_ubatch=len(ids),
        n_threads=threads,
        n_threads_batch=threads,
        logits_all=False,
        verbose=False,
    )
    t0 = time.perf_counter()
    llm.eval(ids)
    prompt_s = time.perf_counter() - t0
    token = next_token(llm)
    t0 = time.perf_counter()
    for _ in range(n_gen - 1):
        llm.eval([token])
        token = next_token(llm)
    gen_s = time.perf_counter() - t0
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"llama.cpp prompt {len(ids)} tokens {len(ids) / prompt_s:.1f} tok/s, "
        f"generated {n_gen - 1} tokens {(n_gen - 1) / gen_s:.1f} tok/s, peak RSS {rss_mib:.0f} MiB"
    )


if __name__ == "__main__":
    main()
